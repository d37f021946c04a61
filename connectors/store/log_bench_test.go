package store

import (
	"fmt"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// BenchmarkSnapshot times what a writer does every 256 commits on S3:
// encode the snapshot of a log of n shard entries, and the bytes it then
// writes (the snapshot and the segments it seals), with sealed segments
// (4,096 entries, as connectors/s3) and as a whole (segments off, as
// before them). With segments the log has sealed all it can before the
// timed snapshot, as it has in a run that snapshots every 256 commits.
func BenchmarkSnapshot(b *testing.B) {
	for _, n := range []int{10_000, 100_000, 1_000_000} {
		l := NewLog()
		for i := range n {
			l.Apply(schemas.ShardEntry{Seq: int64(i), Writer: "writer", Path: fmt.Sprintf("policy=%d/part-writer-%06d.parquet", i%8, i),
				Rows: 2048, Bytes: 64 << 20, Groups: 256, GroupKeys: []string{fmt.Sprintf("task-%d", i)}, RunID: "writer",
				SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Unix(int64(i), 0).UTC(),
				Settled: schemas.Settled{"topic/0": {{int64(i) * 2048, int64(i)*2048 + 2047}}}})
		}
		for _, seg := range []int{4096, 0} {
			name := "segments"
			if seg == 0 {
				name = "whole"
			}
			b.Run(fmt.Sprintf("%s/entries=%d", name, n), func(b *testing.B) {
				l.segs = nil
				if seg > 0 {
					_, segs, err := l.Snapshot(int64(n), seg)
					if err != nil {
						b.Fatal(err)
					}
					l.Sealed(segs)
				}
				var written int
				for b.Loop() {
					head, segs, err := l.Snapshot(int64(n), seg)
					if err != nil {
						b.Fatal(err)
					}
					written = len(head)
					for _, g := range segs {
						written += len(g.Data)
					}
				}
				b.ReportMetric(float64(written)/1e6, "MB/snapshot")
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/snapshot")
			})
		}
	}
}
