package transform

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/prefix"
)

// chainGroups makes groups of multi-turn trajectories from r: steps that
// extend their predecessor, resets, steps that extend the step before
// their predecessor (branches), prompts that share only part of the
// predecessor, steps that add no token, messages that extend or not.
func chainGroups(r *rand.Rand) []*Group {
	var groups []*Group
	tok := func(n int) []int32 {
		out := make([]int32, n)
		for i := range out {
			out[i] = int32(r.IntN(50))
		}
		return out
	}
	for g := range 1 + r.IntN(3) {
		grp := &Group{Key: fmt.Sprintf("g%d", g), Expected: 2}
		for tr := range 1 + r.IntN(3) {
			id := fmt.Sprintf("g%d-t%d", g, tr)
			n := 1 + r.IntN(12)
			traj := &Trajectory{Trajectory: &schemas.Trajectory{TrajectoryID: id, NumSteps: int64(n)}}
			var steps []*Step
			for k := range n {
				s := &schemas.Step{StepID: fmt.Sprintf("%s-s%d", id, k), TaskID: grp.Key, TrajectoryID: id, StepIndex: int64(k)}
				s.ResponseIDs = tok(r.IntN(4))
				s.ResponseLogprobs = make([]float32, len(s.ResponseIDs))
				var base *schemas.Step
				if k > 0 {
					base = steps[k-1].Step
				}
				switch u := r.IntN(10); {
				case base == nil || u == 0: // first step, or a reset
					s.PromptIDs = tok(r.IntN(6))
				case u == 1 && k > 1: // a branch: extends the step before
					b := steps[k-2].Step
					s.PromptIDs = slices.Concat(b.PromptIDs, b.ResponseIDs, tok(r.IntN(3)))
				case u == 2 && len(base.PromptIDs) > 0: // shares only a part
					s.PromptIDs = slices.Concat(base.PromptIDs[:r.IntN(len(base.PromptIDs))], []int32{99}, tok(r.IntN(3)))
				case u == 3: // adds nothing
					s.PromptIDs = slices.Concat(base.PromptIDs, base.ResponseIDs)
				default:
					s.PromptIDs = slices.Concat(base.PromptIDs, base.ResponseIDs, tok(r.IntN(5)))
				}
				switch u := r.IntN(8); {
				case u == 0: // none
				case base == nil || base.Messages == nil || u == 1:
					s.Messages = fmt.Appendf(nil, `[{"role":"user","content":"%d"}]`, r.IntN(100))
				default:
					s.Messages = fmt.Appendf(nil, `%s,{"role":"tool","content":"%d"}]`, base.Messages[:len(base.Messages)-1], r.IntN(100))
				}
				steps = append(steps, &Step{Step: s})
			}
			traj.Steps = steps
			grp.Trajectories = append(grp.Trajectories, traj)
		}
		groups = append(groups, grp)
	}
	return groups
}

// checkWhole reads rec's rows back whole and compares them with groups.
func checkWhole(t testing.TB, groups []*Group, recs []arrow.RecordBatch) {
	t.Helper()
	var want []*schemas.Step
	for _, g := range groups {
		for _, tr := range g.Trajectories {
			for _, s := range tr.Steps {
				want = append(want, s.Step)
			}
		}
	}
	i := 0
	for _, rec := range recs {
		prompt := rec.Column(schemas.ColPromptIDs).(*array.List)
		pv := prompt.ListValues().(*array.Int32).Int32Values()
		msgs := rec.Column(schemas.ColMessages).(*array.String)
		for r := range int(rec.NumRows()) {
			s := want[i]
			lo, hi := prompt.ValueOffsets(r)
			if prompt.IsNull(r) || !slices.Equal(pv[lo:hi], s.PromptIDs) && (len(s.PromptIDs) > 0 || hi > lo) {
				t.Fatalf("row %d (%s): prompt %v, want %v", i, s.StepID, pv[lo:hi], s.PromptIDs)
			}
			if got := msgs.IsValid(r); got != (s.Messages != nil) || got && msgs.Value(r) != string(s.Messages) {
				t.Fatalf("row %d (%s): messages %q, want %q", i, s.StepID, msgs.Value(r), s.Messages)
			}
			i++
		}
	}
	if i != len(want) {
		t.Fatalf("%d rows read back, want %d", i, len(want))
	}
}

