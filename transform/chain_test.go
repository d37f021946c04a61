package transform

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/prefix"
)

// TestMissingParentNamed: a prompt delta whose parent never arrives keeps
// its trajectory incomplete, and its dead letter names the parent; a
// delta that arrives after its group closed is late and names its parent
// too.
func TestMissingParentNamed(t *testing.T) {
	for _, c := range []struct {
		name   string
		others []string // other records of the group
		reason schemas.Reason
	}{
		{"alone", nil, schemas.ReasonIncompleteGroup},
		{"beside a complete trajectory", []string{
			`{"type":"step","step_id":"y0","task_id":"g","trajectory_id":"y","step_index":0,"policy_version":0,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-1]}`,
			`{"type":"trajectory","trajectory_id":"y","task_id":"g","reward":0,"num_steps":1}`,
		}, schemas.ReasonIncompleteTrajectory},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, Config{GroupSize: 2, MinGroupSize: 1})
			h.add(t0, c.others...)
			h.add(t0,
				`{"type":"step","step_id":"x1","task_id":"g","trajectory_id":"x","step_index":1,"policy_version":0,"parent_step_id":"x0","prompt_delta_ids":[5],"response_ids":[6],"response_logprobs":[-1]}`,
				`{"type":"trajectory","trajectory_id":"x","task_id":"g","reward":1,"num_steps":3}`,
			)
			h.a.Flush()
			h.add(t0, `{"type":"step","step_id":"x2","task_id":"g","trajectory_id":"x","step_index":2,"policy_version":0,"parent_step_id":"x1","prompt_delta_ids":[7],"response_ids":[8],"response_logprobs":[-1]}`)
			h.take()
			// Each record's letter: its reason and what its error must name.
			want := map[string]struct {
				reason schemas.Reason
				names  string
			}{
				`"step_id":"x1"`:      {c.reason, `step "x1" is a prompt delta of parent_step_id "x0", which never arrived`},
				`"type":"trajectory"`: {c.reason, `trajectory "x" had 1 of 3 steps`},
				`"step_id":"x2"`:      {schemas.ReasonLate, `; it is a prompt delta of parent_step_id "x1"`},
			}
			if len(h.dead) != len(want) {
				t.Fatalf("dead letters %s, want %d", h.reasons(), len(want))
			}
			for _, d := range h.dead {
				found := false
				for rec, w := range want {
					if !bytes.Contains(d.Record, []byte(rec)) {
						continue
					}
					found = true
					if d.Reason != w.reason || !strings.Contains(d.Error, w.names) {
						t.Errorf("%s: %s %q, want %s naming %q", rec, d.Reason, d.Error, w.reason, w.names)
					}
					if rec == `"type":"trajectory"` && strings.Contains(d.Error, "parent_step_id") {
						t.Errorf("the trajectory record's letter names a parent: %s", d.Error)
					}
				}
				if !found {
					t.Errorf("unexpected dead letter %s: %s", d.Reason, d.Record)
				}
			}
		})
	}
}

// TestExpanderRefusesShardStartingWithDelta: a shard is read on its own,
// so one whose first row is a prompt delta (a trajectory's chain cut
// across shards, which the sink never writes) is refused, not rebuilt
// from whatever row an earlier read left behind.
func TestExpanderRefusesShardStartingWithDelta(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	s := func(k int64, prompt ...int32) *Step {
		return &Step{Step: &schemas.Step{StepID: "s" + string(rune('0'+k)), TaskID: "g", TrajectoryID: "x", StepIndex: k,
			PromptIDs: prompt, ResponseIDs: []int32{9}, ResponseLogprobs: []float32{-1}}}
	}
	g := &Group{Key: "g", Expected: 1, Trajectories: []*Trajectory{{
		Trajectory: &schemas.Trajectory{TrajectoryID: "x", NumSteps: 3},
		Steps:      []*Step{s(0, 1, 2), s(1, 1, 2, 9, 3), s(2, 1, 2, 9, 3, 9, 4)},
	}}}
	bt := NewBatcher(mem, BatchConfig{Estimator: mustGRPO()})
	defer bt.Release()
	batches, err := bt.Build([]*Group{g})
	if err != nil {
		t.Fatal(err)
	}
	rec := batches[0].Record
	defer rec.Release()
	if p := rec.Column(schemas.ColPromptPrefixLen).(*array.Int32); p.Value(1) == 0 || p.Value(2) == 0 {
		t.Fatal("steps 1 and 2 not stored as deltas")
	}

	// The rows from step 1 on, alone: in memory and as a shard file.
	tail := rec.NewSlice(1, 3)
	defer tail.Release()
	x := prefix.NewExpander(mem)
	if out, err := x.Expand(tail); err == nil {
		out.Release()
		t.Fatal("Expander rebuilt a delta row with no predecessor")
	} else if !strings.Contains(err.Error(), "not the row before it") {
		t.Fatalf("error %v", err)
	}
	var buf bytes.Buffer
	w, err := parquet.NewWriter(&buf, schemas.StepSchema, parquet.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(tail); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := parquet.Open(context.Background(), "shard-2", bytes.NewReader(buf.Bytes()), []string{"step_id", "prompt_ids"}, mem)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	for {
		r, err := rd.Next()
		if err == io.EOF {
			t.Fatal("a shard starting with a delta row was read")
		}
		if err != nil {
			if !strings.Contains(err.Error(), "not the row before it") {
				t.Fatalf("error %v", err)
			}
			break
		}
		_ = r
	}
}
