package train

import (
	"math"
	"time"
)

// Freshness is how long after their last trajectory finished at the
// capture gateway groups were delivered to the trainer: the age of the
// data it trains on. Groups without the time (records not captured by the
// gateway) are not counted.
type Freshness struct {
	Groups int64   `json:"groups"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
}

// ageBuckets are the upper bounds of the age histogram: 1 ms doubling to
// about 9 days; quantiles are read at a bucket's upper bound (within a
// factor of two, exact at the maximum).
const ageBuckets = 40

// ageHist is a histogram of ages.
type ageHist struct {
	n      int64
	counts [ageBuckets + 1]int64
	max    time.Duration
}

func ageBucket(d time.Duration) int {
	if d <= time.Millisecond {
		return 0
	}
	b := int(math.Ceil(math.Log2(float64(d) / float64(time.Millisecond))))
	return min(b, ageBuckets)
}

func (h *ageHist) add(d time.Duration) {
	d = max(d, 0)
	h.n++
	h.counts[ageBucket(d)]++
	h.max = max(h.max, d)
}

// quantile is the upper bound of the bucket holding quantile q, at most
// the largest age seen.
func (h *ageHist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	var seen int64
	for b, c := range h.counts {
		if seen += c; seen >= rank {
			return min(time.Duration(math.Exp2(float64(b)))*time.Millisecond, h.max)
		}
	}
	return h.max
}

func (h *ageHist) summary() Freshness {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	return Freshness{Groups: h.n, P50Ms: ms(h.quantile(0.5)), P99Ms: ms(h.quantile(0.99)), MaxMs: ms(h.max)}
}

// Ages returns the age of each group of b at now (-1 where its finish
// time is unknown), in b.Groups' order.
func (b *Batch) Ages(now time.Time) []time.Duration {
	out := make([]time.Duration, len(b.Groups))
	for i := range out {
		out[i] = -1
		if i < len(b.Finished) && !b.Finished[i].IsZero() {
			out[i] = max(now.Sub(b.Finished[i]), 0)
		}
	}
	return out
}