// roundTrip builds groups with prefix deltas, checks that deltas were
// used only where exact, and reads the rows back whole two ways: the
// record cut in random slices through one Expander, and a Parquet file.
func roundTrip(t testing.TB, r *rand.Rand, groups, want []*Group) (deltas int) {
	bt, mem := testBatcher(t)
	batches, err := bt.Build(groups)
	if err != nil {
		t.Fatal(err)
	}
	if len(batches) != 1 {
		t.Fatalf("%d batches, want 1", len(batches))
	}
	rec := batches[0].Record
	defer rec.Release()
	plen := rec.Column(schemas.ColPromptPrefixLen).(*array.Int32)
	for i := range int(rec.NumRows()) {
		if plen.Value(i) > 0 {
			deltas++
		}
	}

	x := prefix.NewExpander(mem)
	var whole []arrow.RecordBatch
	for lo := int64(0); lo < rec.NumRows(); {
		hi := min(rec.NumRows(), lo+1+r.Int64N(4))
		sl := rec.NewSlice(lo, hi)
		w, err := x.Expand(sl)
		sl.Release()
		if err != nil {
			t.Fatal(err)
		}
		whole = append(whole, w)
		lo = hi
	}
	checkWhole(t, want, whole)
	for _, w := range whole {
		w.Release()
	}

	var buf bytes.Buffer
	w, err := parquet.NewWriter(&buf, schemas.StepSchema, parquet.Options{RowGroupBytes: 1 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	rd, err := parquet.Open(context.Background(), "shard", bytes.NewReader(buf.Bytes()), nil, mem)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	var read []arrow.RecordBatch
	for {
		r, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		r.Retain()
		read = append(read, r)
	}
	checkWhole(t, want, read)
	for _, r := range read {
		r.Release()
	}
	// The delta columns read without prompt_ids or messages come back as
	// stored: nothing is asked whole, so nothing is rebuilt.
	for _, cols := range [][]string{{"step_id", "prompt_prefix_len"}, {"step_id", "messages_delta"}, {"prompt_delta_ids", "prompt_prefix_len", "messages_delta"}} {
		pr, err := parquet.Open(context.Background(), "shard", bytes.NewReader(buf.Bytes()), cols, mem)
		if err != nil {
			t.Fatal(err)
		}
		rows := int64(0)
		for {
			r, err := pr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("columns %v: %v", cols, err)
			}
			rows += r.NumRows()
		}
		pr.Close()
		if rows != rec.NumRows() {
			t.Fatalf("columns %v: %d rows, want %d", cols, rows, rec.NumRows())
		}
	}
	return deltas
}

func TestPromptDeltasRoundTrip(t *testing.T) {
	total := 0
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		g := chainGroups(r)
		total += roundTrip(t, r, g, g)
	}
	if total == 0 {
		t.Fatal("no step was stored as a delta")
	}
}

// TestPromptDeltasOnlyWhenExact: the writer stores a delta exactly when
// the prompt begins with the predecessor's prompt and response.
func TestPromptDeltasOnlyWhenExact(t *testing.T) {
	for _, tc := range []struct {
		name               string
		prompt, prev, resp []int32
		want               int
	}{
		{"extends", []int32{1, 2, 3, 4}, []int32{1, 2}, []int32{3}, 3},
		{"adds nothing", []int32{1, 2, 3}, []int32{1, 2}, []int32{3}, 3},
		{"differs in the response", []int32{1, 2, 9, 4}, []int32{1, 2}, []int32{3}, 0},
		{"differs in the prompt", []int32{1, 9, 3, 4}, []int32{1, 2}, []int32{3}, 0},
		{"shorter", []int32{1, 2}, []int32{1, 2}, []int32{3}, 0},
		{"nothing to reuse", []int32{1}, nil, nil, 0},
		{"differs in a high byte", []int32{1, 1 << 20, 3}, []int32{1, 1<<20 + 1<<8}, []int32{3}, 0},
		{"differs at the end of a long prompt", append(slices.Repeat([]int32{7}, 999), 8, 9), slices.Repeat([]int32{7}, 1000), []int32{9}, 0},
		{"long prompt", append(slices.Repeat([]int32{7}, 1000), 9, 10), slices.Repeat([]int32{7}, 1000), []int32{9}, 1001},
	} {
		if got := prefix.Extends(tc.prompt, tc.prev, tc.resp); got != tc.want {
			t.Errorf("%s: Extends = %d, want %d", tc.name, got, tc.want)
		}
	}
	// The gateway's token ids are int64.
	if got := prefix.Extends([]int64{1, 1 << 40, 3, 4}, []int64{1, 1 << 40}, []int64{3}); got != 3 {
		t.Errorf("int64: Extends = %d, want 3", got)
	}
	if got := prefix.Extends([]int64{1, 1 << 40, 3}, []int64{1, 1<<40 + 1<<33}, []int64{3}); got != 0 {
		t.Errorf("int64 differing in a high byte: Extends = %d, want 0", got)
	}
	for _, tc := range []struct {
		msgs, prev string
		want       bool
	}{
		{`[{"a":1},{"b":2}]`, `[{"a":1}]`, true},
		{`[{"a":1}]`, `[{"a":1}]`, true},
		{`[{"a":2},{"b":2}]`, `[{"a":1}]`, false},
		{`[{"a":1}]`, ``, false},
		{`[{"a":1} ,{"b":2}]`, `[{"a":1} ]`, true},
		{`[{"a":1}`, `[{"a":1}]x`, false},
	} {
		if got := prefix.MessagesExtend([]byte(tc.msgs), []byte(tc.prev)); got != tc.want {
			t.Errorf("MessagesExtend(%s, %s) = %v, want %v", tc.msgs, tc.prev, got, tc.want)
		}
	}
}

