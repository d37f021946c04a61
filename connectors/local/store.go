// Package local is the embedded default for output: a directory on the
// local file system holding committed Parquet shards in Hive-style
// partition folders, the manifest, and the dead letters.
//
// Layout under the root:
//
//	policy=<N>/part-<run>-<seq>.parquet   committed shards
//	_manifest/shards.jsonl                one line per committed shard
//	_dlq/<run>.jsonl                      dead letters
//	_tmp/                                 shards being written
//
// Folders whose names start with "_" hold what is not data; every
// *.parquet outside them is committed. A shard is written under _tmp,
// synced, and renamed into place (readers never see a partial file); then
// its manifest line is appended and synced. A crash between the two is
// repaired on the next Open: a published shard missing from the manifest
// is re-listed from the entry stored in its own footer.
package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"

	"github.com/apache/arrow-go/v18/parquet/file"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Folder names under the root.
const (
	ManifestDir  = "_manifest"
	ManifestFile = "shards.jsonl"
	DLQDir       = "_dlq"
	TmpDir       = "_tmp"
)

// Store is a local output directory. Create and commit are safe for
// concurrent use.
type Store struct {
	root string
	mu   sync.Mutex // serialises manifest appends
	man  *os.File
	// entries are the committed shards, loaded at Open and kept current.
	entries []schemas.ShardEntry
}

// Open prepares root for writing: creates the folders, clears stale
// temporary files, reads the manifest (dropping a torn last line) and
// re-lists published shards that a crash left out of it.
func Open(root string) (*Store, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("output root %q: %w", root, err)
	}
	for _, d := range []string{abs, filepath.Join(abs, ManifestDir), filepath.Join(abs, DLQDir), filepath.Join(abs, TmpDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("create %s: %w", d, err)
		}
	}
	if err := clearDir(filepath.Join(abs, TmpDir)); err != nil {
		return nil, err
	}
	s := &Store{root: abs}
	entries, valid, err := readManifest(filepath.Join(abs, ManifestDir, ManifestFile))
	if err != nil {
		return nil, err
	}
	s.entries = entries
	mpath := filepath.Join(abs, ManifestDir, ManifestFile)
	f, err := os.OpenFile(mpath, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open manifest: %w", err)
	}
	// Cut a torn tail left by a crash mid-append.
	if err := f.Truncate(valid); err != nil {
		f.Close()
		return nil, fmt.Errorf("repair manifest: %w", err)
	}
	if _, err := f.Seek(valid, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("repair manifest: %w", err)
	}
	s.man = f
	if err := s.recover(); err != nil {
		f.Close()
		return nil, err
	}
	if err := s.cutDeadLetters(); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// Settled returns the union of the positions settled by every commit: a
// run skips them.
func (s *Store) Settled() schemas.Settled {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := schemas.Settled{}
	for _, e := range s.entries {
		out.Union(e.Settled)
	}
	return out
}

// Rel returns p relative to the root with forward slashes when p lies
// under it, else p unchanged.
func (s *Store) Rel(p string) string {
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	rel, err := filepath.Rel(s.root, abs)
	if err != nil || strings.HasPrefix(rel, "..") {
		return abs
	}
	return filepath.ToSlash(rel)
}

// cutDeadLetters truncates dead-letter files under the root to the length
// the manifest made durable: lines beyond belong to records that were not
// settled and will be dead-lettered again.
func (s *Store) cutDeadLetters() error {
	durable := map[string]int64{}
	for _, e := range s.entries {
		if e.DeadLetters != nil {
			durable[e.DeadLetters.File] = max(durable[e.DeadLetters.File], e.DeadLetters.Bytes)
		}
	}
	dir := filepath.Join(s.root, DLQDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, de := range ents {
		if de.IsDir() {
			continue
		}
		rel := DLQDir + "/" + de.Name()
		info, err := de.Info()
		if err != nil {
			return err
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
			return fmt.Errorf("cut uncommitted dead letters of %s: %w", rel, err)
		}
	}
	return nil
}

// Append lists e in the manifest: a checkpoint without a shard.
func (s *Store) Append(ctx context.Context, e schemas.ShardEntry) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.appendEntry(e)
}

// Root is the absolute output directory.
func (s *Store) Root() string { return s.root }

// Entries returns the committed shards (a copy).
func (s *Store) Entries() []schemas.ShardEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]schemas.ShardEntry(nil), s.entries...)
}

func clearDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %w", dir, err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove stale %s: %w", e.Name(), err)
		}
	}
	return nil
}

// readManifest returns the entries and the byte length of the valid
// prefix of the file (a torn last line is not part of it).
func readManifest(p string) ([]schemas.ShardEntry, int64, error) {
	data, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read manifest: %w", err)
	}
	var out []schemas.ShardEntry
	var valid int64
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // torn: no newline yet
		}
		var e schemas.ShardEntry
		if err := json.Unmarshal(data[:i], &e); err != nil {
			return nil, 0, fmt.Errorf("manifest line at byte %d: %w", valid, err)
		}
		out = append(out, e)
		valid += int64(i + 1)
		data = data[i+1:]
	}
	return out, valid, nil
}

// ReadManifest returns the manifest entries under root: committed shards
// and checkpoints (entries without a Path, which settle dead letters).
func ReadManifest(root string) ([]schemas.ShardEntry, error) {
	e, _, err := readManifest(filepath.Join(root, ManifestDir, ManifestFile))
	return e, err
}

