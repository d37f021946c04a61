// Package local is the embedded default output: a directory on the local
// file system holding committed Parquet shards in Hive-style partition
// folders, the manifest, and the dead letters. It implements store.Store.
//
// Layout under the root:
//
//	policy=<N>/part-<writer>-<seq>.parquet   committed shards
//	_manifest/shards.jsonl                   one entry a line: the manifest
//	_manifest/lock                           held by the one writer
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
	"os"
	"path/filepath"
	"regexp"
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

	mu  sync.Mutex // serialises manifest appends
	man *os.File
	log *store.Log
	dl  *DeadLetterFile
	// known has the writers registered (writers.jsonl) that may have left
	// files but no entry.
	known *store.Log
}

// isKnown reports whether writer wrote here: files named after it are the
// store's. Callers hold mu or run before the store is shared.
func (s *Store) isKnown(writer string) bool {
	return writer != "" && (s.log.Known(writer) || s.known.Known(writer) || writer == s.writer)
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
	s := &Store{Reader: &Reader{root: abs}, writer: writer, lock: lock, log: store.NewLog()}
	if err := s.open(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) open() error {
	mpath := filepath.Join(s.root, ManifestDir, ManifestFile)
	entries, valid, err := readManifest(mpath)
	if err != nil {
		return err
	}
	for _, e := range entries {
		s.log.Apply(e)
	}
	writers, err := readWriters(s.root)
	if err != nil {
		return err
	}
	known := store.NewLog()
	for _, w := range writers {
		known.Apply(schemas.ShardEntry{Writer: w})
	}
	s.known = known
	f, err := os.OpenFile(mpath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("local: open manifest: %w", err)
	}
	s.man = f
	// Cut a torn tail left by a crash mid-append (no other writer is
	// alive: we hold the lock).
	if err := f.Truncate(valid); err != nil {
		return fmt.Errorf("local: repair manifest: %w", err)
	}
	if _, err := f.Seek(valid, io.SeekStart); err != nil {
		return fmt.Errorf("local: repair manifest: %w", err)
	}
	if err := s.clearTemporary(); err != nil {
		return err
	}
	if err := s.removeOrphans(""); err != nil {
		return err
	}
	if err := s.cutDeadLetters(); err != nil {
		return err
	}
	return s.register()
}

// register adds this writer to _manifest/writers.jsonl before it creates
// anything: from then on the files named after it are the store's,
// whatever happens to the process. (The manifest itself lists only
// commits.)
func (s *Store) register() error {
	p := filepath.Join(s.root, ManifestDir, WritersFile)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("local: register writer: %w", err)
	}
	line, _ := json.Marshal(writerLine{Writer: s.writer, PID: os.Getpid(), Opened: time.Now().UTC()})
	_, err = f.Write(append(line, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("local: register writer: %w", err)
	}
	return nil
}

// writerLine is a line of _manifest/writers.jsonl.
type writerLine struct {
	Writer string    `json:"writer"`
	PID    int       `json:"pid"`
	Opened time.Time `json:"opened"`
}

// readWriters returns the writers registered under root.
func readWriters(root string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(root, ManifestDir, WritersFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("local: read writers: %w", err)
	}
	var out []string
	for _, l := range bytes.Split(data, []byte("\n")) {
		var w writerLine
		if json.Unmarshal(l, &w) == nil && w.Writer != "" {
			out = append(out, w.Writer)
		}
	}
	return out, nil
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

// Entries returns the manifest (this writer is its only appender, so its
// view is current).
func (s *Store) Entries(ctx context.Context) ([]schemas.ShardEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Entries(), nil
}

// Committed returns the entries that list a shard.
func (s *Store) Committed(ctx context.Context) ([]schemas.ShardEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Committed(), nil
}

// Settled returns the union of the positions settled by every entry.
func (s *Store) Settled() schemas.Settled {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Settled()
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
	if st := s.log.Fenced(&e, s.writer); st != "" {
		return fmt.Errorf("%w: %s", store.ErrFenced, st)
	}
	e.Seq = int64(s.log.Len())
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("local: encode manifest entry: %w", err)
	}
	if _, err := s.man.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("local: append manifest: %w", err)
	}
	if err := s.man.Sync(); err != nil {
		return fmt.Errorf("local: sync manifest: %w", err)
	}
	s.log.Apply(e)
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
		if err := os.Remove(filepath.Join(dir, de.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("local: remove stale %s: %w", de.Name(), err)
		}
	}
	return nil
}

// removeOrphans removes published shards that no entry lists, named after
// a writer the manifest knows (only, when only is set): the shards of a
// writer that crashed or failed between the rename and the append.
func (s *Store) removeOrphans(only string) error {
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
			s.mu.Lock()
			w := store.ShardWriter(rel)
			doomed := s.isKnown(w) && !s.log.Listed(rel) && (only == "" || w == only)
			s.mu.Unlock()
			if !doomed {
				continue
			}
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
	return s.removeOrphans(s.writer)
}

// cutDeadLetters truncates the dead-letter files of known writers to the
// length the manifest made durable: lines beyond belong to records that
// were not settled and will be dead-lettered again.
func (s *Store) cutDeadLetters() error {
	durable := map[string]int64{}
	for _, e := range s.log.Entries() {
		if e.DeadLetters != nil {
			durable[e.DeadLetters.File] = max(durable[e.DeadLetters.File], e.DeadLetters.Bytes)
		}
	}
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
		if !de.Type().IsRegular() || !s.isKnown(store.DeadLetterWriter(rel)) {
			continue
		}
		info, err := de.Info()
		if err != nil {
			return fmt.Errorf("local: %w", err)
		}
		keep := durable[rel]
		if info.Size() <= keep {
			continue
		}
		p := filepath.Join(dir, de.Name())
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
		s.dl = NewDeadLetterFile(filepath.Join(s.root, DLQDir, s.writer+".jsonl"), DLQDir+"/"+s.writer+".jsonl")
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
	var out []schemas.ShardEntry
	var valid int64
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // torn, or an append in progress: no newline yet
		}
		var e schemas.ShardEntry
		if err := json.Unmarshal(data[:i], &e); err != nil {
			return nil, 0, fmt.Errorf("local: manifest line at byte %d: %w", offset+valid, err)
		}
		out = append(out, e)
		valid += int64(i + 1)
		data = data[i+1:]
	}
	return out, valid, nil
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
	dl := s.dl
	s.mu.Unlock()
	if dl != nil {
		errs = append(errs, dl.Close())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
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