// FuzzPromptChains builds random chains (resets, branches, partial
// prefixes, empty deltas) and reads every prompt and message back whole.
func FuzzPromptChains(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 99} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		r := rand.New(rand.NewPCG(seed, seed>>7))
		g := chainGroups(r)
		roundTrip(t, r, g, g)
	})
}

// wireLines renders groups as wire records, a step whose prompt extends
// an earlier step's prompt and response (its predecessor, or a step
// before that: a branch) sent as a delta of it, and shuffled.
func wireLines(r *rand.Rand, groups []*Group) []string {
	var lines []string
	for _, g := range groups {
		for _, tr := range g.Trajectories {
			for k, s := range tr.Steps {
				rec := wholeRecord(g.Key, s)
				for j := k - 1; j >= 0 && r.IntN(4) != 0; j-- {
					p := tr.Steps[j]
					// Any prompt extends an empty parent's (no prompt, no
					// response): sent as a delta of it too.
					if n := prefix.Extends(s.PromptIDs, p.PromptIDs, p.ResponseIDs); n > 0 || len(p.PromptIDs)+len(p.ResponseIDs) == 0 {
						delete(rec, "prompt_ids")
						rec["parent_step_id"], rec["prompt_delta_ids"] = p.StepID, append([]int32{}, s.PromptIDs[n:]...)
						// Messages that extend the parent's: only those added.
						if s.Messages != nil && len(s.Messages) > len(p.Messages) && prefix.MessagesExtend(s.Messages, p.Messages) {
							delete(rec, "messages")
							rec["messages_added"] = json.RawMessage("[" + string(s.Messages[len(p.Messages):]))
						}
						break
					}
				}
				b, _ := json.Marshal(rec)
				lines = append(lines, string(b))
			}
			b, _ := json.Marshal(map[string]any{"type": "trajectory", "trajectory_id": tr.TrajectoryID, "task_id": g.Key, "reward": 1, "num_steps": len(tr.Steps)})
			lines = append(lines, string(b))
		}
	}
	r.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
	return lines
}

// TestWireDeltas sends chains as prompt deltas, shuffled: the rows read
// back with the whole prompts of the input, as when sent whole.
func TestWireDeltas(t *testing.T) {
	for seed := range uint64(30) {
		wireRoundTrip(t, seed)
	}
}

// FuzzWireDeltas is TestWireDeltas on random seeds.
func FuzzWireDeltas(f *testing.F) {
	for _, s := range []uint64{1, 5, 17} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) { wireRoundTrip(t, seed) })
}

func wireRoundTrip(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 11))
	want := chainGroups(r)
	h := newHarness(t, Config{GroupSize: 1 << 10, MinGroupSize: 1})
	h.add(t0, wireLines(r, want)...)
	h.a.Flush()
	h.take()
	roundTrip(t, r, received(t, h, want), want)
}

// received returns the groups h emitted, ordered as want's and their
// trajectories as want's (rows follow the input's order), after checking
// that there is no dead letter and every group came whole.
func received(t *testing.T, h *harness, want []*Group) []*Group {
	t.Helper()
	if len(h.dead) > 0 {
		t.Fatalf("dead letter %s: %s", h.dead[0].Reason, h.dead[0].Error)
	}
	byKey := map[string]*Group{}
	for _, g := range h.groups {
		byKey[g.Key] = g
	}
	var got []*Group
	for _, g := range want {
		rg := byKey[g.Key]
		if rg == nil || len(rg.Trajectories) != len(g.Trajectories) {
			t.Fatalf("group %s not emitted whole", g.Key)
		}
		order := map[string]int{}
		for i, tr := range g.Trajectories {
			order[tr.TrajectoryID] = i
		}
		slices.SortFunc(rg.Trajectories, func(a, b *Trajectory) int { return order[a.TrajectoryID] - order[b.TrajectoryID] })
		got = append(got, rg)
	}
	return got
}

