package duckdb

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	duckdbdrv "github.com/duckdb/duckdb-go/v2"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// ErrBadQuery marks a query DuckDB could not parse or bind (a syntax
// error, an unknown table or column): the caller's mistake, not a
// failure of the data.
var ErrBadQuery = errors.New("bad query")

// Options tune Open.
type Options struct {
	// DownloadDir receives the files that must be local copies: the
	// shards and dead letters of an S3 output, and the committed prefix
	// of a local dead-letter file that has an uncommitted tail. They are
	// kept, so ViewsSQL stays usable after Close (unless a later
	// opening's PruneDownloads removes what it reads), and a shard
	// already there with the size its manifest entry records is not
	// downloaded again (shards are immutable). Empty: a temporary folder, removed by
	// Close. It must not lie under a local output root.
	DownloadDir string
	// Parallel is how many S3 objects download at once. Default 4.
	Parallel int
	// AllowHostFiles turns the sandbox off: by default, once the views
	// exist, DuckDB reaches no file but the committed shards and dead
	// letters the views read (no other host file, no URL, no extension
	// to install or load, settings locked) and Query runs queries only.
	// With AllowHostFiles, DuckDB keeps its defaults and Query runs any
	// statement: it may read and write whatever the process may, and
	// install extensions over the network.
	AllowHostFiles bool
	// Progress, when set, is told the bytes of S3 shards downloaded so
	// far, out of those to download, as each shard lands (for a progress
	// bar: a first query over a large S3 output waits on this).
	Progress func(done, total int64)
	// ConsumerGroups, when set, reads the consumer groups' logs for the
	// consumed view (the commands pass train.ConsumerLogs; connectors sit
	// below train and do not import it). Nil: consumed stays empty.
	ConsumerGroups ConsumerGroups
}

// ConsumerGroups reads what the consumer groups of an output root
// acknowledged.
type ConsumerGroups interface {
	// Groups lists the consumer groups under r.
	Groups(ctx context.Context, r store.Reader) ([]string, error)
	// Consumed returns the batches group acknowledged, in the order of
	// acknowledgement.
	Consumed(ctx context.Context, r store.Reader, group string) ([]schemas.ConsumedBatch, error)
	// StaleSkips returns the groups group skipped as stale, by policy
	// version (the newest versions its log keeps counts for).
	StaleSkips(ctx context.Context, r store.Reader, group string) ([]schemas.VersionCount, error)
}

// DB is an in-memory DuckDB with the views over one output root's
// committed data. Queries may run concurrently; Close once done.
type DB struct {
	db       *sql.DB
	from     string
	views    []View
	shards   int
	dlqFiles int
	layout   *layout // what the views read
	warnings []string
	work     string // temporary folder removed by Close
	kept     string // Options.DownloadDir of a remote opening, absolute ("" otherwise)
	open     bool   // Options.AllowHostFiles: no sandbox
	groups   ConsumerGroups

	// connInit runs on every new connection once set: the per-connection
	// variables holding the shard files the views read (filesSQL).
	connInit atomic.Pointer[string]

	closeOnce sync.Once
	closeErr  error
}

// OpenLocal opens the views over the committed data of a local output
// root (an ingest --to folder). It reads the manifest and stats the
// files it lists; it writes nothing under root.
func OpenLocal(ctx context.Context, root string, o Options) (*DB, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("duckdb: output root %q: %w", root, err)
	}
	if info, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("duckdb: output root: %w", err)
	} else if !info.IsDir() {
		return nil, fmt.Errorf("duckdb: output root %s is not a folder", abs)
	}
	if o.DownloadDir != "" {
		dd, err := filepath.Abs(o.DownloadDir)
		if err != nil {
			return nil, fmt.Errorf("duckdb: download folder %q: %w", o.DownloadDir, err)
		}
		if rel, err := filepath.Rel(abs, dd); err == nil && !strings.HasPrefix(rel, "..") {
			return nil, fmt.Errorf("duckdb: download folder %s lies under the output root %s (which is read only)", dd, abs)
		}
	}
	d, err := newDB(abs, o)
	if err != nil {
		return nil, err
	}
	if err := d.openLocal(ctx, abs, o); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return d, nil
}

