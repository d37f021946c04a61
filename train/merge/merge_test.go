package merge

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// step is a step row for a test; unset fields get defaults.
type step struct {
	traj     string
	idx      int32
	num      int32
	pv       int64
	prompt   []int32
	resp     []int32
	lp       []float32 // default: -(k+1)/10 for token k
	tokAdv   []float32 // nil: none
	adv      float64
	nullProm bool
	// Prefix-delta storage (prompt_prefix_len, prompt_delta_ids) and the
	// filter mark.
	prefix int32
	delta  []int32
	filter string
}

// stepRecord builds rows of schemas.StepSchema from steps (group "g").
func stepRecord(t testing.TB, mem memory.Allocator, steps []step) arrow.RecordBatch {
	t.Helper()
	b := array.NewRecordBuilder(mem, schemas.StepSchema)
	defer b.Release()
	for _, s := range steps {
		num := s.num
		if num == 0 {
			num = 3
		}
		lp := s.lp
		if lp == nil {
			for k := range s.resp {
				lp = append(lp, -float32(k+1)/10)
			}
		}
		for i, f := range schemas.StepSchema.Fields() {
			fb := b.Field(i)
			switch i {
			case schemas.ColGroupID:
				fb.(*array.StringBuilder).Append("g")
			case schemas.ColTaskID:
				fb.(*array.StringBuilder).Append("task")
			case schemas.ColTrajectoryID:
				fb.(*array.StringBuilder).Append(s.traj)
			case schemas.ColStepID:
				fb.(*array.StringBuilder).Append(fmt.Sprintf("%s#%d", s.traj, s.idx))
			case schemas.ColStepIndex:
				fb.(*array.Int32Builder).Append(s.idx)
			case schemas.ColNumSteps:
				fb.(*array.Int32Builder).Append(num)
			case schemas.ColPolicyVersion:
				fb.(*array.Int64Builder).Append(s.pv)
			case schemas.ColPromptIDs:
				lb := fb.(*array.ListBuilder)
				if s.nullProm {
					lb.AppendNull()
				} else {
					lb.Append(true)
					lb.ValueBuilder().(*array.Int32Builder).AppendValues(s.prompt, nil)
				}
			case schemas.ColResponseIDs:
				fb.(*array.ListBuilder).Append(true)
				fb.(*array.ListBuilder).ValueBuilder().(*array.Int32Builder).AppendValues(s.resp, nil)
			case schemas.ColResponseLogprobs:
				fb.(*array.ListBuilder).Append(true)
				fb.(*array.ListBuilder).ValueBuilder().(*array.Float32Builder).AppendValues(lp, nil)
			case schemas.ColTokenAdvantages:
				lb := fb.(*array.ListBuilder)
				if s.tokAdv == nil {
					lb.AppendNull()
				} else {
					lb.Append(true)
					lb.ValueBuilder().(*array.Float32Builder).AppendValues(s.tokAdv, nil)
				}
			case schemas.ColReward:
				fb.(*array.Float64Builder).Append(1)
			case schemas.ColAdvantage:
				fb.(*array.Float64Builder).Append(s.adv)
			case schemas.ColEstimator:
				fb.(*array.StringBuilder).Append("grpo/rllm")
			case schemas.ColPromptPrefixLen:
				fb.(*array.Int32Builder).Append(s.prefix)
			case schemas.ColPromptDeltaIDs:
				fb.(*array.ListBuilder).Append(true)
				fb.(*array.ListBuilder).ValueBuilder().(*array.Int32Builder).AppendValues(s.delta, nil)
			case schemas.ColFilterReason:
				if s.filter == "" {
					fb.AppendNull()
				} else {
					fb.(*array.StringBuilder).Append(s.filter)
				}
			default:
				if f.Nullable {
					fb.AppendNull()
				} else {
					fb.AppendEmptyValue()
				}
			}
		}
	}
	return b.NewRecordBatch()
}

// row is the part of a merged row the table checks.
type row struct {
	traj       string
	first      int32
	last       int32
	merged     int32
	seg, nRows int32
	prompt     []int32
	resp       []int32
	mask       []int8
	lp         []float32
	adv        []float32
	isLast     bool
}

