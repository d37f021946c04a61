package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
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

// fixedShards is a manifest of entries that are never read (the lease
// benchmark only leases).
type fixedShards []schemas.ShardEntry

func (f fixedShards) Committed(context.Context) ([]schemas.ShardEntry, error) { return f, nil }
func (f fixedShards) ReadShard(context.Context, schemas.ShardEntry, []string, memory.Allocator) (*parquet.Reader, error) {
	return nil, errors.New("not readable")
}

// BenchmarkLeaseAfterDone times leasing the next shard when the first n
// shards of the manifest are done, as after a long run: a lease scans
// from the first shard not done, so it costs the same at every n. The
// group does not fold here (the n done shards are put in its state at
// once, which a run never does: folding them would be the catch-up of
// 1M/foldMax fold events); BenchmarkConsumerStart measures the watermark.
func BenchmarkLeaseAfterDone(b *testing.B) {
	saved := foldEvery
	foldEvery = math.MaxInt
	defer func() { foldEvery = saved }()
	for _, n := range []int{1_000, 100_000, 1_000_000} {
		b.Run(fmt.Sprintf("done=%d", n), func(b *testing.B) {
			entries := make(fixedShards, n+b.N+1)
			for i := range entries {
				entries[i].Path = fmt.Sprintf("v0/shard-%08d.parquet", i)
			}
			r, err := local.OpenReader(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			obj, err := r.Objects(GroupDir("g"))
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			c, err := NewConsumer(ctx, entries, obj, ConsumerConfig{Name: "bench", LeaseTimeout: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			defer c.abandon()
			c.coord.view(func(st *groupState) {
				for _, e := range entries[:n] {
					st.Shards[e.Path] = &shardState{Done: true}
				}
			})
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				e, _, err := c.leaseNext(ctx)
				if err != nil || e == nil || e.Path != entries[n+i].Path {
					b.Fatalf("leased %v, %v; want %s", e, err, entries[n+i].Path)
				}
				c.coord.view(func(st *groupState) { st.Shards[e.Path].Done = true })
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/float64(b.N)/1000, "ms/lease")
		})
	}
}
