package report

import (
	"fmt"
	"html/template"
	"io"
	"strings"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
)

// CSS is the style sheet of the report and the live view: light by
// default, dark under prefers-color-scheme: dark; series colours are
// CSS variables, so the SVG follows the theme.
var CSS = `:root{--bg:#fff;--fg:#1b1f24;--muted:#59636e;--grid:#d8dee4;--card:#f6f8fa;--link:#0969da;
--c0:#0969da;--c1:#cf222e;--c2:#1a7f37;--c3:#8250df;--c4:#bc4c00;--c5:#1b7c83;--c6:#bf3989;--c7:#6e7781}
@media (prefers-color-scheme: dark){:root{--bg:#0d1117;--fg:#e6edf3;--muted:#9198a1;--grid:#30363d;--card:#161b22;--link:#4493f8;
--c0:#4493f8;--c1:#ff7b72;--c2:#3fb950;--c3:#bc8cff;--c4:#f0883e;--c5:#39c5cf;--c6:#ff80c8;--c7:#9198a1}}
body{background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1360px;padding:16px}
a{color:var(--link)} h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px} .meta{color:var(--muted)}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:16px}
figure{background:var(--card);border-radius:8px;margin:0;padding:12px} figcaption{font-weight:600;margin-bottom:4px}
svg.chart{width:100%;height:auto;display:block} svg text{fill:var(--fg);font-size:11px} svg .label{fill:var(--muted);font-size:12px}
svg .note{fill:var(--muted);font-size:14px} svg .grid,svg .base,svg .tick{stroke:var(--grid);stroke-width:1}
svg .line{fill:none;stroke-width:2} svg .pt{stroke:var(--bg);stroke-width:1}
` + seriesCSS + `
table{border-collapse:collapse;margin:4px 0 12px;font-variant-numeric:tabular-nums} th,td{padding:3px 10px;border-bottom:1px solid var(--grid);text-align:right}
th:first-child,td:first-child{text-align:left} th{color:var(--muted);font-weight:600}
`

var seriesCSS = func() string {
	var b strings.Builder
	for i := range 8 {
		fmt.Fprintf(&b, "svg .s%[1]d .line{stroke:var(--c%[1]d)} svg .s%[1]d .pt,svg .s%[1]d .bar,svg .key.s%[1]d{fill:var(--c%[1]d)}\n", i)
	}
	b.WriteString("svg .alt .line{stroke-dasharray:6 3} svg .alt .bar,svg .alt .pt,svg .key.alt{fill-opacity:.45}\n")
	return b.String()
}()

// SummaryTables are the reports shown as tables under the charts.
func SummaryTables(d *Data) []*Table {
	var out []*Table
	for _, n := range []string{duckdb.ReportTokenLengths, duckdb.ReportAdvantage, duckdb.ReportDeadLetters, duckdb.ReportRoles} {
		if t := d.Tables[n]; t != nil && len(t.Rows) > 0 {
			out = append(out, t)
		}
	}
	// pass-at-k: the mean row only (a row per task is data, not a summary).
	if t := d.Tables[duckdb.ReportPassAtK]; t != nil && len(t.Rows) > 0 {
		out = append(out, &Table{Name: duckdb.ReportPassAtK + " (mean over tasks)", Columns: t.Columns, Rows: t.Rows[len(t.Rows)-1:]})
	}
	return out
}

// FormatCell prints a value of a table cell.
func FormatCell(v any) string {
	if f, ok := v.(float64); ok {
		return fmtNum(f)
	}
	if v == nil {
		return "—"
	}
	return Str(v)
}

// ChartsHTML is the figures of the charts and the summary tables.
func ChartsHTML(d *Data, link Linker) template.HTML {
	var b strings.Builder
	b.WriteString(`<div class="charts">`)
	for _, c := range Charts(d, link) {
		fmt.Fprintf(&b, `<figure data-chart="%s"><figcaption>%s</figcaption>%s</figure>`, esc(c.ID), esc(c.Title), c.SVG())
	}
	b.WriteString(`</div><h2>Summaries</h2>`)
	for _, t := range SummaryTables(d) {
		fmt.Fprintf(&b, `<h3>%s</h3><table data-report="%s"><tr>`, esc(t.Name), esc(t.Name))
		for _, c := range t.Columns {
			fmt.Fprintf(&b, `<th>%s</th>`, esc(c))
		}
		b.WriteString(`</tr>`)
		for _, r := range t.Rows {
			b.WriteString(`<tr>`)
			for _, v := range r {
				fmt.Fprintf(&b, `<td>%s</td>`, esc(FormatCell(v)))
			}
			b.WriteString(`</tr>`)
		}
		b.WriteString(`</table>`)
	}
	return template.HTML(b.String())
}

var page = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta name="color-scheme" content="light dark">
<title>rllm-pipe report: {{.Source}}</title><style>{{.CSS}}</style></head>
<body><h1>rllm-pipe report</h1>
<p class="meta">{{.Source}} · {{.Shards}} committed shards · generated {{.Generated}} · every figure is a <code>rllm-pipe sql --report</code> query</p>
{{.Body}}
</body></html>
`))

// Write writes d as one self-contained HTML page: no script, no request
// (its Content-Security-Policy allows none).
func Write(w io.Writer, d *Data) error {
	return page.Execute(w, map[string]any{
		"Source": d.Source, "Shards": d.Shards, "Generated": d.Generated.Format("2006-01-02 15:04:05 UTC"),
		"CSS": template.CSS(CSS), "Body": ChartsHTML(d, nil),
	})
}