func (d *DB) openLocal(ctx context.Context, root string, o Options) error {
	// Compacted files, if any: looked for only where their folder exists
	// (opening it through a reader would create it), and before the
	// manifest is read.
	var comp compaction
	var l *layout
	var dls []schemas.DeadLetterState
	var marks [][]dlMark
	dir, err := d.downloadDir(o)
	if err != nil {
		return err
	}
	if info, err := os.Stat(filepath.Join(root, compact.Dir)); err == nil && info.IsDir() {
		r, err := local.OpenReader(root)
		if err != nil {
			return fmt.Errorf("duckdb: %w", err)
		}
		comp = d.readCompaction(ctx, r)
		// The snapshot is read at every query over the shards: a copy of
		// it, which a later compaction does not remove.
		from, err := d.snapshotStart(ctx, r, comp, func(name string, size int64) (string, error) {
			return linkOrCopy(filepath.Join(root, compact.Dir, name), filepath.Join(dir, "compacted", name), size)
		})
		if err != nil {
			return err
		}
		if from != nil {
			if l, dls, marks, err = from.layout(ctx, d, root, filepath.Join(root, compact.Dir), false); err != nil {
				return err
			}
		}
	}
	if l == nil {
		var err error
		if l, dls, marks, err = d.localManifest(root, comp); err != nil {
			return err
		}
	}
	if err := checkFiles(l.shards); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	for i, c := range dls {
		p := c.File
		if !filepath.IsAbs(p) {
			if err := checkRel(p); err != nil {
				return fmt.Errorf("duckdb: dead-letter file %q: %w", c.File, err)
			}
			p = filepath.Join(root, filepath.FromSlash(c.File))
		}
		f, err := d.localDeadLetters(ctx, c, marks[i], p, dir)
		if err != nil {
			return err
		}
		if f != nil {
			l.dlq = append(l.dlq, *f)
		}
	}
	// The consumer groups' logs, if any: opening them through a reader
	// creates no folder, since they exist.
	if info, err := os.Stat(filepath.Join(root, store.ConsumersDir)); err == nil && info.IsDir() {
		r, err := local.OpenReader(root)
		if err != nil {
			return fmt.Errorf("duckdb: %w", err)
		}
		if l.consumed, err = d.writeConsumed(ctx, r, dir); err != nil {
			return err
		}
		if l.staleSkips, err = d.staleSkips(ctx, r); err != nil {
			return err
		}
	}
	return d.define(ctx, l)
}

// localManifest lays out the shards of the whole manifest under root,
// read from the compacted files comp records where they match.
func (d *DB) localManifest(root string, comp compaction) (*layout, []schemas.DeadLetterState, [][]dlMark, error) {
	entries, err := local.ReadManifest(root)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("duckdb: %w", err)
	}
	if len(entries) == 0 {
		if _, err := os.Stat(filepath.Join(root, local.ManifestDir, local.ManifestFile)); errors.Is(err, fs.ErrNotExist) {
			d.warnf("%s has no manifest (%s/%s): nothing is committed there", root, local.ManifestDir, local.ManifestFile)
		}
	}
	l, committed, err := d.manifestShards(entries, root, false)
	if err != nil {
		return nil, nil, nil, err
	}
	if comp.rec != nil {
		comp.apply(d, committed, l, filepath.Join(root, compact.Dir))
	}
	dls, marks := committedDeadLetters(entries, func(i int) int64 { return int64(i) })
	return l, dls, marks, nil
}

// consumedLine is one line of the consumed file.
type consumedLine struct {
	Group         string `json:"consumer_group"`
	Step          int    `json:"train_step"`
	Position      int    `json:"position"`
	Groups        int    `json:"groups_in_batch"`
	Member        string `json:"member"`
	MemberID      string `json:"member_id"`
	BatchID       uint64 `json:"batch_id"`
	PolicyVersion int64  `json:"policy_version"`
	GroupID       string `json:"group_id"`
	GroupVersion  int64  `json:"group_version"`
	Trajectories  int32  `json:"trajectories"`
	Steps         int64  `json:"steps"`
	Shard         string `json:"shard"`
	Ordinal       int32  `json:"group_ordinal"`
	Seq           int64  `json:"log_seq"`
	AckedAt       string `json:"acked_at"`
}

