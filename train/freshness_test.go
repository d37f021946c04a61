package train

import (
	"testing"
	"time"
)

// The histogram's quantiles are within a factor of two above the true
// ones and never above the largest age; the maximum is exact.
func TestAgeQuantiles(t *testing.T) {
	var h ageHist
	if h.summary() != (Freshness{}) {
		t.Fatalf("empty: %+v", h.summary())
	}
	for i := 1; i <= 100; i++ {
		h.add(time.Duration(i) * 10 * time.Millisecond) // 10 ms .. 1 s
	}
	h.add(-time.Second) // a clock behind: counted as 0
	f := h.summary()
	if f.Groups != 101 || f.MaxMs != 1000 {
		t.Fatalf("%+v", f)
	}
	for _, c := range []struct{ got, truth float64 }{{f.P50Ms, 500}, {f.P99Ms, 990}} {
		if c.got < c.truth || c.got > 2*c.truth || c.got > f.MaxMs {
			t.Errorf("quantile %g ms for a true %g ms", c.got, c.truth)
		}
	}
}

func TestBatchAges(t *testing.T) {
	now := time.Now()
	b := Batch{Groups: []string{"a", "b", "c"}, Finished: []time.Time{now.Add(-3 * time.Second), {}, now.Add(time.Second)}}
	ages := b.Ages(now)
	if len(ages) != 3 || ages[0] != 3*time.Second || ages[1] != -1 || ages[2] != 0 {
		t.Fatalf("ages %v, want [3s -1 0]", ages)
	}
	if got := (&Batch{Groups: []string{"a"}}).Ages(now); got[0] != -1 {
		t.Fatalf("a batch without finish times (a replay): %v", got)
	}
}
