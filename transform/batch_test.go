package transform

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"go.uber.org/goleak"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBatcherColumnsAndAdvantage(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 4})
	h.add(t0,
		// Group A at version 1..2: rewards 1,0,0,0 → rLLM GRPO vector.
		step("A", "a1", 0), step("A", "a1", 1, `"reward":0.25`, `"done":true`, `"created_at":"2026-01-01T00:00:01.5Z"`, `"messages":[{"role":"assistant","content":"x"}]`, `"teacher_logprobs":[-0.1]`),
		traj("A", "a1", 1, 2, `"signals":{"acc":1}`, `"is_correct":true`, `"termination_reason":"ENV_DONE"`),
		step("A", "a2", 0), traj("A", "a2", 0, 1),
		step("A", "a3", 0), traj("A", "a3", 0, 1),
		step("A", "a4", 0), traj("A", "a4", 0, 1),
	)
	h2 := newHarness(t, Config{GroupSize: 1})
	h2.add(t0, strings2(step("B", "b1", 0), `"policy_version":1`, `"policy_version":7`), traj("B", "b1", 0.5, 1))
	groups := append(h.groups, h2.groups...)

	bt, _ := testBatcher(t)
	batches, err := bt.Build(groups)
	if err != nil {
		t.Fatal(err)
	}
	if len(batches) != 2 || batches[0].Version != 1 || batches[1].Version != 7 {
		t.Fatalf("batches by version: %d", len(batches))
	}
	rec := batches[0].Record
	if rec.NumRows() != 5 || !rec.Schema().Equal(schemas.StepSchema) {
		t.Fatalf("rows %d schema %v", rec.NumRows(), rec.Schema())
	}
	adv := rec.Column(schemas.ColAdvantage).(*array.Float64)
	want := []float64{1.732046807578115, 1.732046807578115, -0.5773489358593717, -0.5773489358593717, -0.5773489358593717}
	for i, w := range want {
		if math.Abs(adv.Value(i)-w) > 1e-12 {
			t.Fatalf("advantage[%d] = %v, want %v", i, adv.Value(i), w)
		}
	}
	col := func(c int) any { return rec.Column(c) }
	if v := col(schemas.ColStepReward).(*array.Float64); v.IsValid(0) || v.Value(1) != 0.25 {
		t.Fatal("step_reward")
	}
	if v := col(schemas.ColCreatedAt).(*array.Timestamp); v.IsValid(0) || int64(v.Value(1)) != time.Date(2026, 1, 1, 0, 0, 1, 5e8, time.UTC).UnixMicro() {
		t.Fatal("created_at")
	}
	if v := col(schemas.ColMessages).(*array.String); v.IsValid(0) || v.Value(1) != `[{"role":"assistant","content":"x"}]` {
		t.Fatal("messages")
	}
	if v := col(schemas.ColTeacherLogprobs).(*array.List); v.IsValid(0) || !v.IsValid(1) {
		t.Fatal("teacher_logprobs nulls")
	}
	if v := col(schemas.ColGroupSize).(*array.Int32); v.Value(0) != 4 {
		t.Fatal("group_size")
	}
	if v := col(schemas.ColGroupVersion).(*array.Int64); v.Value(4) != 1 {
		t.Fatalf("group_version %d", v.Value(4))
	}
	if v := col(schemas.ColSignals).(*array.Map); !v.IsValid(0) || v.IsValid(2) {
		t.Fatal("signals nulls")
	}
	if v := col(schemas.ColSourceLine).(*array.Int64); v.Value(0) != 1 || v.Value(1) != 2 {
		t.Fatal("lineage")
	}
	lone := batches[1].Record.Column(schemas.ColAdvantage).(*array.Float64)
	if math.Abs(lone.Value(0)-0.4999995) > 1e-12 {
		t.Fatalf("lone advantage %v", lone.Value(0))
	}
	for _, b := range batches {
		b.Record.Release()
	}
}

func strings2(s, old, new string) string {
	for i := 0; i+len(old) <= len(s); i++ {
		if s[i:i+len(old)] == old {
			return s[:i] + new + s[i+len(old):]
		}
	}
	return s
}

type memDL struct{ letters []schemas.DeadLetter }

func (m *memDL) Write(_ context.Context, l []schemas.DeadLetter, _ []schemas.Source) error {
	m.letters = append(m.letters, l...)
	return nil
}

