package schemas

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestRangesAgainstAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for iter := 0; iter < 200; iter++ {
		var r Ranges
		set := map[int64]bool{}
		for k := 0; k < 50; k++ {
			lo := int64(rng.IntN(200))
			hi := lo + int64(rng.IntN(5))
			r.Add(lo, hi)
			for x := lo; x <= hi; x++ {
				set[x] = true
			}
		}
		for x := int64(-2); x < 210; x++ {
			if r.Contains(x) != set[x] {
				t.Fatalf("iter %d: Contains(%d) = %v, want %v (%v)", iter, x, r.Contains(x), set[x], r)
			}
		}
		if r.Len() != int64(len(set)) {
			t.Fatalf("Len %d, want %d", r.Len(), len(set))
		}
		for i := 1; i < len(r); i++ {
			if r[i][0] <= r[i-1][1]+1 {
				t.Fatalf("not normalised: %v", r)
			}
		}
	}
}

// TestRangesUnion: the merge equals adding o's intervals one by one, for
// fragmented sets of every overlap, and for an o out of order.
func TestRangesUnion(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	random := func(n int) Ranges {
		var r Ranges
		for range n {
			lo := int64(rng.IntN(400))
			r.Add(lo, lo+int64(rng.IntN(4)))
		}
		return r
	}
	for iter := range 500 {
		a, b := random(rng.IntN(60)), random(rng.IntN(60))
		if iter%50 == 0 && len(b) > 1 {
			b[0], b[len(b)-1] = b[len(b)-1], b[0] // not sorted
		}
		want := append(Ranges(nil), a...)
		for _, iv := range b {
			want.Add(iv[0], iv[1])
		}
		got := append(Ranges(nil), a...)
		got.Union(b)
		if !slices.Equal(got, want) {
			t.Fatalf("iter %d: %v ∪ %v = %v, want %v", iter, a, b, got, want)
		}
	}
}

// BenchmarkRangesUnion: a store's settled set and a commit's, both of n
// interleaved intervals (every other position).
func BenchmarkRangesUnion(b *testing.B) {
	for _, n := range []int{1_000, 100_000} {
		b.Run(fmt.Sprint("intervals=", n), func(b *testing.B) {
			var store, commit Ranges
			for i := range int64(n) {
				store = append(store, [2]int64{4 * i, 4 * i})
				commit = append(commit, [2]int64{4*i + 2, 4*i + 2})
			}
			for b.Loop() {
				r := append(Ranges(nil), store...)
				r.Union(commit)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(2*n), "ns/interval")
		})
	}
}

func TestSettled(t *testing.T) {
	s := Settled{}
	s.Add("f", 3)
	s.Add("f", 4)
	s.Add("", 9) // untracked stream (stdin)
	o := Settled{"f": {{10, 12}}, "g": {{1, 1}}}
	s.Union(o)
	if len(s["f"]) != 2 || !s.Contains(Source{Stream: "f", Line: 11}) || s.Contains(Source{Stream: "f", Line: 5}) ||
		s.Contains(Source{Line: 9}) || !s.Contains(Source{Stream: "g", Topic: "t", Offset: 1}) {
		t.Fatalf("%v", s)
	}
}

func TestLedger(t *testing.T) {
	var l Ledger
	l.Drop() // before any note: must leave the ledger usable
	l.Note([]DeadLetter{{Reason: ReasonLate, Source: Source{Stream: "s", Line: 3}}}, []Source{{Stream: "s", Line: 4}, {Line: 9}})
	if c := l.Counts(); c[ReasonLate] != 1 || len(c) != 1 {
		t.Fatalf("counts %v", c)
	}
	if p := l.Take(); len(p["s"]) != 1 || p["s"][0] != [2]int64{3, 4} {
		t.Fatalf("taken %v", p)
	}
	if p := l.Take(); p != nil {
		t.Fatalf("taken twice: %v", p)
	}
	l.Note(nil, []Source{{Stream: "s", Line: 5}})
	l.Drop()
	if p := l.Take(); p != nil {
		t.Fatalf("dropped positions came back: %v", p)
	}
}
