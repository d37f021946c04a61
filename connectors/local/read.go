package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Reader reads the committed data of an output directory without writing
// to it (a writer's Open repairs; a reader must not), but for consumer
// groups' objects. It follows the manifest: every call to Entries reads
// what was appended since the previous one. Safe for concurrent use.
type Reader struct {
	root string

	mu      sync.Mutex
	offset  int64 // bytes of the manifest read so far
	entries []schemas.ShardEntry
	shards  []int // the entries that list a shard, by index
	// from is the mark the entries start at (zero: the manifest's start):
	// a follower that asked for the shards from the nth on first.
	from mark
}

var _ store.Reader = (*Reader)(nil)

// OpenReader opens the output directory root for reading.
func OpenReader(root string) (*Reader, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("local: output root %q: %w", root, err)
	}
	info, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("local: output root: %w", err)
	}
	if !info.IsDir() {
		return nil, fmt.Errorf("local: output root %s is not a folder", abs)
	}
	return &Reader{root: abs}, nil
}

// Root is the absolute output directory.
func (r *Reader) Root() string { return r.root }

// Name is the root's path.
func (r *Reader) Name() string { return r.root }

// Close releases nothing: a reader holds no file open.
func (r *Reader) Close() error { return nil }

// Entries returns the manifest's entries, reading what was appended since
// the last call (an append in progress is read next time).
func (r *Reader) Entries(ctx context.Context) ([]schemas.ShardEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.startAt(0)
	if err := r.follow(ctx); err != nil {
		return nil, err
	}
	return append([]schemas.ShardEntry(nil), r.entries...), nil
}

// startAt makes the reader hold the shard entries from the nth on: on a
// reader that has read nothing yet, it starts at the writer state's last
// mark at or before shard n; on one that started past n, it starts over.
// Callers hold mu.
func (r *Reader) startAt(n int) {
	if int64(n) < r.from.Shards {
		r.offset, r.entries, r.shards, r.from = 0, nil, nil, mark{}
	}
	if r.offset != 0 || n == 0 {
		return
	}
	for _, m := range readMarks(r.root) {
		if m.Shards > int64(n) || m.Offset <= 0 {
			break
		}
		r.from = m
	}
	r.offset = r.from.Offset
}

