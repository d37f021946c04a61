package transform

import (
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func TestParseFilters(t *testing.T) {
	for _, bad := range []string{"zero", "termination=", "truncated,nope"} {
		if _, err := ParseFilters(bad); err == nil {
			t.Errorf("ParseFilters(%q) accepted", bad)
		}
	}
	fs, err := ParseFilters("truncated, termination=ERROR|TIMEOUT ,zero-variance")
	if err != nil || len(fs) != 3 || fs[0].Name != "truncated" || !fs[1].set["TIMEOUT"] || fs[2].Name != "zero_variance" {
		t.Fatalf("%+v %v", fs, err)
	}
	// rLLM's lower-case reasons are stored upper case: the filter matches them.
	if fs, err := ParseFilters("termination=timeout|max_turns_exceeded|Custom"); err != nil || !fs[0].set["TIMEOUT"] || !fs[0].set["MAX_TURNS_EXCEEDED"] || !fs[0].set["Custom"] {
		t.Fatalf("%+v %v", fs, err)
	}
}

func TestBatcherFiltersAndDistill(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 2})
	h.add(t0,
		// Group A: rewards differ; a1 truncated and timed out.
		step("A", "a1", 0, `"finish_reason":"length"`, `"teacher_logprobs":[-0.1]`), traj("A", "a1", 1, 1, `"termination_reason":"TIMEOUT"`),
		step("A", "a2", 0), traj("A", "a2", 0, 1, `"termination_reason":"ENV_DONE"`),
		// Group B: equal rewards.
		step("B", "b1", 0), traj("B", "b1", 1, 1), step("B", "b2", 0), traj("B", "b2", 1, 1),
	)
	filters, err := ParseFilters("termination=TIMEOUT|ERROR,truncated,zero-variance")
	if err != nil {
		t.Fatal(err)
	}
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	est, err := advantage.New("rloo", advantage.Options{Compat: advantage.Verl})
	if err != nil {
		t.Fatal(err)
	}
	bt := NewBatcher(mem, BatchConfig{Estimator: est, Label: "rloo/verl", Filters: filters, Distill: &advantage.Distill{Coef: 1}})
	defer bt.Release()
	batches, err := bt.Build(h.groups)
	if err != nil {
		t.Fatal(err)
	}
	defer batches[0].Record.Release()
	rec := batches[0].Record
	fr := rec.Column(schemas.ColFilterReason).(*array.String)
	want := []string{"termination=TIMEOUT,truncated", "", "zero_variance", "zero_variance"}
	for i, w := range want {
		got := ""
		if fr.IsValid(i) {
			got = fr.Value(i)
		}
		if got != w {
			t.Fatalf("row %d filter_reason %q, want %q", i, got, w)
		}
	}
	adv := rec.Column(schemas.ColAdvantage).(*array.Float64)
	if adv.Value(0) != 1 || adv.Value(1) != -1 || adv.Value(2) != 0 {
		t.Fatalf("rloo advantages %v %v %v", adv.Value(0), adv.Value(1), adv.Value(2))
	}
	tok := rec.Column(schemas.ColTokenAdvantages).(*array.List)
	vals := tok.ListValues().(*array.Float32).Float32Values()
	// a1: advantage 1 + (teacher −0.1 − student −0.5) = 1.4.
	if tok.IsNull(0) || len(vals) != 1 || vals[0] < 1.3999 || vals[0] > 1.4001 || tok.NullN() != 3 {
		t.Fatalf("token advantages %v nulls %d", vals, tok.NullN())
	}
	if e := rec.Column(schemas.ColEstimator).(*array.String); e.Value(3) != "rloo/verl" {
		t.Fatalf("estimator %q", e.Value(3))
	}
	if bt.Counters.NoTeacher != 3 || bt.Counters.Filtered["zero_variance"] != 2 || bt.Counters.Filtered["termination=TIMEOUT"] != 1 || bt.Counters.Filtered["truncated"] != 1 {
		t.Fatalf("counters %+v", bt.Counters)
	}
}
