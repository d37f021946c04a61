package s3

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// scaleFor is how long each case of the scale benchmarks commits
// (RLLM_SCALE_SECONDS overrides it, e.g. for a quick check).
func scaleFor() time.Duration {
	if s := os.Getenv("RLLM_SCALE_SECONDS"); s != "" {
		if d, err := time.ParseDuration(s + "s"); err == nil && d > 0 {
			return d
		}
	}
	return 5 * time.Second
}

// BenchmarkIntegrationManifestCommits measures how many shard commits per
// second one output root's manifest takes with 1, 4 and 16 writers
// committing at once, and the p99 latency of a commit (upload of a small
// shard, then the manifest append), on MinIO and, side by side in the
// same run, on a local folder.
//
// On S3 every writer is a Store of its own (an ingest worker), claiming
// its own stream, so appends race for the next manifest number exactly as
// workers of one consumer group do. A local folder has one writer at a
// time (its lock): there the writers are goroutines sharing the one Store,
// as the lanes of one ingest do. Shards are 64 KiB, so the figure is the
// manifest's ceiling, not the upload bandwidth.
//
// Run with -benchtime 1x -count 3: each run commits for scaleFor per case,
// and the cases alternate between backends and writer counts.
func BenchmarkIntegrationManifestCommits(b *testing.B) {
	for _, writers := range []int{1, 4, 16} {
		for _, backend := range []string{"local", "s3"} {
			b.Run(fmt.Sprintf("%s/writers=%d", backend, writers), func(b *testing.B) {
				var stores []store.Store
				if backend == "s3" {
					cfg := testConfig(b)
					for w := range writers {
						s, err := Open(context.Background(), cfg, fmt.Sprintf("w%02d", w))
						if err != nil {
							b.Fatal(err)
						}
						stores = append(stores, s)
					}
				} else {
					s, err := local.Open(b.TempDir(), "w00")
					if err != nil {
						b.Fatal(err)
					}
					defer s.Close()
					for range writers {
						stores = append(stores, s)
					}
				}
				for b.Loop() {
					lat, elapsed := commitFor(b, stores, scaleFor())
					slices.Sort(lat)
					b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "commits/s")
					b.ReportMetric(msAt(lat, 0.50), "p50-ms")
					b.ReportMetric(msAt(lat, 0.99), "p99-ms")
				}
				checkManifest(b, stores[0], len(stores))
			})
		}
	}
}

// commitFor has writer i commit shards through stores[i] for d, each
// settling the next position of its own stream, and returns the latency of
// every commit made and the time until the last one returned.
func commitFor(b *testing.B, stores []store.Store, d time.Duration) ([]time.Duration, time.Duration) {
	b.Helper()
	ctx := context.Background()
	shard := bytes.Repeat([]byte("PAR1"), 16<<10)
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	errs := make([]error, len(stores))
	begin := time.Now()
	deadline := begin.Add(d)
	for w, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := fmt.Sprintf("bench/%d", w)
			if err := s.Claim(ctx, []string{stream}, 1); err != nil {
				errs[w] = err
				return
			}
			next := int64(0)
			if r := s.Settled()[stream]; len(r) > 0 { // settled by an earlier run
				next = r[len(r)-1][1] + 1
			}
			var mine []time.Duration
			for time.Now().Before(deadline) {
				start := time.Now()
				p, err := s.Create(ctx, fmt.Sprintf("policy=0/part-%s-%d", s.Writer(), int64(w)<<32|next)+".parquet")
				if err == nil {
					_, err = p.Write(shard)
				}
				if err == nil {
					err = p.Commit(ctx, schemas.ShardEntry{Rows: 1, Groups: 1, SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Now().UTC(),
						Settled: schemas.Settled{stream: {{next, next}}}})
				}
				if err != nil {
					errs[w] = err
					return
				}
				mine = append(mine, time.Since(start))
				next++
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return lat, elapsed
}

// checkManifest checks that every commit landed once: each writer's
// stream is settled without a gap from 0, and the log lists one shard per
// settled position.
func checkManifest(b *testing.B, s store.Store, writers int) {
	b.Helper()
	es, err := s.Committed(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	all := schemas.Settled{}
	for _, e := range es {
		all.Union(e.Settled)
	}
	var n int64
	for w := range writers {
		r := all[fmt.Sprintf("bench/%d", w)]
		if len(r) > 1 || (len(r) == 1 && r[0][0] != 0) {
			b.Fatalf("stream of writer %d settled in %d ranges from %d: a gap", w, len(r), r[0][0])
		}
		n += r.Len()
	}
	if n != int64(len(es)) {
		b.Fatalf("%d shards listed for %d settled positions", len(es), n)
	}
}

// msAt is the q-quantile of sorted latencies in milliseconds.
func msAt(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[min(int(q*float64(len(sorted))), len(sorted)-1)].Microseconds()) / 1000
}
