package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline/pipelinetest"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunFileThenSkipOnRerun(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	var lines []string
	for g := range 20 {
		lines = append(lines, pipelinetest.GroupLines(g)...)
	}
	lines = append(lines, `{"type":"step"`) // malformed
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "out")
	run := func(writer string) pipeline.Result {
		st, err := local.Open(root, writer)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		src, err := ingest.OpenFile(in, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		p := pipeline.New(pipelinetest.Config(t), st, nil)
		if err := p.Run(ctx, ctx, src, src.Stream()); err != nil {
			t.Fatal(err)
		}
		return p.Result()
	}
	first := run("run-1")
	if first.StepsEmitted != 40 || first.GroupsEmitted != 20 || first.Rows != 40 {
		t.Fatalf("first run: %+v", first)
	}
	second := run("run-2")
	if second.SkippedCommitted != int64(len(lines)) || second.Rows != 0 {
		t.Fatalf("second run over the same input: %+v", second)
	}
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	for id, n := range storetest.StepCounts(t, r) {
		if n != 1 {
			t.Errorf("step %s committed %d times", id, n)
		}
	}
}

// fakeGroup hands out generations over two in-memory partitions: each
// generation but the last ends (a rebalance) after reading limit records.
type fakeGroup struct {
	parts   [2][]string
	limits  []int // records read by generation i before it ends; the last reads on
	mu      sync.Mutex
	gen     int
	joins   int
	commits int
	empty   int // reads of a generation that had nothing left
}

func (f *fakeGroup) drained() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.empty
}

func (f *fakeGroup) join() (pipeline.Group, error) {
	f.mu.Lock()
	f.joins++
	f.mu.Unlock()
	return f, nil
}

func (f *fakeGroup) Close() error { return nil }

func (f *fakeGroup) Next(ctx context.Context) (pipeline.Generation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	limit := -1
	if f.gen <= len(f.limits) {
		limit = f.limits[f.gen-1]
	}
	return &fakeGen{f: f, id: int64(f.gen), limit: limit}, nil
}

type fakeGen struct {
	f     *fakeGroup
	id    int64
	limit int
}

func (g *fakeGen) ID() int64 { return g.id }
func (g *fakeGen) Streams() []string {
	return []string{kafka.Stream("t", 0), kafka.Stream("t", 1)}
}

func (g *fakeGen) Source(ctx context.Context, settled schemas.Settled) (ingest.Source, error) {
	s := &fakeSource{f: g.f, limit: g.limit}
	for p, lines := range g.f.parts {
		start := kafka.ResumeOffset(settled[kafka.Stream("t", p)], 0)
		for off := start; off < int64(len(lines)); off++ {
			s.recs = append(s.recs, ingest.Raw{Data: []byte(lines[off]), Source: schemas.Source{
				Stream: kafka.Stream("t", p), Topic: "t", Partition: int32(p), Offset: off}})
		}
	}
	return s, nil
}

func (g *fakeGen) Commit(schemas.Settled) error {
	g.f.mu.Lock()
	g.f.commits++
	g.f.mu.Unlock()
	return nil
}

// fakeSource yields its records a few at a time (partitions interleaved as
// the offsets were listed: partition order is kept), then the end of the
// generation, or waits for the stop.
type fakeSource struct {
	f     *fakeGroup
	recs  []ingest.Raw
	read  int
	limit int
}

func (s *fakeSource) Read(ctx context.Context) (ingest.Chunk, error) {
	if s.limit >= 0 && s.read >= s.limit {
		return ingest.Chunk{}, fmt.Errorf("fake: %w", kafka.ErrGenerationEnded)
	}
	if len(s.recs) == 0 {
		s.f.mu.Lock()
		s.f.empty++
		s.f.mu.Unlock()
		<-ctx.Done()
		return ingest.Chunk{}, ctx.Err()
	}
	n := min(5, len(s.recs))
	if s.limit >= 0 {
		n = min(n, s.limit-s.read)
	}
	c := ingest.Chunk{Records: s.recs[:n]}
	s.recs, s.read = s.recs[n:], s.read+n
	time.Sleep(2 * time.Millisecond) // let commits happen between reads
	return c, nil
}