// writeConsumed writes the consumed rows of every consumer group of r
// (Options.ConsumerGroups) to a file in dir, and returns it ("" when
// there is no row). A group whose log cannot be read is left out with a
// warning.
func (d *DB) writeConsumed(ctx context.Context, r store.Reader, dir string) (string, error) {
	if d.groups == nil {
		return "", nil
	}
	groups, err := d.groups.Groups(ctx, r)
	if err != nil {
		return "", fmt.Errorf("duckdb: consumer groups: %w", err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	rows := 0
	for _, g := range groups {
		batches, err := d.groups.Consumed(ctx, r, g)
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			d.warnf("consumer group %s: its log cannot be read, left out of consumed: %v", g, err)
			continue
		}
		for step, b := range batches {
			name, _, _ := strings.Cut(b.Member, "/")
			for pos, cg := range b.Groups {
				line := consumedLine{
					Group: g, Step: step, Position: pos, Groups: len(b.Groups), Member: name, MemberID: b.Member,
					BatchID: b.BatchID, PolicyVersion: b.PolicyVersion, GroupID: cg.GroupID, GroupVersion: cg.GroupVersion,
					Trajectories: cg.Trajectories, Steps: cg.Steps, Shard: cg.Shard, Ordinal: cg.Ordinal, Seq: b.Seq,
					AckedAt: b.Time.UTC().Format("2006-01-02 15:04:05.999999"),
				}
				if err := enc.Encode(&line); err != nil {
					return "", fmt.Errorf("duckdb: consumed: %w", err)
				}
				rows++
			}
		}
	}
	if rows == 0 {
		return "", nil
	}
	file := filepath.Join(dir, "consumed.jsonl")
	if err := writeFile(file, &buf); err != nil {
		return "", fmt.Errorf("duckdb: save consumed: %w", err)
	}
	return file, nil
}

// staleSkips returns the rows of the stale_skips table: every consumer
// group's stale skips by policy version, as SQL VALUES ("" when none). A
// group whose log cannot be read is left out with a warning.
func (d *DB) staleSkips(ctx context.Context, r store.Reader) (string, error) {
	if d.groups == nil {
		return "", nil
	}
	groups, err := d.groups.Groups(ctx, r)
	if err != nil {
		return "", fmt.Errorf("duckdb: consumer groups: %w", err)
	}
	var rows []string
	for _, g := range groups {
		counts, err := d.groups.StaleSkips(ctx, r, g)
		if err != nil {
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			d.warnf("consumer group %s: its log cannot be read, left out of stale_skips: %v", g, err)
			continue
		}
		for _, c := range counts {
			rows = append(rows, fmt.Sprintf("(%s, %d::BIGINT, %d::BIGINT)", sqlText(g), c.Version, c.Groups))
		}
	}
	return strings.Join(rows, ",\n  "), nil
}

// dlMark is a manifest entry's mark on a dead-letter file: the file's
// durable length when the entry committed.
type dlMark struct {
	seq   int64
	at    time.Time
	bytes int64
}

// committedDeadLetters returns, per dead-letter file, the durable length
// recorded by the latest manifest entry naming it, in order of first
// mention, and the marks of every entry naming it, in manifest order
// (seq gives an entry's place).
func committedDeadLetters(entries []schemas.ShardEntry, seq func(i int) int64) ([]schemas.DeadLetterState, [][]dlMark) {
	idx := map[string]int{}
	var out []schemas.DeadLetterState
	var marks [][]dlMark
	for i, e := range entries {
		dl := e.DeadLetters
		if dl == nil || dl.File == "" {
			continue
		}
		m := dlMark{seq: seq(i), at: e.CommittedAt, bytes: dl.Bytes}
		if j, ok := idx[dl.File]; ok {
			out[j].Bytes = dl.Bytes
			marks[j] = append(marks[j], m)
			continue
		}
		idx[dl.File] = len(out)
		out = append(out, *dl)
		marks = append(marks, []dlMark{m})
	}
	return out, marks
}

// dlCommit counts the dead letters of one reason that one manifest entry
// committed in one file.
type dlCommit struct {
	seq     int64
	at      time.Time
	file    string // as the manifest names it
	reason  string
	letters int64
}

// attributeDeadLetters reads the complete lines of r (the committed lines
// of the dead-letter file rel) and counts them by reason and by the first
// entry, in manifest order, whose mark covers the line's end. Lines past
// every mark (a manifest whose marks shrank) go to the last entry.
func attributeDeadLetters(ctx context.Context, r io.Reader, rel string, marks []dlMark) ([]dlCommit, error) {
	if len(marks) == 0 {
		return nil, nil
	}
	type k struct {
		mark   int
		reason string
	}
	counts := map[k]int64{}
	var order []k
	br := bufio.NewReaderSize(r, 1<<20)
	var end int64
	j := 0
	for n := 0; ; n++ {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		line, err := br.ReadBytes('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, err
		}
		end += int64(len(line))
		for j < len(marks)-1 && marks[j].bytes < end {
			j++
		}
		var dl struct {
			Reason string `json:"reason"`
		}
		// The view reads the same line; a line it cannot read fails there.
		_ = json.Unmarshal(line, &dl)
		key := k{j, dl.Reason}
		if _, ok := counts[key]; !ok {
			order = append(order, key)
		}
		counts[key]++
	}
	out := make([]dlCommit, 0, len(order))
	for _, key := range order {
		m := marks[key.mark]
		out = append(out, dlCommit{seq: m.seq, at: m.at, file: rel, reason: key.reason, letters: counts[key]})
	}
	return out, nil
}

// localDeadLetters returns the committed lines of the dead-letter file at
// p: the file itself when all of it is committed, else a copy of its
// committed prefix under dir.
func (d *DB) localDeadLetters(ctx context.Context, c schemas.DeadLetterState, marks []dlMark, p, dir string) (*dlqFile, error) {
	if c.Bytes <= 0 {
		return nil, nil
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		d.warnf("committed dead-letter file %s is missing: its %d bytes are not shown", c.File, c.Bytes)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("duckdb: dead letters: %w", err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("duckdb: dead letters: %w", err)
	}
	n := c.Bytes
	if info.Size() < n {
		d.warnf("dead-letter file %s holds %d bytes, fewer than the %d committed: reading what is there", c.File, info.Size(), n)
		n = info.Size()
	}
	longest, complete, err := scanLines(ctx, io.LimitReader(f, n))
	if err != nil {
		return nil, fmt.Errorf("duckdb: dead letters %s: %w", c.File, err)
	}
	if complete == 0 {
		return nil, nil
	}
	if filepath.IsAbs(c.File) {
		// A file outside the root (ingest --dlq FILE) is read only when
		// it holds dead letters: a manifest naming any other file (a
		// host file) would otherwise open it to every query.
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return nil, fmt.Errorf("duckdb: dead letters %s: %w", c.File, err)
		}
		if line, err := notDeadLetters(ctx, io.LimitReader(f, complete)); err != nil {
			return nil, fmt.Errorf("duckdb: dead letters %s: %w", c.File, err)
		} else if line > 0 {
			d.warnf("committed dead-letter file %s is not a dead-letter file (line %d is not a dead letter): not shown", c.File, line)
			return nil, nil
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("duckdb: dead letters %s: %w", c.File, err)
	}
	commits, err := attributeDeadLetters(ctx, io.LimitReader(f, complete), c.File, marks)
	if err != nil {
		return nil, fmt.Errorf("duckdb: dead letters %s: %w", c.File, err)
	}
	if complete == info.Size() {
		return &dlqFile{rel: c.File, file: p, longest: longest, commits: commits}, nil
	}
	// An uncommitted tail (a writer at work, or a crashed run no writer
	// has reopened yet): copy the committed lines.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("duckdb: dead letters %s: %w", c.File, err)
	}
	dst := filepath.Join(dir, "_dlq-prefix", strings.NewReplacer("/", "_", "\\", "_", ":", "_").Replace(c.File))
	if err := writeFile(dst, io.LimitReader(f, complete)); err != nil {
		return nil, fmt.Errorf("duckdb: copy committed dead letters of %s: %w", c.File, err)
	}
	return &dlqFile{rel: c.File, file: dst, longest: longest, commits: commits}, nil
}

// notDeadLetters returns the number (from 1) of the first line of r that
// is not a dead letter (a JSON object with a reason), or 0 if every line is
// one.
func notDeadLetters(ctx context.Context, r io.Reader) (int, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	for n := 1; ; n++ {
		if n%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
		}
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			var dl struct {
				Reason string `json:"reason"`
			}
			if json.Unmarshal(line, &dl) != nil || dl.Reason == "" {
				return n, nil
			}
		}
		if errors.Is(err, io.EOF) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// scanLines reads r and returns its longest line and the length of its
// prefix made of complete lines (ending with '\n').
func scanLines(ctx context.Context, r io.Reader) (longest int, complete int64, err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var cur int
	var n int64
	for i := 0; ; i++ {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return 0, 0, err
			}
		}
		chunk, err := br.ReadSlice('\n')
		cur += len(chunk)
		n += int64(len(chunk))
		if err == nil {
			longest = max(longest, cur)
			complete = n
			cur = 0
			continue
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if errors.Is(err, io.EOF) {
			return longest, complete, nil
		}
		return 0, 0, err
	}
}

