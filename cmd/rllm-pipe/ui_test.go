package main

// `rllm-pipe ui` in headless Chromium: the live view loads with no console
// error and no request outside the server, its charts follow a shard
// committed during the test, and the trajectory browser filters, pages and
// shows a trajectory's steps with coloured tokens.

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
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
	if r := e2eRun(t, bin, work, "gen", "--out", in2, "--groups", "20", "--group-size", "4", "--policy-versions", "2", "--seed", "9", "--quiet"); r.code != 0 {
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
