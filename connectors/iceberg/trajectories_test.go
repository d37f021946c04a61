package iceberg

import (
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// TestFolderTakesTheFirstStepsValues: values a trajectory's steps do not
// repeat alike (shards repeat them, so the tables' tests cannot tell) are
// taken as sql's view takes them: each column's value at the lowest
// step_index where it is not null, whatever the row order; token counts
// add delta prompts without rebuilding them; partial is any step's;
// pass falls back to reward > 0 when is_correct is null throughout.
func TestFolderTakesTheFirstStepsValues(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	sc := arrow.NewSchema([]arrow.Field{
		{Name: "group_id", Type: arrow.BinaryTypes.String},
		{Name: "group_version", Type: arrow.PrimitiveTypes.Int64},
		{Name: "trajectory_id", Type: arrow.BinaryTypes.String},
		{Name: "step_index", Type: arrow.PrimitiveTypes.Int32},
		{Name: "reward", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
		{Name: "is_correct", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
		{Name: "policy_version", Type: arrow.PrimitiveTypes.Int64},
		{Name: "partial", Type: arrow.FixedWidthTypes.Boolean},
		{Name: "prompt_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
		{Name: "prompt_prefix_len", Type: arrow.PrimitiveTypes.Int32},
		{Name: "prompt_delta_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32), Nullable: true},
		{Name: "response_ids", Type: arrow.ListOf(arrow.PrimitiveTypes.Int32)},
	}, nil)
	b := array.NewRecordBuilder(mem, sc)
	defer b.Release()
	type row struct {
		step           int32
		reward         *float64
		policy         int64
		partial        bool
		prompt, delta  int // lengths; delta > 0: a delta row
		prefix, answer int
	}
	f := func(v float64) *float64 { return &v }
	// Trajectory "a", rows out of step order: step 2 first (reward 9,
	// partial), step 0 with no reward, step 1 with reward 3.
	rows := []row{
		{step: 2, reward: f(9), policy: 7, partial: true, delta: 4, prefix: 30, answer: 5},
		{step: 0, reward: nil, policy: 5, prompt: 10, answer: 2},
		{step: 1, reward: f(3), policy: 6, delta: 6, prefix: 12, answer: 3},
	}
	ints := func(lb *array.ListBuilder, n int) {
		lb.Append(true)
		for i := range n {
			lb.ValueBuilder().(*array.Int32Builder).Append(int32(i))
		}
	}
	for _, r := range rows {
		b.Field(0).(*array.StringBuilder).Append("g")
		b.Field(1).(*array.Int64Builder).Append(1)
		b.Field(2).(*array.StringBuilder).Append("a")
		b.Field(3).(*array.Int32Builder).Append(r.step)
		if r.reward == nil {
			b.Field(4).AppendNull()
		} else {
			b.Field(4).(*array.Float64Builder).Append(*r.reward)
		}
		b.Field(5).AppendNull()
		b.Field(6).(*array.Int64Builder).Append(r.policy)
		b.Field(7).(*array.BooleanBuilder).Append(r.partial)
		if r.delta > 0 {
			b.Field(8).AppendNull()
			b.Field(9).(*array.Int32Builder).Append(int32(r.prefix))
			ints(b.Field(10).(*array.ListBuilder), r.delta)
		} else {
			ints(b.Field(8).(*array.ListBuilder), r.prompt)
			b.Field(9).(*array.Int32Builder).Append(0)
			b.Field(10).AppendNull()
		}
		ints(b.Field(11).(*array.ListBuilder), r.answer)
	}
	rec := b.NewRecordBatch()
	defer rec.Release()
	var fo folder
	fo.add(rec)
	if len(fo.order) != 1 {
		t.Fatalf("%d trajectories, want 1", len(fo.order))
	}
	out := array.NewRecordBuilder(mem, trajectorySchema)
	defer out.Release()
	fo.order[0].append(out, "policy=1/s.parquet")
	got := out.NewRecordBatch()
	defer got.Release()
	want := map[string]string{
		"reward":             "3", // step 1's: step 0 has none, step 2 comes later
		"steps":              "3",
		"prompt_tokens":      "62", // 10 + (12+6) + (30+4)
		"response_tokens":    "10",
		"min_policy_version": "5",
		"max_policy_version": "7",
		"partial":            "true",
		"is_correct":         "(null)",
		"pass":               "true", // reward 3 > 0
		"shard":              "policy=1/s.parquet",
	}
	for name, w := range want {
		idx := got.Schema().FieldIndices(name)
		if len(idx) != 1 {
			t.Fatalf("no column %s", name)
		}
		if v := got.Column(idx[0]).ValueStr(0); v != w {
			t.Errorf("%s = %s, want %s", name, v, w)
		}
	}
}
