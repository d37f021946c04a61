package report

import (
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// xTicks are the labels under the x axis of a line chart's SVG.
func xTicks(t *testing.T, svg string) []string {
	t.Helper()
	var out []string
	for _, m := range regexp.MustCompile(`<text x="[0-9.]+" y="(\d+)" text-anchor="(?:middle|start|end)">([^<]*)</text>`).FindAllStringSubmatch(svg, -1) {
		if m[1] == strconv.Itoa(svgH-padB+16) { // the x axis's row
			out = append(out, m[2])
		}
	}
	return out
}

// TestIntegralXTicks: whole-number x values (policy versions) get a tick
// per integer over a short range, never one between two versions; other
// values keep the nice ticks.
func TestIntegralXTicks(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want []string
	}{
		{[]float64{0, 1, 2}, []string{"0", "1", "2"}},
		{[]float64{3, 5}, []string{"3", "4", "5"}},
		{[]float64{0, 0.5, 2}, []string{"0", "0.5", "1", "1.5", "2"}},
	} {
		c := Chart{ID: "c", Title: "t", Kind: KindLine}
		s := Series{Name: "s"}
		for _, x := range tc.xs {
			s.Points = append(s.Points, Point{X: x, Y: x})
		}
		c.Series = []Series{s}
		if got := xTicks(t, c.SVG()); !slices.Equal(got, tc.want) {
			t.Errorf("x %v: ticks %q, want %q", tc.xs, got, tc.want)
		}
	}
}
