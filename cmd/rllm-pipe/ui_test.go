package main

// `rllm-pipe ui` in headless Chromium: the live view loads with no console
// error and no request outside the server, its charts follow a shard
// committed during the test, and the trajectory browser filters, pages and
// shows a trajectory's steps with coloured tokens.

import (
	"bytes"
	"context"
	"encoding/json"
	"html"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
)

func TestUILiveAndBrowser(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	from := reportFixture(t, bin, work)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := connectors.ParseRoot(from, connectors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := connectors.OpenReader(ctx, root, "ui-test")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	srv := live.New(r, live.Options{Poll: 200 * time.Millisecond, PageSize: 20, Progress: groupProgress})
	if err := srv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()

	// Read only.
	resp, err := http.Post(hs.URL+"/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /: %d, want 405", resp.StatusCode)
	}

	p := newPage(t)
	p.do(t, "open the live view", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#throughput`)))
	before := eval[int](t, p, `document.querySelectorAll('#throughput .pt').length`)
	if before != 5 {
		t.Errorf("throughput: %d points, want 5 (shards)", before)
	}
	// A second ingest run commits more shards: the page follows.
	in2 := filepath.Join(work, "in2.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in2, "--groups", "20", "--group-size", "4", "--policy-versions", "2", "--seed", "9", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	if r := e2eRun(t, bin, work, "ingest", "--from", in2, "--to", from, "--group-size", "4"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	deadline := time.Now().Add(30 * time.Second)
	after := before
	for time.Now().Before(deadline) && after == before {
		time.Sleep(300 * time.Millisecond)
		after = eval[int](t, p, `document.querySelectorAll('#throughput .pt').length`)
	}
	if after <= before {
		t.Errorf("the live view did not follow the commit: %d throughput points before and after", before)
	}
	health := eval[string](t, p, `document.getElementById('health').textContent`)
	if !strings.Contains(health, "shards") {
		t.Errorf("health panel: %q", health)
	}
	p.screenshot(t, "ui-charts.png")

	// The browser: filter by version, page, open a trajectory.
	p.do(t, "open trajectories", chromedp.Navigate(hs.URL+"/trajectories"), chromedp.WaitVisible(chromedp.CSS(`#trajectories`)))
	if n := eval[int](t, p, `document.querySelectorAll('#trajectories tr.traj').length`); n != 20 {
		t.Errorf("first page: %d rows, want 20", n)
	}
	p.do(t, "filter", chromedp.SetValue(chromedp.CSS(`input[name=version]`), "2"), chromedp.SetValue(chromedp.CSS(`input[name=role]`), "solver"),
		chromedp.Submit(chromedp.CSS(`#filters`)), chromedp.WaitVisible(chromedp.CSS(`#trajectories`)))
	time.Sleep(500 * time.Millisecond)
	cells := eval[[]string](t, p, `[...document.querySelectorAll('#trajectories tr.traj')].map(r => r.children[1].textContent + '/' + r.children[4].textContent)`)
	if len(cells) == 0 {
		t.Fatalf("filter version=2 role=solver: no rows")
	}
	for _, c := range cells {
		if c != "2/solver" {
			t.Errorf("filtered row %q, want version 2 and role solver", c)
		}
	}
	first := eval[string](t, p, `document.querySelector('#trajectories tr.traj td:nth-child(3)').textContent`)
	if eval[bool](t, p, `!!document.getElementById('next')`) {
		p.do(t, "next page", chromedp.Click(chromedp.CSS(`#next`)), chromedp.WaitVisible(chromedp.CSS(`#prev`)))
		if second := eval[string](t, p, `document.querySelector('#trajectories tr.traj td:nth-child(3)').textContent`); second == first {
			t.Errorf("page 2 starts with the same trajectory %q", first)
		}
		if pg := eval[string](t, p, `document.getElementById('trajectories').dataset.page`); pg != "1" {
			t.Errorf("page %s after next, want 1", pg)
		}
	}
	p.do(t, "open a trajectory", chromedp.Click(chromedp.CSS(`#trajectories tr.traj td:nth-child(3) a`)), chromedp.WaitVisible(chromedp.CSS(`.step`)))
	steps := eval[int](t, p, `document.querySelectorAll('.step').length`)
	toks := eval[int](t, p, `document.querySelectorAll('.step .tok').length`)
	if steps == 0 || toks == 0 {
		t.Errorf("trajectory page: %d steps, %d tokens", steps, toks)
	}
	p.screenshot(t, "ui-trajectory.png")
	errs, reqs := p.seen()
	if len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
	for _, u := range reqs {
		if !strings.HasPrefix(u, hs.URL+"/") {
			t.Errorf("request outside the server: %s", u)
		}
	}
}

// TestUIIngestMetrics runs a real `rllm-pipe ingest` reading stdin with
// --metrics-addr, feeds it half of a run (so groups stay open and some
// shards commit), and checks that the live view scrapes its endpoint: the
// open-group backlog it shows is the endpoint's value, commits per minute
// become positive, and the backlog chart has a point per scrape.
func TestUIIngestMetrics(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "40", "--group-size", "4", "--seed", "3", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSpace(string(data)), "\n")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	out := filepath.Join(work, "out")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ing := exec.CommandContext(ctx, bin, "ingest", "--from", "-", "--to", out, "--group-size", "4",
		"--metrics-addr", addr, "--flush-interval", "200ms", "--quiet")
	ing.Dir, ing.Env = work, e2eEnv()
	var stderr bytes.Buffer
	ing.Stderr = &stderr
	stdin, err := ing.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	defer func() {
		if !exited {
			stdin.Close()
			ing.Wait()
		}
	}()
	half := len(lines) / 2
	if _, err := io.WriteString(stdin, strings.Join(lines[:half], "")); err != nil {
		t.Fatal(err)
	}
	metricsURL := "http://" + addr + "/metrics"
	scrapeOpen := func() (float64, bool) {
		resp, err := http.Get(metricsURL)
		if err != nil {
			return 0, false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		m := regexp.MustCompile(`(?m)^rllm_pipe_open_groups (\S+)$`).FindStringSubmatch(string(body))
		if m == nil {
			return 0, false
		}
		v, err := strconv.ParseFloat(m[1], 64)
		return v, err == nil
	}
	waitFor(t, 60*time.Second, "the ingest process's metrics endpoint and its first shard", func() bool {
		_, ok := scrapeOpen()
		_, err := os.Stat(filepath.Join(out, "_manifest"))
		return ok && err == nil
	})
	root, err := connectors.ParseRoot(out, connectors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := connectors.OpenReader(ctx, root, "ui-test")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	srv := live.New(r, live.Options{Poll: 100 * time.Millisecond, IngestMetrics: metricsURL})
	if err := srv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(rctx) }()
	defer func() { rcancel(); <-done }()
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	state := func() live.State {
		resp, err := http.Get(hs.URL + "/api/state")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st live.State
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st
	}
	// Half the input is read: the backlog stands still, and the view
	// shows the endpoint's figure.
	var shown, direct float64
	waitFor(t, 30*time.Second, "the backlog shown equal to the endpoint's, above 0, with commits per minute above 0", func() bool {
		st := state()
		d, ok := scrapeOpen()
		if st.Ingest == nil || st.Ingest.Last == nil || !ok {
			return false
		}
		shown, direct = st.Ingest.Last.OpenGroups, d
		return shown == direct && shown > 0 && st.Ingest.Last.CommitsPerMinute > 0
	})
	t.Logf("open groups: %v shown, %v at the endpoint", shown, direct)
	resp, err := http.Get(hs.URL + "/ingest")
	if err != nil {
		t.Fatal(err)
	}
	section, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	backlog := regexp.MustCompile(`(?s)<svg class="chart" id="ingest-backlog".*?</svg>`).FindString(string(section))
	pts := regexp.MustCompile(`data-y="([^"]*)"`).FindAllStringSubmatch(backlog, -1)
	if len(pts) < 2 || pts[len(pts)-1][1] != strconv.FormatFloat(shown, 'g', -1, 64) {
		t.Errorf("backlog chart: %d points, last %v; want at least 2, the last %v", len(pts), pts, shown)
	}
	// The rest of the input: every group completes, the backlog drains.
	if _, err := io.WriteString(stdin, strings.Join(lines[half:], "")+"\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the backlog drained to 0", func() bool {
		st := state()
		return st.Ingest != nil && st.Ingest.Last != nil && st.Ingest.Last.OpenGroups == 0
	})
	stdin.Close()
	exited = true
	if err := ing.Wait(); err != nil {
		t.Fatalf("ingest: %v\n%s", err, stderr.String())
	}
}

// waitFor polls cond every 100ms until it holds or the time is up.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", d, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestUIPagingWalksEveryTrajectory pages the trajectory browser through a
// run, filtered and not, forwards to the end and back: every trajectory
// of `sql` over the same filter shows exactly once, in order, and going
// back shows the same pages.
func TestUIPagingWalksEveryTrajectory(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	from := reportFixture(t, bin, work)
	ctx := context.Background()
	root, err := connectors.ParseRoot(from, connectors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := connectors.OpenReader(ctx, root, "ui-test")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	srv := live.New(r, live.Options{PageSize: 7})
	defer srv.Close()
	if err := srv.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	rowRe := regexp.MustCompile(`<tr class="traj"><td>([^<]*)</td><td>([^<]*)</td><td><a [^>]*>([^<]*)</a>`)
	linkRe := func(id string) *regexp.Regexp { return regexp.MustCompile(`<a id="` + id + `" href="([^"]*)"`) }
	get := func(path string) (rows []string, next, prev string) {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		for _, m := range rowRe.FindAllStringSubmatch(string(body), -1) {
			rows = append(rows, html.UnescapeString(m[2]+"|"+m[1]+"|"+m[3]))
		}
		if m := linkRe("next").FindStringSubmatch(string(body)); m != nil {
			next = html.UnescapeString(m[1])
		}
		if m := linkRe("prev").FindStringSubmatch(string(body)); m != nil {
			prev = html.UnescapeString(m[1])
		}
		return rows, next, prev
	}
	for _, tc := range []struct {
		name, query, where string
	}{
		{"all", "", "true"},
		{"version 3, solver", "version=3&role=solver", "group_version = 3 AND role = 'solver'"},
		{"reward at least 0.5", "min_reward=0.5", "reward >= 0.5"},
	} {
		res := e2eRun(t, bin, work, "sql", "--from", from, "--format", "csv",
			"SELECT group_version || '|' || group_id || '|' || trajectory_id AS k FROM trajectories WHERE "+tc.where+" ORDER BY group_version, group_id, trajectory_id")
		if res.code != 0 {
			t.Fatalf("%s: sql: %s", tc.name, res.stderr)
		}
		want := strings.Split(strings.TrimSpace(res.stdout), "\n")[1:]
		var pages [][]string
		var got []string
		path := "/trajectories?" + tc.query
		for path != "" && len(pages) <= len(want) {
			rows, next, _ := get(path)
			pages = append(pages, rows)
			got = append(got, rows...)
			path = next
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: paging forwards showed %d trajectories, sql has %d (or the order differs)", tc.name, len(got), len(want))
		}
		if len(want) > 7 && len(pages) < 2 {
			t.Errorf("%s: %d pages for %d trajectories", tc.name, len(pages), len(want))
		}
		// Back from the last page to the first.
		_, _, prev := get(lastPath(t, get, "/trajectories?"+tc.query))
		for i := len(pages) - 2; i >= 0; i-- {
			if prev == "" {
				t.Fatalf("%s: no previous link on page %d", tc.name, i+2)
			}
			rows, _, p := get(prev)
			if strings.Join(rows, ",") != strings.Join(pages[i], ",") {
				t.Errorf("%s: page %d going back: %v, going forwards: %v", tc.name, i+1, rows, pages[i])
			}
			prev = p
		}
		if prev != "" {
			t.Errorf("%s: the first page, reached going back, links to a previous one: %s", tc.name, prev)
		}
	}
}

// lastPath follows the next links from path and returns the last page's.
func lastPath(t *testing.T, get func(string) ([]string, string, string), path string) string {
	t.Helper()
	for range 10_000 {
		_, next, _ := get(path)
		if next == "" {
			return path
		}
		path = next
	}
	t.Fatal("no last page")
	return ""
}

// TestIntegrationReportAndUIFromS3: report and ui over an output in MinIO.
// The report's reward chart is sql --report's over the same prefix; a
// real `rllm-pipe ui` process serves the state, the charts and the
// trajectory browser, and follows a second ingest into the prefix.
func TestIntegrationReportAndUIFromS3(t *testing.T) {
	target := newS3Target(t, "ui")
	bin := e2eBinary(t)
	work := t.TempDir()
	ingestRun := func(name, seed string) {
		t.Helper()
		in := filepath.Join(work, name+".jsonl")
		if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "30", "--group-size", "4", "--policy-versions", "3", "--seed", seed,
			"--prompt-len", "40", "--response-len", "20", "--quiet"); r.code != 0 {
			t.Fatalf("gen: %s", r.stderr)
		}
		args := append([]string{"ingest", "--from", in, "--to", target.url, "--group-size", "4", "--quiet"}, target.flags()...)
		if r := e2eRun(t, bin, work, args...); r.code != 0 {
			t.Fatalf("ingest: %s", r.stderr)
		}
	}
	ingestRun("a", "1")

	out := filepath.Join(work, "report.html")
	if r := e2eRun(t, bin, work, append([]string{"report", "--from", target.url, "--to", out}, target.flags()...)...); r.code != 0 {
		t.Fatalf("report: %s", r.stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	r := e2eRun(t, bin, work, append([]string{"sql", "--from", target.url, "--report", "reward-by-version", "--format", "jsonl"}, target.flags()...)...)
	if r.code != 0 {
		t.Fatalf("sql --report: %s", r.stderr)
	}
	var rows []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, m)
	}
	sameFigures(t, "s3 report: mean reward", pagePoints(t, string(data))["reward"]["mean reward"], rows, "group_version", "mean_reward")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ui := exec.CommandContext(ctx, bin, append([]string{"ui", "--from", target.url, "--listen", addr, "--poll", "300ms"}, target.flags()...)...)
	tmp := t.TempDir() // the ui's download cache goes here
	ui.Dir, ui.Env = work, append(e2eEnv(), "TMPDIR="+tmp)
	var stderr bytes.Buffer
	ui.Stderr = &stderr
	if err := ui.Start(); err != nil {
		t.Fatal(err)
	}
	defer terminate(t, ui, waitChan(ui), &stderr)
	base := "http://" + addr
	state := func() (live.State, bool) {
		resp, err := http.Get(base + "/api/state")
		if err != nil {
			return live.State{}, false
		}
		defer resp.Body.Close()
		var st live.State
		return st, json.NewDecoder(resp.Body).Decode(&st) == nil
	}
	var first live.State
	waitFor(t, 60*time.Second, "the ui process serving the S3 output", func() bool {
		st, ok := state()
		first = st
		return ok && st.Shards > 0
	})
	resp, err := http.Get(base + "/trajectories?version=1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(body), `<tr class="traj">`); resp.StatusCode != http.StatusOK || n == 0 {
		t.Errorf("trajectories over S3: status %d, %d rows\n%s", resp.StatusCode, n, stderr.String())
	}
	ingestRun("b", "2")
	var second live.State
	waitFor(t, 60*time.Second, "the ui following the second ingest into S3", func() bool {
		st, ok := state()
		second = st
		return ok && st.Shards > first.Shards && st.Rows > first.Rows
	})

	// A compaction merges the shards the ui downloaded; once it follows
	// a third ingest, its download cache holds the copies of the shards
	// not merged and one snapshot, not the merged shards' copies.
	if r := e2eRun(t, bin, work, append([]string{"compact", "--from", target.url, "--min-shards", "2", "--max-shards", "3", "--quiet"}, target.flags()...)...); r.code != 0 {
		t.Fatalf("compact: %s", r.stderr)
	}
	ingestRun("c", "3")
	r = e2eRun(t, bin, work, append([]string{"sql", "--from", target.url, "--format", "jsonl",
		`SELECT path FROM shards WHERE file NOT LIKE '%/compacted/%' ORDER BY path`}, target.flags()...)...)
	if r.code != 0 || strings.Contains(r.stderr, "not used") {
		t.Fatalf("sql after compact: %d %s", r.code, r.stderr)
	}
	var loose []string
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var m struct{ Path string }
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		loose = append(loose, "shards/"+m.Path)
	}
	if len(loose) == 0 {
		t.Fatal("no shard after the compaction is read from its own file")
	}
	var cached []string
	var snaps int
	defer func() {
		if t.Failed() {
			t.Logf("download cache: %v and %d snapshots; want %v and 1", cached, snaps, loose)
		}
	}()
	waitFor(t, 60*time.Second, "the ui's download cache pruned after the compaction", func() bool {
		st, ok := state()
		if !ok || st.Rows <= second.Rows {
			return false
		}
		caches, _ := filepath.Glob(filepath.Join(tmp, "rllm-pipe-ui-*"))
		if len(caches) != 1 {
			return false
		}
		cached = nil
		filepath.WalkDir(filepath.Join(caches[0], "shards"), func(path string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				rel, _ := filepath.Rel(caches[0], path)
				cached = append(cached, filepath.ToSlash(rel))
			}
			return nil
		})
		slices.Sort(cached)
		names, _ := filepath.Glob(filepath.Join(caches[0], "compacted", "snapshot-*.parquet"))
		snaps = len(names)
		return slices.Equal(cached, loose) && snaps == 1
	})
}
