package duckdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// compactRoot writes a local root of n committed one-step shards.
func compactRoot(t *testing.T, n int) string {
	t.Helper()
	root := t.TempDir()
	entries := make([]schemas.ShardEntry, n)
	for i := range entries {
		rel := fmt.Sprintf("policy=0/part-w-%06d.parquet", i)
		writeStepFile(t, filepath.Join(root, filepath.FromSlash(rel)), []string{fmt.Sprintf("s%d", i)})
		entries[i] = schemas.ShardEntry{Writer: "w", Path: rel, Rows: 1, Groups: 1, GroupKeys: []string{fmt.Sprintf("task-%d", i)},
			RunID: "w", SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Date(2026, 12, 1, 0, 0, i, 0, time.UTC)}
	}
	writeManifest(t, root, entries)
	return root
}

// recordObjects answers the Create of a compaction record as a store may
// after a retried request: fs.ErrExist, having created it (landed: the
// answer was lost) or not (another compaction's record is there).
type recordObjects struct {
	store.Objects
	landed bool
}

func (o recordObjects) Create(ctx context.Context, name string, data []byte) error {
	if !strings.HasPrefix(name, "record-") {
		return o.Objects.Create(ctx, name, data)
	}
	if o.landed {
		if err := o.Objects.Create(ctx, name, data); err != nil {
			return err
		}
		return fmt.Errorf("after a retry: %w", fs.ErrExist)
	}
	if err := o.Objects.Create(ctx, name, []byte(`{"seq":0,"writer":"other"}`)); err != nil {
		return err
	}
	return fmt.Errorf("create %s: %w", name, fs.ErrExist)
}

type recordReader struct {
	store.Reader
	landed bool
}

func (r recordReader) Objects(dir string) (store.Objects, error) {
	o, err := r.Reader.Objects(dir)
	return recordObjects{o, r.landed}, err
}

// TestCompactRecordCreateExists: a record whose create answers "exists"
// is this compaction's when it holds its bytes (a retried request whose
// first attempt landed), and then the run succeeds and the views read the
// merged files; another's, and the run fails with ErrRaced, removing its
// merged files.
func TestCompactRecordCreateExists(t *testing.T) {
	ctx := context.Background()
	for _, landed := range []bool{true, false} {
		t.Run(fmt.Sprintf("landed=%t", landed), func(t *testing.T) {
			root := compactRoot(t, 6)
			r, err := local.OpenReader(root)
			if err != nil {
				t.Fatal(err)
			}
			st, err := compact.Run(ctx, recordReader{r, landed}, compact.Config{Writer: "c1", MinShards: 2, MaxShards: 3})
			files, _ := filepath.Glob(filepath.Join(root, compact.Dir, "c1-*.parquet"))
			if !landed {
				if !errors.Is(err, compact.ErrRaced) || len(files) != 0 {
					t.Fatalf("err %v, merged files left %v: want ErrRaced and none", err, files)
				}
				return
			}
			if err != nil || st.Files != 2 || len(files) != 2 {
				t.Fatalf("err %v, %d files recorded, %d there: want the 2 merged files", err, st.Files, len(files))
			}
			d, err := OpenLocal(ctx, root, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			got := queryStrings(t, d, "SELECT count(DISTINCT file)::VARCHAR || '/' || count(*)::VARCHAR FROM shards")
			if fmt.Sprint(got) != "[2/6]" {
				t.Fatalf("files/shards %v, want 2 files for 6 shards", got)
			}
			if got := queryStrings(t, d, "SELECT string_agg(step_id || '@' || shard, ',' ORDER BY step_id) FROM steps"); !strings.Contains(got[0], "s5@policy=0/part-w-000005.parquet") {
				t.Fatalf("steps %v", got)
			}
		})
	}
}