// wholeRecord is step s of task key as a whole record (before encoding).
func wholeRecord(key string, s *Step) map[string]any {
	rec := map[string]any{"type": "step", "step_id": s.StepID, "task_id": key, "trajectory_id": s.TrajectoryID,
		"step_index": s.StepIndex, "policy_version": 0, "prompt_ids": append([]int32{}, s.PromptIDs...),
		"response_ids": s.ResponseIDs, "response_logprobs": s.ResponseLogprobs}
	if s.Messages != nil {
		rec["messages"] = json.RawMessage(s.Messages)
	}
	return rec
}

// wholeLines renders groups as whole records (every prompt and message
// list whole), each trajectory's steps in order then its record; the
// trajectories of all groups interleaved at random.
func wholeLines(r *rand.Rand, groups []*Group) []string {
	var queues [][]string
	for _, g := range groups {
		for _, tr := range g.Trajectories {
			var q []string
			for _, s := range tr.Steps {
				b, _ := json.Marshal(wholeRecord(g.Key, s))
				q = append(q, string(b))
			}
			b, _ := json.Marshal(map[string]any{"type": "trajectory", "trajectory_id": tr.TrajectoryID, "task_id": g.Key, "reward": 1, "num_steps": len(tr.Steps)})
			queues = append(queues, append(q, string(b)))
		}
	}
	var lines []string
	for len(queues) > 0 {
		i := r.IntN(len(queues))
		lines = append(lines, queues[i][0])
		if queues[i] = queues[i][1:]; len(queues[i]) == 0 {
			queues = slices.Delete(queues, i, i+1)
		}
	}
	return lines
}

// TestDeltasOnArrival: whole records of a trajectory are held, while
// their group waits, as deltas of their predecessors wherever they extend
// them, in order or shuffled (so a trajectory holds about one whole
// prompt, not every turn's), and the rows built from them are those built
// from the whole steps; read back, every prompt and message list is the
// input's.
func TestDeltasOnArrival(t *testing.T) {
	held := 0
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 13))
		want := chainGroups(r)
		for _, shuffle := range []bool{false, true} {
			lines := wholeLines(r, want)
			if shuffle {
				r.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
			}
			h := newHarness(t, Config{GroupSize: 1 << 10, MinGroupSize: 1})
			h.add(t0, lines...)
			held += checkHeld(t, h, want)
			h.a.Flush()
			h.take()
			got := received(t, h, want)
			sameRows(t, got, want)
			roundTrip(t, r, got, want)
		}
	}
	if held == 0 {
		t.Fatal("no step was held as a delta")
	}
}

// checkHeld checks how h holds the steps of want's trajectories (all
// open, arrived in any order): a step whose prompt extends its predecessor's
// prompt and response holds only the tokens after them, naming its
// predecessor; others hold their whole prompt. Messages alike. It returns
// how many steps were held as deltas.
func checkHeld(t *testing.T, h *harness, want []*Group) (deltas int) {
	t.Helper()
	for _, g := range want {
		for _, wt := range g.Trajectories {
			ht := h.a.trajs[wt.TrajectoryID]
			if ht == nil || len(ht.Steps) != len(wt.Steps) {
				t.Fatalf("trajectory %s not held whole", wt.TrajectoryID)
			}
			byIndex := map[int64]*Step{}
			for _, s := range ht.Steps {
				byIndex[s.StepIndex] = s
			}
			for k, ws := range wt.Steps {
				hs := byIndex[int64(k)]
				p := 0
				var pm []byte
				if k > 0 {
					prev := wt.Steps[k-1]
					p, pm = prefix.Extends(ws.PromptIDs, prev.PromptIDs, prev.ResponseIDs), prev.Messages
				}
				switch {
				case p > 0:
					if hs.PromptIDs != nil || !slices.Equal(hs.PromptDeltaIDs, ws.PromptIDs[p:]) || hs.PromptDeltaIDs == nil || hs.ParentStepID != wt.Steps[k-1].StepID {
						t.Fatalf("%s: held prompt %v delta %v parent %q, want the delta %v of %s", ws.StepID, hs.PromptIDs, hs.PromptDeltaIDs, hs.ParentStepID, ws.PromptIDs[p:], wt.Steps[k-1].StepID)
					}
					deltas++
				case !slices.Equal(hs.PromptIDs, ws.PromptIDs) || hs.PromptIDs == nil:
					t.Fatalf("%s: held prompt %v, want it whole: %v", ws.StepID, hs.PromptIDs, ws.PromptIDs)
				}
				if ws.Messages != nil && prefix.MessagesExtend(ws.Messages, pm) {
					if hs.Messages != nil || string(hs.msgTail) != string(ws.Messages[len(pm)-1:]) {
						t.Fatalf("%s: held messages %q tail %q, want the tail %q", ws.StepID, hs.Messages, hs.msgTail, ws.Messages[len(pm)-1:])
					}
				} else if string(hs.Messages) != string(ws.Messages) || hs.msgTail != nil {
					t.Fatalf("%s: held messages %q, want %q", ws.StepID, hs.Messages, ws.Messages)
				}
			}
		}
	}
	return deltas
}

