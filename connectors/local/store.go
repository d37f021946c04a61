// Package local is the embedded default output: a directory on the local
// file system holding committed Parquet shards in Hive-style partition
// folders, the manifest, and the dead letters. It implements store.Store.
//
// Layout under the root:
//
//	policy=<N>/part-<writer>-<seq>.parquet   committed shards
//	_manifest/shards.jsonl                   one entry a line: the manifest
//	_manifest/lock                           held by the one writer
//	_manifest/writers.jsonl                  the writers that wrote here
//	_manifest/state.json                     what a writer needs of the manifest, folded (state.go)
//	_dlq/<writer>.jsonl                      dead letters
//	_tmp/<writer>.<random>.tmp               shards being written
//	_consumers/<group>/                      consumer groups' logs
//
// One writer at a time: a writer holds an exclusive OS lock on
// _manifest/lock for its whole life, and a second one is refused with
// store.ErrLocked (the lock goes with the process, kill -9 included).
// Readers take no lock.
//
// A shard is written under _tmp, synced, and renamed into place (readers
// never see a partial file); then its manifest line is appended and
// synced. The manifest is the only truth: a shard that a crash left
// published but unlisted is not data, and the next writer removes it (it
// bears the name of a writer the manifest knows). The store removes only
// what it created: files named by its own patterns, in its own folders,
// never through a symbolic link.
package local

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Folder and file names under the root.
const (
	ManifestDir  = store.ManifestDir
	ManifestFile = "shards.jsonl"
	LockFile     = "lock"
	WritersFile  = "writers.jsonl"
	DLQDir       = store.DeadLetterDir
	TmpDir       = "_tmp"
)

// Store is a local output directory opened by its one writer. Safe for
// concurrent use.
type Store struct {
	*Reader
	writer string
	lock   *os.File

	mu         sync.Mutex // serialises manifest appends
	man        *os.File
	size       int64 // manifest bytes
	count      int64 // manifest entries: the next Seq
	shardCount int64 // of them, the entries that list a shard
	marks      []mark
	sinceState int // appends since state.json was written
	settled    schemas.Settled
	known      map[string]bool  // writers whose files are the store's
	durable    map[string]int64 // dead-letter file → its durable length
	// listed has the shards and dead-letter files listed by the entries
	// read at Open (from the oldest dead writer's registration on) and
	// appended since: enough to tell the orphans of those writers.
	listed map[string]bool
	// suspects are the writers that died without closing: their orphans
	// are removed at Open.
	suspects map[string]bool
	ready    bool // Open completed: the figures above are the manifest's
	dl       *DeadLetterFile
}

var _ store.Store = (*Store)(nil)

