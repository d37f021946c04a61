package main

import (
	"slices"
	"strconv"
	"testing"
)

func TestMultiTurnShapes(t *testing.T) {
	for _, c := range []struct {
		shape string
		want  bool
	}{
		{"agents", true},
		{"agents-100", true},
		{"agents,agents-100", true},
		{"agents-text", true},
		{"agents-text-wire", false},
		{"steps", false},
		{"agents-wire", false},
		{"agents,steps", false},
	} {
		if got := multiTurn(c.shape); got != c.want {
			t.Errorf("multiTurn(%q) = %v, want %v", c.shape, got, c.want)
		}
	}
	for shape, want := range map[string]int{"steps": 8, "steps-nomsg": 8, "agents": 8, "agents-100": 4, "agents-100-wire": 4, "agents-text": 8, "agents-text-wire": 8} {
		if got := groupSize(shape); got != want {
			t.Errorf("groupSize(%q) = %d, want %d", shape, got, want)
		}
		// gen's --group-size and ingest's agree, or groups never fill.
		args := shapes[shape].args
		if i := slices.Index(args, "--group-size"); i < 0 || args[i+1] != strconv.Itoa(want) {
			t.Errorf("%s: gen args %v, ingest --group-size %d", shape, args, want)
		}
	}
}

// TestMemoryFlat: the verdict rests on the delta and wire layouts, the
// full layout shown beside them; one turns setting is not judged.
func TestMemoryFlat(t *testing.T) {
	rep := func(turns int, full, deltas, wire int64) *mtReport {
		r := &mtReport{Turns: turns}
		for n, rss := range map[string]int64{"full": full, "deltas": deltas, "wire": wire} {
			r.Layouts = append(r.Layouts, &mtLayout{Name: n, RSSMax: rss})
		}
		return r
	}
	if memoryFlat([]*mtReport{rep(30, 1, 1, 1)}) != nil {
		t.Error("one turns setting judged")
	}
	a := memoryFlat([]*mtReport{rep(100, 300, 110, 100), rep(30, 100, 100, 100)})
	if a == nil || !a.Met || a.Value != 1.1 {
		t.Errorf("full growing 3x, deltas 1.1x: %+v, want met at 1.1", a)
	}
	if a := memoryFlat([]*mtReport{rep(30, 100, 100, 100), rep(100, 100, 100, 130)}); a == nil || a.Met {
		t.Errorf("wire growing 1.3x: %+v, want not met", a)
	}
}
