package duckdb

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/minio/minio-go/v7"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// memShards serves every shard of a reader from one Parquet file in
// memory: compacting a synthetic log of a million commits reads no
// million objects.
type memShards struct {
	store.Reader
	data []byte
}

func (m memShards) ReadShard(ctx context.Context, e schemas.ShardEntry, columns []string, mem memory.Allocator) (*parquet.Reader, error) {
	return parquet.Open(ctx, e.Path, bytes.NewReader(m.data), columns, mem)
}

// BenchmarkIntegrationOpenViewsS3 times what every `sql` call over an S3
// root does before its query reads data, once a compaction has run (the
// download folder kept, as the live view keeps it, so that what is timed
// is the start-up, not the first download): open a reader, read the
// compaction record and snapshot and the manifest after it, define the
// views, list the shards and bind the steps view. The root holds n shard
// commits (a synthetic log: its snapshots and sealed segments written
// directly, as BenchmarkIntegrationOpenManifest in connectors/s3 does), all
// but the last 100 merged by a compaction; the last 100 are real objects.
func BenchmarkIntegrationOpenViewsS3(b *testing.B) {
	ep := os.Getenv("RLLM_PIPE_S3_ENDPOINT")
	if ep == "" {
		b.Skip("RLLM_PIPE_S3_ENDPOINT not set: start MinIO (scripts/services.sh up) and eval scripts/services.sh env")
	}
	src := filepath.Join(b.TempDir(), "one.parquet")
	writeStepFile(b, src, []string{"s1", "s2"})
	data, err := os.ReadFile(src)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{10*1024 + 100, 100*1024 + 100, 1000*1024 + 100} {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) {
			ctx := context.Background()
			// RLLM_BENCH_ROOT: a root set up by an earlier run with
			// RLLM_BENCH_KEEP set (which logs it), to time two builds'
			// openings of the same root side by side.
			url, setUp := os.Getenv("RLLM_BENCH_ROOT"), false
			if url == "" {
				var id [4]byte
				rand.Read(id[:])
				url, setUp = "s3://rllm-pipe-test/bench-openviews-"+hex.EncodeToString(id[:]), true
			}
			cfg, err := s3.ParseURL(url)
			if err != nil {
				b.Fatal(err)
			}
			cfg.Endpoint = ep
			if setUp && os.Getenv("RLLM_BENCH_KEEP") == "" {
				b.Cleanup(func() {
					if _, err := s3.RemovePrefix(context.Background(), cfg); err != nil {
						b.Logf("cleanup: %v", err)
					}
				})
			}
			if setUp {
				b.Logf("root %s", url)
				setUpS3Root(b, cfg, n, data)
			}
			dl := b.TempDir()
			open := func() {
				r, err := s3.OpenReader(ctx, cfg, "bench")
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close()
				d, err := OpenRemote(ctx, r, Options{DownloadDir: dl})
				if err != nil {
					b.Fatal(err)
				}
				if d.layout.snap == nil || d.Shards() != n {
					b.Fatalf("opened %d shards (snapshot %v, warnings %q), want %d from the snapshot", d.Shards(), d.layout.snap != nil, d.Warnings(), n)
				}
				bindAndClose(b, d)
			}
			open() // downloads the compacted files, the snapshot, the last shards
			b.ResetTimer()
			for b.Loop() {
				open()
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/open")
		})
	}
}

// setUpS3Root writes a root of n commits (writeS3Log) and compacts it.
func setUpS3Root(b *testing.B, cfg s3.Config, n int, data []byte) {
	b.Helper()
	ctx := context.Background()
	writeS3Log(b, cfg, n, data)
	r, err := s3.OpenReader(ctx, cfg, "bench")
	if err != nil {
		b.Fatal(err)
	}
	st, err := compact.Run(ctx, memShards{r, data}, compact.Config{Writer: "bench", MinShards: 2})
	r.Close()
	if err != nil {
		b.Fatal(err)
	}
	if st.Shards != n-100 || st.Record.Snapshot == nil {
		b.Fatalf("compacted %d shards of %d (snapshot %v)", st.Shards, n, st.Record.Snapshot != nil)
	}
}

// writeS3Log writes a manifest log of n shard commits under cfg's root
// directly: everything but the tail in the newest snapshot and its sealed
// segments, the tail as records; the last 100 shards as objects holding
// data.
func writeS3Log(b *testing.B, cfg s3.Config, n int, data []byte) {
	b.Helper()
	ctx := context.Background()
	s, err := s3.Open(ctx, cfg, "writer")
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	cli, bucket := s.Client()
	put := func(rel string, body []byte) error {
		_, err := cli.PutObject(ctx, bucket, s.Key(rel), bytes.NewReader(body), int64(len(body)), minio.PutObjectOptions{})
		return err
	}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	entry := func(seq int) schemas.ShardEntry {
		return schemas.ShardEntry{Seq: int64(seq), Writer: "writer", Path: fmt.Sprintf("policy=%d/part-writer-%07d.parquet", seq%8, seq),
			Rows: 2, Bytes: int64(len(data)), Groups: 1, GroupKeys: []string{fmt.Sprintf("task-%d", seq)}, RunID: "writer",
			SchemaVersion: schemas.SchemaVersion, CommittedAt: at.Add(time.Duration(seq) * time.Second),
			Settled: schemas.Settled{"topic/0": {{int64(seq) * 2, int64(seq)*2 + 1}}}}
	}
	last := (n - 1) / s3.SnapshotEvery * s3.SnapshotEvery
	l := store.NewLog()
	for seq := 0; seq <= last; seq++ {
		l.Apply(entry(seq))
	}
	snap, segs, err := l.Snapshot(int64(last+1), s3.SegmentSize)
	if err != nil {
		b.Fatal(err)
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(32)
	for _, sg := range segs {
		g.Go(func() error { return put(store.ManifestDir+"/"+sg.Name, sg.Data) })
	}
	g.Go(func() error { return put(store.ManifestDir+"/"+store.SnapshotName(int64(last)), snap) })
	for seq := last + 1; seq < n; seq++ {
		g.Go(func() error {
			if gctx.Err() != nil {
				return gctx.Err()
			}
			rec, _ := json.Marshal(entry(seq))
			return put(store.ManifestDir+"/"+store.RecordName(int64(seq)), rec)
		})
	}
	for seq := n - 100; seq < n; seq++ {
		g.Go(func() error { return put(entry(seq).Path, data) })
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
}
