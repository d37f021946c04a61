package advantage

import (
	"fmt"
	"math"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Groups is the input of an estimator: trajectory-level columns cut into
// groups by Offsets (len = number of groups + 1, starting at 0 and ending
// at Rewards.Len()).
type Groups struct {
	Offsets []int32
	Rewards *array.Float64
}

// Validate checks that the offsets describe the reward column.
func (g Groups) Validate() error {
	if len(g.Offsets) == 0 || g.Offsets[0] != 0 {
		return fmt.Errorf("advantage: offsets must start at 0")
	}
	if int(g.Offsets[len(g.Offsets)-1]) != g.Rewards.Len() {
		return fmt.Errorf("advantage: offsets end at %d, rewards have %d values", g.Offsets[len(g.Offsets)-1], g.Rewards.Len())
	}
	for i := 1; i < len(g.Offsets); i++ {
		if g.Offsets[i] < g.Offsets[i-1] {
			return fmt.Errorf("advantage: offsets decrease at group %d", i-1)
		}
	}
	if g.Rewards.NullN() > 0 {
		return fmt.Errorf("advantage: %d null rewards", g.Rewards.NullN())
	}
	return nil
}

// Estimator computes one advantage per trajectory.
type Estimator interface {
	// Name is the estimator's registry name.
	Name() string
	// Compute returns a new Float64 array (allocated from mem, owned by the
	// caller) with the advantage of every trajectory in g.
	Compute(mem memory.Allocator, g Groups) (*array.Float64, error)
}

// GRPO is group-relative normalisation: A = (r − μ)/(σ + Eps).
type GRPO struct {
	// Eps is added to the standard deviation. rLLM and verl use 1e-6.
	Eps float64
	// SampleStd selects the sample (n−1) standard deviation (verl, TRL)
	// instead of the population one (rLLM).
	SampleStd bool
	// NoStd drops the division (Dr. GRPO): A = r − μ.
	NoStd bool
}

// RLLMGRPO is GRPO in rLLM's convention: population std, ε = 1e-6, and a
// group of one normalised with μ = 0, σ = 1.
var RLLMGRPO = GRPO{Eps: 1e-6}

// Name implements Estimator.
func (GRPO) Name() string { return "grpo" }

// Compute implements Estimator.
func (e GRPO) Compute(mem memory.Allocator, g Groups) (*array.Float64, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	out, vals := newFloat64(mem, g.Rewards.Len())
	e.compute(g.Offsets, g.Rewards.Float64Values(), vals)
	return out, nil
}

// newFloat64 allocates a Float64 array of n values from mem, with no null
// bitmap, and returns it with a view of its values for a kernel to fill.
func newFloat64(mem memory.Allocator, n int) (*array.Float64, []float64) {
	buf := memory.NewResizableBuffer(mem)
	buf.Resize(n * arrow.Float64SizeBytes)
	data := array.NewData(arrow.PrimitiveTypes.Float64, n, []*memory.Buffer{nil, buf}, nil, 0, 0)
	buf.Release()
	out := array.NewFloat64Data(data)
	data.Release()
	return out, out.Float64Values()
}

// compute is the kernel over plain slices: two passes per group, no
// allocation.
func (e GRPO) compute(offsets []int32, r, out []float64) {
	for gi := 0; gi+1 < len(offsets); gi++ {
		lo, hi := offsets[gi], offsets[gi+1]
		n := hi - lo
		if n == 0 {
			continue
		}
		rs := r[lo:hi]
		os := out[lo:hi]
		if n == 1 {
			// rLLM and verl: a lone trajectory is scaled with μ = 0, σ = 1.
			if e.NoStd {
				os[0] = rs[0]
			} else {
				os[0] = rs[0] / (1 + e.Eps)
			}
			continue
		}
		var sum float64
		for _, v := range rs {
			sum += v
		}
		mean := sum / float64(n)
		if e.NoStd {
			for i, v := range rs {
				os[i] = v - mean
			}
			continue
		}
		var ss float64
		for _, v := range rs {
			d := v - mean
			ss += d * d
		}
		den := float64(n)
		if e.SampleStd {
			den--
		}
		inv := 1 / (math.Sqrt(ss/den) + e.Eps)
		for i, v := range rs {
			os[i] = (v - mean) * inv
		}
	}
}

// Broadcast copies each trajectory's advantage to its rows: rowTraj[i] is
// the trajectory index of row i. The result is allocated from mem.
func Broadcast(mem memory.Allocator, adv *array.Float64, rowTraj []int32) *array.Float64 {
	vals := adv.Float64Values()
	out, dst := newFloat64(mem, len(rowTraj))
	for i, t := range rowTraj {
		dst[i] = vals[t]
	}
	return out
}