// Open takes root for writer (a run id, unique per run): it creates the
// folders, takes the writer's lock (store.ErrLocked if another writer
// holds it), reads the manifest (cutting a torn last line), and removes
// what a dead writer left: its temporary files, its published shards that
// no entry lists, and the dead letters its entries did not make durable.
func Open(root, writer string) (*Store, error) {
	if !store.CheckWriter(writer) {
		return nil, fmt.Errorf("local: writer id %q: use letters, digits, '.', '_' and '-'", writer)
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("local: output root %q: %w", root, err)
	}
	for _, d := range []string{abs, filepath.Join(abs, ManifestDir), filepath.Join(abs, TmpDir)} {
		if err := ownDir(d); err != nil {
			return nil, err
		}
	}
	lock, err := lockRoot(filepath.Join(abs, ManifestDir, LockFile), writer)
	if err != nil {
		return nil, fmt.Errorf("local: %s: %w", abs, err)
	}
	s := &Store{Reader: &Reader{root: abs}, writer: writer, lock: lock, settled: schemas.Settled{},
		known: map[string]bool{writer: true}, durable: map[string]int64{}, listed: map[string]bool{}, suspects: map[string]bool{}}
	if err := s.open(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) open() error {
	reg, err := readWriters(s.root)
	if err != nil {
		return err
	}
	st, err := readState(s.root)
	if err != nil {
		return err
	}
	mpath := filepath.Join(s.root, ManifestDir, ManifestFile)
	f, err := os.OpenFile(mpath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("local: open manifest: %w", err)
	}
	s.man = f
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("local: manifest: %w", err)
	}
	if st.Offset > info.Size() || st.Offset < 0 || (st.Offset > 0 && (len(st.Marks) == 0 || st.Marks[len(st.Marks)-1].Offset != st.Offset)) {
		// A manifest shorter than its state, or a state without marks
		// (from before them): read it all.
		st = writerState{}
	}
	// Read from the state on, and from the registration of every dead
	// writer: its entries tell its orphans.
	from := st.Offset
	for w, off := range reg.open {
		s.suspects[w] = true
		from = min(from, off)
	}
	from = max(from, 0)
	data := make([]byte, info.Size()-from)
	if _, err := f.ReadAt(data, from); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("local: read manifest: %w", err)
	}
	before, n1, err := parseManifest(data[:st.Offset-from], from)
	if err != nil {
		return err
	}
	if n1 != st.Offset-from {
		return fmt.Errorf("local: manifest: byte %d, where its state ends, is not the end of an entry", st.Offset)
	}
	after, n2, err := parseManifest(data[st.Offset-from:], st.Offset)
	if err != nil {
		return err
	}
	for _, e := range before { // folded into the state already
		s.note(e)
	}
	s.settled.Union(st.Settled)
	for _, w := range st.Writers {
		s.known[w] = true
	}
	for file, n := range st.DeadLetters {
		s.durable[file] = max(s.durable[file], n)
	}
	s.count = st.Entries
	s.marks = st.Marks
	if n := len(st.Marks); n > 0 {
		s.shardCount = st.Marks[n-1].Shards
	} else {
		s.marks = markEvery(data[st.Offset-from:st.Offset-from+n2], st.Offset, after, stateEvery)
	}
	for _, e := range after {
		s.note(e)
		s.settled.Union(e.Settled)
		s.count++
		if e.Path != "" {
			s.shardCount++
		}
	}
	for _, w := range reg.all {
		s.known[w] = true
	}
	if from == 0 {
		// Everything was read: the writers from before the registry are
		// known by their entries, and as dead as any.
		for w := range s.known {
			s.suspects[w] = true
		}
	}
	delete(s.suspects, s.writer)
	// Cut a torn tail left by a crash mid-append (no other writer is
	// alive: we hold the lock).
	s.size = st.Offset + n2
	if err := f.Truncate(s.size); err != nil {
		return fmt.Errorf("local: repair manifest: %w", err)
	}
	if _, err := f.Seek(s.size, io.SeekStart); err != nil {
		return fmt.Errorf("local: repair manifest: %w", err)
	}
	if err := s.clearTemporary(); err != nil {
		return err
	}
	if err := s.removeOrphans(func(w string) bool { return s.suspects[w] }); err != nil {
		return err
	}
	if err := s.cutDeadLetters(); err != nil {
		return err
	}
	// The dead writers are cleaned up: later opens need not read back to
	// their registrations. Then this writer registers, before it creates
	// anything: from then on the files named after it are the store's,
	// whatever happens to the process.
	var lines []writerLine
	for w := range reg.open {
		lines = append(lines, writerLine{Writer: w, Closed: true})
	}
	lines = append(lines, writerLine{Writer: s.writer, PID: os.Getpid(), Opened: time.Now().UTC(), Offset: s.size})
	if err := s.appendWriters(lines...); err != nil {
		return err
	}
	s.ready = true
	return nil
}

// markEvery returns marks every k entries of the manifest lines in data
// (starting at byte offset, entries their decoded form), for a manifest
// read whole because its state has none.
func markEvery(data []byte, offset int64, entries []schemas.ShardEntry, k int) []mark {
	var marks []mark
	var at, shards int64
	for i, e := range entries {
		if i > 0 && i%k == 0 {
			marks = append(marks, mark{Offset: offset + at, Entries: int64(i), Shards: shards})
		}
		if e.Path != "" {
			shards++
		}
		at += int64(bytes.IndexByte(data[at:], '\n') + 1)
	}
	return marks
}

// note records what an entry lists and who wrote it. Callers hold mu or
// run before the store is shared.
func (s *Store) note(e schemas.ShardEntry) {
	if e.Path != "" {
		s.listed[e.Path] = true
	}
	if dl := e.DeadLetters; dl != nil {
		s.listed[dl.File] = true
		s.durable[dl.File] = max(s.durable[dl.File], dl.Bytes)
	}
	for _, w := range []string{e.Writer, e.RunID} {
		if w != "" {
			s.known[w] = true
		}
	}
}

