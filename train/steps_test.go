package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
)

// drainSteps reads every batch of a consumer of root's group name (not
// following), acknowledging each step once all its parts are in hand, as
// a trainer accumulating micro-batches does; MaxInflight 1 counts steps,
// so the parts of a step must come without acknowledgements between.
func drainSteps(t *testing.T, root, name string, cfg Config, mem memory.Allocator) []*Delivery {
	t.Helper()
	sh, obj := openGroup(t, root, name)
	cfg.Allocator = mem
	c, err := NewConsumer(context.Background(), sh, obj, ConsumerConfig{Config: cfg, Name: "t", Poll: 10 * time.Millisecond, MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, step []*Delivery
	for {
		d, err := c.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: after %d batches: %v", name, len(out), err)
		}
		out, step = append(out, d), append(step, d)
		if d.StepPart.Part == d.StepPart.Parts-1 {
			for _, p := range step {
				if _, err := c.Ack(ctx, p.ID); err != nil {
					t.Fatal(err)
				}
			}
			step = nil
		}
	}
	if len(step) > 0 {
		t.Fatalf("%s: a step's last parts never came: %+v", name, step[len(step)-1].StepPart)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	return out
}

// stepColumns joins the rows of a step's batches, column by column.
func stepColumns(t *testing.T, ds []*Delivery) []arrow.Array {
	t.Helper()
	var cols []arrow.Array
	for i := range ds[0].Record.NumCols() {
		parts := make([]arrow.Array, len(ds))
		for j, d := range ds {
			parts[j] = d.Record.Column(int(i))
		}
		a, err := array.Concatenate(parts, memory.DefaultAllocator)
		if err != nil {
			t.Fatal(err)
		}
		cols = append(cols, a)
	}
	return cols
}

// TestStepsSplitByTheTokenBudget: with --batch-groups 6 and a budget of
// two groups' tokens, every step of 6 groups comes as 3 batches of whole
// groups within the budget, numbered as parts of one step; joined, their
// rows are the rows of the unsplit step — the batch estimator's
// advantages included (it sees the whole step), in both layouts.
func TestStepsSplitByTheTokenBudget(t *testing.T) {
	const groups, perStep, groupTokens = 40, 6, 8 // writeShardsTo: 2 trajectories of 3+1 tokens
	root := t.TempDir()
	writeShardsTo(t, root, 0, groups)
	est, err := advantage.NewBatch("reinforce_plus_plus_baseline", advantage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for n, tc := range []struct {
		name   string
		layout Layout
		est    advantage.BatchEstimator
	}{
		{"steps", LayoutSteps, nil}, {"trajectories", LayoutTrajectories, nil},
		{"steps with a batch estimator", LayoutSteps, est}, {"trajectories with a batch estimator", LayoutTrajectories, est},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			cfg := Config{MaxStaleness: -1, IncludeFiltered: true, BatchGroups: perStep, Layout: tc.layout, Batch: tc.est}
			whole := drainSteps(t, root, fmt.Sprintf("whole-%d", n), cfg, mem)
			cfg.MaxTokens = 2*groupTokens + groupTokens/2
			split := drainSteps(t, root, fmt.Sprintf("split-%d", n), cfg, mem)
			defer func() {
				for _, d := range append(whole, split...) {
					d.Record.Release()
				}
			}()
			if len(whole) != (groups+perStep-1)/perStep {
				t.Fatalf("%d unsplit batches, want %d", len(whole), (groups+perStep-1)/perStep)
			}
			i := 0
			for s, w := range whole {
				if w.StepPart.Parts != 1 || w.StepPart.Groups != len(w.Groups) {
					t.Errorf("unsplit step %d: %+v", s, w.StepPart)
				}
				var parts []*Delivery
				var ids []string
				for ; i < len(split) && split[i].StepPart.Step == split[0].StepPart.Step+uint64(s); i++ {
					p := split[i]
					if p.StepPart.Part != len(parts) || p.StepPart.Groups != len(w.Groups) || p.Tokens > cfg.MaxTokens || len(p.Groups) != 2 && i < len(split)-1 {
						t.Errorf("step %d part %d: %+v, %d groups, %d tokens (budget %d)", s, len(parts), p.StepPart, len(p.Groups), p.Tokens, cfg.MaxTokens)
					}
					parts = append(parts, p)
					ids = append(ids, p.Groups...)
				}
				if len(parts) == 0 || parts[0].StepPart.Parts != len(parts) || fmt.Sprint(ids) != fmt.Sprint(w.Groups) {
					t.Fatalf("step %d: parts %d, groups %v; want the unsplit step's %v", s, len(parts), ids, w.Groups)
				}
				got, want := stepColumns(t, parts), stepColumns(t, []*Delivery{w})
				for c := range want {
					if !array.Equal(got[c], want[c]) {
						t.Errorf("step %d column %s: split %v, unsplit %v", s, w.Record.ColumnName(c), got[c], want[c])
					}
					got[c].Release()
					want[c].Release()
				}
			}
			if i != len(split) {
				t.Errorf("%d split batches beyond the steps", len(split)-i)
			}
		})
	}
}

// TestGroupMultiple: without --batch-groups, a batch the token budget
// closes keeps the largest multiple of GroupMultiple groups and carries
// the rest over; only the last batch (the end of the input) is short.
func TestGroupMultiple(t *testing.T) {
	const groups, groupTokens = 42, 8
	root := t.TempDir()
	paths := writeShardsTo(t, root, 0, groups)
	cfg := Config{MaxStaleness: -1, IncludeFiltered: true, MaxTokens: 7 * groupTokens, GroupMultiple: 4}
	ds := drainSteps(t, root, "g", cfg, memory.DefaultAllocator)
	seen := map[string]bool{}
	for i, d := range ds {
		d.Record.Release()
		if n := len(d.Groups); (n%4 != 0 || n == 0) && i < len(ds)-1 {
			t.Errorf("batch %d: %d groups, not a multiple of 4", i, n)
		}
		for _, g := range d.Groups {
			if seen[g] {
				t.Errorf("group %s twice", g)
			}
			seen[g] = true
		}
	}
	if len(seen) != groups || len(ds[len(ds)-1].Groups)%4 != 2 {
		t.Errorf("%d groups delivered, last batch %d; want %d, 2 short", len(seen), len(ds[len(ds)-1].Groups), groups)
	}
	// The same through a Reader.
	r := NewReader(cfg)
	var sizes []int
	if err := r.ReadShards(context.Background(), paths, func(b Batch) error {
		b.Record.Release()
		sizes = append(sizes, len(b.Groups))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	total := 0
	for i, n := range sizes {
		total += n
		if n%4 != 0 && i < len(sizes)-1 {
			t.Errorf("reader batch %d: %d groups", i, n)
		}
	}
	if total != groups || r.Counters.ShortBatches != 1 {
		t.Errorf("reader: %d groups in %v, %d short; want %d, 1", total, sizes, r.Counters.ShortBatches, groups)
	}
}
