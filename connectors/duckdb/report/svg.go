package report

import (
	"cmp"
	"fmt"
	"html"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
)

// Chart kinds.
const (
	KindLine = "line" // numeric x, one polyline with points per series
	KindBar  = "bar"  // categorical x, grouped bars per series
	// KindColumns: numeric x, a bar per point spanning X ± W/2 (a
	// histogram's bins, or one bar per integer with the missing ones
	// left as gaps); the series of a bucket share its width.
	KindColumns = "columns"
)

// Point is one bucket of a chart. Label names a category (bars) or
// replaces the x value in the tooltip; Link, when set, leads to the
// trajectories behind the bucket (live view only).
type Point struct {
	X     float64
	Label string
	Y     float64
	Link  string
	// W is a column's width in x units (KindColumns; 0 means 1).
	W float64
}

func (p Point) width() float64 {
	if p.W > 0 {
		return p.W
	}
	return 1
}

// Series is one named line or set of bars.
type Series struct {
	Name   string
	Points []Point
}

// Chart is one chart.
type Chart struct {
	ID, Title, XLabel, YLabel string
	Kind                      string
	// XTime draws x values (Unix seconds) as clock times.
	XTime bool
	// YZero starts the y axis at 0 (counts, cumulative totals).
	YZero  bool
	Series []Series
	// Note explains an empty chart.
	Note string
}

// integralX reports whether every x value is a whole number.
func (c *Chart) integralX() bool {
	for _, s := range c.Series {
		for _, p := range s.Points {
			if p.X != math.Trunc(p.X) {
				return false
			}
		}
	}
	return true
}

// Points counts the points of all series.
func (c *Chart) Points() int {
	n := 0
	for _, s := range c.Series {
		n += len(s.Points)
	}
	return n
}

const (
	svgW, svgH             = 640, 300
	padL, padR, padT, padB = 64, 16, 16, 48
	maxPointsDrawn         = 2000
	legendLine             = 14
	charW                  = 6.2 // the mean width of a character of an 11 px label
	legendTop              = padT
)

