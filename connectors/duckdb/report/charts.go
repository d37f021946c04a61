package report

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"sort"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
)

// Linker gives the link of a bucket to the trajectories behind it: the
// filters as query parameters (version, reason, role, staleness, shard,
// estimator and adv_bin). Nil: no links.
type Linker func(filters url.Values) string

// Charts draws the charts of d, in page order.
func Charts(d *Data, link Linker) []*Chart {
	lk := func(kv ...string) string {
		if link == nil {
			return ""
		}
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return link(v)
	}
	version := func(x float64, _ []any) string { return lk("version", fmtNum(x)) }
	var out []*Chart

	rv := d.Tables[duckdb.ReportRewardByVersion]
	out = append(out, &Chart{ID: "reward", Title: "Mean reward by policy version", XLabel: "policy version", YLabel: "mean reward", Kind: KindLine,
		Series: lineSeries(rv, "group_version", []string{"mean_reward"}, []string{"mean reward"}, version)})
	pk := d.Tables[duckdb.ReportPassAtKByVersion]
	pass := lineSeries(rv, "group_version", []string{"pass_rate"}, []string{"pass rate"}, version)
	var cols, names []string
	for _, k := range d.Ks {
		cols = append(cols, fmt.Sprintf("pass@%d", k))
		names = append(names, fmt.Sprintf("pass@%d", k))
	}
	pass = append(pass, lineSeries(pk, "group_version", cols, names, version)...)
	out = append(out, &Chart{ID: "pass", Title: "Pass rate and pass@k by policy version", XLabel: "policy version", YLabel: "share of trajectories / pass@k", Kind: KindLine, Series: pass})

	// Staleness on a numeric axis: a version no group was behind by
	// keeps its place, empty.
	st := d.Tables[duckdb.ReportStaleness]
	out = append(out, &Chart{ID: "staleness", Title: "Staleness of committed groups", XLabel: "staleness (policy versions behind the newest at commit)", YLabel: "groups", Kind: KindColumns,
		Series: lineSeries(st, "staleness", []string{"groups"}, []string{"groups"}, func(x float64, _ []any) string { return lk("staleness", fmtNum(x)) })})

	ah := d.Tables[duckdb.ReportAdvantageHistogram]
	out = append(out, &Chart{ID: "advantage", Title: "Advantage distribution", XLabel: "advantage (30 equal bins)", YLabel: "trajectories", Kind: KindColumns,
		Series: histSeries(ah, lk)})

	lv := d.Tables[duckdb.ReportLengthsByVersion]
	out = append(out, &Chart{ID: "lengths", Title: "Prompt and response tokens per step by policy version", XLabel: "policy version", YLabel: "tokens per step", Kind: KindLine,
		Series: lineSeries(lv, "group_version", []string{"prompt_mean", "prompt_p90", "response_mean", "response_p90"},
			[]string{"prompt mean", "prompt p90", "response mean", "response p90"}, version)})

	fv := d.Tables[duckdb.ReportFilteredByVersion]
	out = append(out, &Chart{ID: "filtered", Title: "Groups filtered by reason, by policy version", XLabel: "policy version", YLabel: "groups", Kind: KindLine,
		Series: filteredSeries(fv, lk), Note: "no group was filtered"})

	ft := d.Tables[duckdb.ReportFilteredOverTime]
	out = append(out, &Chart{ID: "filtered-time", Title: "Groups filtered by reason over commit time", XLabel: "commit time (UTC)", YLabel: "groups filtered (cumulative)", Kind: KindLine, XTime: true, YZero: true,
		Series: reasonSeries(ft, "committed_at", "filter_reason", "cumulative_groups", func(_ float64, reason string, row []any) string {
			return lk("reason", reason, "shard", Str(row[ft.Col("seq")]))
		}), Note: "no group was filtered"})

	dl := d.Tables[duckdb.ReportDeadLetters]
	out = append(out, &Chart{ID: "dead-letters", Title: "Dead letters by reason", XLabel: "reason", YLabel: "dead letters", Kind: KindBar,
		Series: barSeries(dl, "reason", []string{"dead_letters"}, []string{"dead letters"}, nil), Note: "no dead letters"})
	dt := d.Tables[duckdb.ReportDeadLettersOverTime]
	out = append(out, &Chart{ID: "dead-letters-time", Title: "Dead letters by reason over commit time", XLabel: "commit time (UTC)", YLabel: "dead letters (cumulative)", Kind: KindLine, XTime: true, YZero: true,
		Series: reasonSeries(dt, "committed_at", "reason", "cumulative_dead_letters", nil), Note: "no dead letters"})

	tp := d.Tables[duckdb.ReportThroughput]
	out = append(out, &Chart{ID: "throughput", Title: "Ingest: rows committed over commit time", XLabel: "commit time (UTC)", YLabel: "rows committed (cumulative)", Kind: KindLine, XTime: true, YZero: true,
		Series: lineSeries(tp, "committed_at", []string{"cumulative_rows"}, []string{"rows"}, func(_ float64, row []any) string { return lk("shard", Str(row[tp.Col("seq")])) })})

	tl := d.Tables[duckdb.ReportTrainingLoop]
	out = append(out, &Chart{ID: "loop-staleness", Title: "Staleness trained on, per train step", XLabel: "train step (acknowledged batch)",
		YLabel: "largest staleness in the batch (versions)", Kind: KindLine, YZero: true,
		Series: reasonSeries(tl, "train_step", "consumer_group", "staleness_max", nil), Note: "no consumer group acknowledged a batch"})
	out = append(out, &Chart{ID: "loop-age", Title: "Age of the groups when acknowledged, per train step", XLabel: "train step (acknowledged batch)",
		YLabel: "seconds from finished at the gateway (p50)", Kind: KindLine, YZero: true,
		Series: reasonSeries(tl, "train_step", "consumer_group", "ack_age_p50_s", nil), Note: "no acknowledged group has a finish time from the capture gateway"})
	ss := d.Tables[duckdb.ReportStaleSkips]
	out = append(out, &Chart{ID: "loop-stale", Title: "Groups skipped as stale (rollouts thrown away), by policy version", XLabel: "policy version",
		YLabel: "groups skipped as stale", Kind: KindLine, YZero: true,
		Series: reasonSeries(ss, "policy_version", "consumer_group", "groups_skipped_stale", nil), Note: "no consumer group skipped a group as stale"})

	pf := d.Tables[duckdb.ReportPromptForks]
	out = append(out, &Chart{ID: "prompt-forks", Title: "Trajectories by prompt forks (prompts that do not extend the previous step's)", XLabel: "forks in the trajectory",
		YLabel: "trajectories", Kind: KindBar, Series: barSeries(pf, "forks", []string{"trajectories"}, []string{"trajectories"}, nil), Note: "no trajectory"})

	ro := d.Tables[duckdb.ReportRoles]
	if hasRoles(ro) {
		out = append(out, &Chart{ID: "roles", Title: "Mean reward and pass rate by role", XLabel: "role", YLabel: "mean reward / pass rate", Kind: KindBar,
			Series: barSeries(ro, "role", []string{"mean_reward", "pass_rate"}, []string{"mean reward", "pass rate"}, func(cat string) string { return lk("role", cat) })})
	}
	return out
}

