package train

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// BenchmarkConsumerStart times a member joining a consumer group late in
// a long run, local folder: n shards committed, all but the last 8 done;
// the member opens the group's log, reads the manifest and leases the
// first shard not done. "watermark" is the layout of today (done shards
// folded into the group's low watermark, the manifest read from the
// writer state's last mark before it); "every-shard" is the layout before
// (the group's snapshot holds every shard's state, the manifest is read
// from its first line). A flat "watermark" row is the point.
func BenchmarkConsumerStart(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		root := longRun(b, n)
		for _, layout := range []string{"watermark", "every-shard"} {
			b.Run(fmt.Sprintf("%s/shards=%d", layout, n), func(b *testing.B) {
				group := "g-" + layout
				groupAt(b, root, group, n, layout == "watermark")
				ctx := context.Background()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					sh, err := local.OpenReader(root)
					if err != nil {
						b.Fatal(err)
					}
					obj, err := sh.Objects(GroupDir(group))
					if err != nil {
						b.Fatal(err)
					}
					var shards Shards = sh
					if layout == "every-shard" {
						shards = wholeShards{sh} // no CommittedFrom: reads from the first line
					}
					c, err := NewConsumer(ctx, shards, obj, ConsumerConfig{Name: "late", LeaseTimeout: time.Hour})
					if err != nil {
						b.Fatal(err)
					}
					e, _, err := c.leaseNext(ctx)
					if err != nil || e == nil || e.Path != shardPath(n-8) {
						b.Fatalf("leased %v, %v; want %s", e, err, shardPath(n-8))
					}
					c.abandon()
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/start")
			})
		}
	}
}

// wholeShards hides CommittedFrom.
type wholeShards struct{ Shards }

func shardPath(i int) string {
	return fmt.Sprintf("policy=%d/part-20261201T000000Z-0123456789ab-%07d.parquet", i/10_000, i)
}

// longRun writes a manifest of n shard entries (directly, as lines: the
// append path would fsync each), then lets a writer open and close the
// folder, which writes its state with marks.
func longRun(b *testing.B, n int) string {
	b.Helper()
	root := b.TempDir()
	dir := filepath.Join(root, local.ManifestDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, local.ManifestFile))
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	for i := range n {
		e := schemas.ShardEntry{Seq: int64(i), Writer: "20261201T000000Z-0123456789ab", Path: shardPath(i), Rows: 64, Bytes: 1 << 20, Groups: 8,
			PolicyVersion: int64(i / 10_000), RunID: "20261201T000000Z-0123456789ab", SchemaVersion: schemas.SchemaVersion,
			Settled: schemas.Settled{"topic/0": {{int64(i) * 64, int64(i)*64 + 63}}}}
		for g := range 8 {
			e.GroupKeys = append(e.GroupKeys, fmt.Sprintf("task-%d-%d", i, g))
		}
		line, _ := json.Marshal(e)
		w.Write(append(line, '\n'))
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	st, err := local.Open(root, "marker")
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	return root
}

// groupAt writes a consumer group's log in which the first n-8 shards are
// done: folded into the watermark, or each in the snapshot.
func groupAt(b *testing.B, root, group string, n int, watermark bool) {
	b.Helper()
	dir := filepath.Join(root, filepath.FromSlash(GroupDir(group)))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	st := &groupState{Next: 1, Shards: map[string]*shardState{}}
	if watermark {
		st.Low, st.LowPath, st.LowAcked = int64(n-8), shardPath(n-9), int64(n-8)*8
	} else {
		for i := range n - 8 {
			st.Shards[shardPath(i)] = &shardState{Done: true, Total: 8, Counted: true, NAcked: 8}
		}
	}
	for name, v := range map[string]any{store.SnapshotName(0): st, store.RecordName(0): &event{Member: "old/1"}} {
		data, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
}
