package report

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
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

// TestVersionTicksUpToTwelve: a tick per policy version up to 12
// versions (8 versions had ticks at 0, 2, 4, 6 only).
func TestVersionTicksUpToTwelve(t *testing.T) {
	for _, n := range []int{8, 12} {
		c := Chart{ID: "c", Title: "t", Kind: KindLine}
		s := Series{Name: "s"}
		var want []string
		for v := 0; v <= n; v++ {
			s.Points = append(s.Points, Point{X: float64(v), Y: 1})
			want = append(want, strconv.Itoa(v))
		}
		c.Series = []Series{s}
		if got := xTicks(t, c.SVG()); !slices.Equal(got, want) {
			t.Errorf("versions 0..%d: ticks %q, want %q", n, got, want)
		}
	}
}

var barRe = regexp.MustCompile(`<rect class="bar" x="([0-9.]+)" y="[0-9.]+" width="([0-9.]+)" height="[0-9.]+" data-x="([^"]*)"`)

// TestColumnsKeepGaps: staleness 0, 2, 4, 5 on a numeric axis: the
// missing 1 and 3 keep their places (bars evenly spaced by value, ticks
// at every integer), not closed up as categories.
func TestColumnsKeepGaps(t *testing.T) {
	c := Chart{ID: "c", Title: "t", Kind: KindColumns, Series: []Series{{Name: "groups", Points: []Point{{X: 0, Y: 5}, {X: 2, Y: 3}, {X: 4, Y: 1}, {X: 5, Y: 1}}}}}
	svg := c.SVG()
	if got, want := xTicks(t, svg), []string{"0", "1", "2", "3", "4", "5"}; !slices.Equal(got, want) {
		t.Errorf("ticks %q, want %q", got, want)
	}
	bars := barRe.FindAllStringSubmatch(svg, -1)
	if len(bars) != 4 {
		t.Fatalf("%d bars, want 4", len(bars))
	}
	left := func(i int) float64 { v, _ := strconv.ParseFloat(bars[i][1], 64); return v }
	unit := left(3) - left(2) // 4 → 5
	for i, x := range []float64{0, 2, 4} {
		if d := left(i+1) - left(i); math.Abs(d-unit*([]float64{2, 2, 1}[i])) > 0.2 {
			t.Errorf("bar at %v to the next: %.1f px, want %.1f (spacing by value)", x, d, unit*([]float64{2, 2, 1}[i]))
		}
	}
}

// TestHistogramAsBars: bins are bars as wide as the bin (less a gap),
// touching the axis range at both ends.
func TestHistogramAsBars(t *testing.T) {
	var pts []Point
	for i := range 30 {
		lo := -1 + float64(i)*2.0/30
		pts = append(pts, Point{X: lo + 1.0/30, W: 2.0 / 30, Y: float64(i % 7)})
	}
	c := Chart{ID: "c", Title: "t", Kind: KindColumns, Series: []Series{{Name: "grpo", Points: pts}}}
	bars := barRe.FindAllStringSubmatch(c.SVG(), -1)
	if len(bars) != 30 {
		t.Fatalf("%d bars, want 30", len(bars))
	}
	pw := float64(svgW - padL - padR)
	for _, b := range bars {
		if w, _ := strconv.ParseFloat(b[2], 64); math.Abs(w-pw/30*0.9) > 0.2 {
			t.Errorf("bin %s: %v px wide, want %.1f", b[3], w, pw/30*0.9)
		}
	}
	if x, _ := strconv.ParseFloat(bars[0][1], 64); math.Abs(x-(padL+pw/30*0.05)) > 0.2 {
		t.Errorf("first bin starts at %v px, want %.1f", x, padL+pw/30*0.05)
	}
}

// TestLegendNamesWhole: a name too long for the legend is cut on the
// chart and whole in the entry's tooltip; names up to 24 characters are
// not cut at all (three entries a row).
func TestLegendNamesWhole(t *testing.T) {
	long := "termination=a-rather-long-reason-name-indeed"
	c := Chart{ID: "c", Title: "t", Kind: KindLine, Series: []Series{
		{Name: "zero_variance", Points: []Point{{X: 0, Y: 1}}},
		{Name: "termination=TIMEOUT_ERR", Points: []Point{{X: 1, Y: 2}}},
		{Name: long, Points: []Point{{X: 1, Y: 2}}},
	}}
	svg := c.SVG()
	if !strings.Contains(svg, "<title>"+long+"</title>") {
		t.Errorf("no tooltip with the whole name %q", long)
	}
	c.Series = c.Series[:2]
	if svg := c.SVG(); !strings.Contains(svg, ">termination=TIMEOUT_ERR</text>") {
		t.Errorf("a 23-character name cut in the legend")
	}
	// A bar chart's category cut under its bar keeps a tooltip too.
	cut := strings.Repeat("a_very_long_reason_code_", 3)
	bars := Chart{ID: "b", Title: "t", Kind: KindBar, Series: []Series{{Name: "dead letters", Points: []Point{{Label: cut, Y: 3}}}}}
	if svg := bars.SVG(); !strings.Contains(svg, ">"+cut[:39]+"…<title>"+cut+"</title></text>") {
		t.Errorf("a cut category without its whole name as a tooltip")
	}
}