func rowsOf(t *testing.T, rec arrow.RecordBatch) []row {
	t.Helper()
	c := func(i int) arrow.Array { return rec.Column(i) }
	i32 := func(col, r int) int32 { return c(col).(*array.Int32).Value(r) }
	var out []row
	for r := 0; r < int(rec.NumRows()); r++ {
		ints := func(col int) []int32 {
			l := c(col).(*array.List)
			a, b := l.ValueOffsets(r)
			return slices.Clone(l.ListValues().(*array.Int32).Int32Values()[a:b])
		}
		flts := func(col int) []float32 {
			l := c(col).(*array.List)
			a, b := l.ValueOffsets(r)
			return slices.Clone(l.ListValues().(*array.Float32).Float32Values()[a:b])
		}
		ml := c(ColResponseMask).(*array.List)
		a, b := ml.ValueOffsets(r)
		out = append(out, row{
			traj: c(ColTrajectoryID).(*array.String).Value(r), first: i32(ColFirstStepIndex, r), last: i32(ColLastStepIndex, r),
			merged: i32(ColStepsMerged, r), seg: i32(ColSegment, r), nRows: i32(ColRowsInTrajectory, r),
			prompt: ints(ColPromptIDs), resp: ints(ColResponseIDs), mask: slices.Clone(ml.ListValues().(*array.Int8).Int8Values()[a:b]),
			lp: flts(ColRolloutLogProbs), adv: flts(ColAdvantages), isLast: c(ColIsLast).(*array.Boolean).Value(r),
		})
	}
	return out
}