// follow reads the entries appended to the manifest since the last call.
// Callers hold mu.
func (r *Reader) follow(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.Open(filepath.Join(r.root, ManifestDir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("local: read manifest: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(r.offset, io.SeekStart); err != nil {
		return fmt.Errorf("local: read manifest: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Errorf("local: read manifest: %w", err)
	}
	more, n, err := parseManifest(data, r.offset)
	if r.from.Offset > 0 && r.offset == r.from.Offset && (err != nil || len(more) > 0 && more[0].Seq != r.from.Entries) {
		// Not the start of the entry the mark names (a manifest
		// rewritten by hand?): read it all.
		r.offset, r.from = 0, mark{}
		data, err = io.ReadAll(io.NewSectionReader(f, 0, 1<<62))
		if err != nil {
			return fmt.Errorf("local: read manifest: %w", err)
		}
		more, n, err = parseManifest(data, 0)
	}
	if err != nil {
		return err
	}
	for _, e := range more {
		if e.Path != "" {
			r.shards = append(r.shards, len(r.entries))
		}
		r.entries = append(r.entries, e)
	}
	r.offset += n
	return nil
}

// holdFrom makes the reader hold the shard entries from the nth on,
// read up to the manifest's end, and returns shard n's place in r.shards
// (len(r.shards) or more: none yet). Callers hold mu.
func (r *Reader) holdFrom(ctx context.Context, n int) (int, error) {
	n = max(n, 0)
	r.startAt(n)
	if err := r.follow(ctx); err != nil {
		return 0, err
	}
	return n - int(r.from.Shards), nil // the reader holds the shards from r.from on
}

// CommittedFrom is Committed without the first n shard entries, for a
// follower that holds them: it reads what was appended since the last
// call and copies only the entries asked for.
func (r *Reader) CommittedFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, err := r.holdFrom(ctx, n)
	if err != nil {
		return nil, err
	}
	if k >= len(r.shards) {
		return nil, nil
	}
	out := make([]schemas.ShardEntry, 0, len(r.shards)-k)
	for _, i := range r.shards[k:] {
		out = append(out, r.entries[i])
	}
	return out, nil
}

// EntriesFrom returns the entries from the nth shard entry on, each with
// Seq its line's place in the manifest; EntriesFrom(0) is Entries but for
// Seq (Entries keeps the seq a line holds: none in old manifests).
func (r *Reader) EntriesFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k, err := r.holdFrom(ctx, n)
	if err != nil {
		return nil, err
	}
	start := 0 // n <= 0: every entry, checkpoints before the first shard too
	if n > 0 {
		if k >= len(r.shards) {
			return nil, nil
		}
		start = r.shards[k]
	}
	out := append([]schemas.ShardEntry(nil), r.entries[start:]...)
	for i := range out {
		out[i].Seq = r.from.Entries + int64(start+i)
	}
	return out, nil
}

// Committed returns the shard entries committed so far, in manifest order
// (checkpoints and claims, which list no shard, are left out).
func (r *Reader) Committed(ctx context.Context) ([]schemas.ShardEntry, error) {
	return r.CommittedFrom(ctx, 0)
}

// Get reads the file at rel under the root.
func (r *Reader) Get(ctx context.Context, rel string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !store.CheckPath(rel) {
		return nil, fmt.Errorf("local: path %q is not a clean relative path", rel)
	}
	data, err := os.ReadFile(filepath.Join(r.root, filepath.FromSlash(rel)))
	if err != nil {
		return nil, fmt.Errorf("local: %w", err)
	}
	return data, nil
}

// ReadShard opens a committed shard for reading the named columns (all
// when none).
func (r *Reader) ReadShard(ctx context.Context, e schemas.ShardEntry, columns []string, mem memory.Allocator) (*parquet.Reader, error) {
	if !store.CheckShardPath(e.Path) {
		return nil, fmt.Errorf("local: shard path %q is not a clean relative data path", e.Path)
	}
	return parquet.OpenFile(ctx, filepath.Join(r.root, filepath.FromSlash(e.Path)), columns, mem)
}

// Objects returns the folder dir under the root (created if needed) as a
// set of small create-only objects.
func (r *Reader) Objects(dir string) (store.Objects, error) {
	if !store.CheckPath(dir) {
		return nil, fmt.Errorf("local: objects folder %q is not a clean relative path", dir)
	}
	p := filepath.Join(r.root, filepath.FromSlash(dir))
	if err := os.MkdirAll(p, 0o755); err != nil {
		return nil, fmt.Errorf("local: create %s: %w", p, err)
	}
	return &Objects{dir: p}, nil
}

// Objects is a folder of small objects, each created at most once:
// written to a temporary file, synced, then hard-linked under its name
// (link fails if the name exists, so of two creators exactly one wins,
// and a reader never sees a partial object).
// The first Create of an Objects also removes the temporary files a
// process killed while creating left (removeStaleTemps): only a writer
// does, so that reading a folder never changes it.
type Objects struct {
	dir   string
	swept sync.Once
}

// Create writes name with data unless it exists (fs.ErrExist).
func (o *Objects) Create(ctx context.Context, name string, data []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	o.swept.Do(func() { removeStaleTemps(o.dir, time.Now().Add(-staleTemp)) })
	tmp, err := os.CreateTemp(o.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("create %s: %w", name, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync %s: %w", name, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", name, err)
	}
	if err := os.Link(tmp.Name(), filepath.Join(o.dir, name)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s: %w", name, fs.ErrExist)
		}
		return fmt.Errorf("publish %s: %w", name, err)
	}
	return syncDir(o.dir)
}

// staleTemp is the age past which a temporary file of Objects.Create is
// the leftover of a process killed while creating (a live Create removes
// its own within the time of one write and sync).
const staleTemp = 15 * time.Minute

// removeStaleTemps removes the temporary files of Objects.Create in dir
// last modified before cutoff, as far as it can: only names Create makes
// are touched, and what it cannot remove is left for the next writer.
func removeStaleTemps(dir string, cutoff time.Time) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".tmp-") || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil || !info.ModTime().Before(cutoff) {
			continue // gone meanwhile, or maybe a live Create's
		}
		_ = os.Remove(filepath.Join(dir, e.Name()))
	}
}

// Get reads name (fs.ErrNotExist if absent).
func (o *Objects) Get(ctx context.Context, name string) ([]byte, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(o.dir, name))
}

// Delete removes name (absent is not an error).
func (o *Objects) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(o.dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local: delete %s: %w", name, err)
	}
	return nil
}

// List returns the names starting with prefix, sorted.
func (o *Objects) List(ctx context.Context, prefix string) ([]string, error) {
	ents, err := os.ReadDir(o.dir)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", o.dir, err)
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, prefix) && !strings.HasPrefix(n, ".tmp-") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out, nil
}

func checkName(name string) error {
	if !store.CheckName(name) || strings.HasPrefix(name, ".tmp-") {
		return fmt.Errorf("local: object name %q is not a plain file name", name)
	}
	return nil
}
