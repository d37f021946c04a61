package train

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkAuditedAcks appends acknowledgements of 8-group batches to a
// local log (snapshots every 256 events, each preceded by its audit
// segment), then reads the whole audit back: the cost of the audit on the
// acknowledgement path and of the consumed view's read.
func BenchmarkAuditedAcks(b *testing.B) {
	for _, n := range []int{2048} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				obj := newObjects(&testing.T{})
				ctx := context.Background()
				c, _ := openCoordinator(ctx, obj, "m/1")
				_ = c.append(ctx, func(_ *groupState, e *event) bool {
					for i := range n {
						e.Lease = append(e.Lease, fmt.Sprintf("s%05d", i))
					}
					return true
				})
				b.StartTimer()
				start := time.Now()
				for i := range n {
					shard := fmt.Sprintf("s%05d", i)
					groups := make([]ConsumedGroup, 8)
					ords := make([]int32, 8)
					for j := range groups {
						groups[j] = ConsumedGroup{Shard: shard, Ordinal: int32(j), GroupID: fmt.Sprintf("task-%d-%d", i, j), GroupVersion: int64(i / 64), Trajectories: 8, Steps: 24}
						ords[j] = int32(j)
					}
					if err := c.append(ctx, func(_ *groupState, e *event) bool {
						e.Ack = []marks{{Shard: shard, Groups: ords}}
						e.Batch = &ackBatch{ID: uint64(i), PolicyVersion: int64(i / 64), Groups: groups}
						return true
					}); err != nil {
						b.Fatal(err)
					}
				}
				acks := time.Since(start)
				start = time.Now()
				got, err := ReadConsumed(ctx, obj)
				if err != nil || len(got) != n {
					b.Fatalf("%d batches read back: %v", len(got), err)
				}
				read := time.Since(start)
				b.ReportMetric(float64(acks.Microseconds())/float64(n), "µs/ack")
				b.ReportMetric(float64(n)/read.Seconds(), "batches/s-read")
			}
		})
	}
}