// writeFile writes dst beside, then renames: a reader (or a later
// opening that keeps copies of the right size) never sees half a file.
func writeFile(dst string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(dst), ".part-*")
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), dst); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}

// checkRel rejects manifest paths that could leave the root.
func checkRel(rel string) error {
	if rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || rel == ".." || strings.HasPrefix(rel, "../") ||
		strings.ContainsAny(rel, "\\\x00") {
		return fmt.Errorf("path %q is not a clean relative path", rel)
	}
	return nil
}

// Open opens the views over the committed data of r: in place for a
// local directory (OpenLocal), else through downloads (OpenRemote).
func Open(ctx context.Context, r store.Reader, o Options) (*DB, error) {
	if l, ok := r.(interface{ Root() string }); ok {
		return OpenLocal(ctx, l.Root(), o)
	}
	return OpenRemote(ctx, r, o)
}

// OpenRemote opens the views over the committed data of an object store
// (S3): it re-reads the manifest, downloads every committed shard not
// already there and every dead-letter object to the download folder (Options.DownloadDir, else a
// temporary one that Close removes) and reads them there. It writes
// nothing to the store.
func OpenRemote(ctx context.Context, st store.Reader, o Options) (*DB, error) {
	d, err := newDB(st.Name(), o)
	if err != nil {
		return nil, err
	}
	if err := d.openRemote(ctx, st, o); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return d, nil
}