func TestStageEndOfInputAndStop(t *testing.T) {
	for _, stopped := range []bool{false, true} {
		mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
		bt := NewBatcher(mem, BatchConfig{Estimator: mustGRPO()})
		in := make(chan ingest.Batch, 1)
		out := make(chan Batch, 8)
		var d ingest.Decoder
		var items []ingest.Item
		for i, l := range []string{step("A", "a1", 0), traj("A", "a1", 1, 1), step("A", "a2", 0), traj("A", "a2", 0, 1), step("B", "b1", 0), traj("B", "b1", 1, 1), step("B", "b2", 0), traj("B", "b2", 1, 1), "{bad"} {
			rec, err := d.Decode([]byte(l))
			it := ingest.Item{Source: schemas.Source{File: "f", Line: int64(i + 1)}, Raw: []byte(l), Rec: rec}
			if err != nil {
				it.Err = err.(*schemas.RejectError)
			}
			items = append(items, it)
		}
		in <- ingest.Batch{Items: items}
		close(in)
		dl := &memDL{}
		c, err := Stage(context.Background(), in, out, dl, bt, StageConfig{
			Assembler: Config{GroupSize: 3},
			Stopped:   func() bool { return stopped },
		})
		if err != nil {
			t.Fatal(err)
		}
		rows := 0
		for b := range out {
			rows += int(b.Record.NumRows())
			b.Record.Release()
		}
		// Groups of 2 out of 3: emitted partial at the end of input, but
		// dropped (left for the next run) on a stop.
		wantRows, wantGroups := 4, int64(2)
		if stopped {
			wantRows, wantGroups = 0, 0
		}
		if rows != wantRows || c.GroupsEmitted != wantGroups || len(dl.letters) != 1 {
			t.Fatalf("stopped=%v: rows %d groups %d dead %d", stopped, rows, c.GroupsEmitted, len(dl.letters))
		}
		bt.Release()
		mem.AssertSize(t, 0)
	}
}

// testBatcher returns a GRPO Batcher over a checked allocator; when the
// test ends the Batcher is released and the allocator must hold nothing.
func testBatcher(t testing.TB) (*Batcher, memory.Allocator) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	bt := NewBatcher(mem, BatchConfig{Estimator: mustGRPO()})
	t.Cleanup(func() {
		bt.Release()
		mem.AssertSize(t, 0)
	})
	return bt, mem
}

func mustGRPO() advantage.Estimator {
	e, err := advantage.New("grpo", advantage.Options{Compat: advantage.RLLM})
	if err != nil {
		panic(err)
	}
	return e
}

// failing is an estimator that fails.
type failing struct{}

func (failing) Name() string { return "failing" }
func (failing) Compute(memory.Allocator, advantage.Groups) (*array.Float64, error) {
	return nil, errors.New("no advantages today")
}

// An estimator's error comes back from Build, nothing leaks, and the
// Batcher's next batch is whole.
func TestBatcherEstimatorError(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 1})
	h.add(t0, step("A", "a1", 0), traj("A", "a1", 1, 1))
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	bt := NewBatcher(mem, BatchConfig{Estimator: failing{}})
	defer bt.Release()
	if _, err := bt.Build(h.groups); err == nil || !strings.Contains(err.Error(), "no advantages today") {
		t.Fatalf("Build: %v, want the estimator's error", err)
	}
	bt.cfg.Estimator = mustGRPO()
	batches, err := bt.Build(h.groups)
	if err != nil {
		t.Fatal(err)
	}
	if n := batches[0].Record.NumRows(); n != 1 {
		t.Fatalf("next batch has %d rows, want 1", n)
	}
	batches[0].Record.Release()
}

// TestBuildCutsByWholeSize: groups of one version go into several
// batches when their prompts and messages, counted whole, would outgrow
// maxColumnLoad together; no group is split and no row lost.
func TestBuildCutsByWholeSize(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	var groups []*Group
	for len(groups) < 4 {
		groups = append(groups, chainGroups(r)...)
	}
	rows, most, total := 0, 0, 0
	for _, g := range groups {
		rows += g.Rows()
		most = max(most, wholeLoad(g))
		total += wholeLoad(g)
	}
	old := maxColumnLoad
	maxColumnLoad = max(most, total/3)
	defer func() { maxColumnLoad = old }()
	bt, _ := testBatcher(t)
	batches, err := bt.Build(groups)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, b := range batches {
		got += int(b.Record.NumRows())
		b.Record.Release()
	}
	if len(batches) < 3 || got != rows {
		t.Fatalf("%d batches of %d rows, want at least 3 holding %d", len(batches), got, rows)
	}
}