func TestRows(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
		want  []row
	}{
		{
			name:  "one step",
			steps: []step{{traj: "a", num: 1, prompt: []int32{1, 2}, resp: []int32{3, 4}, adv: 0.5}},
			want:  []row{{traj: "a", merged: 1, nRows: 1, prompt: []int32{1, 2}, resp: []int32{3, 4}, mask: []int8{1, 1}, lp: []float32{-.1, -.2}, adv: []float32{.5, .5}, isLast: true}},
		},
		{
			name: "three turns extend each other",
			steps: []step{
				{traj: "a", idx: 0, prompt: []int32{1, 2}, resp: []int32{3}, adv: 1},
				{traj: "a", idx: 1, prompt: []int32{1, 2, 3, 9, 9}, resp: []int32{4, 5}, adv: 1},
				{traj: "a", idx: 2, prompt: []int32{1, 2, 3, 9, 9, 4, 5, 8}, resp: []int32{6}, adv: 1},
			},
			want: []row{{traj: "a", first: 0, last: 2, merged: 3, nRows: 1, prompt: []int32{1, 2},
				resp: []int32{3, 9, 9, 4, 5, 8, 6}, mask: []int8{1, 0, 0, 1, 1, 0, 1},
				lp: []float32{-.1, 0, 0, -.1, -.2, 0, -.1}, adv: []float32{1, 0, 0, 1, 1, 0, 1}, isLast: true}},
		},
		{
			name: "a context reset starts a new row",
			steps: []step{
				{traj: "a", idx: 0, prompt: []int32{1, 2}, resp: []int32{3}, adv: -1},
				{traj: "a", idx: 1, prompt: []int32{1, 2, 3, 7}, resp: []int32{4}, adv: -1},
				{traj: "a", idx: 2, prompt: []int32{1, 5}, resp: []int32{6}, adv: -1},
			},
			want: []row{
				{traj: "a", first: 0, last: 1, merged: 2, seg: 0, nRows: 2, prompt: []int32{1, 2}, resp: []int32{3, 7, 4}, mask: []int8{1, 0, 1}, lp: []float32{-.1, 0, -.1}, adv: []float32{-1, 0, -1}},
				{traj: "a", first: 2, last: 2, merged: 1, seg: 1, nRows: 2, prompt: []int32{1, 5}, resp: []int32{6}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{-1}, isLast: true},
			},
		},
		{
			name: "no new observation tokens still extends",
			steps: []step{
				{traj: "a", idx: 0, num: 2, prompt: []int32{1}, resp: []int32{2}},
				{traj: "a", idx: 1, num: 2, prompt: []int32{1, 2}, resp: []int32{3}},
			},
			want: []row{{traj: "a", first: 0, last: 1, merged: 2, nRows: 1, prompt: []int32{1}, resp: []int32{2, 3}, mask: []int8{1, 1}, lp: []float32{-.1, -.1}, adv: []float32{0, 0}, isLast: true}},
		},
		{
			name: "the previous prompt without its response is not an extension",
			steps: []step{
				{traj: "a", idx: 0, num: 2, prompt: []int32{1, 2}, resp: []int32{3}},
				{traj: "a", idx: 1, num: 2, prompt: []int32{1, 2, 4, 3}, resp: []int32{5}},
			},
			want: []row{
				{traj: "a", first: 0, last: 0, merged: 1, seg: 0, nRows: 2, prompt: []int32{1, 2}, resp: []int32{3}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}},
				{traj: "a", first: 1, last: 1, merged: 1, seg: 1, nRows: 2, prompt: []int32{1, 2, 4, 3}, resp: []int32{5}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}, isLast: true},
			},
		},
		{
			name: "the previous response at the right place after a different prompt is not an extension",
			steps: []step{
				{traj: "a", idx: 0, num: 2, prompt: []int32{1, 2}, resp: []int32{3}},
				{traj: "a", idx: 1, num: 2, prompt: []int32{9, 2, 3, 4}, resp: []int32{5}},
			},
			want: []row{
				{traj: "a", first: 0, last: 0, merged: 1, seg: 0, nRows: 2, prompt: []int32{1, 2}, resp: []int32{3}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}},
				{traj: "a", first: 1, last: 1, merged: 1, seg: 1, nRows: 2, prompt: []int32{9, 2, 3, 4}, resp: []int32{5}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}, isLast: true},
			},
		},
		{
			name: "a shorter prompt than the running sequence is a new row",
			steps: []step{
				{traj: "a", idx: 0, num: 2, prompt: []int32{1, 2}, resp: []int32{3}},
				{traj: "a", idx: 1, num: 2, prompt: []int32{1, 2}, resp: []int32{4}},
			},
			want: []row{
				{traj: "a", first: 0, last: 0, merged: 1, seg: 0, nRows: 2, prompt: []int32{1, 2}, resp: []int32{3}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}},
				{traj: "a", first: 1, last: 1, merged: 1, seg: 1, nRows: 2, prompt: []int32{1, 2}, resp: []int32{4}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}, isLast: true},
			},
		},
		{
			name: "trajectories never merge with each other",
			steps: []step{
				{traj: "a", idx: 0, num: 1, prompt: []int32{1}, resp: []int32{2}},
				{traj: "b", idx: 0, num: 1, prompt: []int32{1, 2, 3}, resp: []int32{4}},
			},
			want: []row{
				{traj: "a", merged: 1, nRows: 1, prompt: []int32{1}, resp: []int32{2}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}, isLast: true},
				{traj: "b", merged: 1, nRows: 1, prompt: []int32{1, 2, 3}, resp: []int32{4}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}, isLast: true},
			},
		},
		{
			name: "token advantages from distillation carried per token",
			steps: []step{
				{traj: "a", idx: 0, num: 2, prompt: []int32{1}, resp: []int32{2, 3}, adv: 1, tokAdv: []float32{1.5, 0.25}},
				{traj: "a", idx: 1, num: 2, prompt: []int32{1, 2, 3, 4}, resp: []int32{5}, adv: 1},
			},
			want: []row{{traj: "a", first: 0, last: 1, merged: 2, nRows: 1, prompt: []int32{1}, resp: []int32{2, 3, 4, 5}, mask: []int8{1, 1, 0, 1}, lp: []float32{-.1, -.2, 0, -.1}, adv: []float32{1.5, 0.25, 0, 1}, isLast: true}},
		},
		{
			name: "the last step missing: is_last false",
			steps: []step{
				{traj: "a", idx: 0, num: 3, prompt: []int32{1}, resp: []int32{2}},
			},
			want: []row{{traj: "a", merged: 1, nRows: 1, prompt: []int32{1}, resp: []int32{2}, mask: []int8{1}, lp: []float32{-.1}, adv: []float32{0}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			in := stepRecord(t, mem, tc.steps)
			defer in.Release()
			out, st, err := Rows(mem, in)
			if err != nil {
				t.Fatal(err)
			}
			defer out.Release()
			if !out.Schema().Equal(Schema) {
				t.Fatalf("schema %s", out.Schema())
			}
			got := rowsOf(t, out)
			if len(got) != len(tc.want) {
				t.Fatalf("%d rows, want %d: %+v", len(got), len(tc.want), got)
			}
			var tokens, action, obs int64
			for i := range got {
				g, w := got[i], tc.want[i]
				if g.traj != w.traj || g.first != w.first || g.last != w.last || g.merged != w.merged || g.seg != w.seg || g.nRows != w.nRows || g.isLast != w.isLast ||
					!slices.Equal(g.prompt, w.prompt) || !slices.Equal(g.resp, w.resp) || !slices.Equal(g.mask, w.mask) || !near(g.lp, w.lp) || !near(g.adv, w.adv) {
					t.Errorf("row %d:\n got %+v\nwant %+v", i, g, w)
				}
				tokens += int64(len(g.prompt) + len(g.resp))
				for _, m := range g.mask {
					if m == 1 {
						action++
					} else {
						obs++
					}
				}
			}
			if st.Rows != int64(len(got)) || st.Steps != int64(len(tc.steps)) || st.ActionTokens != action || st.ObservationTokens != obs {
				t.Errorf("stats %+v, want %d rows, %d steps, %d action and %d observation tokens", st, len(got), len(tc.steps), action, obs)
			}
			// Tokens counts the same without building the rows, also with the
			// steps split over records at any point.
			for cut := 0; cut <= int(in.NumRows()); cut++ {
				parts := []arrow.RecordBatch{in.NewSlice(0, int64(cut)), in.NewSlice(int64(cut), in.NumRows())}
				n, err := Tokens(parts)
				for _, p := range parts {
					p.Release()
				}
				if err != nil || n != tokens {
					t.Errorf("Tokens split at %d = %d, %v; want %d", cut, n, err, tokens)
				}
			}
		})
	}
}