func (d *DB) openRemote(ctx context.Context, st store.Reader, o Options) error {
	comp := d.readCompaction(ctx, st) // before the manifest
	dir, err := d.downloadDir(o)
	if err != nil {
		return err
	}
	if o.DownloadDir != "" {
		d.kept = dir // PruneDownloads prunes it
	}
	base := filepath.Join(dir, "shards")
	mergedDir := filepath.Join(dir, "compacted")
	// Compacted files are downloaded instead of the shards they hold.
	mergedBytes := map[string]int64{}
	if comp.rec != nil {
		for _, g := range comp.rec.Ranges {
			mergedBytes[g.File] = g.Bytes
		}
	}
	var l *layout
	var dls []schemas.DeadLetterState
	var marks [][]dlMark
	from, err := d.snapshotStart(ctx, st, comp, func(name string, size int64) (string, error) {
		file := filepath.Join(mergedDir, name)
		return file, download(ctx, st, compact.Dir+"/"+name, file, size)
	})
	if err != nil {
		return err
	}
	if from != nil {
		if l, dls, marks, err = from.layout(ctx, d, base, mergedDir, true); err != nil {
			return err
		}
	}
	if l == nil {
		if l, dls, marks, err = d.remoteManifest(ctx, st, comp, base, mergedDir); err != nil {
			return err
		}
	}
	l.dlq = make([]dlqFile, len(dls))
	par := o.Parallel
	if par <= 0 {
		par = 4
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(par)
	type fetchItem struct {
		rel, file string
		bytes     int64
	}
	var fetch []fetchItem
	var total int64
	fetched := map[string]bool{}
	for _, s := range append(l.snapMerged[:len(l.snapMerged):len(l.snapMerged)], l.shards...) {
		f := fetchItem{rel: s.entry.Path, file: s.file, bytes: s.entry.Bytes}
		if s.merged {
			name := filepath.Base(s.file)
			f = fetchItem{rel: compact.Dir + "/" + name, file: s.file, bytes: mergedBytes[name]}
		}
		if fetched[f.file] {
			continue
		}
		fetched[f.file] = true
		// Shards and compacted files are immutable: a copy already in the
		// download folder with the size the manifest (or the record)
		// gives is the file (a folder kept across openings, as the live
		// view's, downloads only new ones).
		if info, err := os.Stat(f.file); err == nil && f.bytes > 0 && info.Size() == f.bytes {
			continue
		}
		fetch = append(fetch, f)
		total += f.bytes
	}
	var done atomic.Int64
	if o.Progress != nil {
		o.Progress(0, total)
	}
	for _, s := range fetch {
		g.Go(func() error {
			n, err := fetchFile(gctx, st, s.rel, s.file)
			if err != nil {
				return err
			}
			if o.Progress != nil {
				o.Progress(done.Add(n), total)
			}
			return nil
		})
	}
	for i, c := range dls {
		g.Go(func() error {
			if err := checkRel(c.File); err != nil {
				return fmt.Errorf("duckdb: dead-letter object: %w", err)
			}
			data, err := getObject(gctx, st, c.File)
			if err != nil {
				return err
			}
			if int64(len(data)) > c.Bytes {
				data = data[:c.Bytes]
			}
			longest, complete, err := scanLines(gctx, bytes.NewReader(data))
			if err != nil {
				return err
			}
			if complete == 0 {
				return nil
			}
			commits, err := attributeDeadLetters(gctx, bytes.NewReader(data[:complete]), c.File, marks[i])
			if err != nil {
				return fmt.Errorf("duckdb: dead letters %s: %w", c.File, err)
			}
			file := filepath.Join(dir, "dead-letters", filepath.FromSlash(c.File))
			if err := writeFile(file, bytes.NewReader(data[:complete])); err != nil {
				return fmt.Errorf("duckdb: save dead letters %s: %w", c.File, err)
			}
			l.dlq[i] = dlqFile{rel: c.File, file: file, longest: longest, commits: commits}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	kept := l.dlq[:0]
	for _, f := range l.dlq {
		if f.file != "" {
			kept = append(kept, f)
		}
	}
	l.dlq = kept
	if l.consumed, err = d.writeConsumed(ctx, st, dir); err != nil {
		return err
	}
	if l.staleSkips, err = d.staleSkips(ctx, st); err != nil {
		return err
	}
	return d.define(ctx, l)
}

// manifestShards lays out the shards of the manifest entries (in order)
// under base and returns the committed ones (every shard entry, in
// order). A shard's seq is its entry's index in entries (a local
// manifest's line), or, remote, the entry's Seq (its place in the
// manifest); remote shard paths must not start with "_" (as openRemote
// requires).
func (d *DB) manifestShards(entries []schemas.ShardEntry, base string, remote bool) (*layout, []schemas.ShardEntry, error) {
	l := &layout{base: base}
	seq := func(i int) int64 { return int64(i) }
	if remote {
		seq = func(i int) int64 { return entries[i].Seq }
	}
	committed, err := d.addShards(l, entries, 0, map[string]bool{}, remote, seq)
	return l, committed, err
}

// addShards appends the shards of entries, read from their files under
// l.base, to l.shards, and returns the shard entries. at is the number of
// shards of the manifest before entries; seq gives entry i's place in it.
// A path in seen is listed again: read once, with a warning.
func (d *DB) addShards(l *layout, entries []schemas.ShardEntry, at int, seen map[string]bool, remote bool, seq func(i int) int64) ([]schemas.ShardEntry, error) {
	var committed []schemas.ShardEntry
	for i, e := range entries {
		if e.Path == "" {
			continue
		}
		committed = append(committed, e)
		if err := checkRel(e.Path); err != nil || remote && strings.HasPrefix(e.Path, "_") {
			return nil, fmt.Errorf("duckdb: manifest entry %d: shard path %q is not a clean relative data path", seq(i), e.Path)
		}
		if seen[e.Path] {
			d.warnf("shard %s is listed twice in the manifest: read once", e.Path)
			continue
		}
		seen[e.Path] = true
		l.shards = append(l.shards, shardFile{entry: e, seq: seq(i), at: at + len(committed) - 1, file: filepath.Join(l.base, filepath.FromSlash(e.Path))})
	}
	return committed, nil
}

// remoteManifest lays out the shards of st's whole manifest as
// downloaded under base, read from the compacted files comp records
// (downloaded under mergedDir) where they match.
func (d *DB) remoteManifest(ctx context.Context, st store.Reader, comp compaction, base, mergedDir string) (*layout, []schemas.DeadLetterState, [][]dlMark, error) {
	entries, err := st.Entries(ctx)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("duckdb: %w", err)
	}
	l, committed, err := d.manifestShards(entries, base, true)
	if err != nil {
		return nil, nil, nil, err
	}
	if comp.rec != nil {
		comp.apply(d, committed, l, mergedDir)
	}
	dls, marks := committedDeadLetters(entries, func(i int) int64 { return entries[i].Seq })
	return l, dls, marks, nil
}

// linkOrCopy makes dst the file src (a hard link, else a copy), unless a
// file of size bytes is there already, and returns dst.
func linkOrCopy(src, dst string, size int64) (string, error) {
	if info, err := os.Stat(dst); err == nil && info.Size() == size {
		return dst, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", fmt.Errorf("duckdb: %w", err)
	}
	_ = os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return dst, nil
	}
	f, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("duckdb: %w", err)
	}
	defer f.Close()
	if err := writeFile(dst, f); err != nil {
		return "", fmt.Errorf("duckdb: copy %s: %w", src, err)
	}
	return dst, nil
}

// download saves the object at rel under st's root to file, unless a
// file of size bytes (> 0) is there already (objects are immutable).
func download(ctx context.Context, st store.Reader, rel, file string, size int64) error {
	if info, err := os.Stat(file); err == nil && size > 0 && info.Size() == size {
		return nil
	}
	_, err := fetchFile(ctx, st, rel, file)
	return err
}

// fetchFile saves the object at rel under st's root to file and returns
// its size. A store that streams an object to a file (S3) does: a
// compacted file can be large, and several download at once.
func fetchFile(ctx context.Context, st store.Reader, rel, file string) (int64, error) {
	if fg, ok := st.(interface {
		GetFile(ctx context.Context, rel, path string) (int64, error)
	}); ok {
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return 0, fmt.Errorf("duckdb: save %s: %w", rel, err)
		}
		n, err := fg.GetFile(ctx, rel, file)
		if err != nil {
			return 0, fmt.Errorf("duckdb: %w", err)
		}
		return n, nil
	}
	data, err := getObject(ctx, st, rel)
	if err != nil {
		return 0, err
	}
	if err := writeFile(file, bytes.NewReader(data)); err != nil {
		return 0, fmt.Errorf("duckdb: save %s: %w", rel, err)
	}
	return int64(len(data)), nil
}