// fmtNum prints a figure for a label or tooltip: 4 significant digits.
func fmtNum(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

// exact prints a figure for a data attribute: the shortest exact form.
func exact(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// niceTicks returns about n round tick values covering [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if hi < lo {
		lo, hi = hi, lo
	}
	if hi == lo {
		if lo == 0 {
			hi = 1
		} else {
			lo, hi = lo-math.Abs(lo)*0.1, hi+math.Abs(hi)*0.1
		}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for v := math.Floor(lo/step) * step; ; v += step {
		out = append(out, math.Round(v/step)*step)
		if v >= hi-step*1e-9 || len(out) > 50 {
			break
		}
	}
	if len(out) < 2 {
		out = append(out, out[len(out)-1]+step)
	}
	return out
}

// seriesClass is series si's style: one of 8 colours, then the same
// colours dashed and paler ("alt") for series 8 to 15, and so on, so that
// up to 16 series (ten dead-letter reasons) look apart.
func seriesClass(si int) string {
	if si/8%2 == 1 {
		return fmt.Sprintf("s%d alt", si%8)
	}
	return fmt.Sprintf("s%d", si%8)
}

// SVG draws the chart. Each series is a <g class="series"
// data-series="NAME">, each point a <circle class="pt"> or <rect
// class="bar"> with data-x and data-y holding its exact values.
func (c *Chart) SVG() string {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" id="%s" data-kind="%s" data-series-count="%d" data-points="%d" viewBox="0 0 %d %d" role="img" aria-label="%s" xmlns="http://www.w3.org/2000/svg">`,
		esc(c.ID), c.Kind, len(c.Series), c.Points(), svgW, svgH, esc(c.Title))
	fmt.Fprintf(&b, `<title>%s</title>`, esc(c.Title))
	if c.Points() == 0 {
		note := c.Note
		if note == "" {
			note = "no data"
		}
		fmt.Fprintf(&b, `<text class="note" x="%d" y="%d" text-anchor="middle">%s</text></svg>`, svgW/2, svgH/2, esc(note))
		return b.String()
	}
	p := newPlot(c)
	p.yAxis(&b)
	fmt.Fprintf(&b, `<g class="axis x"><line class="base" x1="%d" x2="%d" y1="%d" y2="%d"/>`, padL, svgW-padR, p.bottom(), p.bottom())
	if c.Kind == KindBar {
		p.categoryAxis(&b)
	} else {
		p.numericAxis(&b)
	}
	fmt.Fprintf(&b, `<text class="label" x="%d" y="%d" text-anchor="middle">%s</text></g>`, padL+int(p.pw/2), svgH-8, esc(c.XLabel))
	for si, s := range c.Series {
		fmt.Fprintf(&b, `<g class="series %s" data-series="%s" data-points="%d">`, seriesClass(si), esc(s.Name), len(s.Points))
		switch c.Kind {
		case KindColumns:
			p.columns(&b, si, s)
		case KindBar:
			p.bars(&b, si, s)
		default:
			p.line(&b, s)
		}
		b.WriteString(`</g>`)
	}
	if len(c.Series) > 1 {
		p.legend(&b)
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// plot is a chart's layout: the value ranges, the padding around the
// plot area and how values map to it.
type plot struct {
	c                  *Chart
	xlo, xhi, ylo, yhi float64   // the values' extent (y: the ticks')
	yt                 []float64 // y ticks
	cats               []string  // bar categories, in order of first appearance
	catIdx             map[string]int
	padT, padB         int
	pw, ph             float64 // the plot area
	catClip            int     // characters of a category label kept
	slant              bool    // category labels slanted
	perRow, clipAt     int     // legendLayout
	xmap               func(p Point) float64
}

func newPlot(c *Chart) *plot {
	p := &plot{c: c, catIdx: map[string]int{}, padT: padT, padB: padB, catClip: 18}
	p.ylo, p.yhi = math.Inf(1), math.Inf(-1)
	p.xlo, p.xhi = math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for _, pt := range s.Points {
			p.ylo, p.yhi = math.Min(p.ylo, pt.Y), math.Max(p.yhi, pt.Y)
			if c.Kind == KindColumns {
				p.xlo, p.xhi = math.Min(p.xlo, pt.X-pt.width()/2), math.Max(p.xhi, pt.X+pt.width()/2)
			} else {
				p.xlo, p.xhi = math.Min(p.xlo, pt.X), math.Max(p.xhi, pt.X)
			}
			if _, ok := p.catIdx[pt.Label]; !ok {
				p.catIdx[pt.Label] = len(p.cats)
				p.cats = append(p.cats, pt.Label)
			}
		}
	}
	// y range, always including 0 for bars.
	if c.Kind == KindBar || c.Kind == KindColumns || c.YZero || p.ylo > 0 && p.ylo < p.yhi/3 {
		p.ylo = math.Min(p.ylo, 0)
	}
	p.yt = niceTicks(p.ylo, p.yhi, 5)
	p.ylo, p.yhi = p.yt[0], p.yt[len(p.yt)-1]
	// The legend gets rows of its own above the plot, never over it.
	p.perRow, p.clipAt = legendLayout(c.Series)
	if len(c.Series) > 1 {
		p.padT += ((len(c.Series) + p.perRow - 1) / p.perRow) * legendLine
	}
	// A bar's category is written under it, whole when its slot holds it
	// (up to 40 characters); categories too long to sit side by side
	// (ten dead-letter reasons) are slanted, with room made for them below
	// the plot, and cut at 24.
	if c.Kind == KindBar {
		every := max(1, len(p.cats)/12)
		slot := float64(svgW-padL-padR) / float64(len(p.cats)) * float64(every)
		longest := 0
		for _, cat := range p.cats {
			longest = max(longest, len([]rune(cat)))
		}
		if fit := int((slot - 4) / charW); fit >= p.catClip {
			p.catClip = min(fit, 40) // as much of a name as its slot holds
		} else if longest > fit {
			p.slant, p.catClip = true, 24
			p.padB += int(float64(min(longest, p.catClip)) * charW / 2)
		}
	}
	p.pw, p.ph = float64(svgW-padL-padR), float64(svgH-p.padT-p.padB)
	return p
}

// ymap is the vertical position of value v.
func (p *plot) ymap(v float64) float64 {
	return float64(p.padT) + p.ph - (v-p.ylo)/(p.yhi-p.ylo)*p.ph
}

// bottom is the plot area's bottom edge.
func (p *plot) bottom() int { return p.padT + int(p.ph) }

// yAxis writes the y axis: its ticks, the grid and its label.
func (p *plot) yAxis(b *strings.Builder) {
	b.WriteString(`<g class="axis y">`)
	for _, t := range p.yt {
		y := p.ymap(t)
		fmt.Fprintf(b, `<line class="grid" x1="%d" x2="%d" y1="%.1f" y2="%.1f"/><text x="%d" y="%.1f" text-anchor="end" dominant-baseline="middle">%s</text>`,
			padL, svgW-padR, y, y, padL-6, y, fmtNum(t))
	}
	fmt.Fprintf(b, `<text class="label" transform="translate(14 %d) rotate(-90)" text-anchor="middle">%s</text></g>`, p.padT+int(p.ph/2), esc(p.c.YLabel))
}

// categoryAxis sets xmap for bars and writes their category labels.
func (p *plot) categoryAxis(b *strings.Builder) {
	slot := p.pw / float64(len(p.cats))
	p.xmap = func(pt Point) float64 { return float64(padL) + slot*(float64(p.catIdx[pt.Label])+0.5) }
	every := max(1, len(p.cats)/12)
	for i, cat := range p.cats {
		if i%every != 0 {
			continue
		}
		// A category cut short keeps its whole name as a tooltip.
		tip := ""
		if clip(cat, p.catClip) != cat {
			tip = `<title>` + esc(cat) + `</title>`
		}
		x := float64(padL) + slot*(float64(i)+0.5)
		if p.slant {
			fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="end" transform="rotate(-30 %.1f %d)">%s%s</text>`, x, p.bottom()+14, x, p.bottom()+14, esc(clip(cat, p.catClip)), tip)
			continue
		}
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s%s</text>`, x, p.bottom()+16, esc(clip(cat, p.catClip)), tip)
	}
}

// xTicks are the ticks of a numeric x axis.
func (p *plot) xTicks() []float64 {
	c, xlo, xhi := p.c, p.xlo, p.xhi
	var xt []float64
	switch {
	case c.XTime:
		if xlo == xhi {
			xlo, xhi = xlo-30, xlo+30
		}
		xt = timeTicks(xlo, xhi, 5)
	case c.Kind == KindColumns:
		// The bars' edges bound the axis; ticks inside it only.
		if c.integralX() && xhi-xlo <= 13 {
			for v := math.Ceil(xlo); v <= xhi; v++ {
				xt = append(xt, v)
			}
		} else {
			for _, v := range niceTicks(xlo, xhi, 8) {
				if v >= xlo-1e-9*math.Abs(xhi-xlo) && v <= xhi+1e-9*math.Abs(xhi-xlo) {
					xt = append(xt, v)
				}
			}
		}
	case xlo == xhi:
		xt = []float64{xlo - 1, xlo, xlo + 1}
	case c.integralX() && xhi-xlo <= 12:
		// Policy versions and the like: a tick per integer, none
		// between two.
		for v := xlo; v <= xhi; v++ {
			xt = append(xt, v)
		}
	default:
		xt = niceTicks(xlo, xhi, 6)
	}
	return xt
}

// numericAxis sets xmap for a numeric x axis and writes its ticks.
func (p *plot) numericAxis(b *strings.Builder) {
	c := p.c
	xt := p.xTicks()
	x0, x1 := p.xlo, p.xhi // the x domain
	switch {
	case c.XTime && x0 == x1:
		x0, x1 = x0-30, x0+30
	case !c.XTime && c.Kind != KindColumns:
		x0, x1 = xt[0], xt[len(xt)-1]
	}
	if x0 == x1 {
		x0, x1 = x0-0.5, x1+0.5
	}
	p.xmap = func(pt Point) float64 { return float64(padL) + (pt.X-x0)/(x1-x0)*p.pw }
	layout := timeLayout(x1 - x0)
	for _, t := range xt {
		lbl, anchor := fmtNum(t), "middle"
		x := p.xmap(Point{X: t})
		if c.XTime {
			sec, frac := math.Modf(t)
			lbl = time.Unix(int64(sec), int64(math.Round(frac*1e3))*1e6).UTC().Format(layout)
			// Labels near the ends stay inside the chart.
			if x < float64(padL)+30 {
				anchor = "start"
			} else if x > float64(svgW-padR)-30 {
				anchor = "end"
			}
		}
		fmt.Fprintf(b, `<line class="tick" x1="%.1f" x2="%.1f" y1="%d" y2="%d"/><text x="%.1f" y="%d" text-anchor="%s">%s</text>`,
			x, x, p.bottom(), p.bottom()+4, x, p.bottom()+16, anchor, lbl)
	}
}

// columns writes series si as columns spanning X ± W/2, side by side
// with the other series'.
func (p *plot) columns(b *strings.Builder, si int, s Series) {
	n := float64(len(p.c.Series))
	for _, pt := range s.Points {
		w := pt.width() * 0.9 / n
		left := pt.X - pt.width()*0.45 + w*float64(si)
		xa, xb := p.xmap(Point{X: left}), p.xmap(Point{X: left + w})
		y0, y1 := p.ymap(math.Max(0, p.ylo)), p.ymap(pt.Y)
		top, h := math.Min(y0, y1), math.Abs(y0-y1)
		xl := pt.Label
		if xl == "" {
			xl = fmtNum(pt.X)
		}
		open, close := link(pt.Link)
		fmt.Fprintf(b, `%s<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" data-x="%s" data-y="%s"><title>%s at %s: %s</title></rect>%s`,
			open, xa, top, math.Max(xb-xa, 1), math.Max(h, 0.5), exact(pt.X), exact(pt.Y), esc(s.Name), esc(xl), fmtNum(pt.Y), close)
	}
}

// bars writes series si as bars in their categories' slots.
func (p *plot) bars(b *strings.Builder, si int, s Series) {
	slot := p.pw / float64(len(p.cats))
	bw := slot * 0.8 / float64(len(p.c.Series))
	for _, pt := range s.Points {
		x := p.xmap(pt) - slot*0.4 + bw*float64(si)
		y0, y1 := p.ymap(math.Max(0, p.ylo)), p.ymap(pt.Y)
		top, h := math.Min(y0, y1), math.Abs(y0-y1)
		open, close := link(pt.Link)
		fmt.Fprintf(b, `%s<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" data-x="%s" data-y="%s"><title>%s %s: %s</title></rect>%s`,
			open, x, top, math.Max(bw-1, 1), math.Max(h, 0.5), esc(pt.Label), exact(pt.Y), esc(s.Name), esc(pt.Label), fmtNum(pt.Y), close)
	}
}

// line writes series s as a line with a point at every stride-th value.
func (p *plot) line(b *strings.Builder, s Series) {
	pts := s.Points
	stride := max(1, len(pts)/maxPointsDrawn)
	// The line runs in x order (shards committed at once by parallel
	// encoders can be listed slightly out of time order); the points keep
	// the report's order.
	line := slices.Clone(pts)
	slices.SortStableFunc(line, func(a, b Point) int { return cmp.Compare(a.X, b.X) })
	var path strings.Builder
	for i := 0; i < len(line); i += stride {
		cmd := "L"
		if i == 0 {
			cmd = "M"
		}
		fmt.Fprintf(&path, "%s%.1f %.1f", cmd, p.xmap(line[i]), p.ymap(line[i].Y))
	}
	fmt.Fprintf(b, `<path class="line" d="%s"/>`, path.String())
	for i := 0; i < len(pts); i += stride {
		pt := pts[i]
		xl := pt.Label
		if xl == "" {
			xl = fmtNum(pt.X)
			if p.c.XTime {
				sec, frac := math.Modf(pt.X)
				xl = time.Unix(int64(sec), int64(math.Round(frac*1e3))*1e6).UTC().Format("2006-01-02 15:04:05.000 UTC")
			}
		}
		open, close := link(pt.Link)
		fmt.Fprintf(b, `%s<circle class="pt" cx="%.1f" cy="%.1f" r="3" data-x="%s" data-y="%s"><title>%s at %s: %s</title></circle>%s`,
			open, p.xmap(pt), p.ymap(pt.Y), exact(pt.X), exact(pt.Y), esc(s.Name), esc(xl), fmtNum(pt.Y), close)
	}
}

// legend writes the legend above the plot: a key and the name (whole in
// a tooltip) per series.
func (p *plot) legend(b *strings.Builder) {
	b.WriteString(`<g class="legend">`)
	interval := (svgW - padL - padR - 8) / p.perRow
	for si, s := range p.c.Series {
		x := padL + 8 + (si%p.perRow)*interval
		y := legendTop + 6 + (si/p.perRow)*legendLine
		fmt.Fprintf(b, `<g class="entry"><title>%s</title><rect class="key %s" x="%d" y="%d" width="10" height="10"/><text x="%d" y="%d">%s</text></g>`,
			esc(s.Name), seriesClass(si), x, y, x+14, y+9, esc(clip(s.Name, p.clipAt)))
	}
	b.WriteString(`</g>`)
}

// legendLayout is the legend's entries per row and the characters a
// name keeps: 4 of 16, or fewer, wider entries when names are longer.
func legendLayout(series []Series) (perRow, clipAt int) {
	longest := 0
	for _, s := range series {
		longest = max(longest, len([]rune(s.Name)))
	}
	switch {
	case longest <= 16:
		return 4, 16
	case longest <= 24:
		return 3, 24
	}
	return 2, 40
}

// timeSteps are the spacings of time ticks, in seconds.
var timeSteps = []float64{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800,
	3600, 7200, 10800, 21600, 43200, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 28 * 86400}

// timeTicks returns about n round clock times (whole seconds, minutes,
// hours, days in UTC) within [lo, hi]; at least lo and hi when no round
// time fits twice.
func timeTicks(lo, hi float64, n int) []float64 {
	step := timeSteps[len(timeSteps)-1]
	for _, s := range timeSteps {
		if s >= (hi-lo)/float64(n) {
			step = s
			break
		}
	}
	var out []float64
	for v := math.Ceil(lo/step) * step; v <= hi+step*1e-9 && len(out) <= 2*n; v += step {
		out = append(out, math.Round(v/step)*step)
	}
	if len(out) < 2 {
		return []float64{lo, hi}
	}
	return out
}

// timeLayout formats clock times on an axis spanning span seconds: to
// the millisecond under 3 seconds, with the date beyond a day.
func timeLayout(span float64) string {
	switch {
	case span < 3:
		return "15:04:05.000"
	case span > 86400:
		return "01-02 15:04"
	case span > 600:
		return "15:04"
	}
	return "15:04:05"
}

func link(href string) (string, string) {
	if href == "" {
		return "", ""
	}
	return `<a href="` + esc(href) + `">`, `</a>`
}

// Esc escapes record text for a page, in text and in attribute values:
// HTML's special characters, and the layout controls shown as \uNNNN
// (duckdb.ShowLayoutControls) so that they cannot reorder the page.
func Esc(s string) string { return html.EscapeString(duckdb.ShowLayoutControls(s)) }

func esc(s string) string { return Esc(s) }

func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
