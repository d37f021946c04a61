package merge

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// randomSteps generates trajectories whose steps extend each other, start
// over (resets), or extend by coincidence (a tiny vocabulary and short
// lists), with empty responses and observations, token advantages on some
// steps and filter marks on random rows (mid-trajectory too, which
// today's filters never do). It returns the steps with whole prompts, and
// the same steps stored as the writer would, except that some extending
// steps are stored whole anyway.
func randomSteps(rng *rand.Rand, trajs int) (whole, stored []step) {
	tokens := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = rng.Int32N(3)
		}
		return s
	}
	for t := range trajs {
		turns := 1 + rng.IntN(6)
		var prev *step
		for k := range turns {
			s := step{traj: fmt.Sprintf("t%03d", t), idx: int32(k), num: int32(turns), pv: int64(rng.IntN(3)), resp: tokens(rng.IntN(4)), adv: float64(rng.IntN(5)) - 2}
			if rng.IntN(4) == 0 {
				s.tokAdv = make([]float32, len(s.resp))
				for i := range s.tokAdv {
					s.tokAdv[i] = rng.Float32()
				}
			}
			if rng.IntN(5) == 0 {
				s.filter = "truncated"
			}
			st := s
			switch {
			case prev == nil || rng.IntN(5) == 0: // first step or reset
				s.prompt = tokens(rng.IntN(5))
				st.prompt = s.prompt
			default:
				obs := tokens(rng.IntN(3))
				s.prompt = slices.Concat(prev.prompt, prev.resp, obs)
				st.prompt = s.prompt
				if n := len(prev.prompt) + len(prev.resp); n > 0 && rng.IntN(4) != 0 {
					st.prompt, st.nullProm, st.prefix, st.delta = nil, true, int32(n), obs
				}
			}
			whole, stored = append(whole, s), append(stored, st)
			prev = &whole[len(whole)-1]
		}
	}
	return whole, stored
}

// split cuts rec into 1 to 4 slices at random rows.
func split(rng *rand.Rand, rec arrow.RecordBatch) []arrow.RecordBatch {
	n := rec.NumRows()
	cuts := []int64{0, n}
	for range rng.IntN(4) {
		cuts = append(cuts, rng.Int64N(n+1))
	}
	slices.Sort(cuts)
	var parts []arrow.RecordBatch
	for i := 1; i < len(cuts); i++ {
		parts = append(parts, rec.NewSlice(cuts[i-1], cuts[i]))
	}
	return parts
}

// Merging stored prefix deltas gives the same record, byte for byte, as
// merging the whole prompts after dropping the filtered rows (what
// readers did before: rebuild every prompt, then merge).
func TestRowsOfDeltasEqualsWholePrompts(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	rng := rand.New(rand.NewPCG(17, 4))
	var deltaRows, multi int64
	for round := range 300 {
		whole, stored := randomSteps(rng, 1+rng.IntN(6))
		for _, s := range stored {
			if s.nullProm {
				deltaRows++
			}
		}
		for _, skip := range []bool{false, true} {
			kept := whole
			if skip {
				kept = slices.DeleteFunc(slices.Clone(whole), func(s step) bool { return s.filter != "" })
			}
			if len(kept) == 0 {
				continue
			}
			ref := stepRecord(t, mem, kept)
			want, wst, err := Rows(mem, ref)
			if err != nil {
				t.Fatal(err)
			}
			wantTok, err := Tokens([]arrow.RecordBatch{ref})
			if err != nil {
				t.Fatal(err)
			}
			rec := stepRecord(t, mem, stored)
			parts := split(rng, rec)
			got, gst, err := RowsOf(mem, parts, skip)
			if err != nil {
				t.Fatalf("round %d skip=%v: %v", round, skip, err)
			}
			gotTok, err := TokensOf(parts, skip)
			if err != nil {
				t.Fatal(err)
			}
			if !array.RecordEqual(got, want) || gst != wst || gotTok != wantTok {
				for i, s := range stored {
					t.Logf("stored %d: %+v whole prompt %v", i, s, whole[i].prompt)
				}
				for c := range got.NumCols() {
					if !array.Equal(got.Column(int(c)), want.Column(int(c))) {
						t.Logf("column %s: got %v want %v", got.ColumnName(int(c)), got.Column(int(c)), want.Column(int(c)))
					}
				}
				t.Fatalf("round %d skip=%v: deltas merge to\n%v\n%+v tokens %d\nwhole prompts to\n%v\n%+v tokens %d", round, skip, got, gst, gotTok, want, wst, wantTok)
			}
			multi += wst.Steps - wst.Rows
			for _, r := range []arrow.RecordBatch{ref, want, rec, got} {
				r.Release()
			}
			for _, p := range parts {
				p.Release()
			}
		}
	}
	if deltaRows < 100 || multi < 100 {
		t.Fatalf("%d delta rows and %d merged steps: the data does not exercise deltas", deltaRows, multi)
	}
}

// A delta row whose predecessor is not the row before it is refused.
func TestRowsOfDeltaWithoutPredecessor(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	for name, steps := range map[string][]step{
		"first row":         {{traj: "a", idx: 1, nullProm: true, prefix: 2, delta: []int32{5}, resp: []int32{1}}},
		"other trajectory":  {{traj: "a", prompt: []int32{1}, resp: []int32{2}}, {traj: "b", idx: 1, nullProm: true, prefix: 2, delta: []int32{5}, resp: []int32{1}}},
		"step skipped":      {{traj: "a", prompt: []int32{1}, resp: []int32{2}}, {traj: "a", idx: 2, nullProm: true, prefix: 2, delta: []int32{5}, resp: []int32{1}}},
		"wrong prefix size": {{traj: "a", prompt: []int32{1}, resp: []int32{2}}, {traj: "a", idx: 1, nullProm: true, prefix: 3, delta: []int32{5}, resp: []int32{1}}},
	} {
		t.Run(name, func(t *testing.T) {
			rec := stepRecord(t, mem, steps)
			defer rec.Release()
			if out, _, err := RowsOf(mem, []arrow.RecordBatch{rec}, false); err == nil {
				out.Release()
				t.Fatal("merged a delta row without its predecessor")
			}
			if _, err := TokensOf([]arrow.RecordBatch{rec}, false); err == nil {
				t.Fatal("counted a delta row without its predecessor")
			}
		})
	}
}
