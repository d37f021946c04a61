package schemas

import (
	"math/rand/v2"
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