// TestBarCategories: a bar's category shows whole when its slot holds it
// (a role name of 27 characters under one of three bars); ten long ones
// are slanted instead of overlapping, and the plot leaves them room.
func TestBarCategories(t *testing.T) {
	chart := func(names ...string) string {
		var pts []Point
		for i, n := range names {
			pts = append(pts, Point{Label: n, Y: float64(i + 1)})
		}
		return (&Chart{ID: "b", Title: "t", Kind: KindBar, Series: []Series{{Name: "n", Points: pts}}}).SVG()
	}
	roles := []string{"solver", "verifier_with_a_longer_name", "critic"}
	svg := chart(roles...)
	for _, r := range roles {
		if !strings.Contains(svg, `text-anchor="middle">`+r+`</text>`) {
			t.Errorf("role %q not shown whole, level under its bar", r)
		}
	}
	reasons := []string{"invalid_json", "missing_field", "invalid_value", "duplicate_conflict", "too_large",
		"invalid_parent", "late", "orphan_step", "schema_mismatch", "empty_response"}
	svg = chart(reasons...)
	slanted := regexp.MustCompile(`<text x="([0-9.]+)" y="([0-9]+)" text-anchor="end" transform="rotate\(-30 `).FindAllStringSubmatch(svg, -1)
	if len(slanted) != len(reasons) {
		t.Fatalf("%d slanted categories, want %d", len(slanted), len(reasons))
	}
	for _, r := range reasons {
		if !strings.Contains(svg, ">"+r+"</text>") {
			t.Errorf("reason %q cut", r)
		}
	}
	// The labels start below the axis and end above the chart's bottom.
	y, _ := strconv.Atoi(slanted[0][2])
	if bottom := float64(y) + 18*charW/2; y >= svgH || bottom > svgH {
		t.Errorf("slanted labels from y=%d to %.0f, past the chart's height %d", y, bottom, svgH)
	}
}

// TestTimeTicks: clock-time ticks fall on round times, several of them.
func TestTimeTicks(t *testing.T) {
	lo := float64(time.Date(2026, 1, 2, 3, 4, 7, 0, time.UTC).Unix())
	for _, tc := range []struct {
		span, step float64
	}{{600, 120}, {40, 10}, {2.5, 0.5}, {3 * 3600, 3600}} {
		ts := timeTicks(lo, lo+tc.span, 5)
		if len(ts) < 3 {
			t.Errorf("span %vs: ticks %v, want at least 3", tc.span, ts)
		}
		for _, v := range ts {
			if r := math.Mod(v, tc.step); math.Abs(r) > 1e-6 && math.Abs(r-tc.step) > 1e-6 || v < lo || v > lo+tc.span {
				t.Errorf("span %vs: tick %v not a multiple of %vs within the span", tc.span, v, tc.step)
			}
		}
	}
}

// TestTimeTooltips: a point on a time axis names its clock time, not
// its Unix seconds.
func TestTimeTooltips(t *testing.T) {
	at := float64(time.Date(2026, 1, 2, 3, 4, 5, 250e6, time.UTC).UnixNano()) / 1e9
	c := Chart{ID: "c", Title: "t", Kind: KindLine, XTime: true, Series: []Series{{Name: "rows", Points: []Point{{X: at, Y: 7}}}}}
	if svg := c.SVG(); !strings.Contains(svg, "<title>rows at 2026-01-02 03:04:05.250 UTC: 7</title>") {
		t.Errorf("tooltip of a time point: %s", regexp.MustCompile(`<title>rows at [^<]*</title>`).FindString(svg))
	}
}

// A version where a reason filtered no group has no row in the table: the
// reason's line still drops to 0 there instead of passing over it.
func TestFilteredSeriesZeroWhereNoRow(t *testing.T) {
	tab := &Table{Columns: []string{"group_version", "filter_reason", "groups"}, Rows: [][]any{
		{int64(0), "truncated", int64(8)}, {int64(0), "(kept)", int64(5)},
		{int64(1), "(kept)", int64(3)}, {int64(1), "zero-variance", int64(2)},
		{int64(2), "truncated", int64(1)},
	}}
	lk := func(kv ...string) string { return fmt.Sprint(kv) }
	got := map[string]string{}
	for _, s := range filteredSeries(tab, lk) {
		var pts []string
		for _, p := range s.Points {
			pts = append(pts, fmt.Sprintf("%v:%v", p.X, p.Y))
		}
		got[s.Name] = strings.Join(pts, " ")
	}
	want := map[string]string{"truncated": "0:8 1:0 2:1", "zero-variance": "0:0 1:2 2:0"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("series %v, want %v", got, want)
	}
	if filteredSeries(nil, lk) != nil {
		t.Fatal("series from no table")
	}
}

// Ten series (ten dead-letter reasons) get ten different styles: the
// colours, then the same colours dashed and paler.
func TestSeriesStylesApart(t *testing.T) {
	seen := map[string]int{}
	for i := range 16 {
		c := seriesClass(i)
		if j, ok := seen[c]; ok {
			t.Fatalf("series %d and %d share the style %q", j, i, c)
		}
		seen[c] = i
	}
	if !strings.Contains(CSS, "svg .alt .line{stroke-dasharray") {
		t.Fatal("no style for the alt series")
	}
}