func (s *fakeSource) Close() error { return nil }

// Generations that end mid-stream hand their uncommitted records to the
// next one: in the end every step is committed once and every bad record
// dead-lettered once.
// With a long flush interval nothing is committed before the last
// generation, so every record is read three times; with a short one,
// generations end between commits.
func TestRunKafkaAcrossRebalances(t *testing.T) {
	for _, flush := range []time.Duration{time.Hour, 20 * time.Millisecond} {
		t.Run(flush.String(), func(t *testing.T) { testRunKafka(t, flush) })
	}
}

func testRunKafka(t *testing.T, flush time.Duration) {
	root := t.TempDir()
	f := &fakeGroup{limits: []int{37, 23}}
	f.parts[0] = append(f.parts[0], `{"type":"step","step_id":`) // read by every generation
	total := 0
	for g := range 40 {
		p := g % 2
		f.parts[p] = append(f.parts[p], pipelinetest.GroupLines(g)...)
	}
	for _, p := range f.parts {
		total += len(p)
	}
	st, err := local.Open(root, "worker")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	soft, stop := context.WithCancel(ctx)
	cfg := pipelinetest.Config(t)
	cfg.FlushInterval = flush
	p := pipeline.New(cfg, st, nil)
	done := make(chan error, 1)
	go func() { done <- p.RunKafka(ctx, soft, f.join) }()
	// Wait until the last generation has read everything, then stop: the
	// stop commits what is assembled.
	for f.drained() < 1 {
		select {
		case <-ctx.Done():
			t.Fatal("the last generation never read its partitions to the end")
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(50 * time.Millisecond)
	stop()
	if err := stopped(t, done); err != nil {
		t.Fatal(err)
	}
	if s := st.Settled(); s[kafka.Stream("t", 0)].Len()+s[kafka.Stream("t", 1)].Len() != int64(total) {
		t.Fatalf("settled %v of %d records", s, total)
	}
	if f.gen < 3 {
		t.Fatalf("%d generations, want at least 3", f.gen)
	}
	counts := storetest.StepCounts(t, st)
	if len(counts) != 80 {
		t.Fatalf("%d steps committed, want 80", len(counts))
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("step %s committed %d times", id, n)
		}
	}
	data, err := os.ReadFile(filepath.Join(root, local.DLQDir, "worker.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "\n"); n != 1 {
		t.Fatalf("%d dead letters, want 1:\n%s", n, data)
	}
	if c := st.DeadLetters().Counts(); c[schemas.ReasonMalformedJSON] != 1 {
		t.Fatalf("dead-letter counts %v", c)
	}
}

// downGroup is a consumer group whose broker never answers.
type downGroup struct{ calls int }

func (d *downGroup) Close() error { return nil }
func (d *downGroup) Next(ctx context.Context) (pipeline.Generation, error) {
	d.calls++
	return nil, errors.New("dial tcp: connection refused")
}

// TestRunKafkaGivesUp: a broker that stays away fails the run after
// RetryFor, with the reason; a soft stop ends the waiting at once, with
// ErrStoppedInOutage (the run did not finish: exit 3, as docs/operations.md#exit-codes says).
func TestRunKafkaGivesUp(t *testing.T) {
	ctx := context.Background()
	st, err := local.Open(t.TempDir(), "w")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := pipelinetest.Config(t)
	cfg.RetryFor = 2500 * time.Millisecond
	d := &downGroup{}
	start := time.Now()
	err = pipeline.New(cfg, st, nil).RunKafka(ctx, ctx, func() (pipeline.Group, error) { return d, nil })
	if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), "2.5s") {
		t.Fatalf("RunKafka: %v, want the broker's error after 2.5s", err)
	}
	if took := time.Since(start); took < 2500*time.Millisecond || took > 30*time.Second || d.calls < 2 {
		t.Fatalf("gave up after %s and %d attempts", took, d.calls)
	}

	soft, stop := context.WithCancel(ctx)
	cfg.RetryFor = time.Hour
	go func() { time.Sleep(200 * time.Millisecond); stop() }()
	start = time.Now()
	if err := pipeline.New(cfg, st, nil).RunKafka(ctx, soft, func() (pipeline.Group, error) { return &downGroup{}, nil }); !errors.Is(err, pipeline.ErrStoppedInOutage) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("a soft stop while the broker is away: %v, want ErrStoppedInOutage with the broker's error (exit 3)", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the soft stop took %s", took)
	}
}