// getObject reads the object at rel under the store's root (the store
// retries transient errors).
func getObject(ctx context.Context, st store.Reader, rel string) ([]byte, error) {
	data, err := st.Get(ctx, rel)
	if err != nil {
		return nil, fmt.Errorf("duckdb: download %s: %w", rel, err)
	}
	return data, nil
}

func newDB(from string, o Options) (*DB, error) {
	work, err := os.MkdirTemp("", "rllm-pipe-sql-*")
	if err != nil {
		return nil, fmt.Errorf("duckdb: temporary folder: %w", err)
	}
	if abs, err := filepath.Abs(work); err == nil {
		work = abs // clean: the copies' paths are joined (cleaned) from it, and temporary compares them
	}
	d := &DB{from: from, work: work, open: o.AllowHostFiles, groups: o.ConsumerGroups}
	c, err := duckdbdrv.NewConnector("", func(e driver.ExecerContext) error {
		if q := d.connInit.Load(); q != nil {
			if _, err := e.ExecContext(context.Background(), *q, nil); err != nil {
				return fmt.Errorf("duckdb: connection set-up: %w", err)
			}
		}
		return nil
	})
	if err != nil {
		os.RemoveAll(work)
		return nil, fmt.Errorf("duckdb: open: %w", err)
	}
	db := sql.OpenDB(c)
	d.db = db
	for _, set := range []string{
		// Spill to our folder, not to the working directory (which may be
		// the output root).
		"SET GLOBAL temp_directory = " + sqlString(filepath.Join(work, "spill")),
		// Every query over steps binds the view again, reading shard
		// footers: keep them in memory, on every connection (GLOBAL: a
		// plain SET of this option holds for one connection only).
		"SET GLOBAL parquet_metadata_cache = true",
	} {
		if _, err := db.Exec(set); err != nil {
			return nil, errors.Join(fmt.Errorf("duckdb: %s: %w", set, err), d.Close())
		}
	}
	return d, nil
}

// downloadDir is where local copies go.
func (d *DB) downloadDir(o Options) (string, error) {
	if o.DownloadDir == "" {
		return filepath.Join(d.work, "files"), nil
	}
	dir, err := filepath.Abs(o.DownloadDir)
	if err != nil {
		return "", fmt.Errorf("duckdb: download folder %q: %w", o.DownloadDir, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("duckdb: download folder: %w", err)
	}
	return dir, nil
}

// define creates the views, then, unless Options.AllowHostFiles, closes
// the sandbox over the files they read.
func (d *DB) define(ctx context.Context, l *layout) error {
	for i := range l.dlq {
		l.dlq[i].longest = min(l.dlq[i].longest, math.MaxUint32-1024)
	}
	views, err := l.views()
	if err != nil {
		return fmt.Errorf("duckdb: %w", err)
	}
	// The shards table first: the variables listing the files the views
	// read are set from it on every connection, this one included.
	if err := d.shardsTable(ctx, l, views[0]); err != nil {
		return err
	}
	if files := l.filesSQL(); files != "" {
		d.connInit.Store(&files)
	}
	// Connections opened before lack the variables: close them.
	d.db.SetMaxIdleConns(0)
	d.db.SetMaxIdleConns(2)
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("duckdb: connection: %w", err)
	}
	defer conn.Close()
	for _, v := range views[1:] {
		if _, err := conn.ExecContext(ctx, v.SQL); err != nil {
			return fmt.Errorf("duckdb: create view %s: %w", v.Name, err)
		}
	}
	d.views, d.shards, d.dlqFiles, d.layout = views, l.count(), len(l.dlq), l
	if d.open {
		return nil
	}
	return d.sandbox(ctx, conn, l)
}

// shardsTable creates the shards table (v) and fills it with l's shards.
func (d *DB) shardsTable(ctx context.Context, l *layout, v View) error {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("duckdb: connection: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, v.SQL); err != nil {
		return fmt.Errorf("duckdb: create table %s: %w", v.Name, err)
	}
	if err := l.appendShards(ctx, conn); err != nil {
		return fmt.Errorf("duckdb: %w", err)
	}
	return nil
}