// lineSeries makes one series per column of ys against column x.
func lineSeries(t *Table, x string, ys, names []string, link func(x float64, row []any) string) []Series {
	if t == nil {
		return nil
	}
	xi := t.Col(x)
	var out []Series
	for j, y := range ys {
		yi := t.Col(y)
		if xi < 0 || yi < 0 {
			continue
		}
		s := Series{Name: names[j]}
		for _, r := range t.Rows {
			xv, ok1 := Num(r[xi])
			yv, ok2 := Num(r[yi])
			if !ok1 || !ok2 {
				continue
			}
			p := Point{X: xv, Y: yv}
			if link != nil {
				p.Link = link(xv, r)
			}
			s.Points = append(s.Points, p)
		}
		out = append(out, s)
	}
	return out
}

// barSeries makes one series per column of ys over the categories of
// column cat.
func barSeries(t *Table, cat string, ys, names []string, link func(string) string) []Series {
	if t == nil {
		return nil
	}
	ci := t.Col(cat)
	var out []Series
	for j, y := range ys {
		yi := t.Col(y)
		if ci < 0 || yi < 0 {
			continue
		}
		s := Series{Name: names[j]}
		for _, r := range t.Rows {
			yv, ok := Num(r[yi])
			if !ok {
				continue
			}
			p := Point{Label: Str(r[ci]), Y: yv}
			if link != nil {
				p.Link = link(p.Label)
			}
			s.Points = append(s.Points, p)
		}
		if len(s.Points) > 0 {
			out = append(out, s)
		}
	}
	return out
}

