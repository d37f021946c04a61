package main

// `rllm-pipe report` through the real binary: the figures of every chart
// are read back from the page's SVG and compared with the rows of
// `rllm-pipe sql --report` over the same output; then the page is opened in
// headless Chromium: no console error, no request but the file itself,
// the expected charts with their number of series and points.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
)

// reportFixture generates and ingests a run with roles and several policy
// versions; returns the output root.
func reportFixture(t *testing.T, bin, work string) string {
	t.Helper()
	in := filepath.Join(work, "in.jsonl")
	r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "60", "--group-size", "4", "--policy-versions", "5",
		"--roles", "solver,verifier", "--seed", "7", "--prompt-len", "60", "--response-len", "30", "--quiet")
	if r.code != 0 {
		t.Fatalf("gen: exit %d\n%s", r.code, r.stderr)
	}
	out := filepath.Join(work, "out")
	r = e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "4")
	if r.code != 0 {
		t.Fatalf("ingest: exit %d\n%s", r.code, r.stderr)
	}
	return out
}

// sqlReport runs `sql --report name --format jsonl`.
func sqlReport(t *testing.T, bin, work, from, name string) []map[string]any {
	t.Helper()
	r := e2eRun(t, bin, work, "sql", "--from", from, "--report", name, "--format", "jsonl")
	if r.code != 0 {
		t.Fatalf("sql --report %s: exit %d\n%s", name, r.code, r.stderr)
	}
	var rows []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("sql --report %s: %v: %s", name, err, l)
		}
		rows = append(rows, m)
	}
	return rows
}

var (
	svgRe    = regexp.MustCompile(`(?s)<svg class="chart" id="([^"]+)".*?</svg>`)
	seriesRe = regexp.MustCompile(`(?s)<g class="series s\d(?: alt)?" data-series="([^"]*)" data-points="\d+">(.*?)</g>`)
	pointRe  = regexp.MustCompile(`class="(?:pt|bar)"[^>]*data-x="([^"]*)" data-y="([^"]*)"`)
)

// pagePoints reads chart id → series → "x" → y from the page.
func pagePoints(t *testing.T, html string) map[string]map[string]map[string]float64 {
	t.Helper()
	out := map[string]map[string]map[string]float64{}
	for _, m := range svgRe.FindAllStringSubmatch(html, -1) {
		series := map[string]map[string]float64{}
		for _, s := range seriesRe.FindAllStringSubmatch(m[0], -1) {
			pts := map[string]float64{}
			for _, p := range pointRe.FindAllStringSubmatch(s[2], -1) {
				y, err := strconv.ParseFloat(p[2], 64)
				if err != nil {
					t.Fatalf("chart %s series %s: y %q: %v", m[1], s[1], p[2], err)
				}
				pts[p[1]] = y
			}
			series[s[1]] = pts
		}
		out[m[1]] = series
	}
	return out
}

func jsonKey(v any) string {
	switch x := v.(type) {
	case float64:
		return strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		return x
	}
	return fmt.Sprint(v)
}

// orderedPoints reads chart id → series → points "x=y" in page order.
func orderedPoints(html string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	for _, m := range svgRe.FindAllStringSubmatch(html, -1) {
		out[m[1]] = map[string][]string{}
		for _, s := range seriesRe.FindAllStringSubmatch(m[0], -1) {
			for _, p := range pointRe.FindAllStringSubmatch(s[2], -1) {
				out[m[1]][s[1]] = append(out[m[1]][s[1]], p[1]+"="+p[2])
			}
		}
	}
	return out
}

// epochKey is a committed_at of sql --report jsonl as the charts' x: Unix
// seconds, exact.
func epochKey(t *testing.T, v any) string {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, strings.Replace(v.(string), " ", "T", 1))
	if err != nil {
		t.Fatalf("committed_at %v: %v", v, err)
	}
	return strconv.FormatFloat(float64(at.UnixNano())/1e9, 'g', -1, 64)
}