func (d *DB) warnf(format string, args ...any) {
	d.warnings = append(d.warnings, fmt.Sprintf(format, args...))
}

// Views returns the views, in creation order.
func (d *DB) Views() []View { return append([]View(nil), d.views...) }

// ErrViewsNeedCopies is ViewsSQL's answer when the views read local
// copies in the temporary folder Close removes (a compaction snapshot's,
// the committed prefix of a dead-letter file with an uncommitted tail,
// an S3 output's files): the script would name files gone once the
// caller exits. Options.DownloadDir keeps them.
var ErrViewsNeedCopies = errors.New("the views read local copies that are removed on exit")

// ViewsSQL returns the CREATE VIEW statements, to paste into the DuckDB
// CLI. They name local files, which must outlive the DB: the rows of the
// consumer groups' acknowledgements (up to maxInlineConsumed of them) are
// written into the script itself unless Options.DownloadDir keeps their
// file, and any other copy in the temporary folder is ErrViewsNeedCopies.
func (d *DB) ViewsSQL() (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "-- rllm-pipe sql: views over the committed data of %s (%d shards, %d dead-letter files)\n", d.from, d.shards, d.dlqFiles)
	for _, v := range d.views {
		q := v.SQL
		switch v.Name {
		case ViewShards:
			// The same rows, naming no temporary file of ours (but a
			// compaction snapshot's copy: see shardsValuesSQL).
			q = d.layout.shardsValuesSQL()
		case ViewStoredSteps:
			// The files listed in the view, not in variables of a
			// session, so that a database file keeps the view working.
			var err error
			if q, err = d.layout.storedStepsSQL(true); err != nil {
				q = "-- " + err.Error() + "\n"
			}
		case ViewConsumed:
			if d.temporary(d.layout.consumed) {
				if fi, err := os.Stat(d.layout.consumed); err == nil && fi.Size() > maxInlineConsumed {
					return "", fmt.Errorf("duckdb: view %s: %d bytes of acknowledgements: %w", v.Name, fi.Size(), ErrViewsNeedCopies)
				}
				var err error
				if q, err = consumedValuesSQL(d.layout.consumed); err != nil {
					return "", err
				}
			}
		}
		if d.temporary(q) {
			return "", fmt.Errorf("duckdb: view %s: %w", v.Name, ErrViewsNeedCopies)
		}
		fmt.Fprintf(&b, "\n-- %s: %s\n%s", v.Name, v.Doc, q)
	}
	return b.String(), nil
}

// temporary reports whether s (a path, or SQL naming paths as quoted
// literals) names a file in the folder Close removes.
func (d *DB) temporary(s string) bool {
	dir := d.work + string(filepath.Separator)
	return s != "" && (strings.Contains(s, dir) || strings.Contains(s, strings.ReplaceAll(dir, "'", "''")))
}

// maxInlineConsumed is the largest consumed file ViewsSQL writes into a
// script (a statement of that many bytes of VALUES); beyond, the file
// must be kept (Options.DownloadDir) and the script reads it.
const maxInlineConsumed = 64 << 20

// sqlText is s as a SQL string literal that any text survives: a NUL,
// which ends a literal in DuckDB's parser, is spliced in with chr(0).
func sqlText(s string) string {
	if !strings.Contains(s, "\x00") {
		return sqlString(s)
	}
	parts := strings.Split(s, "\x00")
	for i, p := range parts {
		parts[i] = sqlString(p)
	}
	return "(" + strings.Join(parts, " || chr(0) || ") + ")"
}

// consumedValuesSQL is consumedSQL with the rows of file in the
// statement, for a script that outlives the file.
func consumedValuesSQL(file string) (string, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("duckdb: consumed: %w", err)
	}
	var b strings.Builder
	b.WriteString("CREATE OR REPLACE TABLE consumed AS\nSELECT " + consumedCols + "\nFROM (VALUES")
	dec := json.NewDecoder(bytes.NewReader(data))
	n := 0
	for ; ; n++ {
		var c consumedLine
		if err := dec.Decode(&c); err == io.EOF {
			break
		} else if err != nil {
			return "", fmt.Errorf("duckdb: consumed: %w", err)
		}
		if n > 0 {
			b.WriteByte(',')
		}
		// Typed as consumedColumns types them (read_json's table).
		fmt.Fprintf(&b, "\n  (%s, %d::BIGINT, %d::INTEGER, %d::INTEGER, %s, %s, %d::UBIGINT, %d::BIGINT, %s, %d::BIGINT, %d::INTEGER, %d::BIGINT, %s, %d::INTEGER, %d::BIGINT, %s::TIMESTAMP)",
			sqlText(c.Group), c.Step, c.Position, c.Groups, sqlText(c.Member), sqlText(c.MemberID), c.BatchID,
			c.PolicyVersion, sqlText(c.GroupID), c.GroupVersion, c.Trajectories, c.Steps, sqlText(c.Shard),
			c.Ordinal, c.Seq, sqlText(c.AckedAt))
	}
	if n == 0 {
		return (&layout{}).consumedSQL(), nil
	}
	b.WriteString("\n) AS t(consumer_group, train_step, position, groups_in_batch, member, member_id, batch_id, policy_version,\n" +
		"  group_id, group_version, trajectories, steps, shard, group_ordinal, log_seq, acked_at)\nORDER BY consumer_group, train_step, position;\n")
	return b.String(), nil
}

