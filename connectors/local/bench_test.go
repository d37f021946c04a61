package local

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// BenchmarkOpenManifest times opening a local output of n commits, as a
// writer (ingest) and as a reader listing the shards (sql, consume,
// serve). A writer reads the state the last one left and the manifest
// after it ("writer"); a manifest without one is read whole ("writer, no
// state": the first open after an upgrade, or a state deleted). A reader
// lists every shard: it grows with them (docs/performance.md#logs-and-manifests).
func BenchmarkOpenManifest(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		root := b.TempDir()
		writeManifest(b, root, n)
		openWriter := func(b *testing.B, i int) {
			st, err := Open(root, fmt.Sprintf("bench-%d", i))
			if err != nil {
				b.Fatal(err)
			}
			if got := st.Settled()["file"].Len(); got != int64(n)*2048 {
				b.Fatalf("%d positions settled, want %d", got, n*2048)
			}
			if err := st.Close(); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("writer-no-state/commits=%d", n), func(b *testing.B) {
			start := time.Now()
			for i := range b.N {
				if err := os.Remove(filepath.Join(root, ManifestDir, StateFile)); err != nil && !os.IsNotExist(err) {
					b.Fatal(err)
				}
				openWriter(b, i)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/open")
		})
		b.Run(fmt.Sprintf("writer/commits=%d", n), func(b *testing.B) {
			openWriter(b, -1) // the run before left its state
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				openWriter(b, i)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/open")
		})
		b.Run(fmt.Sprintf("reader/commits=%d", n), func(b *testing.B) {
			start := time.Now()
			for range b.N {
				r, err := OpenReader(root)
				if err != nil {
					b.Fatal(err)
				}
				if es, err := r.Committed(context.Background()); err != nil || len(es) != n {
					b.Fatalf("%d shards, %v", len(es), err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/open")
		})
	}
}

func writeManifest(b *testing.B, root string, n int) {
	b.Helper()
	if err := os.MkdirAll(filepath.Join(root, ManifestDir), 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(filepath.Join(root, ManifestDir, ManifestFile))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriter(f)
	for seq := range n {
		e := schemas.ShardEntry{Seq: int64(seq), Writer: "writer", Path: fmt.Sprintf("policy=%d/part-writer-%06d.parquet", seq%8, seq),
			Rows: 2048, Bytes: 64 << 20, Groups: 256, GroupKeys: []string{fmt.Sprintf("task-%d", seq)}, RunID: "writer",
			SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Unix(int64(seq), 0).UTC(),
			Settled: schemas.Settled{"file": {{int64(seq) * 2048, int64(seq)*2048 + 2047}}}}
		line, err := json.Marshal(e)
		if err != nil {
			b.Fatal(err)
		}
		w.Write(append(line, '\n'))
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
}