// ownDir creates dir if needed and checks that it is a real folder (the
// store never writes or deletes through a symbolic link).
func ownDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("local: create %s: %w", dir, err)
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("local: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("local: %s is not a folder (a symbolic link?): the store writes only into folders of its own", dir)
	}
	return nil
}

// Writer is the id this store writes as.
func (s *Store) Writer() string { return s.writer }

// Settled returns the union of the positions settled by every entry.
func (s *Store) Settled() schemas.Settled {
	s.mu.Lock()
	defer s.mu.Unlock()
	return store.CloneSettled(s.settled)
}

// Claim does nothing on a local directory: the lock keeps every other
// writer out for as long as this one lives, so no stream needs fencing.
func (s *Store) Claim(ctx context.Context, streams []string, generation int64) error {
	return ctx.Err()
}

// Append lists e in the manifest: a checkpoint without a shard.
func (s *Store) Append(ctx context.Context, e schemas.ShardEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.append(e)
}

func (s *Store) append(e schemas.ShardEntry) error {
	e.Writer = s.writer
	if e.RunID == "" {
		e.RunID = s.writer
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.man == nil {
		return errors.New("local: store is closed")
	}
	e.Seq = s.count
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("local: encode manifest entry: %w", err)
	}
	step("append manifest")
	_, err = s.man.Write(append(line, '\n'))
	if err == nil {
		err = s.man.Sync()
	}
	if err != nil {
		// A part of the line may be there (a full disk): cut it, so that
		// the next append starts a line.
		if s.man.Truncate(s.size) == nil {
			_, _ = s.man.Seek(s.size, io.SeekStart)
		}
		return fmt.Errorf("local: append manifest: %w", err)
	}
	s.size += int64(len(line) + 1)
	s.count++
	if e.Path != "" {
		s.shardCount++
	}
	s.note(e)
	s.settled.Union(e.Settled)
	if s.sinceState++; s.sinceState >= stateEvery {
		if err := s.writeState(); err != nil {
			slog.Warn("local: writer state", "err", err) // opening reads more; nothing is lost
		}
	}
	return nil
}

