package export

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
)

// distillRow is a step row of DistillSchema's columns as JSON; teacher
// and tokenAdv may be "null".
func distillRow(step string, adv float64, logprobs, teacher, tokenAdv string) string {
	return fmt.Sprintf(`{"group_id":"g","task_id":"t","role":null,"trajectory_id":"tr-%s","step_id":%q,"step_index":0,"policy_version":1,"group_version":1,
		"prompt_ids":[1,2],"response_ids":[3,4,5],"response_logprobs":%s,"teacher_logprobs":%s,"advantage":%v,"token_advantages":%s}`,
		step, step, logprobs, teacher, adv, tokenAdv)
}

// addDistill writes a shard of rows of DistillSchema to m.
func (m *memShards) addDistill(t *testing.T, rows ...string) {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.DefaultAllocator)
	defer mem.AssertSize(t, 0)
	rec, _, err := array.RecordFromJSON(mem, DistillSchema, strings.NewReader("["+strings.Join(rows, ",")+"]"))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	m.write(t, rec)
}

// TestDistill: steps with teacher logprobs are exported, those without
// counted; token advantages missing in the shard are computed (the
// reference vector: teacher [-0.1, -2, -0.5], student [-0.3, -0.2, -0.5],
// clip 1: d = [0.2, -1.8, 0] → [0.2, -1, 0] on top of the advantage),
// those present kept unless Recompute.
func TestDistill(t *testing.T) {
	const student, teacher = "[-0.3,-0.2,-0.5]", "[-0.1,-2.0,-0.5]"
	src := &memShards{}
	src.addDistill(t,
		distillRow("a", 0.5, student, teacher, "null"),
		distillRow("b", 0.5, student, "null", "null"),
	)
	src.addDistill(t, distillRow("c", -1, student, teacher, "[9,9,9]"))
	cfg := DistillConfig{Distill: advantage.Distill{Coef: 1, Clip: 1}}
	for _, recompute := range []bool{false, true} {
		t.Run(fmt.Sprintf("recompute=%v", recompute), func(t *testing.T) {
			cfg.Recompute = recompute
			var out bytes.Buffer
			st, err := Distill(context.Background(), src, cfg, &out, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := DistillStats{Shards: 2, Steps: 3, Scored: 2, Unscored: 1, Recomputed: 1}
			if recompute {
				want.Recomputed = 2
			}
			if st != want {
				t.Errorf("stats %+v, want %+v", st, want)
			}
			got := map[string][]float64{}
			rd, err := parquet.Open(context.Background(), "distill", bytes.NewReader(out.Bytes()), []string{"step_id", "token_advantages"}, memory.DefaultAllocator)
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			if err := rd.Each(func(rec arrow.RecordBatch) error {
				ids := rec.Column(0).(*array.String)
				ta := rec.Column(1).(*array.List)
				vals := ta.ListValues().(*array.Float32)
				for i := 0; i < int(rec.NumRows()); i++ {
					s, e := ta.ValueOffsets(i)
					for k := s; k < e; k++ {
						got[ids.Value(i)] = append(got[ids.Value(i)], float64(vals.Value(int(k))))
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			wantTA := map[string][]float64{"a": {0.7, -0.5, 0.5}, "c": {9, 9, 9}}
			if recompute {
				wantTA["c"] = []float64{-0.8, -2, -1}
			}
			if len(got) != len(wantTA) {
				t.Fatalf("exported %v, want steps a and c", keys(got))
			}
			for id, w := range wantTA {
				g := got[id]
				for k := range w {
					if len(g) != len(w) || math.Abs(g[k]-w[k]) > 1e-6 {
						t.Errorf("step %s: token advantages %v, want %v", id, g, w)
						break
					}
				}
			}
		})
	}
}

func keys(m map[string][]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
