package compare

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// rounds is how many times each benchmark runs its contenders, alternated
// (round 1: a, b, c; round 2: a, b, c; ...), so that all of them see the
// same machine; the summary prints the median and the spread.
const rounds = 3

// results collects the last (largest b.N) timing of every contender in
// every round, for the summary TestMain prints.
var results = struct {
	sync.Mutex
	order []string
	ns    map[string]map[int]float64 // contender → round → ns/op
	extra map[string]string          // contender → a note (e.g. the file size)
}{ns: map[string]map[int]float64{}, extra: map[string]string{}}

// note records one round of a contender; call it at the end of the
// benchmark function.
func note(b *testing.B, contender string, round int) {
	results.Lock()
	defer results.Unlock()
	if results.ns[contender] == nil {
		results.ns[contender] = map[int]float64{}
		results.order = append(results.order, contender)
	}
	results.ns[contender][round] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

// noteExtra attaches a note to a contender's summary line.
func noteExtra(contender, s string) {
	results.Lock()
	defer results.Unlock()
	results.extra[contender] = s
}

// forRounds runs each contender once per round, alternated.
func forRounds(b *testing.B, contenders []string, run func(b *testing.B, contender string)) {
	for r := 1; r <= rounds; r++ {
		for _, c := range contenders {
			b.Run(fmt.Sprintf("round%d/%s", r, c), func(b *testing.B) {
				run(b, c)
				note(b, b.Name()[:strings.Index(b.Name(), "/round")]+"/"+c, r)
			})
		}
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	results.Lock()
	defer results.Unlock()
	if len(results.order) > 0 {
		fmt.Printf("\nsummary: median of %d alternated rounds (min-max); relative to the first contender of each benchmark\n", rounds)
		base := map[string]float64{}
		for _, c := range results.order {
			var v []float64
			for _, x := range results.ns[c] {
				v = append(v, x)
			}
			sort.Float64s(v)
			med := v[len(v)/2]
			if len(v)%2 == 0 {
				med = (v[len(v)/2-1] + v[len(v)/2]) / 2
			}
			group := c[:strings.LastIndex(c, "/")]
			if _, ok := base[group]; !ok {
				base[group] = med
			}
			fmt.Printf("  %-40s %10s (%s–%s)  %.2fx  %s\n", c, time.Duration(med).Round(time.Microsecond),
				time.Duration(slices.Min(v)).Round(time.Microsecond), time.Duration(slices.Max(v)).Round(time.Microsecond),
				med/base[group], results.extra[c])
		}
	}
	os.Exit(code)
}
