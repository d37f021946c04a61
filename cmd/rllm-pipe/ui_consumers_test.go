package main

// The live view's consumer-group panel against a real `rllm-pipe
// consume`: acknowledged and skipped groups, lag and the member's policy
// version and staleness, in /api/state and on the page.

import (
	"encoding/json"
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
	if r := e2eRun(t, bin, work, "gen", "--out", in, "--groups", "40", "--group-size", "4", "--policy-versions", "4",
		"--seed", "4", "--prompt-len", "30", "--response-len", "10", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	from := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	// One group per batch, policy 3, groups more than 2 versions behind
	// skipped, 6 batches: some groups left (a lag).
	stats := filepath.Join(work, "stats.json")
	r := e2eRun(t, bin, work, "consume", "--from", from, "--consumer-group", "trainers", "--name", "alpha",
		"--max-batches", "6", "--policy-version", "3", "--max-staleness", "2", "--stats-json", stats)
	if r.code != 0 {
		t.Fatalf("consume: %s", r.stderr)
	}
	var st struct {
		Groups       int64 `json:"groups_acked"`
		Batches      int64 `json:"batches"`
		SkippedStale int64 `json:"groups_skipped_stale"`
		SkippedEmpty int64 `json:"groups_skipped_empty"`
	}
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
	// Independent figures: committed groups, and the last batch's
	// group version.
	q := e2eRun(t, bin, work, "sql", "--from", from, "--format", "csv",
		"SELECT (SELECT count(*) FROM groups) AS n, (SELECT max(group_version) FROM groups WHERE group_id = '"+last.Groups[0]+"') AS v")
	if q.code != 0 {
		t.Fatalf("sql: %s", q.stderr)
	}
	f := strings.Split(strings.Split(strings.TrimSpace(q.stdout), "\n")[1], ",")
	committed, _ := strconv.ParseInt(f[0], 10, 64)
	lastVersion, _ := strconv.ParseInt(f[1], 10, 64)

	t.Logf("consume: %d groups acknowledged in %d batches, %d skipped as stale, %d empty; %d committed", st.Groups, st.Batches, st.SkippedStale, st.SkippedEmpty, committed)
	if st.SkippedStale == 0 || st.Groups == 0 || committed-st.Groups-st.SkippedStale <= 0 {
		t.Fatalf("the test needs groups acknowledged, groups skipped as stale and a lag")
	}
	hs := liveServer(t, from, live.Options{Progress: groupProgress, Members: groupMembers})
	var state live.State
	if err := json.Unmarshal([]byte(httpBody(t, hs.URL+"/api/state")), &state); err != nil {
		t.Fatal(err)
	}
	if len(state.Consumers) != 1 {
		t.Fatalf("consumers %+v, want the one group", state.Consumers)
	}
	c := state.Consumers[0]
	skipped := st.SkippedStale + st.SkippedEmpty
	if c.Group != "trainers" || c.Acked != st.Groups || c.Skipped != skipped || c.Lag != committed-st.Groups-skipped {
		t.Errorf("consumer %+v; consume acknowledged %d groups and skipped %d of %d committed", c, st.Groups, skipped, committed)
	}
	if len(c.Members) != 1 || c.Members[0].Name != "alpha" || c.Members[0].Batches != st.Batches || c.Members[0].PolicyVersion != 3 ||
		c.Members[0].Staleness != 3-lastVersion {
		t.Errorf("members %+v; want alpha, %d batches, policy 3, staleness %d (its last group's version %d)", c.Members, st.Batches, 3-lastVersion, lastVersion)
	}

	p := newPage(t)
	p.do(t, "open the live view", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`#consumers`)))
	cells := eval[[]string](t, p, `[...document.querySelectorAll('#consumers tr:nth-child(2) td')].map(td => td.textContent)`)
	want := []string{"trainers", strconv.FormatInt(st.Groups, 10), strconv.FormatInt(skipped, 10), strconv.FormatInt(committed-st.Groups-skipped, 10)}
	if len(cells) != 5 || strings.Join(cells[:4], "|") != strings.Join(want, "|") || !strings.HasPrefix(cells[4], "alpha (") {
		t.Errorf("consumer panel %q, want %q and alpha", cells, want)
	}
	p.screenshot(t, "ui-health.png")
	if errs, _ := p.seen(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
}