// sameFigures compares a chart series with a column of sql --report rows.
func sameFigures(t *testing.T, what string, got map[string]float64, rows []map[string]any, xcol, ycol string) {
	t.Helper()
	want := map[string]float64{}
	for _, r := range rows {
		y, ok := r[ycol].(float64)
		if !ok || r[xcol] == nil {
			continue
		}
		want[jsonKey(r[xcol])] = y
	}
	if len(want) == 0 {
		t.Errorf("%s: sql --report has no %s", what, ycol)
	}
	if len(got) != len(want) {
		t.Errorf("%s: %d points on the page, sql --report has %d (%v vs %v)", what, len(got), len(want), got, want)
	}
	for x, y := range want {
		g, ok := got[x]
		if !ok {
			t.Errorf("%s: x=%s missing on the page", what, x)
			continue
		}
		if math.Abs(g-y) > 1e-9*math.Max(1, math.Abs(y)) {
			t.Errorf("%s at %s: page %v, sql --report %v", what, x, g, y)
		}
	}
}

func TestReportFiguresEqualSQLReports(t *testing.T) {
	t.Parallel() // see main_test.go
	bin := e2eBinary(t)
	work := t.TempDir()
	from := reportFixture(t, bin, work)
	out := filepath.Join(work, "report.html")
	if r := e2eRun(t, bin, work, "report", "--from", from, "--to", out); r.code != 0 {
		t.Fatalf("report: exit %d\n%s", r.code, r.stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	html := string(data)
	pts := pagePoints(t, html)

	rv := sqlReport(t, bin, work, from, "reward-by-version")
	sameFigures(t, "reward: mean reward", pts["reward"]["mean reward"], rv, "group_version", "mean_reward")
	sameFigures(t, "pass: pass rate", pts["pass"]["pass rate"], rv, "group_version", "pass_rate")
	pk := sqlReport(t, bin, work, from, "pass-at-k-by-version")
	for _, k := range []string{"pass@1", "pass@2", "pass@4", "pass@8"} {
		sameFigures(t, "pass: "+k, pts["pass"][k], pk, "group_version", k)
	}
	sameFigures(t, "staleness", pts["staleness"]["groups"], sqlReport(t, bin, work, from, "staleness"), "staleness", "groups")
	lv := sqlReport(t, bin, work, from, "token-lengths-by-version")
	for col, name := range map[string]string{"prompt_mean": "prompt mean", "prompt_p90": "prompt p90", "response_mean": "response mean", "response_p90": "response p90"} {
		sameFigures(t, "lengths: "+name, pts["lengths"][name], lv, "group_version", col)
	}
	ro := sqlReport(t, bin, work, from, "roles")
	sameFigures(t, "roles: mean reward", pts["roles"]["mean reward"], ro, "role", "mean_reward")
	sameFigures(t, "roles: pass rate", pts["roles"]["pass rate"], ro, "role", "pass_rate")
	tp := sqlReport(t, bin, work, from, "throughput")
	if got := len(pts["throughput"]["rows"]); got != len(tp) {
		t.Errorf("throughput: %d points, sql --report throughput has %d shards", got, len(tp))
	}
	var last float64
	for _, r := range tp {
		last = math.Max(last, r["cumulative_rows"].(float64))
	}
	var pageLast float64
	for _, y := range pts["throughput"]["rows"] {
		pageLast = math.Max(pageLast, y)
	}
	if pageLast != last || last == 0 {
		t.Errorf("throughput: last cumulative rows %v on the page, %v in sql --report", pageLast, last)
	}
	// Throughput, point for point in order: commit time, cumulative rows.
	var wantTP []string
	for _, r := range tp {
		wantTP = append(wantTP, epochKey(t, r["committed_at"])+"="+jsonKey(r["cumulative_rows"]))
	}
	gotTP := orderedPoints(html)["throughput"]["rows"]
	if strings.Join(gotTP, " ") != strings.Join(wantTP, " ") {
		t.Errorf("throughput: page %v, sql --report %v", gotTP, wantTP)
	}
	// Advantage histogram, bin for bin: the bar's centre and count.
	var wantBins []string
	for _, r := range sqlReport(t, bin, work, from, "advantage-histogram") {
		lo, hi := r["bin_lo"].(float64), r["bin_hi"].(float64)
		wantBins = append(wantBins, r["estimator"].(string)+"@"+strconv.FormatFloat((lo+hi)/2, 'g', 10, 64)+"="+jsonKey(r["trajectories"]))
	}
	var gotBins []string
	hist := orderedPoints(html)["advantage"]
	for _, est := range slices.Sorted(maps.Keys(hist)) {
		for _, p := range hist[est] {
			x, y, _ := strings.Cut(p, "=")
			xf, _ := strconv.ParseFloat(x, 64)
			gotBins = append(gotBins, est+"@"+strconv.FormatFloat(xf, 'g', 10, 64)+"="+y)
		}
	}
	if strings.Join(gotBins, " ") != strings.Join(wantBins, " ") {
		t.Errorf("advantage histogram: page %v, sql --report %v", gotBins, wantBins)
	}
	// Advantage histogram: per estimator, the counts add up to the
	// trajectories of the advantage report.
	adv := sqlReport(t, bin, work, from, "advantage")
	for _, r := range adv {
		est := r["estimator"].(string)
		var sum float64
		for _, y := range pts["advantage"][est] {
			sum += y
		}
		if sum != r["trajectories"].(float64) {
			t.Errorf("advantage histogram of %s sums to %v, the advantage report counts %v", est, sum, r["trajectories"])
		}
	}
	if strings.Contains(html, "<script") || strings.Contains(html, "http://") && !strings.Contains(html, `xmlns="http://www.w3.org/2000/svg"`) {
		t.Errorf("the report holds a script or an outside link")
	}

	// In the browser.
	p := newPage(t)
	p.do(t, "open the report", chromedp.Navigate(e2eFileURL(out)), chromedp.WaitVisible(chromedp.CSS(`#reward`)))
	charts := eval[int](t, p, `document.querySelectorAll('svg.chart').length`)
	series := eval[int](t, p, `document.querySelectorAll('svg.chart g.series').length`)
	points := eval[int](t, p, `document.querySelectorAll('svg.chart .pt, svg.chart .bar').length`)
	ids := eval[[]string](t, p, `[...document.querySelectorAll('svg.chart')].map(s => s.id)`)
	wantIDs := []string{"advantage", "dead-letters", "dead-letters-time", "filtered", "filtered-time", "lengths", "loop-age", "loop-stale", "loop-staleness", "pass", "prompt-forks", "reward", "roles", "staleness", "throughput"}
	sort.Strings(ids)
	if strings.Join(ids, ",") != strings.Join(wantIDs, ",") {
		t.Errorf("charts %v, want %v", ids, wantIDs)
	}
	wantSeries, wantPoints := 0, 0
	for _, s := range pts {
		wantSeries += len(s)
		for _, p := range s {
			wantPoints += len(p)
		}
	}
	// reward 1, pass 5, staleness 1, advantage (1 estimator), lengths 4,
	// throughput 1, roles 2, prompt forks 1; no filtered groups, no dead
	// letters, no consumer group (the training-loop charts are empty).
	if series != 16 || series != wantSeries || points != wantPoints || charts != len(wantIDs) {
		t.Errorf("browser: %d charts, %d series, %d points; want %d, 16 (=%d), %d", charts, series, points, len(wantIDs), wantSeries, wantPoints)
	}
	p.screenshot(t, "report.png")
	// Dark: the theme follows the system's, the charts with it.
	p.colourScheme(t, "dark")
	if bg := eval[string](t, p, `getComputedStyle(document.body).backgroundColor`); bg != "rgb(13, 17, 23)" {
		t.Errorf("dark mode: the page's background is %s", bg)
	}
	if fg := eval[string](t, p, `getComputedStyle(document.querySelector('#reward text')).fill`); fg != "rgb(230, 237, 243)" {
		t.Errorf("dark mode: chart text drawn in %s", fg)
	}
	p.screenshot(t, "report-dark.png")
	errs, reqs := p.seen()
	if len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	for _, u := range reqs {
		if u != e2eFileURL(out) {
			t.Errorf("the report made a request: %s", u)
		}
	}
	if len(reqs) == 0 {
		t.Errorf("no request seen at all: the request listener is not working")
	}
}

// filteredFixture generates a run with teacher logprobs and ingests it
// with both filters on, so that some trajectories carry two reasons
// ("zero_variance,truncated"); returns the input and the output root.
func filteredFixture(t *testing.T, bin, work string) (in, from string) {
	t.Helper()
	in = filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "200", "--group-size", "4", "--policy-versions", "4",
		"--seed", "5", "--prompt-len", "40", "--response-len", "20", "--teacher", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	from = filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--filter", "zero-variance,truncated", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	return in, from
}

// inputReasons counts, from the generated input alone, the groups per
// policy version with a trajectory of each filter reason ("(kept)": one
// no filter marks): a group is a task, its version the least policy
// version of its steps; zero_variance marks every trajectory of a group
// whose rewards are all equal, truncated a trajectory with a step that
// finished with "length". "version|reason" → groups.
func inputReasons(t *testing.T, in string) map[string]int {
	t.Helper()
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type traj struct {
		task      string
		reward    float64
		truncated bool
	}
	trajs := map[string]*traj{}
	version := map[string]int64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var r struct {
			Type          string  `json:"type"`
			TaskID        string  `json:"task_id"`
			TrajectoryID  string  `json:"trajectory_id"`
			PolicyVersion int64   `json:"policy_version"`
			FinishReason  string  `json:"finish_reason"`
			Reward        float64 `json:"reward"`
		}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("input: %v", err)
		}
		tr := trajs[r.TrajectoryID]
		if tr == nil {
			tr = &traj{task: r.TaskID}
			trajs[r.TrajectoryID] = tr
		}
		switch r.Type {
		case "step":
			if v, ok := version[r.TaskID]; !ok || r.PolicyVersion < v {
				version[r.TaskID] = r.PolicyVersion
			}
			tr.truncated = tr.truncated || r.FinishReason == "length"
		case "trajectory":
			tr.reward = r.Reward
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	rewards := map[string][]float64{}
	for _, tr := range trajs {
		rewards[tr.task] = append(rewards[tr.task], tr.reward)
	}
	seen := map[string]bool{}
	out := map[string]int{}
	for _, tr := range trajs {
		zero := true
		for _, r := range rewards[tr.task] {
			zero = zero && r == rewards[tr.task][0]
		}
		var reasons []string
		if zero {
			reasons = append(reasons, "zero_variance")
		}
		if tr.truncated {
			reasons = append(reasons, "truncated")
		}
		if len(reasons) == 0 {
			reasons = []string{"(kept)"}
		}
		for _, reason := range reasons {
			k := strconv.FormatInt(version[tr.task], 10) + "|" + reason
			if !seen[k+"|"+tr.task] {
				seen[k+"|"+tr.task] = true
				out[k]++
			}
		}
	}
	return out
}

// TestReportFilteredEqualSQLReports: a run ingested with both filters
// on, so that some trajectories carry two reasons. The groups per
// version and reason of sql --report filtered-by-version equal an
// independent count over the input (a trajectory with two reasons counts
// under each); the charts of filtered groups (by version, and cumulative
// over commit time) hold exactly the rows of their sql --report, point
// for point in order; and the trajectory browser's reason filter finds
// the groups of each reason.
func TestReportFilteredEqualSQLReports(t *testing.T) {
	t.Parallel() // see main_test.go
	bin := e2eBinary(t)
	work := t.TempDir()
	in, from := filteredFixture(t, bin, work)
	both := e2eRun(t, bin, work, "sql", "--from", from, "--format", "csv", "SELECT count(*) AS n FROM trajectories WHERE filter_reason = 'zero_variance,truncated'")
	if both.code != 0 || strings.TrimSpace(both.stdout) == "n\n0" {
		t.Fatalf("no trajectory carries both reasons: the test needs some (%s%s)", both.stdout, both.stderr)
	}
	indep := inputReasons(t, in)
	byVersion := map[string]int{}
	for _, r := range sqlReport(t, bin, work, from, "filtered-by-version") {
		byVersion[jsonKey(r["group_version"])+"|"+r["filter_reason"].(string)] = int(r["groups"].(float64))
	}
	if fmt.Sprint(byVersion) != fmt.Sprint(indep) {
		t.Errorf("filtered-by-version (version|reason: groups)\n%v\ncounted over the input:\n%v", byVersion, indep)
	}
	out := filepath.Join(work, "report.html")
	if r := e2eRun(t, bin, work, "report", "--from", from, "--to", out); r.code != 0 {
		t.Fatalf("report: %s", r.stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// chart → series → points "x=y", in page order.
	ordered := map[string]map[string][]string{}
	for _, m := range svgRe.FindAllStringSubmatch(string(data), -1) {
		ordered[m[1]] = map[string][]string{}
		for _, s := range seriesRe.FindAllStringSubmatch(m[0], -1) {
			for _, p := range pointRe.FindAllStringSubmatch(s[2], -1) {
				ordered[m[1]][s[1]] = append(ordered[m[1]][s[1]], p[1]+"="+p[2])
			}
		}
	}
	wantTime := map[string][]string{}
	for _, r := range sqlReport(t, bin, work, from, "filtered-over-time") {
		reason := r["filter_reason"].(string)
		if reason == "(kept)" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, strings.Replace(r["committed_at"].(string), " ", "T", 1))
		if err != nil {
			t.Fatalf("committed_at %v: %v", r["committed_at"], err)
		}
		x := strconv.FormatFloat(float64(at.UnixNano())/1e9, 'g', -1, 64)
		wantTime[reason] = append(wantTime[reason], x+"="+jsonKey(r["cumulative_groups"]))
	}
	wantVersion := map[string][]string{}
	totals := map[string]float64{}
	for _, r := range sqlReport(t, bin, work, from, "filtered-by-version") {
		reason := r["filter_reason"].(string)
		if reason == "(kept)" {
			continue
		}
		wantVersion[reason] = append(wantVersion[reason], jsonKey(r["group_version"])+"="+jsonKey(r["groups"]))
		totals[reason] += r["groups"].(float64)
	}
	if len(wantTime) == 0 {
		t.Fatalf("no group was filtered: the test needs some")
	}
	for name, want := range map[string]map[string][]string{"filtered-time": wantTime, "filtered": wantVersion} {
		got := ordered[name]
		if len(got) != len(want) {
			t.Errorf("%s: series %v, sql --report has %v", name, got, want)
		}
		for reason, pts := range want {
			if strings.Join(got[reason], " ") != strings.Join(pts, " ") {
				t.Errorf("%s, %s: page %v, sql --report %v", name, reason, got[reason], pts)
			}
		}
	}
	// Over time ends where by version sums up.
	for reason, pts := range wantTime {
		last := pts[len(pts)-1]
		if !strings.HasSuffix(last, "="+jsonKey(totals[reason])) {
			t.Errorf("%s: cumulative over time ends at %s, by version sums to %v", reason, last, totals[reason])
		}
	}
	// The trajectory browser's reason filter: its rows' groups per
	// version are the input's groups of that reason.
	hs := liveServer(t, from, live.Options{PageSize: 100_000})
	for _, reason := range []string{"zero_variance", "truncated"} {
		rows := browserRows(httpBody(t, hs.URL+"/trajectories?reason="+reason))
		groups := map[string]bool{}
		perVersion := map[string]int{}
		for _, r := range rows {
			if !slices.Contains(strings.Split(r[9], ","), reason) {
				t.Errorf("reason=%s shows trajectory %s with filter_reason %q", reason, r[2], r[9])
			}
			if k := r[1] + "|" + reason; !groups[k+"|"+r[0]] {
				groups[k+"|"+r[0]] = true
				perVersion[k]++
			}
		}
		want := map[string]int{}
		for k, n := range indep {
			if strings.HasSuffix(k, "|"+reason) {
				want[k] = n
			}
		}
		if fmt.Sprint(perVersion) != fmt.Sprint(want) {
			t.Errorf("browser, reason=%s: groups per version %v, counted over the input %v", reason, perVersion, want)
		}
	}
}

// browserRows reads the rows of a trajectory browser page: its cells,
// the trajectory id's link text unwrapped.
func browserRows(body string) [][]string {
	var out [][]string
	for _, row := range regexp.MustCompile(`(?s)<tr class="traj">(.*?)</tr>`).FindAllStringSubmatch(body, -1) {
		var cells []string
		for _, c := range regexp.MustCompile(`(?s)<td>(.*?)</td>`).FindAllStringSubmatch(row[1], -1) {
			cells = append(cells, html.UnescapeString(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(c[1], "")))
		}
		out = append(out, cells)
	}
	return out
}

// liveServer serves the live view of the output root from over HTTP
// until the test ends.
func liveServer(t *testing.T, from string, o live.Options) *httptest.Server {
	t.Helper()
	ctx := context.Background()
	root, err := connectors.ParseRoot(from, connectors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := connectors.OpenReader(ctx, root, "ui-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	srv := live.New(r, o)
	t.Cleanup(func() { srv.Close() })
	if err := srv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs
}

// httpBody GETs url and returns its body, failing on a status not 200.
func httpBody(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return string(body)
}
