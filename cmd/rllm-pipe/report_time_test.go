package main

// Figures the reports count without reading tokens, and dead letters over
// commit time, checked against independent computations and sql --report.

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
)

// TestPromptTokensOfDeltaRows: multi-turn trajectories store most prompts
// as prefix deltas; the token counts the reports use (stored_steps,
// prefix length plus delta) equal the lengths of the prompts the steps
// view rebuilds, row by row, and token-lengths equals its computation
// over the rebuilt prompts.
func TestPromptTokensOfDeltaRows(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "40", "--group-size", "4", "--turns", "2..6",
		"--seed", "3", "--prompt-len", "40", "--response-len", "20", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	from := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	ctx := context.Background()
	db, err := duckdb.OpenLocal(ctx, from, duckdb.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tb, err := report.RunTable(ctx, db, "deltas", `SELECT count(*) FILTER (WHERE st.prompt_prefix_len > 0),
  count(*) FILTER (WHERE st.prompt_tokens IS DISTINCT FROM len(s.prompt_ids) OR st.response_tokens IS DISTINCT FROM len(s.response_ids)),
  count(*), (SELECT count(*) FROM steps)
FROM stored_steps st JOIN steps s USING (shard, group_id, group_version, trajectory_id, step_index)`)
	if err != nil {
		t.Fatal(err)
	}
	r := tb.Rows[0]
	deltas, _ := report.Num(r[0])
	differ, _ := report.Num(r[1])
	joined, _ := report.Num(r[2])
	steps, _ := report.Num(r[3])
	if deltas == 0 {
		t.Fatal("no row stores its prompt as a delta: the test needs some")
	}
	if differ != 0 || joined != steps {
		t.Errorf("%v of %v rows (%v delta rows) count other tokens than the rebuilt prompts; %v steps", differ, joined, deltas, steps)
	}
	q, err := duckdb.Report(duckdb.ReportTokenLengths, duckdb.ReportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := report.RunTable(ctx, db, "token-lengths", q)
	if err != nil {
		t.Fatal(err)
	}
	want, err := report.RunTable(ctx, db, "rebuilt", `SELECT tokens, count(*) AS steps, avg(len) AS mean,
  quantile_cont(len, 0.5) AS p50, quantile_cont(len, 0.9) AS p90, quantile_cont(len, 0.99) AS p99, min(len) AS min, max(len) AS max
FROM (SELECT 'prompt' AS tokens, 0 AS o, len(prompt_ids) AS len FROM steps UNION ALL SELECT 'response', 1, len(response_ids) FROM steps)
GROUP BY tokens, o ORDER BY o`)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Rows) != 2 || len(want.Rows) != 2 {
		t.Fatalf("token-lengths %v, rebuilt %v", got.Rows, want.Rows)
	}
	for i := range want.Rows {
		for j := range want.Rows[i] {
			if report.FormatCell(got.Rows[i][j]) != report.FormatCell(want.Rows[i][j]) {
				t.Errorf("token-lengths row %d %s: %v, over rebuilt prompts %v", i, want.Columns[j], got.Rows[i][j], want.Rows[i][j])
			}
		}
	}
}

// TestReportDeadLettersOverTime: two inputs with bad lines spread
// through them, ingested one after the other; the chart of dead letters over
// commit time holds exactly the rows of sql --report
// dead-letters-over-time, point for point in order, each reason ending at
// its count in dead-letters; and the commits are several.
func TestReportDeadLettersOverTime(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	// Two runs into the same output, each with its own dead-letter file
	// (a file ingest commits its dead letters with its last entry).
	from := filepath.Join(work, "out")
	for run, seed := range []string{"9", "10"} {
		clean := filepath.Join(work, "clean"+seed+".jsonl")
		if r := e2eRun(t, bin, work, "gen", "--to", clean, "--groups", "60", "--group-size", "4", "--policy-versions", "3",
			"--seed", seed, "--prompt-len", "40", "--response-len", "20", "--quiet"); r.code != 0 {
			t.Fatalf("gen: %s", r.stderr)
		}
		in := filepath.Join(work, "in"+seed+".jsonl")
		badLines(t, clean, in, run)
		if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--quiet"); r.code != 0 {
			t.Fatalf("ingest: %s", r.stderr)
		}
	}
	out := filepath.Join(work, "report.html")
	if r := e2eRun(t, bin, work, "report", "--from", from, "--to", out); r.code != 0 {
		t.Fatalf("report: %s", r.stderr)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, m := range svgRe.FindAllStringSubmatch(string(data), -1) {
		if m[1] != "dead-letters-time" {
			continue
		}
		for _, s := range seriesRe.FindAllStringSubmatch(m[0], -1) {
			for _, p := range pointRe.FindAllStringSubmatch(s[2], -1) {
				got[s[1]] = append(got[s[1]], p[1]+"="+p[2])
			}
		}
	}
	want := map[string][]string{}
	commits := map[string]bool{}
	for _, r := range sqlReport(t, bin, work, from, "dead-letters-over-time") {
		at, err := time.Parse(time.RFC3339Nano, strings.Replace(r["committed_at"].(string), " ", "T", 1))
		if err != nil {
			t.Fatalf("committed_at %v: %v", r["committed_at"], err)
		}
		x := strconv.FormatFloat(float64(at.UnixNano())/1e9, 'g', -1, 64)
		reason := r["reason"].(string)
		want[reason] = append(want[reason], x+"="+jsonKey(r["cumulative_dead_letters"]))
		commits[jsonKey(r["seq"])] = true
	}
	if len(commits) < 2 {
		t.Fatalf("dead letters committed by %d entries: the test needs several", len(commits))
	}
	if len(got) != len(want) {
		t.Errorf("series %v, sql --report has %v", got, want)
	}
	for reason, pts := range want {
		if strings.Join(got[reason], " ") != strings.Join(pts, " ") {
			t.Errorf("%s: page %v, sql --report %v", reason, got[reason], pts)
		}
	}
	t.Run("browser", func(t *testing.T) {
		p := newPage(t)
		p.do(t, "open the report", chromedp.Navigate(e2eFileURL(out)), chromedp.WaitVisible(chromedp.CSS(`#dead-letters-time`)))
		series := eval[int](t, p, `document.querySelectorAll('#dead-letters-time g.series').length`)
		points := eval[int](t, p, `document.querySelectorAll('#dead-letters-time .pt').length`)
		wantPoints := 0
		for _, pts := range want {
			wantPoints += len(pts)
		}
		if series != len(want) || points != wantPoints {
			t.Errorf("browser: dead letters over time has %d series, %d points; want %d, %d", series, points, len(want), wantPoints)
		}
		p.screenshot(t, "report-dead-letters.png")
		if errs, _ := p.seen(); len(errs) > 0 {
			t.Errorf("console errors: %q", errs)
		}
	})
	totals := sqlReport(t, bin, work, from, "dead-letters")
	// The bar chart of dead letters by reason: a bar per reason, its count.
	sameFigures(t, "dead letters by reason", pagePoints(t, string(data))["dead-letters"]["dead letters"], totals, "reason", "dead_letters")
	if len(totals) != len(want) {
		t.Errorf("dead-letters has %d reasons, over time %d", len(totals), len(want))
	}
	for _, r := range totals {
		pts := want[r["reason"].(string)]
		if len(pts) == 0 || !strings.HasSuffix(pts[len(pts)-1], "="+jsonKey(r["dead_letters"])) {
			t.Errorf("%v: over time ends at %v, dead-letters counts %v", r["reason"], pts, r["dead_letters"])
		}
	}
}

// badLines copies src to dst with bad lines spread through it: malformed
// JSON, and in the second run (run 1) records missing fields too.
func badLines(t *testing.T, src, dst string, run int) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 64<<20)
	for n := 0; sc.Scan(); n++ {
		out.Write(append(sc.Bytes(), '\n'))
		switch {
		case n%97 == 5:
			out.WriteString("not json " + strconv.Itoa(n) + "\n")
		case run == 1 && n%131 == 7:
			out.WriteString(`{"type":"step"}` + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