// Shards is the number of committed shards the views read.
func (d *DB) Shards() int { return d.shards }

// Warnings lists what Open noticed and worked around (a missing manifest,
// a shorter dead-letter file than committed, ...).
func (d *DB) Warnings() []string { return append([]string(nil), d.warnings...) }

// SQL is the underlying database, for callers that need more than Query.
// It runs any statement (the sandbox's file and setting limits still
// hold): never hand it text from a user.
func (d *DB) SQL() *sql.DB { return d.db }

// Query runs q, one statement. Unless Options.AllowHostFiles, q must be a
// query (a SELECT, or EXPLAIN of one; see readOnly): anything else, and
// any access beyond the committed data, is an error wrapping ErrRefused.
// A parse, binding or catalog error is wrapped as ErrBadQuery. The caller
// closes the rows; cancelling ctx interrupts the query.
func (d *DB) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if !d.open {
		if err := d.readOnly(ctx, q, len(args) == 0); err != nil {
			return nil, err
		}
	}
	rows, err := d.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, classify(err)
	}
	return rows, nil
}

// classify wraps DuckDB's errors about the query text as ErrBadQuery,
// and the sandbox's refusals (a file or URL beyond the committed data, a
// locked setting) as ErrRefused.
func classify(err error) error {
	var de *duckdbdrv.Error
	if errors.As(err, &de) {
		switch {
		case de.Type == duckdbdrv.ErrorTypePermission,
			de.Type == duckdbdrv.ErrorTypeInvalidInput && strings.Contains(de.Msg, "configuration has been locked"):
			return fmt.Errorf("%w: %w", ErrRefused, err)
		}
		switch de.Type {
		case duckdbdrv.ErrorTypeParser, duckdbdrv.ErrorTypeSyntax, duckdbdrv.ErrorTypeBinder, duckdbdrv.ErrorTypeCatalog,
			duckdbdrv.ErrorTypeParameterNotResolved, duckdbdrv.ErrorTypeParameterNotAllowed:
			return fmt.Errorf("%w: %w", ErrBadQuery, err)
		}
	}
	return fmt.Errorf("query: %w", err)
}

// Close closes the database and removes the temporary folder. It is safe
// to call twice.
func (d *DB) Close() error {
	d.closeOnce.Do(func() {
		d.closeErr = errors.Join(d.db.Close(), os.RemoveAll(d.work))
	})
	return d.closeErr
}

// Column is a column of a view.
type Column struct {
	Name, Type string
}

// Columns returns the columns of the named view, in order.
func (d *DB) Columns(ctx context.Context, view string) ([]Column, error) {
	rows, err := d.db.QueryContext(ctx, `SELECT column_name, data_type FROM information_schema.columns
WHERE table_schema = 'main' AND table_name = ? ORDER BY ordinal_position`, view)
	if err != nil {
		return nil, fmt.Errorf("duckdb: columns of %s: %w", view, err)
	}
	defer rows.Close()
	var out []Column
	for rows.Next() {
		var c Column
		if err := rows.Scan(&c.Name, &c.Type); err != nil {
			return nil, fmt.Errorf("duckdb: columns of %s: %w", view, err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("duckdb: columns of %s: %w", view, err)
	}
	return out, nil
}

// listAt is how many shards to check a folder must hold for checkFiles
// to list it rather than look each one up. A listing costs what the whole
// folder holds (a policy folder holds every shard of its version, and
// after a compaction snapshot only the few newest are checked), a look-up
// a few times one entry's share of it.
const listAt = 1024

// checkFiles checks that every shard's file is there, as a stat of each
// would, but lists a folder holding many of them once (the shards of a
// run lie in a few policy folders; a stat each was a sixth of opening the
// views over a long run). A name the listing shows as a regular file is
// there; anything else (missing, a symbolic link) is looked up by itself,
// which gives the error of a missing one.
func checkFiles(shards []shardFile) error {
	split := func(file string) (dir, name string) {
		i := strings.LastIndexByte(file, filepath.Separator)
		return file[:i+1], file[i+1:]
	}
	count := map[string]int{}
	for _, s := range shards {
		dir, _ := split(s.file)
		count[dir]++
	}
	listed := map[string]map[string]bool{} // folder → its regular files (nil: not listed)
	for _, s := range shards {
		dir, name := split(s.file)
		regular, ok := listed[dir]
		if !ok {
			if count[dir] >= listAt {
				regular = regularFiles(dir)
			}
			listed[dir] = regular
		}
		if regular[name] {
			continue
		}
		if _, err := os.Stat(s.file); err != nil {
			return fmt.Errorf("duckdb: committed shard %s: %w", s.entry.Path, err)
		}
	}
	return nil
}

// regularFiles returns the names of the regular files in dir (nil if it
// cannot be listed: each file is then looked up by itself).
func regularFiles(dir string) map[string]bool {
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer f.Close()
	entries, err := f.ReadDir(-1) // unsorted, unlike os.ReadDir
	if err != nil {
		return nil
	}
	regular := make(map[string]bool, len(entries))
	for _, e := range entries {
		if e.Type().IsRegular() {
			regular[e.Name()] = true
		}
	}
	return regular
}
