package advantage

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// BatchGroups is the input of a batch-level estimator: the groups of one
// training batch, with each trajectory's role for per-role estimators.
type BatchGroups struct {
	Groups
	// Roles holds each trajectory's role (PRPO normalises per role); nil
	// means one role for the whole batch.
	Roles *array.String
}

// BatchEstimator computes advantages whose value depends on the whole
// training batch, not only the group. They are applied where batches are
// formed (the trainer side), with the same column layout as Estimator.
type BatchEstimator interface {
	Name() string
	ComputeBatch(mem memory.Allocator, b BatchGroups) (*array.Float64, error)
}

type batchEstimator struct {
	name string
	opts Options
	f    func(o Options, offsets []int32, r []float64, lens []int64, roles *array.String, out []float64)
	lens bool
}

var batchRegistry = map[string]func(Options) *batchEstimator{
	"reinforce_plus_plus_baseline": func(o Options) *batchEstimator {
		return &batchEstimator{name: "reinforce_plus_plus_baseline", opts: o, f: reinforcePPBaseline, lens: o.Compat.Name == Verl.Name}
	},
	"prpo":      func(o Options) *batchEstimator { return &batchEstimator{name: "prpo", opts: o, f: prpo} },
	"batch_std": func(o Options) *batchEstimator { return &batchEstimator{name: "batch_std", opts: o, f: batchStd} },
}

// NewBatch returns the registered batch-level estimator called name.
func NewBatch(name string, o Options) (BatchEstimator, error) {
	f, ok := batchRegistry[name]
	if !ok {
		names := make([]string, 0, len(batchRegistry))
		for n := range batchRegistry {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("unknown batch estimator %q (have %s)", name, strings.Join(names, ", "))
	}
	if o.Compat.Name == "" {
		o.Compat = RLLM
	}
	return f(o), nil
}

func (e *batchEstimator) Name() string { return e.name }

// ComputeBatch implements BatchEstimator.
func (e *batchEstimator) ComputeBatch(mem memory.Allocator, b BatchGroups) (*array.Float64, error) {
	if err := b.Validate(); err != nil {
		return nil, err
	}
	if e.lens && b.Lengths == nil {
		return nil, fmt.Errorf("advantage: %s with verl conventions weighs by response tokens: lengths needed", e.name)
	}
	if b.Roles != nil && b.Roles.Len() != b.Rewards.Len() {
		return nil, fmt.Errorf("advantage: %d roles for %d rewards", b.Roles.Len(), b.Rewards.Len())
	}
	out, vals := newFloat64(mem, b.Rewards.Len())
	var lens []int64
	if e.lens {
		lens = b.Lengths.Int64Values()
	}
	e.f(e.opts, b.Offsets, b.Rewards.Float64Values(), lens, b.Roles, vals)
	return out, nil
}

// centre writes r − μ_group into out. A group of one keeps r (baseline 0)
// under verl's conventions and gets 0 (its own mean subtracted) otherwise.
func centre(o Options, offsets []int32, r, out []float64) {
	for gi := 0; gi+1 < len(offsets); gi++ {
		lo, hi := offsets[gi], offsets[gi+1]
		if hi-lo == 1 && o.Compat.Name == Verl.Name {
			out[lo] = r[lo]
			continue
		}
		var sum float64
		for _, v := range r[lo:hi] {
			sum += v
		}
		mean := sum / float64(hi-lo)
		for i := lo; i < hi; i++ {
			out[i] = r[i] - mean
		}
	}
}

// reinforcePPBaseline: r − μ_group, then normalised over the batch.
//   - rllm: divided by the batch's population std + ε (no second centring).
//   - verl: whitened over response tokens (each trajectory weighs its
//     token count): (x − mean_w)/sqrt(var_w·N/(N−1) + 1e-8), N the tokens.
//   - trl (which has no such estimator): whitened over trajectories with
//     the sample std + ε.
func reinforcePPBaseline(o Options, offsets []int32, r []float64, lens []int64, _ *array.String, out []float64) {
	centre(o, offsets, r, out)
	switch o.Compat.Name {
	case Verl.Name:
		var n, sum float64
		for i, x := range out {
			w := float64(lens[i])
			n += w
			sum += w * x
		}
		if n <= 1 {
			return // verl raises; leave the centred values
		}
		mean := sum / (n + 1e-8)
		var ss float64
		for i, x := range out {
			d := x - mean
			ss += float64(lens[i]) * d * d
		}
		inv := 1 / math.Sqrt(ss/(n+1e-8)*n/(n-1)+1e-8)
		for i, x := range out {
			out[i] = (x - mean) * inv
		}
	case RLLM.Name:
		_, std := meanStd(Options{Compat: Compat{SampleStd: false}}, out)
		inv := 1 / (std + o.Compat.Eps)
		for i := range out {
			out[i] *= inv
		}
	default:
		if len(out) < 2 {
			return
		}
		mean, std := meanStd(o, out)
		inv := 1 / (std + o.Compat.Eps)
		for i, x := range out {
			out[i] = (x - mean) * inv
		}
	}
}

// prpo (rLLM): (r − μ_role)/(σ_role + ε) over the batch's trajectories of
// each role, ignoring group boundaries.
func prpo(o Options, _ []int32, r []float64, _ []int64, roles *array.String, out []float64) {
	byRole := map[string][]int{}
	for i := range r {
		role := ""
		if roles != nil && roles.IsValid(i) {
			role = roles.Value(i)
		}
		byRole[role] = append(byRole[role], i)
	}
	vals := make([]float64, 0, len(r))
	for _, idx := range byRole {
		vals = vals[:0]
		for _, i := range idx {
			vals = append(vals, r[i])
		}
		if len(vals) < 2 && o.Compat.SampleStd {
			for _, i := range idx {
				out[i] = 0
			}
			continue
		}
		mean, std := meanStd(o, vals)
		inv := 1 / (std + o.Compat.Eps)
		for _, i := range idx {
			out[i] = (r[i] - mean) * inv
		}
	}
}

// batchStd (TRL scale_rewards="batch"): (r − μ_group)/(σ_batch + ε), σ over
// every reward of the batch. A group of one gets 0 (r minus its own mean).
func batchStd(o Options, offsets []int32, r []float64, _ []int64, _ *array.String, out []float64) {
	centre(Options{Compat: TRL}, offsets, r, out)
	if len(r) < 2 && o.Compat.SampleStd {
		return
	}
	_, std := meanStd(o, r)
	inv := 1 / (std + o.Compat.Eps)
	for i := range out {
		out[i] *= inv
	}
}
