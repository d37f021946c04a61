package duckdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// BenchmarkOpenViews times what every `sql` call does before its query
// reads data: read the manifest, define the views over n committed
// shards, list the shards and bind the steps view (the shards are hard
// links to one small file; a query that reads every shard adds DuckDB's
// cost of opening each file, which this leaves out).
//
// With compacted=true, `rllm-pipe compact` has merged them (1,024 shards a
// file) before: the views read 1/1,024th of the files.
func BenchmarkOpenViews(b *testing.B) {
	for _, c := range []struct {
		n         int
		compacted bool
	}{{1_000, false}, {10_000, false}, {30_000, false}, {10_000, true}, {30_000, true}, {100_000, true}} {
		n := c.n
		name := fmt.Sprintf("shards=%d", n)
		if c.compacted {
			name += "/compacted"
		}
		b.Run(name, func(b *testing.B) {
			root := b.TempDir()
			src := filepath.Join(b.TempDir(), "one.parquet")
			writeStepFile(b, src, []string{"s1", "s2"})
			entries := make([]schemas.ShardEntry, n)
			at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			for i := range entries {
				rel := fmt.Sprintf("policy=%d/part-w-%07d.parquet", i%8, i)
				file := filepath.Join(root, filepath.FromSlash(rel))
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					b.Fatal(err)
				}
				if i%50_000 == 0 && i > 0 { // a file has at most 65,000 links (ext4)
					src = filepath.Join(filepath.Dir(src), fmt.Sprintf("one-%d.parquet", i))
					writeStepFile(b, src, []string{"s1", "s2"})
				}
				if err := os.Link(src, file); err != nil {
					b.Fatal(err)
				}
				entries[i] = schemas.ShardEntry{Writer: "w", Path: rel, Rows: 2, Groups: 1, PolicyVersion: int64(i % 8),
					GroupKeys: []string{fmt.Sprintf("task-%d", i)}, RunID: "w", SchemaVersion: schemas.SchemaVersion, CommittedAt: at.Add(time.Duration(i) * time.Second)}
			}
			for i := range entries {
				entries[i].Seq = int64(i)
			}
			writeManifest(b, root, entries)
			// A writer opening the root marks the manifest every few
			// entries in its state, as a long run's writers do: readers
			// start at a mark.
			w, err := local.Open(root, "bench-writer")
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if c.compacted {
				r, err := local.OpenReader(root)
				if err != nil {
					b.Fatal(err)
				}
				st, err := compact.Run(ctx, r, compact.Config{Writer: "bench", MinShards: 2})
				if err != nil {
					b.Fatal(err)
				}
				if st.Shards != n-n%1024 {
					b.Fatalf("compacted %d shards of %d", st.Shards, n)
				}
			}
			b.ResetTimer()
			for b.Loop() {
				d, err := OpenLocal(ctx, root, Options{})
				if err != nil {
					b.Fatal(err)
				}
				bindAndClose(b, d)
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/open")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n), "µs/shard")
		})
	}
}

// bindAndClose lists the shards and binds the steps view, as a first
// query does, then closes d.
func bindAndClose(b *testing.B, d *DB) {
	b.Helper()
	ctx := context.Background()
	for _, q := range []string{"SELECT count(*) FROM shards", "SELECT step_id FROM steps LIMIT 0"} {
		rows, err := d.Query(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		for rows.Next() {
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			b.Fatal(err)
		}
	}
	if err := d.Close(); err != nil {
		b.Fatal(err)
	}
}
