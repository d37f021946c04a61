package train

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// BenchmarkOpenGroupLog times a member joining a consumer group whose log
// holds n renewals, side by side: as compaction leaves it (the newest
// snapshots and the events after them) and as logs were kept before
// compaction (every event, and a snapshot every SnapshotEvery). A flat
// "compacted" row is the point: joining costs the same after a week as
// after a minute.
func BenchmarkOpenGroupLog(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		for _, layout := range []string{"compacted", "uncompacted"} {
			if layout == "uncompacted" && n > 100_000 && !testing.Verbose() {
				continue // a million files take minutes to write; -v runs it
			}
			b.Run(fmt.Sprintf("%s/events=%d", layout, n), func(b *testing.B) {
				obj := renewalLog(b, n, layout == "compacted")
				ctx := context.Background()
				b.ResetTimer()
				start := time.Now()
				for range b.N {
					c, err := openCoordinator(ctx, obj, "bench/1")
					if err != nil {
						b.Fatal(err)
					}
					if c.st.Next != int64(n) {
						b.Fatalf("opened at %d, want %d", c.st.Next, n)
					}
				}
				b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/open")
			})
		}
	}
}

// renewalLog writes a log of n events of 16 members renewing 64 shards,
// directly as files (the append path would fsync each one).
func renewalLog(b *testing.B, n int, compacted bool) Objects {
	b.Helper()
	r, err := local.OpenReader(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	obj, err := r.Objects(GroupDir("g"))
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(r.Root(), filepath.FromSlash(GroupDir("g")))
	st := &groupState{Shards: map[string]*shardState{}}
	write := func(name string, v any) {
		data, err := json.Marshal(v)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	// Compaction keeps the two newest snapshots and the events from the
	// older one on.
	keepFrom := 0
	if compacted {
		last := (n - 1) / SnapshotEvery * SnapshotEvery
		keepFrom = max(last-SnapshotEvery, 0)
	}
	for seq := range n {
		m := seq % 16
		e := event{Seq: int64(seq), Member: fmt.Sprintf("m%d/1", m), Time: time.Unix(int64(seq), 0).UTC()}
		for s := m; s < 64; s += 16 {
			e.Lease = append(e.Lease, fmt.Sprintf("policy=%d/part-run-%06d.parquet", s%4, s))
		}
		st.apply(&e)
		if seq >= keepFrom {
			write(store.RecordName(int64(seq)), &e)
		}
		if seq > 0 && seq%SnapshotEvery == 0 && (!compacted || seq >= keepFrom) {
			write(store.SnapshotName(int64(seq)), st)
		}
	}
	return obj
}
