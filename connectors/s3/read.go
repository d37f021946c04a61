package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/minio/minio-go/v7"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Committed re-reads the manifest log and returns the committed shard
// entries in log order (claims and checkpoints, which list no shard, are
// left out).
func (s *Store) Committed(ctx context.Context) ([]schemas.ShardEntry, error) {
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.loaded(ctx); err != nil {
		return nil, err
	}
	return s.log.Committed(), nil
}

// CommittedFrom is Committed without the first n entries, for a follower
// that holds them (the consumer polls the manifest every second: copying
// every entry each time grew with the run).
func (s *Store) CommittedFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error) {
	return s.fromShard(ctx, n, (*store.Log).CommittedFrom)
}

// fromShard re-reads the manifest log, loads the segments holding its
// shard entries from the nth on, and returns get(log, n) (the log is read
// under mu: a re-read may replace it).
func (s *Store) fromShard(ctx context.Context, n int, get func(l *store.Log, n int) []schemas.ShardEntry) ([]schemas.ShardEntry, error) {
	if err := s.refresh(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.log.LoadFrom(ctx, n); err != nil {
		return nil, fmt.Errorf("s3: manifest: %w", err)
	}
	return get(s.log, n), nil
}

// EntriesFrom returns the log's entries from the nth shard entry on
// (reading only the segments that hold them); EntriesFrom(0) is Entries.
func (s *Store) EntriesFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error) {
	if n <= 0 {
		return s.Entries(ctx)
	}
	return s.fromShard(ctx, n, (*store.Log).EntriesFrom)
}

// GetFile downloads the object at rel under the root to the local file
// path (through a temporary file beside it, then renamed), streaming: a
// large object (a compacted file) is never held in memory. Transient
// failures are retried; a missing object is an error wrapping
// fs.ErrNotExist. It returns the bytes written.
func (s *Store) GetFile(ctx context.Context, rel, path string) (int64, error) {
	if !store.CheckPath(rel) {
		return 0, fmt.Errorf("s3: path %q is not a clean relative path", rel)
	}
	var n int64
	missing := false
	err := s.cfg.retry(ctx, func(int) error {
		obj, err := s.cli.GetObject(ctx, s.cfg.Bucket, s.key(rel), minio.GetObjectOptions{})
		if err != nil {
			return err
		}
		defer obj.Close()
		f, err := os.CreateTemp(filepath.Dir(path), ".part-*")
		if err != nil {
			return err
		}
		n, err = io.Copy(f, obj)
		cerr := f.Close()
		if err != nil {
			os.Remove(f.Name())
			if minio.ToErrorResponse(err).Code == "NoSuchKey" {
				missing = true
				return nil
			}
			return err
		}
		if err := errors.Join(cerr, os.Rename(f.Name(), path)); err != nil {
			os.Remove(f.Name())
			return err
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("s3: download %s: %w", rel, err)
	}
	if missing {
		return 0, fmt.Errorf("s3: %s: %w", rel, fs.ErrNotExist)
	}
	return n, nil
}

// ReadShard downloads a committed shard to a temporary file (removed when
// the reader is closed) and opens it for reading the named columns.
func (s *Store) ReadShard(ctx context.Context, e schemas.ShardEntry, columns []string, mem memory.Allocator) (*parquet.Reader, error) {
	if !store.CheckShardPath(e.Path) {
		return nil, fmt.Errorf("s3: shard path %q is not a clean relative path", e.Path)
	}
	f, err := os.CreateTemp("", "rllm-shard-*.parquet")
	if err != nil {
		return nil, fmt.Errorf("s3: temporary file for %s: %w", e.Path, err)
	}
	tmp := &removeOnClose{File: f}
	err = s.cfg.retry(ctx, func(int) error {
		if err := f.Truncate(0); err != nil {
			return err
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		obj, err := s.cli.GetObject(ctx, s.cfg.Bucket, s.key(e.Path), minio.GetObjectOptions{})
		if err != nil {
			return err
		}
		defer obj.Close()
		_, err = io.Copy(f, obj)
		return err
	})
	if err != nil {
		tmp.Close()
		return nil, fmt.Errorf("s3: download %s: %w", e.Path, err)
	}
	rd, err := parquet.Open(ctx, e.Path, tmp, columns, mem)
	if err != nil {
		tmp.Close()
		return nil, err
	}
	return rd, nil
}

// removeOnClose is a temporary file that removes itself when closed.
type removeOnClose struct{ *os.File }

func (r *removeOnClose) Close() error {
	err := r.File.Close()
	os.Remove(r.File.Name())
	return err
}

// Objects returns the folder dir under the prefix as a set of small
// create-only objects (If-None-Match: * PUTs).
func (s *Store) Objects(dir string) (store.Objects, error) {
	dir = strings.Trim(dir, "/")
	if !store.CheckPath(dir) {
		return nil, fmt.Errorf("s3: objects folder %q is not a clean relative path", dir)
	}
	return &Objects{s: s, dir: dir}, nil
}

// Objects is a folder of small objects, each created at most once.
type Objects struct {
	s   *Store
	dir string
}

func (o *Objects) key(name string) string { return o.s.key(o.dir + "/" + name) }

func checkName(name string) error {
	if !store.CheckName(name) {
		return fmt.Errorf("s3: object name %q is not a plain file name", name)
	}
	return nil
}

// Create writes name with data unless it exists (fs.ErrExist). After a
// retried PUT, fs.ErrExist may mean that the first attempt landed: callers
// put a nonce in data and read it back.
func (o *Objects) Create(ctx context.Context, name string, data []byte) error {
	if err := checkName(name); err != nil {
		return err
	}
	err := o.s.putIfAbsent(ctx, o.key(name), bytes.NewReader(data), int64(len(data)), "application/json")
	if errors.Is(err, errExists) {
		return fmt.Errorf("s3: %s: %w", name, fs.ErrExist)
	}
	return err
}

// Delete removes name (absent is not an error).
func (o *Objects) Delete(ctx context.Context, name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	if err := o.s.remove(ctx, o.key(name)); err != nil && minio.ToErrorResponse(err).Code != "NoSuchKey" {
		return fmt.Errorf("s3: delete %s: %w", name, err)
	}
	return nil
}

// Get reads name (fs.ErrNotExist if absent).
func (o *Objects) Get(ctx context.Context, name string) ([]byte, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	data, missing, err := o.s.get(ctx, o.key(name))
	if err != nil {
		return nil, fmt.Errorf("s3: get %s: %w", name, err)
	}
	if missing {
		return nil, fmt.Errorf("s3: %s: %w", name, fs.ErrNotExist)
	}
	return data, nil
}

// List returns the names in the folder starting with prefix, sorted.
func (o *Objects) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	err := o.s.cfg.retry(ctx, func(int) error {
		out = out[:0]
		base := o.s.key(o.dir + "/")
		for obj := range o.s.cli.ListObjects(ctx, o.s.cfg.Bucket, minio.ListObjectsOptions{Prefix: base + prefix}) {
			if obj.Err != nil {
				return obj.Err
			}
			out = append(out, strings.TrimPrefix(obj.Key, base))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("s3: list %s: %w", o.dir, err)
	}
	sort.Strings(out)
	return out, nil
}