// tmpName is the shape of the store's temporary files: <writer>.<hex>.tmp
// (and, from before writers were named, <partition>_part-....parquet.tmp).
var tmpName = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9._-]*\.[0-9a-f]{16}|` + schemas.PartitionKey + `=-?[0-9]+_part-[A-Za-z0-9._-]+\.parquet)\.tmp$`)

// clearTemporary removes the temporary files of dead writers (every
// writer but this one is dead: it holds the lock).
func (s *Store) clearTemporary() error {
	dir := filepath.Join(s.root, TmpDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("local: read %s: %w", dir, err)
	}
	for _, de := range ents {
		if !de.Type().IsRegular() || !tmpName.MatchString(de.Name()) {
			continue
		}
		step("remove temporary")
		if err := os.Remove(filepath.Join(dir, de.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("local: remove stale %s: %w", de.Name(), err)
		}
	}
	return nil
}

// removeOrphans removes published shards, named after a writer doomed
// reports, that no entry lists: the shards of a writer that crashed or
// failed between the rename and the append. Callers hold no lock.
func (s *Store) removeOrphans(doomed func(writer string) bool) error {
	ents, err := os.ReadDir(s.root)
	if err != nil {
		return fmt.Errorf("local: read %s: %w", s.root, err)
	}
	for _, de := range ents {
		if !de.IsDir() || !strings.HasPrefix(de.Name(), schemas.PartitionKey+"=") {
			continue // a symbolic link is no partition of ours either
		}
		files, err := os.ReadDir(filepath.Join(s.root, de.Name()))
		if err != nil {
			return fmt.Errorf("local: read %s: %w", de.Name(), err)
		}
		for _, f := range files {
			rel := de.Name() + "/" + f.Name()
			if !f.Type().IsRegular() {
				continue
			}
			w := store.ShardWriter(rel)
			s.mu.Lock()
			orphan := w != "" && doomed(w) && !s.listed[rel]
			s.mu.Unlock()
			if !orphan {
				continue
			}
			step("remove orphan")
			if err := os.Remove(filepath.Join(s.root, filepath.FromSlash(rel))); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("local: remove unlisted shard %s: %w", rel, err)
			}
		}
	}
	return nil
}

// Sweep removes this writer's published shards that no entry lists (an
// append that failed after the rename).
func (s *Store) Sweep(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.removeOrphans(func(w string) bool { return w == s.writer })
}

// cutDeadLetters truncates the dead-letter files of known writers to the
// length the manifest made durable: lines beyond belong to records that
// were not settled and will be dead-lettered again.
func (s *Store) cutDeadLetters() error {
	dir := filepath.Join(s.root, DLQDir)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("local: read %s: %w", dir, err)
	}
	if info, err := os.Lstat(dir); err != nil || !info.IsDir() {
		return nil // not our folder: a link; leave it alone
	}
	for _, de := range ents {
		rel := DLQDir + "/" + de.Name()
		if w := store.DeadLetterWriter(rel); !de.Type().IsRegular() || w == "" || !s.known[w] {
			continue
		}
		info, err := de.Info()
		if err != nil {
			return fmt.Errorf("local: %w", err)
		}
		keep := s.durable[rel]
		if info.Size() <= keep {
			continue
		}
		p := filepath.Join(dir, de.Name())
		step("cut dead letters")
		if keep == 0 {
			err = os.Remove(p)
		} else {
			err = os.Truncate(p, keep)
		}
		if err != nil {
			return fmt.Errorf("local: cut uncommitted dead letters of %s: %w", rel, err)
		}
	}
	return nil
}

// DeadLetters returns this writer's dead-letter file, _dlq/<writer>.jsonl.
func (s *Store) DeadLetters() store.DeadLetters {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dl == nil {
		rel := DLQDir + "/" + s.writer + ".jsonl"
		s.dl = NewDeadLetterFile(filepath.Join(s.root, DLQDir, s.writer+".jsonl"), rel)
		s.dl.committed = func() int64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.durable[rel]
		}
	}
	return s.dl
}

// readManifest returns the entries and the byte length of the valid
// prefix of the file (a torn last line is not part of it).
func readManifest(p string) ([]schemas.ShardEntry, int64, error) {
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("local: read manifest: %w", err)
	}
	out, valid, err := parseManifest(data, 0)
	return out, valid, err
}

// parseManifest decodes the complete lines of data, which starts at byte
// offset of the manifest, and returns how many bytes they take.
func parseManifest(data []byte, offset int64) ([]schemas.ShardEntry, int64, error) {
	end := bytes.LastIndexByte(data, '\n') + 1 // whole lines: a torn or unfinished last one waits
	// A long manifest (a reader opening a run of many commits) is decoded
	// in chunks of whole lines on every core.
	n := min(runtime.GOMAXPROCS(0), 8, end/manifestChunk+1)
	bounds := []int{0}
	for k := 1; k < n; k++ {
		at := max(end*k/n, bounds[len(bounds)-1])
		j := bytes.IndexByte(data[at:end], '\n')
		if j < 0 || at+j+1 >= end {
			break
		}
		bounds = append(bounds, at+j+1)
	}
	bounds = append(bounds, end)
	parts := make([][]schemas.ShardEntry, len(bounds)-1)
	errs := make([]error, len(parts))
	var wg sync.WaitGroup
	for i := range parts {
		wg.Go(func() { parts[i], errs[i] = parseLines(data[bounds[i]:bounds[i+1]], offset+int64(bounds[i])) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, err := range errs {
			if err != nil {
				return nil, 0, err // the first by position
			}
		}
	}
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	out := make([]schemas.ShardEntry, 0, total)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out, int64(end), nil
}

// manifestChunk is the least manifest bytes decoded on a core of its own.
const manifestChunk = 1 << 20

// parseLines decodes whole manifest lines, the first at offset.
func parseLines(data []byte, offset int64) ([]schemas.ShardEntry, error) {
	var out []schemas.ShardEntry
	var at int64
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		var e schemas.ShardEntry
		if err := json.Unmarshal(data[:i], &e); err != nil {
			return nil, fmt.Errorf("local: manifest line at byte %d: %w", offset+at, err)
		}
		out = append(out, e)
		at += int64(i + 1)
		data = data[i+1:]
	}
	return out, nil
}

// ReadManifest returns the manifest entries under root: committed shards,
// and checkpoints and claims (entries without a Path).
func ReadManifest(root string) ([]schemas.ShardEntry, error) {
	e, _, err := readManifest(filepath.Join(root, ManifestDir, ManifestFile))
	return e, err
}

// pending is a shard being written: bytes go to a temporary file until
// Commit publishes it.
type pending struct {
	s    *Store
	rel  string
	tmp  string
	f    *os.File
	w    *bufio.Writer
	done bool
}

// Create starts the shard at rel. It fails if a shard is already
// published there.
func (s *Store) Create(ctx context.Context, rel string) (store.Pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !store.CheckShardPath(rel) {
		return nil, fmt.Errorf("local: shard path %q is not a clean relative data path", rel)
	}
	final := filepath.Join(s.root, filepath.FromSlash(rel))
	if _, err := os.Lstat(final); err == nil {
		return nil, fmt.Errorf("local: shard %s already exists", rel)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	tmp := filepath.Join(s.root, TmpDir, s.writer+"."+hex.EncodeToString(b[:])+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("local: create temporary shard: %w", err)
	}
	return &pending{s: s, rel: rel, tmp: tmp, f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

// Write implements io.Writer.
func (p *pending) Write(b []byte) (int, error) { return p.w.Write(b) }

// Commit syncs the shard, publishes it by rename, and appends e (with its
// path set) to the manifest. After Commit returns nil the shard is durable
// and listed.
func (p *pending) Commit(ctx context.Context, e schemas.ShardEntry) error {
	if p.done {
		return errors.New("local: shard already committed or aborted")
	}
	p.done = true
	fail := func(err error) error {
		p.f.Close()
		os.Remove(p.tmp)
		return err
	}
	if err := p.w.Flush(); err != nil {
		return fail(fmt.Errorf("local: write shard %s: %w", p.rel, err))
	}
	if info, err := p.f.Stat(); err == nil {
		e.Bytes = info.Size()
	}
	if err := p.f.Sync(); err != nil {
		return fail(fmt.Errorf("local: sync shard %s: %w", p.rel, err))
	}
	if err := p.f.Close(); err != nil {
		return fail(fmt.Errorf("local: close shard %s: %w", p.rel, err))
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	final := filepath.Join(p.s.root, filepath.FromSlash(p.rel))
	dir := filepath.Dir(final)
	if _, err := os.Stat(dir); err != nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fail(fmt.Errorf("local: create partition folder: %w", err))
		}
		// A new folder is durable only once its parent is synced.
		if err := syncDir(filepath.Dir(dir)); err != nil {
			return fail(err)
		}
	}
	step("publish shard")
	if err := os.Rename(p.tmp, final); err != nil {
		return fail(fmt.Errorf("local: publish shard %s: %w", p.rel, err))
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	e.Path = p.rel
	return p.s.append(e)
}

// Abort discards the shard. It is safe to call after Commit (a no-op).
func (p *pending) Abort() error {
	if p.done {
		return nil
	}
	p.done = true
	p.f.Close()
	if err := os.Remove(p.tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local: remove temporary shard: %w", err)
	}
	return nil
}

// crashPoint, set only by tests, runs before each step that changes the
// root, by name: a test kills the process there (kill_test.go).
var crashPoint func(name string)

func step(name string) {
	if crashPoint != nil {
		crashPoint(name)
	}
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("local: open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("local: sync %s: %w", dir, err)
	}
	return nil
}

// Close closes the dead-letter file and the manifest, and lets the lock
// go. It is safe to call twice.
func (s *Store) Close() error {
	var errs []error
	s.mu.Lock()
	dl, open := s.dl, s.man != nil && s.ready
	s.mu.Unlock()
	if dl != nil {
		errs = append(errs, dl.Close())
	}
	// No commit is in flight any more: this writer's unlisted shards go,
	// and then it is closed, so that the next writer need not read the
	// manifest back to its registration to look for them.
	clean := open && s.removeOrphans(func(w string) bool { return w == s.writer }) == nil
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.man != nil && s.ready {
		if err := s.writeState(); err != nil {
			slog.Warn("local: writer state", "err", err)
		} else if clean {
			errs = append(errs, s.appendWriters(writerLine{Writer: s.writer, Closed: true}))
		}
	}
	if s.man != nil {
		errs = append(errs, s.man.Close())
		s.man = nil
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // closing the file releases the lock
		s.lock = nil
	}
	return errors.Join(errs...)
}
