package advantage

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

func rewards(mem memory.Allocator, r []float64) *array.Float64 {
	b := array.NewFloat64Builder(mem)
	defer b.Release()
	b.AppendValues(r, nil)
	return b.NewFloat64Array()
}

func TestGRPOLiteralVectors(t *testing.T) {
	cases := []struct {
		name    string
		est     GRPO
		offsets []int32
		r       []float64
		want    []float64
		tol     float64
	}{
		// ../shared/ANCHORS.md §2: rLLM's published numbers.
		{"rllm 1000", RLLMGRPO, []int32{0, 4}, []float64{1, 0, 0, 0}, []float64{1.732046807578115, -0.5773489358593717, -0.5773489358593717, -0.5773489358593717}, 1e-12},
		{"rllm lone", RLLMGRPO, []int32{0, 1}, []float64{0.5}, []float64{0.4999995}, 1e-12},
		{"verl 1000", GRPO{Eps: 1e-6, SampleStd: true}, []int32{0, 4}, []float64{1, 0, 0, 0}, []float64{1.499997, -0.499999, -0.499999, -0.499999}, 1e-6},
		{"trl 1000", GRPO{Eps: 1e-4, SampleStd: true}, []int32{0, 4}, []float64{1, 0, 0, 0}, []float64{1.4997, -0.4999, -0.4999, -0.4999}, 1e-4},
		{"dr grpo", GRPO{NoStd: true}, []int32{0, 4}, []float64{1, 0, 0, 0}, []float64{0.75, -0.25, -0.25, -0.25}, 1e-15},
		{"all equal", RLLMGRPO, []int32{0, 3}, []float64{1, 1, 1}, []float64{0, 0, 0}, 0},
		{"two groups and an empty one", RLLMGRPO, []int32{0, 2, 2, 4}, []float64{1, 0, 5, 5}, []float64{0.999998000004, -0.999998000004, 0, 0}, 1e-12},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			r := rewards(mem, tc.r)
			defer r.Release()
			got, err := tc.est.Compute(mem, Groups{Offsets: tc.offsets, Rewards: r})
			if err != nil {
				t.Fatal(err)
			}
			defer got.Release()
			for i, w := range tc.want {
				if math.Abs(got.Value(i)-w) > tc.tol {
					t.Fatalf("A[%d] = %.17g, want %.17g", i, got.Value(i), w)
				}
			}
		})
	}
}

// naiveGRPO is the reference: a per-group map of slices, the textbook
// formula, straight from the definition.
func naiveGRPO(groupOf []int, r []float64, eps float64) []float64 {
	byGroup := map[int][]int{}
	for i, g := range groupOf {
		byGroup[g] = append(byGroup[g], i)
	}
	out := make([]float64, len(r))
	for _, idx := range byGroup {
		if len(idx) == 1 {
			out[idx[0]] = (r[idx[0]] - 0) / (1 + eps)
			continue
		}
		mean := 0.0
		for _, i := range idx {
			mean += r[i]
		}
		mean /= float64(len(idx))
		v := 0.0
		for _, i := range idx {
			v += (r[i] - mean) * (r[i] - mean)
		}
		std := math.Sqrt(v / float64(len(idx)))
		for _, i := range idx {
			out[i] = (r[i] - mean) / (std + eps)
		}
	}
	return out
}

func TestGRPOProperty(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	for iter := 0; iter < 500; iter++ {
		offsets := []int32{0}
		var r []float64
		var groupOf []int
		scale := []float64{1, 1e-9, 1e9}[iter%3]
		for g := 0; g < 1+rng.IntN(20); g++ {
			n := 1 + rng.IntN(64)
			kind := rng.IntN(4)
			for range n {
				var v float64
				switch kind {
				case 0: // binary rewards, many ties
					v = float64(rng.IntN(2))
				case 1: // all equal
					v = 0.5
				default:
					v = rng.NormFloat64()
				}
				r = append(r, v*scale)
				groupOf = append(groupOf, g)
			}
			offsets = append(offsets, int32(len(r)))
		}
		ra := rewards(mem, r)
		got, err := RLLMGRPO.Compute(mem, Groups{Offsets: offsets, Rewards: ra})
		if err != nil {
			t.Fatal(err)
		}
		want := naiveGRPO(groupOf, r, 1e-6)
		for i := range want {
			g := got.Value(i)
			if math.IsNaN(g) || math.IsInf(g, 0) {
				t.Fatalf("iter %d: A[%d] = %v", iter, i, g)
			}
			if d := math.Abs(g - want[i]); d > 1e-9*math.Max(1, math.Abs(want[i])) {
				t.Fatalf("iter %d: A[%d] = %.17g, want %.17g", iter, i, g, want[i])
			}
		}
		got.Release()
		ra.Release()
	}
}

func TestGroupsValidate(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	r := rewards(mem, []float64{1, 2})
	defer r.Release()
	for _, offs := range [][]int32{{}, {1, 2}, {0, 3}, {0, 2, 1, 2}} {
		if _, err := RLLMGRPO.Compute(mem, Groups{Offsets: offs, Rewards: r}); err == nil {
			t.Errorf("offsets %v accepted", offs)
		}
	}
}

func TestBroadcast(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	adv := rewards(mem, []float64{1, -1})
	defer adv.Release()
	out := Broadcast(mem, adv, []int32{0, 0, 0, 1})
	defer out.Release()
	want := []float64{1, 1, 1, -1}
	for i, w := range want {
		if out.Value(i) != w {
			t.Fatalf("row %d = %v, want %v", i, out.Value(i), w)
		}
	}
}

// benchGroups builds 1M trajectories in groups of 8 (the common GRPO
// shape) with binary rewards.
func benchGroups(n, size int) ([]int32, []float64, []int) {
	rng := rand.New(rand.NewPCG(3, 4))
	offs := []int32{0}
	r := make([]float64, n)
	groupOf := make([]int, n)
	for i := range r {
		r[i] = float64(rng.IntN(2))
		groupOf[i] = i / size
		if (i+1)%size == 0 || i == n-1 {
			offs = append(offs, int32(i+1))
		}
	}
	return offs, r, groupOf
}

func BenchmarkGRPO(b *testing.B) {
	const n = 1 << 20
	offs, r, groupOf := benchGroups(n, 8)
	b.Run("kernel", func(b *testing.B) {
		out := make([]float64, n)
		b.ReportAllocs()
		b.SetBytes(n * 8)
		for b.Loop() {
			RLLMGRPO.compute(offs, r, out)
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("arrow", func(b *testing.B) {
		mem := memory.NewGoAllocator()
		ra := rewards(mem, r)
		defer ra.Release()
		b.ReportAllocs()
		b.SetBytes(n * 8)
		for b.Loop() {
			a, _ := RLLMGRPO.Compute(mem, Groups{Offsets: offs, Rewards: ra})
			a.Release()
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
	b.Run("naive-map-baseline", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(n * 8)
		for b.Loop() {
			naiveGRPO(groupOf, r, 1e-6)
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	})
}
