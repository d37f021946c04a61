package train

import (
	"fmt"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/ingest/synth"
	"github.com/rllm-pipe/rllm-pipe/train/merge"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// The trajectories layout merges the stored prefix deltas of a batch's
// groups; the rows are those of rebuilding every prompt, dropping the
// filtered rows and merging (the step layout's records through
// merge.Rows), byte for byte, on generated multi-turn runs with resets,
// filtered groups and truncated trajectories, distillation token
// advantages, with and without filtered rows and over token budgets that
// put several groups in a batch.
func TestTrajectoryLayoutDeltasEqualExpandThenMerge(t *testing.T) {
	filters, err := transform.ParseFilters("zero-variance,truncated,termination=timeout|max_turns_exceeded")
	if err != nil {
		t.Fatal(err)
	}
	for _, distill := range []bool{false, true} {
		cfg := synth.Config{Groups: 24, GroupSize: 4, MinSteps: 1, MaxSteps: 10, PromptLen: 40, ResponseLen: 24, ObservationLen: 10,
			Resets: 0.15, ParallelTools: 0.2, Teacher: distill, Shuffle: -1, Vocab: 500, Seed: 23}
		paths := writeGenerated(t, cfg, filters)
		for _, inc := range []bool{false, true} {
			for _, budget := range []int64{0, 4000} {
				t.Run(fmt.Sprintf("distill=%v/include-filtered=%v/budget=%d", distill, inc, budget), func(t *testing.T) {
					mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
					defer mem.AssertSize(t, 0)
					steps := readAll(t, paths, Config{MaxStaleness: -1, Allocator: mem, IncludeFiltered: inc})
					merged := readAll(t, paths, Config{MaxStaleness: -1, Allocator: mem, IncludeFiltered: inc, Layout: LayoutTrajectories, MaxTokens: budget})
					defer func() {
						for _, b := range append(steps, merged...) {
							b.Record.Release()
						}
					}()
					// The reference: each group's step rows (prompts rebuilt,
					// filtered rows dropped) merged on their own.
					var (
						want       []arrow.RecordBatch
						wantTokens int64
						groups     []string
						stats      merge.Stats
					)
					for _, b := range steps {
						w, st, err := merge.Rows(mem, b.Record)
						if err != nil {
							t.Fatal(err)
						}
						defer w.Release()
						want = append(want, w)
						tok, err := merge.Tokens([]arrow.RecordBatch{b.Record})
						if err != nil {
							t.Fatal(err)
						}
						wantTokens += tok
						groups = append(groups, b.Groups...)
						stats.Add(st)
					}
					var (
						got       []arrow.RecordBatch
						gotTokens int64
						gotGroups []string
						gotStats  merge.Stats
					)
					for _, b := range merged {
						got = append(got, b.Record)
						gotTokens += b.Tokens
						gotGroups = append(gotGroups, b.Groups...)
						gotStats.Add(*b.Merge)
					}
					if budget > 0 && len(merged) >= len(steps) {
						t.Fatalf("budget %d: %d batches for %d groups, want several groups a batch", budget, len(merged), len(steps))
					}
					w, g := joined(t, mem, want), joined(t, mem, got)
					defer w.Release()
					defer g.Release()
					if !array.RecordEqual(w, g) {
						t.Fatalf("merged rows differ from expand-then-merge:\n got %v\nwant %v", g, w)
					}
					// The same batches through the expanding path (a batch
					// estimator's).
					expanded := readAll(t, paths, Config{MaxStaleness: -1, Allocator: mem, IncludeFiltered: inc, Layout: LayoutTrajectories, MaxTokens: budget, expand: true})
					if len(expanded) != len(merged) {
						t.Fatalf("%d batches expanding, %d merging deltas", len(expanded), len(merged))
					}
					for i, b := range expanded {
						if !array.RecordEqual(b.Record, merged[i].Record) || b.Tokens != merged[i].Tokens || *b.Merge != *merged[i].Merge {
							t.Errorf("batch %d differs between the expanding and the delta path", i)
						}
						b.Record.Release()
					}
					if fmt.Sprint(gotGroups) != fmt.Sprint(groups) || gotTokens != wantTokens || gotStats != stats {
						t.Fatalf("groups %v tokens %d stats %+v, want %v %d %+v", gotGroups, gotTokens, gotStats, groups, wantTokens, stats)
					}
					if stats.Steps == stats.Rows || stats.MaxRowsPerTrajectory < 2 {
						t.Fatalf("stats %+v: the data has no merged steps or no resets", stats)
					}
					if !inc && !partlyFiltered(steps) {
						t.Fatal("no delivered group lost rows to a filter: the data does not test skipping them")
					}
				})
			}
		}
	}
}

// partlyFiltered reports whether a batch of step rows holds a group some
// of whose trajectories a filter marked: its rows number fewer than its
// trajectories times their steps.
func partlyFiltered(batches []Batch) bool {
	for _, b := range batches {
		sc := b.Record.Schema()
		size := b.Record.Column(sc.FieldIndices("group_size")[0]).(*array.Int32)
		tid := b.Record.Column(sc.FieldIndices("trajectory_id")[0]).(*array.String)
		trajs := map[string]bool{}
		for i := range tid.Len() {
			trajs[tid.Value(i)] = true
		}
		if tid.Len() > 0 && len(trajs) < int(size.Value(0)) {
			return true
		}
	}
	return false
}

// joined is the rows of recs as one record.
func joined(t *testing.T, mem memory.Allocator, recs []arrow.RecordBatch) arrow.RecordBatch {
	t.Helper()
	if len(recs) == 0 {
		t.Fatal("no batches")
	}
	rec, err := concat(mem, recs)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// joinedParts makes the parts that follow each other in one reader batch
// one slice of it, and keeps the others apart.
func TestJoinedParts(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	ib := array.NewInt32Builder(mem)
	defer ib.Release()
	ib.AppendValues([]int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, nil)
	col := ib.NewArray()
	defer col.Release()
	sc := arrow.NewSchema([]arrow.Field{{Name: "x", Type: arrow.PrimitiveTypes.Int32}}, nil)
	r1 := array.NewRecordBatch(sc, []arrow.Array{col}, 10)
	r2 := array.NewRecordBatch(sc, []arrow.Array{col}, 10)
	g1, g2, g3 := &group{}, &group{}, &group{}
	g1.addPart(r1, 0, 3)
	g1.addPart(r1, 3, 4) // follows: joined
	g2.addPart(r1, 4, 6) // follows, in the next group: joined
	g2.addPart(r1, 7, 8) // a row left out: apart
	g3.addPart(r2, 8, 10)
	r1.Release()
	r2.Release()
	parts := joinedParts([]*group{g1, g2, g3})
	var got []string
	for _, p := range parts {
		got = append(got, fmt.Sprint(p.Column(0).(*array.Int32).Int32Values()))
		p.Release()
	}
	for _, g := range []*group{g1, g2, g3} {
		g.release()
	}
	if want := []string{"[0 1 2 3 4 5]", "[7]", "[8 9]"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("parts %v, want %v", got, want)
	}
}
