package local

import (
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
	"sort"
	"strings"
	"sync"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Shards reads the committed shards of an output directory without
// writing to it (a writer's Open repairs and recovers; a reader must not).
// It follows the manifest: every call to Committed reads what was
// appended since the previous one. Safe for concurrent use.
type Shards struct {
	root string

	mu      sync.Mutex
	offset  int64 // bytes of the manifest read so far
	entries []schemas.ShardEntry
}

// OpenShards reads root's manifest.
func OpenShards(root string) (*Shards, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("shards %q: %w", root, err)
	}
	if _, err := os.Stat(abs); err != nil {
		return nil, fmt.Errorf("shards: %w", err)
	}
	return &Shards{root: abs}, nil
}

// Root is the directory read.
func (s *Shards) Root() string { return s.root }

// Committed returns the shard entries committed so far, in manifest order
// (checkpoint entries, which list no shard, are left out).
func (s *Shards) Committed(ctx context.Context) ([]schemas.ShardEntry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := os.Open(filepath.Join(s.root, ManifestDir, ManifestFile))
	if errors.Is(err, fs.ErrNotExist) {
		return append([]schemas.ShardEntry(nil), s.entries...), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(s.offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break // an append in progress: read it next time
		}
		var e schemas.ShardEntry
		if err := json.Unmarshal(data[:i], &e); err != nil {
			return nil, fmt.Errorf("manifest line at byte %d: %w", s.offset, err)
		}
		if e.Path != "" {
			s.entries = append(s.entries, e)
		}
		s.offset += int64(i + 1)
		data = data[i+1:]
	}
	return append([]schemas.ShardEntry(nil), s.entries...), nil
}

// ReadShard opens a committed shard for reading the named columns (all
// when none).
func (s *Shards) ReadShard(ctx context.Context, e schemas.ShardEntry, columns []string, mem memory.Allocator) (*parquet.Reader, error) {
	if err := checkRel(e.Path); err != nil {
		return nil, err
	}
	return parquet.OpenFile(ctx, filepath.Join(s.root, filepath.FromSlash(e.Path)), columns, mem)
}

// Objects returns the folder dir under the root (created if needed) as a
// set of small create-only objects.
func (s *Shards) Objects(dir string) (*Objects, error) {
	if dir == "" || path.IsAbs(dir) || path.Clean(dir) != dir || strings.HasPrefix(dir, "..") || strings.ContainsAny(dir, "\\\x00") {
		return nil, fmt.Errorf("objects folder %q is not a clean relative path", dir)
	}
	p := filepath.Join(s.root, filepath.FromSlash(dir))
	if err := os.MkdirAll(p, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", p, err)
	}
	return &Objects{dir: p}, nil
}

// Objects is a folder of small objects, each created at most once:
// written to a temporary file, synced, then hard-linked under its name
// (link fails if the name exists, so of two creators exactly one wins,
// and a reader never sees a partial object).
type Objects struct{ dir string }

// Create writes name with data unless it exists (fs.ErrExist).
func (o *Objects) Create(ctx context.Context, name string, data []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
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

// Get reads name (fs.ErrNotExist if absent).
func (o *Objects) Get(ctx context.Context, name string) ([]byte, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(o.dir, name))
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
	if name == "" || strings.ContainsAny(name, `/\`) || name == "." || name == ".." || strings.HasPrefix(name, ".tmp-") {
		return fmt.Errorf("object name %q is not a plain file name", name)
	}
	return nil
}
