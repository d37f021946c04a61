package advantage

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

func f64(mem memory.Allocator, r []float64) *array.Float64 {
	b := array.NewFloat64Builder(mem)
	defer b.Release()
	b.AppendValues(r, nil)
	return b.NewFloat64Array()
}

func i64(mem memory.Allocator, v []int64) *array.Int64 {
	b := array.NewInt64Builder(mem)
	defer b.Release()
	b.AppendValues(v, nil)
	return b.NewInt64Array()
}

func mustNew(t testing.TB, name string, o Options) Estimator {
	e, err := New(name, o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// run computes est over one call and returns plain values.
func run(t testing.TB, est Estimator, offsets []int32, r []float64, lens []int64) []float64 {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	ra := f64(mem, r)
	defer ra.Release()
	g := Groups{Offsets: offsets, Rewards: ra}
	if lens != nil {
		la := i64(mem, lens)
		defer la.Release()
		g.Lengths = la
	}
	out, err := est.Compute(mem, g)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Release()
	return append([]float64(nil), out.Float64Values()...)
}

func TestLiteralVectors(t *testing.T) {
	one := []int32{0, 4}
	r1000 := []float64{1, 0, 0, 0}
	cases := []struct {
		est    string
		compat Compat
		noStd  bool
		offs   []int32
		r      []float64
		lens   []int64
		want   []float64
		tol    float64
	}{
		// ../shared/ANCHORS.md §2 and the frameworks' code.
		{"grpo", RLLM, false, one, r1000, nil, []float64{1.732046807578115, -0.5773489358593717, -0.5773489358593717, -0.5773489358593717}, 1e-12},
		{"grpo", Verl, false, one, r1000, nil, []float64{1.499997, -0.499999, -0.499999, -0.499999}, 1e-6},
		{"grpo", TRL, false, one, r1000, nil, []float64{1.4997, -0.4999, -0.4999, -0.4999}, 1e-4},
		{"grpo", RLLM, true, one, r1000, nil, []float64{0.75, -0.25, -0.25, -0.25}, 1e-15},
		{"grpo", RLLM, false, []int32{0, 1}, []float64{0.5}, nil, []float64{0.4999995}, 1e-12},
		{"grpo", Verl, false, []int32{0, 1}, []float64{0.5}, nil, []float64{0.4999995}, 1e-12},
		{"grpo", TRL, false, []int32{0, 1}, []float64{0.5}, nil, []float64{0}, 0},
		{"grpo", RLLM, false, []int32{0, 3}, []float64{1, 1, 1}, nil, []float64{0, 0, 0}, 0},
		{"rloo", RLLM, false, one, r1000, nil, []float64{1, -1.0 / 3, -1.0 / 3, -1.0 / 3}, 1e-15},
		{"rloo", TRL, false, one, r1000, nil, []float64{1, -1.0 / 3, -1.0 / 3, -1.0 / 3}, 1e-15},
		{"rloo", RLLM, false, []int32{0, 1}, []float64{0.5}, nil, []float64{0.5}, 0},
		{"rloo", Verl, false, []int32{0, 1}, []float64{0.5}, nil, []float64{0.5}, 0},
		{"rloo", TRL, false, []int32{0, 1}, []float64{0.5}, nil, []float64{0}, 0},
		{"reinforce", TRL, false, []int32{0, 1, 3}, []float64{0.5, 1, 0}, nil, []float64{0.5, 1, 0}, 0},
		{"opo", RLLM, false, one, r1000, []int64{10, 10, 10, 10}, []float64{0.75, -0.25, -0.25, -0.25}, 1e-15},
		{"opo", Verl, false, one, r1000, []int64{10, 20, 30, 40}, []float64{0.9, -0.1, -0.1, -0.1}, 1e-15},
		{"opo", RLLM, false, []int32{0, 2}, []float64{1, 0}, []int64{0, 0}, []float64{1, 0}, 0},
		{"grpo_passk", Verl, false, one, r1000, nil, []float64{1.999996000008, 0, 0, 0}, 1e-9},
		{"grpo_passk", RLLM, false, one, []float64{0, 1, 0.5, 1}, nil, []float64{0, 0, 0, 0}, 0},
		{"grpo_passk", RLLM, true, one, []float64{0, 1, 0.5, 0.25}, nil, []float64{0, 0.5, 0, 0}, 1e-15},
		{"none", RLLM, false, one, r1000, nil, []float64{0, 0, 0, 0}, 0},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s/%s/nostd=%v/%v", tc.est, tc.compat.Name, tc.noStd, tc.r), func(t *testing.T) {
			got := run(t, mustNew(t, tc.est, Options{Compat: tc.compat, NoStd: tc.noStd}), tc.offs, tc.r, tc.lens)
			for i, w := range tc.want {
				if math.Abs(got[i]-w) > tc.tol {
					t.Fatalf("A[%d] = %.17g, want %.17g", i, got[i], w)
				}
			}
		})
	}
}

