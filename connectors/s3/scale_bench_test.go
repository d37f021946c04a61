package s3

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/transform"
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
	for _, writers := range []int{1, 4, 16, 64} {
		for _, backend := range []string{"local", "s3", "s3-lanes", "raw"} {
			b.Run(fmt.Sprintf("%s/writers=%d", backend, writers), func(b *testing.B) {
				if backend == "raw" {
					// MinIO's own ceiling in the same run: N uploaders of
					// 64 KiB create-only PUTs of fresh keys, no manifest.
					s, err := Open(context.Background(), testConfig(b), "raw")
					if err != nil {
						b.Fatal(err)
					}
					for b.Loop() {
						n, elapsed := putFor(b, s, writers, scaleFor())
						b.ReportMetric(float64(n)/elapsed.Seconds(), "puts/s")
					}
					return
				}
				var stores []store.Store
				if backend == "s3-lanes" {
					// N lanes of one ingest worker: one Store, its
					// appends made at once share records (group commit).
					s, err := Open(context.Background(), testConfig(b), "w00")
					if err != nil {
						b.Fatal(err)
					}
					for range writers {
						stores = append(stores, s)
					}
				} else if backend == "s3" {
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
					lat, elapsed := commitFor(b, stores, scaleFor(), 0)
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
// settling the next position of its own stream (one every every, from a
// random start, when every is not 0), and returns the latency of every
// commit made and the time until the last one returned.
func commitFor(b *testing.B, stores []store.Store, d, every time.Duration) ([]time.Duration, time.Duration) {
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
			tick := pacer(every)
			for time.Now().Before(deadline) {
				tick()
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

// putFor has n goroutines upload 64 KiB objects under fresh keys
// through s for d, and returns the uploads made and the time taken.
func putFor(b *testing.B, s *Store, n int, d time.Duration) (int64, time.Duration) {
	b.Helper()
	ctx := context.Background()
	body := bytes.Repeat([]byte("PAR1"), 16<<10)
	var total int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, n)
	begin := time.Now()
	deadline := begin.Add(d)
	for w := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine int64
			for i := 0; time.Now().Before(deadline); i++ {
				key := s.key(fmt.Sprintf("raw/%s-%d-%d", scaleID(), w, i))
				if err := s.putIfAbsent(ctx, key, bytes.NewReader(body), int64(len(body)), ""); err != nil {
					errs[w] = err
					return
				}
				mine++
			}
			mu.Lock()
			total += mine
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return total, time.Since(begin)
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

// pacer returns a function that waits for the next tick of a clock of
// period every, started at a random phase (no wait when every is 0).
func pacer(every time.Duration) func() {
	if every <= 0 {
		return func() {}
	}
	next := time.Now().Add(time.Duration(mrand.Int64N(int64(every))))
	return func() {
		time.Sleep(time.Until(next))
		next = next.Add(every)
	}
}

// msAt is the q-quantile of sorted latencies in milliseconds.
func msAt(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[min(int(q*float64(len(sorted))), len(sorted)-1)].Microseconds()) / 1000
}

// scaleGroups is how many groups the scale benchmark commits per backend:
// more than the fastest case acknowledges in scaleFor.
const scaleGroups = 24000

// BenchmarkIntegrationGroupAcks measures the acknowledgements per second
// a consumer group takes with 1, 4, 16 and 64 members consuming at once,
// one group per batch, over many small shards (about 20 groups each), and
// the p99 latency of an acknowledgement; on a local folder and on MinIO
// (skipped without RLLM_PIPE_S3_ENDPOINT), alternating. local and s3:
// every member is a process of its own (a reader and a replay of the log
// each), racing the others for the log's next number; s3-serve1 and
// s3-serve4: the members are those of 1 or 4 serve processes, whose
// members share the process's replay and records (train.GroupLog). Each
// run is a new consumer group over the same shards.
//
// Run with -benchtime 1x -count 3.
func BenchmarkIntegrationGroupAcks(b *testing.B) {
	dir := b.TempDir()
	readers := map[string]func(b *testing.B, member int) store.Reader{}
	for _, members := range []int{1, 4, 16, 64} {
		for _, backend := range []string{"local", "s3", "s3-serve1", "s3-serve4"} {
			b.Run(fmt.Sprintf("%s/members=%d", backend, members), func(b *testing.B) {
				root, serves := backend, 0
				if s, ok := strings.CutPrefix(backend, "s3-serve"); ok {
					root, serves = "s3", int(s[0]-'0')
				}
				if readers[root] == nil {
					readers[root] = scaleRoot(b, root, dir)
				}
				for b.Loop() {
					acks, leases, lat, elapsed := consumeFor(b, readers[root], members, serves, scaleFor(), 0)
					slices.Sort(lat)
					b.ReportMetric(float64(acks)/elapsed.Seconds(), "acks/s")
					b.ReportMetric(float64(leases)/elapsed.Seconds(), "leases/s")
					b.ReportMetric(msAt(lat, 0.50), "p50-ms")
					b.ReportMetric(msAt(lat, 0.99), "p99-ms")
				}
			})
		}
	}
}

// scaleRoot commits the benchmark's shards into a new root of the
// backend (under dir, or a new prefix of MinIO's test bucket) and returns
// how a member opens a reader of it.
func scaleRoot(b *testing.B, backend, dir string) func(b *testing.B, member int) store.Reader {
	ctx := context.Background()
	if backend == "local" {
		st, err := local.Open(dir, "writer")
		if err != nil {
			b.Fatal(err)
		}
		writeScaleShards(b, st)
		return func(b *testing.B, _ int) store.Reader {
			r, err := local.OpenReader(dir)
			if err != nil {
				b.Fatal(err)
			}
			return r
		}
	}
	ep := os.Getenv("RLLM_PIPE_S3_ENDPOINT")
	if ep == "" {
		b.Skip("RLLM_PIPE_S3_ENDPOINT not set: run `make bench-scale` (it starts MinIO)")
	}
	cfg, err := ParseURL("s3://rllm-pipe-test/scale-acks-" + scaleID())
	if err != nil {
		b.Fatal(err)
	}
	cfg.Endpoint = ep
	st, err := Open(ctx, cfg, "writer")
	if err != nil {
		b.Fatal(err)
	}
	writeScaleShards(b, st)
	return func(b *testing.B, member int) store.Reader {
		r, err := OpenReader(ctx, cfg, fmt.Sprintf("member-%d", member))
		if err != nil {
			b.Fatal(err)
		}
		return r
	}
}

func scaleID() string {
	var nb [4]byte
	_, _ = rand.Read(nb[:])
	return hex.EncodeToString(nb[:])
}

// writeScaleShards commits scaleGroups groups of two one-step
// trajectories through st, in shards of about 20 groups, and closes it.
func writeScaleShards(b *testing.B, st store.Store) {
	b.Helper()
	ctx := context.Background()
	defer st.Close()
	a := transform.NewAssembler(transform.Config{GroupSize: 2})
	var d ingest.Decoder
	line := int64(0)
	for g := range scaleGroups {
		for tr := range 2 {
			for _, l := range []string{
				fmt.Sprintf(`{"type":"step","step_id":"g%d-t%d","task_id":"g%d","trajectory_id":"g%d-t%d","step_index":0,"policy_version":0,"prompt_ids":[1,2,3],"response_ids":[4],"response_logprobs":[-1]}`, g, tr, g, g, tr),
				fmt.Sprintf(`{"type":"trajectory","trajectory_id":"g%d-t%d","task_id":"g%d","reward":%d,"num_steps":1}`, g, tr, g, tr),
			} {
				line++
				rec, err := d.Decode([]byte(l))
				if err != nil {
					b.Fatal(err)
				}
				a.Add(&ingest.Item{Source: schemas.Source{File: "in", Line: line}, Raw: []byte(l), Rec: rec}, time.Now())
			}
		}
	}
	est, _ := advantage.New("grpo", advantage.Options{})
	bt := transform.NewBatcher(memory.DefaultAllocator, transform.BatchConfig{Estimator: est})
	defer bt.Release()
	sk := sink.New(st, sink.Config{RunID: "scale", ShardSize: 4 << 10})
	groups := a.Take().Groups
	for len(groups) > 0 {
		n := min(len(groups), 20) // a batch is never split: this is the shard
		batches, err := bt.Build(groups[:n])
		if err != nil {
			b.Fatal(err)
		}
		groups = groups[n:]
		for _, batch := range batches {
			if err := sk.Write(ctx, batch, time.Now()); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := sk.Close(ctx); err != nil {
		b.Fatal(err)
	}
	es, err := st.Committed(ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: %d groups in %d shards", st.Name(), scaleGroups, len(es))
}

// consumeFor runs members consumers of a new consumer group for d, each
// taking one-group batches and acknowledging each at once, and returns
// the acknowledgements, the shards leased, every acknowledgement's
// latency and the time taken. It fails if a group was acknowledged twice.
// With serves > 0 the members are spread over that many processes that
// each share a reader and a train.GroupLog among their members (serve);
// with 0 every member is a process of its own.
func consumeFor(b *testing.B, open func(*testing.B, int) store.Reader, members, serves int, d, every time.Duration) (int, int64, []time.Duration, time.Duration) {
	b.Helper()
	// Unpaced members poll often (the benchmark measures how fast the
	// log goes); paced ones as trainers do by default (serve's --poll).
	poll := 20 * time.Millisecond
	if every > 0 {
		poll = time.Second
	}
	group := "scale-" + scaleID()
	var mu sync.Mutex
	var lat []time.Duration
	acked := map[string]int{}
	var leases int64
	var wg sync.WaitGroup
	errs := make([]error, members)
	consumers := make([]*train.Consumer, members)
	logs := make([]*train.GroupLog, serves)
	procs := map[int]store.Reader{}
	for m := range members {
		proc := m
		if serves > 0 {
			proc = m % serves
		}
		r := procs[proc]
		if r == nil {
			r = open(b, proc)
			procs[proc] = r
		}
		obj, err := r.Objects(train.GroupDir(group))
		if err != nil {
			b.Fatal(err)
		}
		var log *train.GroupLog
		if serves > 0 {
			if logs[proc] == nil {
				if logs[proc], err = train.OpenGroupLog(context.Background(), obj); err != nil {
					b.Fatal(err)
				}
			}
			log = logs[proc]
		}
		c, err := train.NewConsumer(context.Background(), r, obj, train.ConsumerConfig{
			Config: train.Config{MaxStaleness: -1, IncludeFiltered: true}, Name: fmt.Sprintf("m%d", m),
			LeaseTimeout: time.Minute, Poll: poll, Log: log})
		if err != nil {
			b.Fatal(err)
		}
		consumers[m] = c
	}
	begin := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), begin.Add(d))
	defer cancel()
	for m, c := range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			var keys []string
			defer func() {
				mu.Lock()
				lat = append(lat, mine...)
				for _, k := range keys {
					acked[k]++
				}
				mu.Unlock()
			}()
			tick := pacer(every)
			for {
				tick()
				dl, err := c.Next(ctx)
				if err != nil {
					if ctx.Err() == nil {
						errs[m] = err
					}
					return
				}
				dl.Record.Release()
				start := time.Now()
				if _, err := c.Ack(context.WithoutCancel(ctx), dl.ID); err != nil {
					errs[m] = err
					return
				}
				mine = append(mine, time.Since(start))
				keys = append(keys, dl.Groups...)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	for _, c := range consumers {
		leases += c.Stats().ShardsLeased
		if err := c.Close(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	for k, n := range acked {
		if n != 1 {
			b.Fatalf("group %s acknowledged %d times", k, n)
		}
	}
	if len(acked) == 0 || len(acked) == scaleGroups {
		b.Fatalf("%d groups acknowledged: the run must stop inside the data (raise scaleGroups)", len(acked))
	}
	return len(lat), leases, lat, elapsed
}

// BenchmarkIntegrationTenX simulates the coordination of the capacity
// plan at 10x (10,000 rollout workers, 200k steps/s): 64 ingest workers
// (a Store each) committing RLLM_TENX_COMMITS shards a second in all
// (default 26: 64 workers x 2 open versions / a 5 s flush; 64 KiB fake
// shards, so that only coordination is measured), and at the same time
// 64 trainer members (a reader each) of one consumer group acknowledging
// RLLM_TENX_ACKS batches a second in all (default 110: 200k steps/s x
// 8.85k tokens / 16M-token batches), on MinIO, for 6 x scaleFor. It
// reports what was reached against the targets and the latencies. The
// members are processes of their own (members=separate), or those of 8
// serve processes sharing their replay and records (members=8-serves).
func BenchmarkIntegrationTenX(b *testing.B) {
	rate := func(name string, def float64) float64 {
		if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil && v > 0 {
			return v
		}
		return def
	}
	const workers, members = 64, 64
	commits, acks := rate("RLLM_TENX_COMMITS", 26), rate("RLLM_TENX_ACKS", 110)
	d := 6 * scaleFor()
	readers := scaleRoot(b, "s3", b.TempDir())
	cfg := testConfig(b)
	var stores []store.Store
	for w := range workers {
		s, err := Open(context.Background(), cfg, fmt.Sprintf("w%02d", w))
		if err != nil {
			b.Fatal(err)
		}
		stores = append(stores, s)
	}
	for _, serves := range []int{0, 8} {
		name := "members=separate"
		if serves > 0 {
			name = fmt.Sprintf("members=%d-serves", serves)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				var wg sync.WaitGroup
				var clat, alat []time.Duration
				var celapsed, aelapsed time.Duration
				var nacks int
				wg.Add(2)
				go func() {
					defer wg.Done()
					clat, celapsed = commitFor(b, stores, d, time.Duration(float64(workers)/commits*float64(time.Second)))
				}()
				go func() {
					defer wg.Done()
					nacks, _, alat, aelapsed = consumeFor(b, readers, members, serves, d, time.Duration(float64(members)/acks*float64(time.Second)))
				}()
				wg.Wait()
				slices.Sort(clat)
				slices.Sort(alat)
				b.ReportMetric(float64(len(clat))/celapsed.Seconds(), "commits/s")
				b.ReportMetric(commits, "commits/s-target")
				b.ReportMetric(msAt(clat, 0.50), "commit-p50-ms")
				b.ReportMetric(msAt(clat, 0.99), "commit-p99-ms")
				b.ReportMetric(float64(nacks)/aelapsed.Seconds(), "acks/s")
				b.ReportMetric(acks, "acks/s-target")
				b.ReportMetric(msAt(alat, 0.50), "ack-p50-ms")
				b.ReportMetric(msAt(alat, 0.99), "ack-p99-ms")
			}
		})
	}
	checkManifest(b, stores[0], workers)
}
