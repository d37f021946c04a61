package recordlog_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
)

// BenchmarkWriteConcurrent: 64 writers of one 1 KiB record each, the
// gateway's shape (each call waits for its fsync).
func BenchmarkWriteConcurrent(b *testing.B) {
	l, err := recordlog.Open(filepath.Join(b.TempDir(), "log.jsonl"), recordlog.Options{MaxFileBytes: 256 << 20})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	rec := [][]byte{append(append([]byte(`{"x":"`), bytes.Repeat([]byte("a"), 1000)...), `"}`...)}
	b.ReportAllocs()
	b.SetBytes(int64(len(rec[0]) + 1))
	b.SetParallelism(64)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Write(context.Background(), rec); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/sec")
	b.ReportMetric(float64(b.N)/float64(max(l.Commits(), 1)), "records/fsync")
}