// sameRows checks that got and want build the same prompt and message
// columns.
func sameRows(t *testing.T, got, want []*Group) {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	var recs [2]arrow.RecordBatch
	for i, groups := range [][]*Group{got, want} {
		bt := NewBatcher(mem, BatchConfig{Estimator: mustGRPO()})
		batches, err := bt.Build(groups)
		bt.Release()
		if err != nil || len(batches) != 1 {
			t.Fatalf("%d batches (%v), want 1", len(batches), err)
		}
		recs[i] = batches[0].Record
		defer recs[i].Release()
	}
	for _, c := range []int{schemas.ColPromptIDs, schemas.ColPromptDeltaIDs, schemas.ColPromptPrefixLen, schemas.ColMessages, schemas.ColMessagesDelta} {
		if !array.Equal(recs[0].Column(c), recs[1].Column(c)) {
			t.Fatalf("column %s differs:\n got %v\nwant %v", recs[0].ColumnName(c), recs[0].Column(c), recs[1].Column(c))
		}
	}
}

// TestWireDeltaInvalidParent: a delta whose parent is not an earlier step
// of its trajectory is dead-lettered (invalid_parent), and the trajectory
// is not emitted without it.
func TestWireDeltaInvalidParent(t *testing.T) {
	for _, parent := range []string{"nope", "y-s0"} {
		h := newHarness(t, Config{GroupSize: 1, MinGroupSize: 1})
		h.add(t0,
			`{"type":"step","step_id":"y-s0","task_id":"g","trajectory_id":"y","step_index":0,"policy_version":0,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-1]}`,
			`{"type":"step","step_id":"x-s0","task_id":"g","trajectory_id":"x","step_index":0,"policy_version":0,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-1]}`,
			`{"type":"step","step_id":"x-s1","task_id":"g","trajectory_id":"x","step_index":1,"policy_version":0,"parent_step_id":"`+parent+`","prompt_delta_ids":[3],"response_ids":[4],"response_logprobs":[-1]}`,
			`{"type":"trajectory","trajectory_id":"x","task_id":"g","reward":1,"num_steps":2}`,
		)
		h.a.Flush()
		h.take()
		if len(h.dead) == 0 || h.dead[0].Reason != schemas.ReasonInvalidParent {
			t.Fatalf("parent %q: dead letters %+v", parent, h.dead)
		}
		for _, g := range h.groups {
			for _, tr := range g.Trajectories {
				if tr.TrajectoryID == "x" {
					t.Fatalf("parent %q: trajectory x emitted without its step", parent)
				}
			}
		}
	}
}

// BenchmarkExtends: the prefix check of a 30-turn agent's last step (a
// 17k-token prompt extending its predecessor's), in tokens compared per
// second.
func BenchmarkExtends(b *testing.B) {
	prev := make([]int32, 16000)
	for i := range prev {
		prev[i] = int32(i * 7919 % 151000)
	}
	resp := slices.Repeat([]int32{42}, 150)
	prompt := append(append(slices.Clone(prev), resp...), slices.Repeat([]int32{5}, 400)...)
	for b.Loop() {
		if prefix.Extends(prompt, prev, resp) == 0 {
			b.Fatal("does not extend")
		}
	}
	b.ReportMetric(float64(b.N)*float64(len(prev)+len(resp))/b.Elapsed().Seconds(), "tokens/s")
}
