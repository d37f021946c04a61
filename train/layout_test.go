package train

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/ingest/synth"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train/merge"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// writeMultiTurn generates multi-turn groups with context resets (and
// teacher logprobs for distillation when distill), commits them as
// shards (prefix-delta storage, schema 4) and returns the shard paths.
func writeMultiTurn(t *testing.T, distill bool) []string {
	t.Helper()
	cfg := synth.Config{Groups: 16, GroupSize: 4, MinSteps: 1, MaxSteps: 9, PromptLen: 48, ResponseLen: 24, ObservationLen: 12,
		Resets: 0.2, ParallelTools: 0.2, Teacher: distill, Shuffle: -1, Vocab: 1000, Seed: 17}
	return writeGenerated(t, cfg, nil)
}

// writeGenerated commits the groups synth generates with cfg as shards,
// marked by filters, with distillation token advantages when cfg.Teacher,
// and returns the shard paths.
func writeGenerated(t testing.TB, cfg synth.Config, filters []transform.Filter) []string {
	t.Helper()
	distill := cfg.Teacher
	var buf bytes.Buffer
	if _, err := synth.Generate(context.Background(), &buf, cfg); err != nil {
		t.Fatal(err)
	}
	a := transform.NewAssembler(transform.Config{GroupSize: 4})
	var d ingest.Decoder
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 64<<20)
	line := int64(0)
	for sc.Scan() {
		line++
		raw := slices.Clone(sc.Bytes())
		rec, err := d.Decode(raw)
		if err != nil {
			t.Fatal(err)
		}
		a.Add(&ingest.Item{Source: schemas.Source{File: "in", Line: line}, Raw: raw, Rec: rec}, time.Now())
	}
	a.Flush()
	est, _ := advantage.New("grpo", advantage.Options{})
	bc := transform.BatchConfig{Estimator: est, Label: "grpo/rllm", Filters: filters}
	if distill {
		bc.Distill = &advantage.Distill{Coef: 1, Clip: 2}
	}
	bt := transform.NewBatcher(memory.DefaultAllocator, bc)
	defer bt.Release()
	out := a.Take()
	if len(out.Groups) != cfg.Groups {
		t.Fatalf("%d groups assembled, want %d (%d dead)", len(out.Groups), cfg.Groups, len(out.Dead))
	}
	batches, err := bt.Build(out.Groups)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	st, err := local.Open(root, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sk := sink.New(st, sink.Config{RunID: "mt", ShardSize: 64 << 10})
	for _, b := range batches {
		if err := sk.Write(context.Background(), b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := sk.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range committedEntries(t, st) {
		if e.Path != "" {
			paths = append(paths, filepath.Join(root, e.Path))
		}
	}
	return paths
}

// refRow is a merged row as the reference computes it.
type refRow struct {
	group, traj         string
	first, last, merged int32
	segment, rowsInTraj int32
	isLast              bool
	minV, maxV          int64
	prompt, resp        []int32
	mask                []int8
	lp, adv             []float32
}

// refMerge is an independent implementation of rLLM's merge
// (_process_trajectory) over step rows: walk each trajectory's steps
// keeping the running sequence (prompt ++ everything appended); a step
// whose prompt starts with it extends the row, any other starts a new one.
// A row's segment is its place among its trajectory's rows, is_last says
// it holds the trajectory's last step (step_index num_steps-1), and its
// versions are the smallest and largest of its steps'.
func refMerge(rec arrow.RecordBatch) []refRow {
	col := func(name string) arrow.Array { return rec.Column(rec.Schema().FieldIndices(name)[0]) }
	gid, tid := col("group_id").(*array.String), col("trajectory_id").(*array.String)
	idx, numSteps := col("step_index").(*array.Int32), col("num_steps").(*array.Int32)
	pv := col("policy_version").(*array.Int64)
	adv := col("advantage").(*array.Float64)
	ints := func(name string, i int) []int32 {
		l := col(name).(*array.List)
		a, b := l.ValueOffsets(i)
		return l.ListValues().(*array.Int32).Int32Values()[a:b]
	}
	flts := func(name string, i int) []float32 {
		l := col(name).(*array.List)
		if l.IsNull(i) {
			return nil
		}
		a, b := l.ValueOffsets(i)
		return l.ListValues().(*array.Float32).Float32Values()[a:b]
	}
	var (
		out     []refRow
		cur     *refRow
		running []int32
	)
	for i := 0; i < int(rec.NumRows()); i++ {
		prompt, resp, lp := ints("prompt_ids", i), ints("response_ids", i), flts("response_logprobs", i)
		ta := flts("token_advantages", i)
		if ta == nil {
			for range resp {
				ta = append(ta, float32(adv.Value(i)))
			}
		}
		sameTraj := cur != nil && cur.group == gid.Value(i) && cur.traj == tid.Value(i)
		if sameTraj && len(prompt) >= len(running) && slices.Equal(prompt[:len(running)], running) {
			obs := prompt[len(running):]
			cur.resp = append(cur.resp, obs...)
			for range obs {
				cur.mask = append(cur.mask, 0)
				cur.lp = append(cur.lp, 0)
				cur.adv = append(cur.adv, 0)
			}
			running = append(running, obs...)
			cur.last = idx.Value(i)
			cur.merged++
			cur.minV, cur.maxV = min(cur.minV, pv.Value(i)), max(cur.maxV, pv.Value(i))
		} else {
			if cur != nil {
				out = append(out, *cur)
			}
			cur = &refRow{group: gid.Value(i), traj: tid.Value(i), first: idx.Value(i), last: idx.Value(i), merged: 1, prompt: slices.Clone(prompt),
				minV: pv.Value(i), maxV: pv.Value(i)}
			if sameTraj {
				cur.segment = out[len(out)-1].segment + 1
			}
			running = slices.Clone(prompt)
		}
		cur.isLast = idx.Value(i) == numSteps.Value(i)-1
		cur.resp = append(cur.resp, resp...)
		for range resp {
			cur.mask = append(cur.mask, 1)
		}
		cur.lp = append(cur.lp, lp...)
		cur.adv = append(cur.adv, ta...)
		running = append(running, resp...)
	}
	if cur != nil {
		out = append(out, *cur)
	}
	rows := map[[2]string]int32{}
	for _, r := range out {
		rows[[2]string{r.group, r.traj}]++
	}
	for i := range out {
		out[i].rowsInTraj = rows[[2]string{out[i].group, out[i].traj}]
	}
	return out
}

func readAll(t *testing.T, paths []string, cfg Config) []Batch {
	t.Helper()
	r := NewReader(cfg)
	var out []Batch
	if err := r.ReadShards(context.Background(), paths, func(b Batch) error { out = append(out, b); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTrajectoryLayoutMatchesReference(t *testing.T) {
	for _, distill := range []bool{false, true} {
		t.Run(fmt.Sprintf("distill=%v", distill), func(t *testing.T) {
			paths := writeMultiTurn(t, distill)
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			// One group per batch, in both layouts: batch i is the same group.
			steps := readAll(t, paths, Config{MaxStaleness: -1, Allocator: mem})
			merged := readAll(t, paths, Config{MaxStaleness: -1, Allocator: mem, Layout: LayoutTrajectories})
			defer func() {
				for _, b := range append(steps, merged...) {
					b.Record.Release()
				}
			}()
			if len(steps) != 16 || len(merged) != 16 {
				t.Fatalf("%d and %d batches, want 16 groups each", len(steps), len(merged))
			}
			var resets, multi, tokAdv, notLast, mixedVersions int
			for bi := range steps {
				want := refMerge(steps[bi].Record)
				got := merged[bi].Record
				if !slices.Equal(steps[bi].Groups, merged[bi].Groups) {
					t.Fatalf("batch %d: groups %v, want %v", bi, merged[bi].Groups, steps[bi].Groups)
				}
				if int(got.NumRows()) != len(want) {
					t.Fatalf("batch %d: %d rows, want %d", bi, got.NumRows(), len(want))
				}
				var tokens int64
				for r, w := range want {
					g := mergedRow(got, r)
					if g.group != w.group || g.traj != w.traj || g.first != w.first || g.last != w.last || g.merged != w.merged ||
						g.segment != w.segment || g.rowsInTraj != w.rowsInTraj || g.isLast != w.isLast || g.minV != w.minV || g.maxV != w.maxV ||
						!slices.Equal(g.prompt, w.prompt) || !slices.Equal(g.resp, w.resp) || !slices.Equal(g.mask, w.mask) ||
						!slices.Equal(g.lp, w.lp) || !slices.EqualFunc(g.adv, w.adv, func(x, y float32) bool { return math.Abs(float64(x-y)) < 1e-6 }) {
						t.Fatalf("batch %d row %d differs from the reference:\n got %+v\nwant %+v", bi, r, g, w)
					}
					tokens += int64(len(w.prompt) + len(w.resp))
					if w.first > 0 {
						resets++
					}
					if w.merged > 1 {
						multi++
					}
					if !w.isLast {
						notLast++
					}
					if w.minV != w.maxV {
						mixedVersions++
					}
				}
				if merged[bi].Tokens != tokens {
					t.Errorf("batch %d: Tokens %d, merged rows hold %d", bi, merged[bi].Tokens, tokens)
				}
				st := merged[bi].Merge
				if st == nil || st.Rows != int64(len(want)) || st.Steps != steps[bi].Record.NumRows() {
					t.Errorf("batch %d: merge stats %+v, want %d rows from %d steps", bi, st, len(want), steps[bi].Record.NumRows())
				}
				ta := got.Column(merge.ColTokenAdvantageSteps).(*array.Int32)
				for r := 0; r < ta.Len(); r++ {
					tokAdv += int(ta.Value(r))
				}
			}
			// The data exercises what the test is for.
			if resets == 0 || multi == 0 || notLast == 0 || mixedVersions == 0 {
				t.Fatalf("generated data has %d reset rows, %d merged rows, %d rows before a reset, %d rows of several versions: not a multi-turn test",
					resets, multi, notLast, mixedVersions)
			}
			if distill != (tokAdv > 0) {
				t.Fatalf("distill=%v but %d steps carried token advantages", distill, tokAdv)
			}
		})
	}
}

func mergedRow(rec arrow.RecordBatch, r int) refRow {
	c := rec.Column
	ints := func(i int) []int32 {
		l := c(i).(*array.List)
		a, b := l.ValueOffsets(r)
		return l.ListValues().(*array.Int32).Int32Values()[a:b]
	}
	flts := func(i int) []float32 {
		l := c(i).(*array.List)
		a, b := l.ValueOffsets(r)
		return l.ListValues().(*array.Float32).Float32Values()[a:b]
	}
	ml := c(merge.ColResponseMask).(*array.List)
	a, b := ml.ValueOffsets(r)
	return refRow{
		group: c(merge.ColGroupID).(*array.String).Value(r), traj: c(merge.ColTrajectoryID).(*array.String).Value(r),
		first: c(merge.ColFirstStepIndex).(*array.Int32).Value(r), last: c(merge.ColLastStepIndex).(*array.Int32).Value(r),
		merged:  c(merge.ColStepsMerged).(*array.Int32).Value(r),
		segment: c(merge.ColSegment).(*array.Int32).Value(r), rowsInTraj: c(merge.ColRowsInTrajectory).(*array.Int32).Value(r),
		isLast: c(merge.ColIsLast).(*array.Boolean).Value(r),
		minV:   c(merge.ColPolicyVersion).(*array.Int64).Value(r), maxV: c(merge.ColMaxPolicyVersion).(*array.Int64).Value(r),
		prompt: ints(merge.ColPromptIDs), resp: ints(merge.ColResponseIDs), mask: ml.ListValues().(*array.Int8).Int8Values()[a:b],
		lp: flts(merge.ColRolloutLogProbs), adv: flts(merge.ColAdvantages),
	}
}

func TestTrajectoryLayoutBudgetCountsMergedRows(t *testing.T) {
	paths := writeMultiTurn(t, false)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	perGroup := map[string]int64{}
	for _, b := range readAll(t, paths, Config{MaxStaleness: -1, Allocator: mem, Layout: LayoutTrajectories}) {
		perGroup[b.Groups[0]] = b.Tokens
		b.Record.Release()
	}
	const budget = 6000
	seen := map[string]bool{}
	for _, b := range readAll(t, paths, Config{MaxStaleness: -1, Allocator: mem, Layout: LayoutTrajectories, MaxTokens: budget}) {
		var want int64
		for _, g := range b.Groups {
			if seen[g] {
				t.Errorf("group %s twice", g)
			}
			seen[g] = true
			want += perGroup[g]
		}
		if b.Tokens != want {
			t.Errorf("batch of %v: %d tokens, its groups' merged rows hold %d", b.Groups, b.Tokens, want)
		}
		if b.Tokens > budget && !(b.Oversized && len(b.Groups) == 1) {
			t.Errorf("batch of %d tokens over the budget %d", b.Tokens, budget)
		}
		// Groups whole: every trajectory's rows are in the batch that lists its group.
		gid := b.Record.Column(merge.ColGroupID).(*array.String)
		for r := 0; r < gid.Len(); r++ {
			if !slices.Contains(b.Groups, gid.Value(r)) {
				t.Errorf("row of group %s in a batch of %v", gid.Value(r), b.Groups)
			}
		}
		b.Record.Release()
	}
	if len(seen) != len(perGroup) {
		t.Errorf("%d groups delivered, want %d", len(seen), len(perGroup))
	}
}