// recover lists published shards that the manifest does not.
func (s *Store) recover() error {
	listed := map[string]bool{}
	for _, e := range s.entries {
		listed[e.Path] = true
	}
	var missing []string
	err := filepath.WalkDir(s.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), "_") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".parquet") {
			rel, _ := filepath.Rel(s.root, p)
			rel = filepath.ToSlash(rel)
			if !listed[rel] {
				missing = append(missing, rel)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scan output: %w", err)
	}
	for _, rel := range missing {
		e, err := footerEntry(filepath.Join(s.root, filepath.FromSlash(rel)))
		if err != nil {
			return fmt.Errorf("recover shard %s (not in the manifest): %w", rel, err)
		}
		e.Path, e.Recovered = rel, true
		if info, err := os.Stat(filepath.Join(s.root, filepath.FromSlash(rel))); err == nil {
			e.Bytes = info.Size()
		}
		if err := s.appendEntry(e); err != nil {
			return err
		}
	}
	return nil
}

func footerEntry(p string) (schemas.ShardEntry, error) {
	var e schemas.ShardEntry
	r, err := file.OpenParquetFile(p, false)
	if err != nil {
		return e, err
	}
	defer r.Close()
	v := r.MetaData().KeyValueMetadata().FindValue(schemas.FooterEntryKey)
	if v == nil {
		return e, fmt.Errorf("footer has no %s", schemas.FooterEntryKey)
	}
	if err := json.Unmarshal([]byte(*v), &e); err != nil {
		return e, fmt.Errorf("footer entry: %w", err)
	}
	return e, nil
}

func (s *Store) appendEntry(e schemas.ShardEntry) error {
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode manifest entry: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.man.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("append manifest: %w", err)
	}
	if err := s.man.Sync(); err != nil {
		return fmt.Errorf("sync manifest: %w", err)
	}
	s.entries = append(s.entries, e)
	return nil
}

// Pending is a shard being written: bytes go to a temporary file until
// Commit publishes it.
type Pending struct {
	s    *Store
	rel  string
	tmp  string
	f    *os.File
	w    *bufio.Writer
	done bool
}

// Create starts the shard at rel, a slash-separated path under the root
// built by the caller from sanitised parts (never from record ids). It
// fails if a shard is already committed there.
func (s *Store) Create(ctx context.Context, rel string) (*Pending, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := checkRel(rel); err != nil {
		return nil, err
	}
	final := filepath.Join(s.root, filepath.FromSlash(rel))
	if _, err := os.Stat(final); err == nil {
		return nil, fmt.Errorf("shard %s already exists", rel)
	}
	tmp := filepath.Join(s.root, TmpDir, strings.ReplaceAll(rel, "/", "_")+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create temporary shard: %w", err)
	}
	return &Pending{s: s, rel: rel, tmp: tmp, f: f, w: bufio.NewWriterSize(f, 1<<20)}, nil
}

// checkRel rejects paths that could leave the root.
func checkRel(rel string) error {
	if rel == "" || path.IsAbs(rel) || path.Clean(rel) != rel || strings.HasPrefix(rel, "..") ||
		strings.ContainsAny(rel, "\\\x00") || strings.HasPrefix(rel, "_") {
		return fmt.Errorf("shard path %q is not a clean relative data path", rel)
	}
	return nil
}

// Write implements io.Writer.
func (p *Pending) Write(b []byte) (int, error) { return p.w.Write(b) }

// Commit syncs the shard, publishes it by rename, and appends e (with its
// path set) to the manifest. After Commit returns nil the shard is durable
// and listed.
func (p *Pending) Commit(ctx context.Context, e schemas.ShardEntry) error {
	if p.done {
		return errors.New("shard already committed or aborted")
	}
	p.done = true
	if err := p.w.Flush(); err != nil {
		p.f.Close()
		os.Remove(p.tmp)
		return fmt.Errorf("write shard %s: %w", p.rel, err)
	}
	if info, err := p.f.Stat(); err == nil {
		e.Bytes = info.Size()
	}
	if err := p.f.Sync(); err != nil {
		p.f.Close()
		os.Remove(p.tmp)
		return fmt.Errorf("sync shard %s: %w", p.rel, err)
	}
	if err := p.f.Close(); err != nil {
		os.Remove(p.tmp)
		return fmt.Errorf("close shard %s: %w", p.rel, err)
	}
	if err := ctx.Err(); err != nil {
		os.Remove(p.tmp)
		return err
	}
	final := filepath.Join(p.s.root, filepath.FromSlash(p.rel))
	dir := filepath.Dir(final)
	if _, err := os.Stat(dir); err != nil {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			os.Remove(p.tmp)
			return fmt.Errorf("create partition folder: %w", err)
		}
		// A new folder is durable only once its parent is synced.
		if err := syncDir(filepath.Dir(dir)); err != nil {
			os.Remove(p.tmp)
			return err
		}
	}
	if err := os.Rename(p.tmp, final); err != nil {
		os.Remove(p.tmp)
		return fmt.Errorf("publish shard %s: %w", p.rel, err)
	}
	if err := syncDir(dir); err != nil {
		return err
	}
	e.Path = p.rel
	return p.s.appendEntry(e)
}

// Abort discards the shard. It is safe to call after Commit (a no-op).
func (p *Pending) Abort() error {
	if p.done {
		return nil
	}
	p.done = true
	p.f.Close()
	if err := os.Remove(p.tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove temporary shard: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Close closes the manifest. It is safe to call twice.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.man == nil {
		return nil
	}
	err := s.man.Close()
	s.man = nil
	return err
}