// reference is a deliberately plain implementation: a map of groups, each
// formula written straight from its definition.
func reference(name string, o Options, groupOf []int, r []float64, lens []int64) []float64 {
	groups := map[int][]int{}
	for i, g := range groupOf {
		groups[g] = append(groups[g], i)
	}
	out := make([]float64, len(r))
	for _, idx := range groups {
		n := float64(len(idx))
		if len(idx) == 1 && name != "reinforce" {
			i := idx[0]
			switch {
			case o.Compat.SingletonZero || name == "none":
				out[i] = 0
			case (name == "grpo" || name == "grpo_passk") && !o.NoStd:
				out[i] = r[i] / (1 + o.Compat.Eps)
			default:
				out[i] = r[i]
			}
			continue
		}
		sum := 0.0
		for _, i := range idx {
			sum += r[i]
		}
		mean := sum / n
		variance := 0.0
		for _, i := range idx {
			variance += (r[i] - mean) * (r[i] - mean)
		}
		if o.Compat.SampleStd {
			variance /= n - 1
		} else {
			variance /= n
		}
		std := math.Sqrt(variance)
		for _, i := range idx {
			switch name {
			case "grpo":
				if o.NoStd {
					out[i] = r[i] - mean
				} else {
					out[i] = (r[i] - mean) / (std + o.Compat.Eps)
				}
			case "rloo":
				others := 0.0
				for _, j := range idx {
					if j != i {
						others += r[j]
					}
				}
				out[i] = r[i] - others/(n-1)
			case "reinforce":
				out[i] = r[i]
			case "opo":
				num, den := 0.0, 0.0
				for _, j := range idx {
					num += float64(lens[j]) * r[j]
					den += float64(lens[j])
				}
				base := 0.0
				if den > 0 {
					base = num / den
				}
				out[i] = r[i] - base
			case "grpo_passk":
				best := idx[0]
				for _, j := range idx {
					if r[j] > r[best] {
						best = j
					}
				}
				if i != best {
					out[i] = 0
					continue
				}
				second := math.Inf(-1)
				for _, j := range idx {
					if j != best && r[j] > second {
						second = r[j]
					}
				}
				out[i] = r[best] - second
				if !o.NoStd {
					out[i] /= std + o.Compat.Eps
				}
			case "none":
				out[i] = 0
			}
		}
	}
	return out
}

// randomGroups draws groups of sizes 1..64 with ties, equal rewards,
// Gaussian rewards, and magnitudes near 0 and near 1e9.
func randomGroups(rng *rand.Rand, iter int) (offsets []int32, groupOf []int, r []float64, lens []int64) {
	offsets = []int32{0}
	scale := []float64{1, 1e-9, 1e9, 1}[iter%4]
	shift := []float64{0, 0, 0, 1e9}[iter%4]
	for g := 0; g < 1+rng.IntN(20); g++ {
		n := 1 + rng.IntN(64)
		kind := rng.IntN(4)
		for range n {
			var v float64
			switch kind {
			case 0:
				v = float64(rng.IntN(2))
			case 1:
				v = 0.5
			default:
				v = rng.NormFloat64()
			}
			r = append(r, v*scale+shift)
			groupOf = append(groupOf, g)
			lens = append(lens, int64(rng.IntN(3)*rng.IntN(500)))
		}
		offsets = append(offsets, int32(len(r)))
	}
	return
}

func TestEstimatorsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, name := range Names() {
		for _, c := range []Compat{RLLM, Verl, TRL} {
			for _, noStd := range []bool{false, true} {
				if noStd && name != "grpo" && name != "grpo_passk" {
					continue
				}
				est := mustNew(t, name, Options{Compat: c, NoStd: noStd})
				for iter := 0; iter < 200; iter++ {
					offs, groupOf, r, lens := randomGroups(rng, iter)
					got := run(t, est, offs, r, lens)
					want := reference(name, Options{Compat: c, NoStd: noStd}, groupOf, r, lens)
					for i := range want {
						if math.IsNaN(got[i]) || math.IsInf(got[i], 0) {
							t.Fatalf("%s/%s iter %d: A[%d] = %v", name, c.Name, iter, i, got[i])
						}
						// Relative to the rewards' magnitude: near 1e9 the
						// two-pass mean and the textbook one differ in the
						// last bits.
						tol := 1e-6 * math.Max(1, math.Abs(want[i]))
						if math.Abs(got[i]-want[i]) > tol {
							t.Fatalf("%s/%s nostd=%v iter %d: A[%d] = %.17g, want %.17g", name, c.Name, noStd, iter, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}

func TestExtremeRewardsStayFinite(t *testing.T) {
	r := []float64{1.5e308, 1.6e308, -1.7e308, math.MaxFloat64}
	for _, name := range Names() {
		for _, c := range []Compat{RLLM, Verl, TRL} {
			got := run(t, mustNew(t, name, Options{Compat: c}), []int32{0, 4}, r, []int64{1, 2, 3, 4})
			for i, v := range got {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("%s/%s: A[%d] = %v", name, c.Name, i, v)
				}
			}
			if name == "grpo" && (got[3] <= 0 || got[2] >= 0) {
				t.Fatalf("grpo order lost: %v", got)
			}
		}
	}
}

func TestGroupsValidate(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	r := f64(mem, []float64{1, 2})
	defer r.Release()
	est := mustNew(t, "grpo", Options{})
	for _, offs := range [][]int32{{}, {1, 2}, {0, 3}, {0, 2, 1, 2}} {
		if _, err := est.Compute(mem, Groups{Offsets: offs, Rewards: r}); err == nil {
			t.Errorf("offsets %v accepted", offs)
		}
	}
	if _, err := mustNew(t, "opo", Options{}).Compute(mem, Groups{Offsets: []int32{0, 2}, Rewards: r}); err == nil {
		t.Error("opo without lengths accepted")
	}
	if _, err := New("nope", Options{}); err == nil {
		t.Error("unknown estimator accepted")
	}
	if _, err := CompatByName("torch"); err == nil {
		t.Error("unknown compat accepted")
	}
}

func TestBroadcast(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	adv := f64(mem, []float64{1, -1})
	defer adv.Release()
	out := Broadcast(mem, adv, []int32{0, 0, 0, 1})
	defer out.Release()
	for i, w := range []float64{1, 1, 1, -1} {
		if out.Value(i) != w {
			t.Fatalf("row %d = %v, want %v", i, out.Value(i), w)
		}
	}
}

// benchInput is 1M trajectories in groups of size with binary rewards and
// realistic response lengths.
func benchInput(n, size int) (offs []int32, groupOf []int, r []float64, lens []int64) {
	rng := rand.New(rand.NewPCG(3, 4))
	offs = []int32{0}
	r = make([]float64, n)
	lens = make([]int64, n)
	groupOf = make([]int, n)
	for i := range r {
		r[i] = float64(rng.IntN(2))
		lens[i] = int64(64 + rng.IntN(512))
		groupOf[i] = i / size
		if (i+1)%size == 0 || i == n-1 {
			offs = append(offs, int32(i+1))
		}
	}
	return
}

// BenchmarkEstimators measures each estimator over pre-grouped Arrow
// columns (1M rows, groups of 8 and 64) next to the plain per-group map
// reference in the same run.
func BenchmarkEstimators(b *testing.B) {
	const n = 1 << 20
	for _, size := range []int{8, 64} {
		offs, groupOf, r, lens := benchInput(n, size)
		mem := memory.NewGoAllocator()
		ra, la := f64(mem, r), i64(mem, lens)
		g := Groups{Offsets: offs, Rewards: ra, Lengths: la}
		for _, name := range Names() {
			est := mustNew(b, name, Options{Compat: RLLM})
			b.Run(fmt.Sprintf("%s/group=%d", name, size), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(n * 8)
				for b.Loop() {
					a, err := est.Compute(mem, g)
					if err != nil {
						b.Fatal(err)
					}
					a.Release()
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
			})
		}
		b.Run(fmt.Sprintf("grpo-naive-map-baseline/group=%d", size), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(n * 8)
			for b.Loop() {
				reference("grpo", Options{Compat: RLLM}, groupOf, r, lens)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
		})
		ra.Release()
		la.Release()
	}
}