// histSeries: one series per estimator, x the bin centre; each bin
// links to its trajectories (estimator and bin).
func histSeries(t *Table, lk func(...string) string) []Series {
	if t == nil {
		return nil
	}
	ei, bi, lo, hi, n := t.Col("estimator"), t.Col("bin"), t.Col("bin_lo"), t.Col("bin_hi"), t.Col("trajectories")
	if ei < 0 || bi < 0 || lo < 0 || hi < 0 || n < 0 {
		return nil
	}
	idx := map[string]int{}
	var out []Series
	for _, r := range t.Rows {
		e := Str(r[ei])
		a, ok1 := Num(r[lo])
		b, ok2 := Num(r[hi])
		c, ok3 := Num(r[n])
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		i, ok := idx[e]
		if !ok {
			i = len(out)
			idx[e] = i
			out = append(out, Series{Name: e})
		}
		out[i].Points = append(out[i].Points, Point{X: (a + b) / 2, W: b - a, Y: c, Label: fmtNum(a) + " to " + fmtNum(b), Link: lk("estimator", e, "adv_bin", Str(r[bi]))})
	}
	return out
}

// filteredSeries: one series per filter reason (not "(kept)"), x the
// group_version; a version where a reason filtered no group is a point at
// 0 (the table has no row for it), so the line does not pass over it —
// unless there are more versions than a line draws points.
func filteredSeries(t *Table, lk func(...string) string) []Series {
	link := func(v float64, reason string) string { return lk("version", fmtNum(v), "reason", reason) }
	out := reasonSeries(t, "group_version", "filter_reason", "groups", func(v float64, reason string, _ []any) string { return link(v, reason) })
	if t == nil {
		return out
	}
	xi := t.Col("group_version")
	versions := map[float64]bool{}
	for _, r := range t.Rows {
		if v, ok := Num(r[xi]); ok {
			versions[v] = true
		}
	}
	if len(versions) > maxPointsDrawn {
		// Too many to draw each: thinned, the zeros could hide the only
		// points that matter. The lines join what was filtered.
		return out
	}
	for i := range out {
		s := &out[i]
		have := map[float64]bool{}
		for _, p := range s.Points {
			have[p.X] = true
		}
		for v := range versions {
			if !have[v] {
				s.Points = append(s.Points, Point{X: v, Y: 0, Link: link(v, s.Name)})
			}
		}
		slices.SortFunc(s.Points, func(a, b Point) int { return cmp.Compare(a.X, b.X) })
	}
	return out
}

// reasonSeries: one series per value of the reason column (not
// "(kept)") of y against x, in reason order; link may be nil.
func reasonSeries(t *Table, x, reasonCol, y string, link func(x float64, reason string, row []any) string) []Series {
	if t == nil {
		return nil
	}
	xi, ri, yi := t.Col(x), t.Col(reasonCol), t.Col(y)
	if xi < 0 || ri < 0 || yi < 0 {
		return nil
	}
	by := map[string][]Point{}
	for _, r := range t.Rows {
		reason := Str(r[ri])
		if reason == "(kept)" {
			continue
		}
		xv, ok1 := Num(r[xi])
		yv, ok2 := Num(r[yi])
		if !ok1 || !ok2 {
			continue
		}
		p := Point{X: xv, Y: yv}
		if link != nil {
			p.Link = link(xv, reason, r)
		}
		by[reason] = append(by[reason], p)
	}
	var reasons []string
	for r := range by {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	var out []Series
	for _, r := range reasons {
		out = append(out, Series{Name: r, Points: by[r]})
	}
	return out
}

func hasRoles(t *Table) bool {
	if t == nil || t.Col("role") < 0 {
		return false
	}
	for _, r := range t.Rows {
		if Str(r[t.Col("role")]) != "(none)" {
			return true
		}
	}
	return false
}
