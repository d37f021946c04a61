package advantage

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

func runBatch(t *testing.T, name string, c Compat, offs []int32, r []float64, lens []int64, roles []string) []float64 {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	est, err := NewBatch(name, Options{Compat: c})
	if err != nil {
		t.Fatal(err)
	}
	ra := f64(mem, r)
	defer ra.Release()
	in := BatchGroups{Groups: Groups{Offsets: offs, Rewards: ra}}
	if lens != nil {
		la := i64(mem, lens)
		defer la.Release()
		in.Lengths = la
	}
	if roles != nil {
		sb := array.NewStringBuilder(mem)
		sb.AppendValues(roles, nil)
		ro := sb.NewStringArray()
		sb.Release()
		defer ro.Release()
		in.Roles = ro
	}
	out, err := est.ComputeBatch(mem, in)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Release()
	return append([]float64(nil), out.Float64Values()...)
}

func TestBatchLevelVectors(t *testing.T) {
	one := []int32{0, 4}
	r := []float64{1, 0, 0, 0}
	cases := []struct {
		name   string
		est    string
		compat Compat
		offs   []int32
		r      []float64
		lens   []int64
		roles  []string
		want   []float64
		tol    float64
	}{
		// rLLM: centre per group, divide by the batch's population std + 1e-6.
		{"rf++ rllm", "reinforce_plus_plus_baseline", RLLM, one, r, nil, nil, []float64{1.7320468, -0.5773489, -0.5773489, -0.5773489}, 1e-6},
		// verl: token-weighted whitening, unbiased over tokens, 1e-8 inside the sqrt.
		{"rf++ verl 1 token", "reinforce_plus_plus_baseline", Verl, one, r, []int64{1, 1, 1, 1}, nil, []float64{1.5, -0.5, -0.5, -0.5}, 1e-6},
		{"rf++ verl 100 tokens", "reinforce_plus_plus_baseline", Verl, one, r, []int64{100, 100, 100, 100}, nil, []float64{1.72988, -0.57663, -0.57663, -0.57663}, 1e-5},
		// A lone trajectory: rLLM subtracts its own mean (0), verl keeps r.
		{"rf++ rllm lone", "reinforce_plus_plus_baseline", RLLM, []int32{0, 1, 3}, []float64{1, 1, 0}, nil, nil, []float64{0, 0.5 / (0.4082482904638631 + 1e-6), -0.5 / (0.4082482904638631 + 1e-6)}, 1e-9},
		// PRPO: per role over the batch, group boundaries ignored.
		{"prpo two groups", "prpo", RLLM, []int32{0, 4, 8}, []float64{1, 0, 0, 0, 1, 1, 1, 0}, nil, nil, []float64{0.999998, -0.999998, -0.999998, -0.999998, 0.999998, 0.999998, 0.999998, -0.999998}, 1e-6},
		{"prpo per role", "prpo", RLLM, []int32{0, 2, 4}, []float64{1, 0, 5, 3}, nil, []string{"a", "a", "b", "b"}, []float64{0.999998, -0.999998, 0.9999995, -0.9999995}, 1e-6},
		// TRL scale_rewards="batch": group mean, batch sample std + 1e-4.
		{"batch_std trl", "batch_std", TRL, []int32{0, 2, 4}, []float64{1, 0, 1, 1}, nil, nil, []float64{0.5 / (0.5 + 1e-4), -0.5 / (0.5 + 1e-4), 0, 0}, 1e-12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := runBatch(t, tc.est, tc.compat, tc.offs, tc.r, tc.lens, tc.roles)
			for i, w := range tc.want {
				if math.Abs(got[i]-w) > tc.tol {
					t.Fatalf("A[%d] = %.10g, want %.10g", i, got[i], w)
				}
			}
		})
	}
}

// TestBatchLevelProperties checks invariants on random batches: no NaN,
// whitened outputs have mean ~0 and (weighted) std ~1.
func TestBatchLevelProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for iter := 0; iter < 100; iter++ {
		offs, _, r, lens := randomGroups(rng, iter%3) // no 1e9 shift here
		for i := range lens {
			lens[i]++ // every trajectory has a token
		}
		for _, c := range []Compat{RLLM, Verl, TRL} {
			for _, name := range []string{"reinforce_plus_plus_baseline", "prpo", "batch_std"} {
				got := runBatch(t, name, c, offs, r, lens, nil)
				for i, v := range got {
					if math.IsNaN(v) || math.IsInf(v, 0) {
						t.Fatalf("%s/%s iter %d: A[%d] = %v", name, c.Name, iter, i, v)
					}
				}
			}
			got := runBatch(t, "prpo", c, offs, r, lens, nil)
			var mean float64
			for _, v := range got {
				mean += v / float64(len(got))
			}
			if math.Abs(mean) > 1e-6 {
				t.Fatalf("prpo/%s iter %d: mean %v", c.Name, iter, mean)
			}
		}
	}
}
