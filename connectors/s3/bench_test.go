package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// BenchmarkIntegrationOpenManifest times opening a reader of a manifest
// of n shard commits on MinIO, side by side: as compaction leaves it (the
// newest snapshots and fewer than SnapshotEvery entries after them) and
// as it was kept before compaction (every entry an object, replayed from
// 0; up to 10,000 entries, beyond which writing the log takes too long).
// The compacted open makes the same few requests at any n; a reader that
// lists every shard reads every sealed segment, a follower that starts
// late in the log (a consumer joining at its group's low watermark:
// "compacted-follower", the last 8 shards) only the last ones.
func BenchmarkIntegrationOpenManifest(b *testing.B) {
	for _, n := range []int{2_000, 10_000, 100_000, 1_000_000} {
		for _, layout := range []string{"compacted", "compacted-writer", "compacted-follower", "uncompacted"} {
			if layout == "uncompacted" && n > 10_000 {
				continue
			}
			b.Run(fmt.Sprintf("%s/commits=%d", layout, n), func(b *testing.B) {
				cfg := testConfig(b)
				writeManifest(b, cfg, n, layout != "uncompacted")
				ctx := context.Background()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					if layout == "compacted-writer" {
						// A writer (ingest) opens without reading the
						// sealed segments.
						w, err := Open(ctx, cfg, "bench")
						if err != nil {
							b.Fatal(err)
						}
						if got := w.Settled()["topic/0"].Len(); got != int64(n)*2048 {
							b.Fatalf("%d positions settled, want %d", got, n*2048)
						}
						continue
					}
					r, err := OpenReader(ctx, cfg, "bench")
					if err != nil {
						b.Fatal(err)
					}
					if layout == "compacted-follower" {
						if es, err := r.CommittedFrom(ctx, n-8); len(es) != 8 || es[7].Seq != int64(n-1) {
							b.Fatalf("the last shards: %d listed (%v)", len(es), err)
						}
						continue
					}
					if es, _ := r.Committed(ctx); len(es) != n {
						b.Fatalf("%d shards listed, want %d", len(es), n)
					}
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/open")
			})
		}
	}
}

// writeManifest writes the log of n shard commits directly.
func writeManifest(b *testing.B, cfg Config, n int, compacted bool) {
	b.Helper()
	ctx := context.Background()
	s, err := Open(ctx, cfg, "writer")
	if err != nil {
		b.Fatal(err)
	}
	entry := func(seq int) schemas.ShardEntry {
		return schemas.ShardEntry{Seq: int64(seq), Writer: "writer", Path: fmt.Sprintf("policy=%d/part-writer-%06d.parquet", seq%8, seq),
			Rows: 2048, Bytes: 64 << 20, Groups: 256, GroupKeys: []string{fmt.Sprintf("task-%d", seq)}, RunID: "writer",
			SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Unix(int64(seq), 0).UTC(),
			Settled: schemas.Settled{"topic/0": {{int64(seq) * 2048, int64(seq)*2048 + 2047}}}}
	}
	put := func(name string, data []byte) error {
		_, err := s.cli.PutObject(ctx, cfg.Bucket, s.key(store.ManifestDir+"/"+name), bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{})
		return err
	}
	first := 0
	if compacted {
		// Everything but the tail is in the newest snapshot.
		last := (n - 1) / SnapshotEvery * SnapshotEvery
		l := store.NewLog()
		for seq := 0; seq <= last; seq++ {
			l.Apply(entry(seq))
		}
		snap, segs, err := l.Snapshot(int64(last+1), SegmentSize)
		if err != nil {
			b.Fatal(err)
		}
		for _, g := range segs {
			if err := put(g.Name, g.Data); err != nil {
				b.Fatal(err)
			}
		}
		if err := put(store.SnapshotName(int64(last)), snap); err != nil {
			b.Fatal(err)
		}
		first = last + 1
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for seq := first; seq < n; seq++ {
		g.Go(func() error {
			if gctx.Err() != nil {
				return gctx.Err()
			}
			data, _ := json.Marshal(entry(seq))
			return put(store.RecordName(int64(seq)), data)
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}