func near(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Abs(float64(x-y)) < 1e-6 })
}

func TestRowsRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []step
		want  string
	}{
		{"a delta row without its whole prompt", []step{{traj: "a", nullProm: true, resp: []int32{1}}}, "no whole prompt_ids"},
		{"logprobs not one per token", []step{{traj: "a", prompt: []int32{1}, resp: []int32{1, 2}, lp: []float32{-1}}}, "1 logprobs for 2 response tokens"},
		{"token advantages not one per token", []step{{traj: "a", prompt: []int32{1}, resp: []int32{1, 2}, tokAdv: []float32{1}}}, "1 token advantages for 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			in := stepRecord(t, mem, tc.steps)
			defer in.Release()
			out, _, err := Rows(mem, in)
			if err == nil {
				out.Release()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want %q", err, tc.want)
			}
		})
	}
	// A record without the step columns.
	b := array.NewInt32Builder(memory.DefaultAllocator)
	b.Append(1)
	col := b.NewArray()
	b.Release()
	rec := array.NewRecordBatch(arrow.NewSchema([]arrow.Field{{Name: "x", Type: arrow.PrimitiveTypes.Int32}}, nil), []arrow.Array{col}, 1)
	col.Release()
	defer rec.Release()
	if _, _, err := Rows(memory.DefaultAllocator, rec); err == nil || !strings.Contains(err.Error(), "no column") {
		t.Errorf("Rows of a record without step columns: %v", err)
	}
	if _, err := Tokens([]arrow.RecordBatch{rec}); err == nil {
		t.Error("Tokens of a record without step columns: no error")
	}
}