// TestIntegrationKafkaRetryAfterRestart: on a real broker, a producer
// retry right after the records an earlier run settled (its original among
// them, its own drop never checkpointed) is dropped again and settled; it
// does not wait alone in a group of its own for the group timeout. The
// earlier run is the manifest entry it would have left.
func TestIntegrationKafkaRetryAfterRestart(t *testing.T) {
	brokers := os.Getenv("RLLM_PIPE_KAFKA_BROKERS")
	if brokers == "" {
		t.Skip("RLLM_PIPE_KAFKA_BROKERS not set: run `make test` (it starts Kafka)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := time.Now().UnixNano()
	kcfg := kafka.Config{Brokers: strings.Split(brokers, ","), Topic: fmt.Sprintf("retry-%d", id), Group: fmt.Sprintf("retry-%d", id)}
	if err := kafka.EnsureTopic(ctx, kcfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	out, err := kafka.NewOutput(kcfg, kafka.OutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	written := pipelinetest.GroupLines(0) // offsets 0-3, settled by the earlier run
	lines := append(append(slices.Clone(written), written[0]), pipelinetest.GroupLines(1)...)
	var recs []kafka.Keyed
	for _, l := range lines {
		recs = append(recs, kafka.Keyed{Key: "k", Line: []byte(l)})
	}
	err = out.Write(ctx, recs)
	out.Close()
	if err != nil {
		t.Fatal(err)
	}
	st, err := local.Open(t.TempDir(), "w")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	stream := kafka.Stream(kcfg.Topic, 0)
	if err := st.Append(ctx, schemas.ShardEntry{Settled: schemas.Settled{stream: {{0, int64(len(written) - 1)}}},
		SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}
	soft, stop := context.WithCancel(ctx)
	p := pipeline.New(pipelinetest.Config(t), st, nil)
	done := make(chan error, 1)
	go func() { done <- p.RunKafka(ctx, soft, pipeline.JoinKafka(kcfg)) }()
	for st.Settled()[stream].Len() < int64(len(lines)) {
		select {
		case err := <-done:
			t.Fatalf("ingest ended (%v) with %v settled of %d", err, st.Settled(), len(lines))
		case <-ctx.Done():
			t.Fatalf("%v settled of %d records: the retry at offset %d was never settled", st.Settled(), len(lines), len(written))
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := stopped(t, done); err != nil {
		t.Fatal(err)
	}
	if r := p.Result(); r.Duplicates != 1 {
		t.Errorf("%d duplicates dropped, want the retry", r.Duplicates)
	}
	if counts := storetest.StepCounts(t, st); len(counts) != 2 || counts["g1-t0"] != 1 || counts["g1-t1"] != 1 {
		t.Errorf("steps committed %v, want group 1's two steps once", counts)
	}
}

// stopped waits for a stopped run's error, at most two minutes: a run
// that does not end (a consumer group whose Close waits for a fetch that
// never ends) fails the test with every goroutine's stack instead of
// holding the suite to its timeout.
func stopped(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		buf := make([]byte, 1<<20)
		t.Fatalf("the run did not end within 2 minutes of its stop:\n%s", buf[:runtime.Stack(buf, true)])
		return nil
	}
}
