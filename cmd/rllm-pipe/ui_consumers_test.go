package main

// The live view's consumer-group panel against a real `rllm-pipe
// consume`: acknowledged and skipped groups, lag and the member's policy
// version and staleness, in /api/state and on the page.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
)

func TestUIConsumerPanel(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "40", "--group-size", "4", "--policy-versions", "4",
		"--seed", "4", "--prompt-len", "30", "--response-len", "10", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	from := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	// Independent figure: the committed groups.
	q := e2eRun(t, bin, work, "sql", "--from", from, "--format", "csv", "SELECT count(*) AS n FROM groups")
	if q.code != 0 {
		t.Fatalf("sql: %s", q.stderr)
	}
	committed, _ := strconv.ParseInt(strings.Split(strings.TrimSpace(q.stdout), "\n")[1], 10, 64)
	groupVersion := func(group string) int64 {
		q := e2eRun(t, bin, work, "sql", "--from", from, "--format", "csv", "SELECT max(group_version) AS v FROM groups WHERE group_id = '"+group+"'")
		if q.code != 0 {
			t.Fatalf("sql: %s", q.stderr)
		}
		v, _ := strconv.ParseInt(strings.Split(strings.TrimSpace(q.stdout), "\n")[1], 10, 64)
		return v
	}
	type consumed struct {
		Groups       int64 `json:"groups_acked"`
		Batches      int64 `json:"batches"`
		SkippedStale int64 `json:"groups_skipped_stale"`
		SkippedEmpty int64 `json:"groups_skipped_empty"`
		lastVersion  int64
	}
	// consume runs one member of a consumer group at policy 3, one group
	// per batch.
	consume := func(group, member string, extra ...string) consumed {
		t.Helper()
		stats := filepath.Join(work, group+".json")
		args := append([]string{"consume", "--from", from, "--consumer-group", group, "--name", member, "--policy-version", "3", "--stats-json", stats}, extra...)
		r := e2eRun(t, bin, work, args...)
		if r.code != 0 {
			t.Fatalf("consume: %s", r.stderr)
		}
		var st consumed
		data, err := os.ReadFile(stats)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		var last struct {
			Groups []string `json:"groups"`
		}
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || len(last.Groups) != 1 {
			t.Fatalf("consume's last batch %q: %v", lines[len(lines)-1], err)
		}
		st.lastVersion = groupVersion(last.Groups[0])
		t.Logf("consume %s: %d groups acknowledged in %d batches, %d skipped as stale, %d empty; %d committed", group, st.Groups, st.Batches, st.SkippedStale, st.SkippedEmpty, committed)
		return st
	}
	// "trainers" stops after 6 batches: a lag. "fresh" reads everything
	// with no staleness allowed: groups behind policy 3 are skipped.
	runs := map[string]consumed{
		"fresh":    consume("fresh", "beta", "--max-staleness", "0"),
		"trainers": consume("trainers", "alpha", "--max-batches", "6"),
	}
	if runs["fresh"].SkippedStale == 0 || runs["trainers"].Groups != 6 || committed <= 6 {
		t.Fatalf("the test needs groups skipped as stale in fresh and a lag in trainers")
	}

	// The same skips through SQL: the stale-skips report sums to them.
	q = e2eRun(t, bin, work, "sql", "--from", from, "--format", "csv", "--report", "stale-skips")
	if q.code != 0 {
		t.Fatalf("sql --report stale-skips: %s", q.stderr)
	}
	var staleSQL int64
	for _, line := range strings.Split(strings.TrimSpace(q.stdout), "\n")[1:] {
		f := strings.Split(line, ",")
		if f[0] != "fresh" {
			t.Errorf("stale-skips row %q: only fresh skipped groups", line)
		}
		n, _ := strconv.ParseInt(f[4], 10, 64)
		staleSQL += n
	}
	if staleSQL != runs["fresh"].SkippedStale {
		t.Errorf("stale-skips report:\n%s\nsums to %d, consume skipped %d", q.stdout, staleSQL, runs["fresh"].SkippedStale)
	}

	hs := liveServer(t, from, live.Options{Progress: groupProgress})
	var state live.State
	if err := json.Unmarshal([]byte(httpBody(t, hs.URL+"/api/state")), &state); err != nil {
		t.Fatal(err)
	}
	if len(state.Consumers) != 2 {
		t.Fatalf("consumers %+v, want fresh and trainers", state.Consumers)
	}
	member := map[string]string{"fresh": "beta", "trainers": "alpha"}
	for _, c := range state.Consumers {
		st, ok := runs[c.Group]
		if !ok {
			t.Errorf("consumer group %q, not one the test ran", c.Group)
			continue
		}
		skipped := st.SkippedStale + st.SkippedEmpty
		if c.Acked != st.Groups || c.Skipped != skipped || c.Lag != committed-st.Groups-skipped {
			t.Errorf("consumer %+v; consume acknowledged %d groups and skipped %d of %d committed", c, st.Groups, skipped, committed)
		}
		var byVersion int64
		for _, v := range c.StaleByVersion {
			byVersion += v.Groups
			if v.Version >= 3 {
				t.Errorf("%s: groups of version %d counted stale at policy 3", c.Group, v.Version)
			}
		}
		if c.Stale != st.SkippedStale || byVersion != st.SkippedStale {
			t.Errorf("%s: %d skipped as stale (%d by version: %+v); consume skipped %d", c.Group, c.Stale, byVersion, c.StaleByVersion, st.SkippedStale)
		}
		if len(c.Members) != 1 || c.Members[0].Name != member[c.Group] || c.Members[0].Batches != st.Batches || c.Members[0].PolicyVersion != 3 ||
			c.Members[0].Staleness != 3-st.lastVersion || c.Members[0].SkippedStale != st.SkippedStale {
			t.Errorf("%s: members %+v; want %s, %d batches, policy 3, staleness %d (its last group's version %d)",
				c.Group, c.Members, member[c.Group], st.Batches, 3-st.lastVersion, st.lastVersion)
		}
	}

	p := newPage(t)
	p.do(t, "open the live view", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#consumers`)))
	rows := eval[[]string](t, p, `[...document.querySelectorAll('#consumers tr')].slice(1).map(tr => [...tr.children].map(td => td.textContent).join('|'))`)
	var want []string
	for _, g := range []string{"fresh", "trainers"} {
		st := runs[g]
		skipped := st.SkippedStale + st.SkippedEmpty
		want = append(want, fmt.Sprintf("%s|%d|%d|%d|%d", g, st.Groups, skipped, committed-st.Groups-skipped, st.SkippedStale))
	}
	if len(rows) != 2 || !strings.HasPrefix(rows[0], want[0]) || !strings.HasPrefix(rows[1], want[1]) {
		t.Errorf("consumer panel %q, want rows starting %q", rows, want)
	}
	p.screenshot(t, "ui-health.png")
	if errs, _ := p.seen(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
}
