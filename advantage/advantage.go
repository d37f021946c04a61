package advantage

import (
	"fmt"
	"math"
	"sort"
	"strings"

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
	// Lengths holds each trajectory's response tokens over all its steps;
	// only estimators that weigh by length (opo) read it.
	Lengths *array.Int64
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
	if g.Lengths != nil && (g.Lengths.Len() != g.Rewards.Len() || g.Lengths.NullN() > 0) {
		return fmt.Errorf("advantage: %d lengths (%d null) for %d rewards", g.Lengths.Len(), g.Lengths.NullN(), g.Rewards.Len())
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

// Compat is a framework's numerical conventions.
type Compat struct {
	Name string
	// SampleStd selects the sample (n−1) standard deviation instead of the
	// population one.
	SampleStd bool
	// Eps is added to the standard deviation.
	Eps float64
	// SingletonZero gives a group of one the advantage 0 (TRL); otherwise
	// a lone trajectory is normalised with μ = 0, σ = 1 (rLLM, verl).
	SingletonZero bool
}

// The presets of --compat.
var (
	RLLM = Compat{Name: "rllm", Eps: 1e-6}
	Verl = Compat{Name: "verl", SampleStd: true, Eps: 1e-6}
	TRL  = Compat{Name: "trl", SampleStd: true, Eps: 1e-4, SingletonZero: true}
)

// CompatByName returns the preset called name.
func CompatByName(name string) (Compat, error) {
	for _, c := range []Compat{RLLM, Verl, TRL} {
		if c.Name == name {
			return c, nil
		}
	}
	return Compat{}, fmt.Errorf("unknown compat %q (have rllm, verl, trl)", name)
}

// Options select an estimator's conventions.
type Options struct {
	Compat Compat
	// NoStd drops the division by σ+ε (Dr. GRPO) in grpo and grpo_passk.
	NoStd bool
}

// kernel computes the advantages of one group of n >= 2 trajectories
// (r, len) into out. Singleton groups are handled by the caller.
type kernel func(o Options, r []float64, lens []int64, out []float64)

type estimator struct {
	name      string
	opts      Options
	k         kernel
	singleton func(o Options, r float64) float64
	lengths   bool
}

var registry = map[string]func(Options) *estimator{
	"grpo": func(o Options) *estimator {
		return &estimator{name: "grpo", opts: o, k: grpo, singleton: scaledSingleton}
	},
	"rloo": func(o Options) *estimator { return &estimator{name: "rloo", opts: o, k: rloo, singleton: rawSingleton} },
	"reinforce": func(o Options) *estimator {
		return &estimator{name: "reinforce", opts: o, k: reinforce, singleton: identity}
	},
	"opo": func(o Options) *estimator {
		return &estimator{name: "opo", opts: o, k: opo, singleton: rawSingleton, lengths: true}
	},
	"grpo_passk": func(o Options) *estimator {
		return &estimator{name: "grpo_passk", opts: o, k: passk, singleton: scaledSingleton}
	},
	"none": func(o Options) *estimator {
		return &estimator{name: "none", opts: o, k: zero, singleton: zeroSingleton}
	},
}

// New returns the registered estimator called name.
func New(name string, o Options) (Estimator, error) {
	f, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown estimator %q (have %s)", name, strings.Join(Names(), ", "))
	}
	if o.Compat.Name == "" {
		o.Compat = RLLM
	}
	return f(o), nil
}

// Names lists the registered estimators.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// NeedsLengths reports whether e reads Groups.Lengths.
func NeedsLengths(e Estimator) bool {
	x, ok := e.(*estimator)
	return ok && x.lengths
}

func (e *estimator) Name() string { return e.name }

// Compute implements Estimator.
func (e *estimator) Compute(mem memory.Allocator, g Groups) (*array.Float64, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if e.lengths && g.Lengths == nil {
		return nil, fmt.Errorf("advantage: %s needs response lengths", e.name)
	}
	out, vals := newFloat64(mem, g.Rewards.Len())
	var lens []int64
	if g.Lengths != nil {
		lens = g.Lengths.Int64Values()
	}
	e.compute(g.Offsets, g.Rewards.Float64Values(), lens, vals)
	return out, nil
}

func (e *estimator) compute(offsets []int32, r []float64, lens []int64, out []float64) {
	for gi := 0; gi+1 < len(offsets); gi++ {
		lo, hi := offsets[gi], offsets[gi+1]
		switch hi - lo {
		case 0:
		case 1:
			if e.opts.Compat.SingletonZero && e.name != "reinforce" {
				out[lo] = 0
			} else {
				out[lo] = e.singleton(e.opts, r[lo])
			}
		default:
			var l []int64
			if lens != nil {
				l = lens[lo:hi]
			}
			e.k(e.opts, r[lo:hi], l, out[lo:hi])
			// x*0 is NaN only for a non-finite x: one multiply-add per value
			// detects sums that overflowed on rewards near ±MaxFloat64.
			var probe float64
			for _, v := range out[lo:hi] {
				probe += v * 0
			}
			if probe != 0 {
				e.scaled(r[lo:hi], l, out[lo:hi])
			}
		}
	}
}

// scaled recomputes a group whose rewards are so large that a sum
// overflowed: on rewards divided by their largest magnitude s, with ε/s for
// std-normalised estimators (whose result does not scale) and the result
// multiplied back by s for the others, clamped to the finite range.
func (e *estimator) scaled(r []float64, lens []int64, out []float64) {
	s := 0.0
	for _, v := range r {
		s = math.Max(s, math.Abs(v))
	}
	rs := make([]float64, len(r))
	for i, v := range r {
		rs[i] = v / s
	}
	o := e.opts
	normalised := !o.NoStd && (e.name == "grpo" || e.name == "grpo_passk")
	if normalised {
		o.Compat.Eps /= s
	}
	e.k(o, rs, lens, out)
	if normalised {
		return
	}
	for i, v := range out {
		out[i] = math.Max(-math.MaxFloat64, math.Min(math.MaxFloat64, v*s))
	}
}

// Singleton rules for rLLM and verl: μ = 0 and σ = 1.
func scaledSingleton(o Options, r float64) float64 {
	if o.NoStd {
		return r
	}
	return r / (1 + o.Compat.Eps)
}
func rawSingleton(_ Options, r float64) float64  { return r }
func identity(_ Options, r float64) float64      { return r }
func zeroSingleton(_ Options, _ float64) float64 { return 0 }

// meanStd returns the mean and the standard deviation of r under o's
// convention (two passes, for accuracy with large offsets).
func meanStd(o Options, r []float64) (mean, std float64) {
	var sum float64
	for _, v := range r {
		sum += v
	}
	n := float64(len(r))
	mean = sum / n
	var ss float64
	for _, v := range r {
		d := v - mean
		ss += d * d
	}
	if o.Compat.SampleStd {
		n--
	}
	return mean, math.Sqrt(ss / n)
}

// grpo: (r − μ)/(σ + ε), or r − μ without std.
func grpo(o Options, r []float64, _ []int64, out []float64) {
	if o.NoStd {
		var sum float64
		for _, v := range r {
			sum += v
		}
		mean := sum / float64(len(r))
		for i, v := range r {
			out[i] = v - mean
		}
		return
	}
	mean, std := meanStd(o, r)
	inv := 1 / (std + o.Compat.Eps)
	for i, v := range r {
		out[i] = (v - mean) * inv
	}
}

// rloo: n/(n−1)·(r − μ) = r − mean of the others.
func rloo(_ Options, r []float64, _ []int64, out []float64) {
	var sum float64
	for _, v := range r {
		sum += v
	}
	n := float64(len(r))
	for i, v := range r {
		out[i] = v - (sum-v)/(n-1)
	}
}

// reinforce: r.
func reinforce(_ Options, r []float64, _ []int64, out []float64) { copy(out, r) }

// opo: r − Σ lenⱼ·rⱼ / Σ lenⱼ. With no response tokens at all the
// baseline is 0, as in rLLM's port (verl would divide by zero).
func opo(_ Options, r []float64, lens []int64, out []float64) {
	var wsum, wtot float64
	for i, v := range r {
		wsum += float64(lens[i]) * v
		wtot += float64(lens[i])
	}
	base := 0.0
	if wtot > 0 {
		base = wsum / wtot
	}
	for i, v := range r {
		out[i] = v - base
	}
}

// passk: only the best trajectory (the first of equal maxima) gets
// (r_max − r_second)/(σ + ε); the others 0.
func passk(o Options, r []float64, _ []int64, out []float64) {
	best := 0
	for i, v := range r {
		if v > r[best] {
			best = i
		}
	}
	second := math.Inf(-1)
	for i, v := range r {
		if i != best && v > second {
			second = v
		}
	}
	clear(out)
	a := r[best] - second
	if !o.NoStd {
		_, std := meanStd(o, r)
		a /= std + o.Compat.Eps
	}
	out[best] = a
}

func zero(_ Options, _ []float64, _ []int64, out []float64) { clear(out) }

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
