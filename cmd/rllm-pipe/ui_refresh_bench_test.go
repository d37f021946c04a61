package main

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
)

// wholePromptViews redefines the views of db the way they were before
// stored_steps: the reports count tokens from the prompts the steps view
// rebuilds (window functions over every step), the baseline of
// BenchmarkUIRefresh.
func wholePromptViews(ctx context.Context, b *testing.B, db *duckdb.DB) {
	b.Helper()
	var stored, steps string
	for _, v := range db.Views() {
		switch v.Name {
		case duckdb.ViewStoredSteps:
			stored = strings.Replace(v.SQL, "CREATE OR REPLACE VIEW stored_steps AS", "CREATE VIEW raw_steps AS", 1)
		case duckdb.ViewSteps:
			steps = strings.Replace(v.SQL, "FROM stored_steps", "FROM raw_steps", 1)
		}
	}
	for _, q := range []string{stored, steps,
		"CREATE OR REPLACE VIEW stored_steps AS SELECT *, len(prompt_ids)::BIGINT AS prompt_tokens, len(response_ids)::BIGINT AS response_tokens FROM steps"} {
		if _, err := db.SQL().ExecContext(ctx, q); err != nil {
			b.Fatalf("%.80s: %v", q, err)
		}
	}
}

// BenchmarkUIRefresh measures one refresh of `rllm-pipe ui` (open the
// views, build the trajectory index, run every report) on the store of
// BenchmarkUIBrowse (about a million steps: uiBenchStore), 3 times,
// alternated with the same work the way it was before the reports
// counted tokens without rebuilding prompts (wholePromptViews). The two
// give the same tables (checked, numbers within rounding). Metrics:
// medians in s, spreads as -min-s and -max-s.
//
//	go test -run '^$' -bench UIRefresh -benchtime 1x -timeout 90m ./cmd/rllm-pipe/
func BenchmarkUIRefresh(b *testing.B) {
	ctx := context.Background()
	r := uiBenchReader(ctx, b)
	index := `CREATE TABLE idx AS SELECT group_id, group_version, trajectory_id, task_id, coalesce(role, '') AS role, reward, advantage, steps,
  response_tokens, coalesce(filter_reason, '') AS filter_reason, pass FROM trajectories ORDER BY group_version, group_id, trajectory_id`
	var after, before *report.Data
	ops := []struct {
		name string
		run  func()
	}{
		{"refresh", func() {
			srv := live.New(r, live.Options{})
			defer srv.Close()
			if err := srv.Refresh(ctx); err != nil {
				b.Fatal(err)
			}
		}},
		{"before-whole-prompts", func() {
			db, err := duckdb.Open(ctx, r, duckdb.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			wholePromptViews(ctx, b, db)
			if _, err := db.SQL().ExecContext(ctx, index); err != nil {
				b.Fatal(err)
			}
			d, err := report.Collect(ctx, db, duckdb.ReportOptions{})
			if err != nil {
				b.Fatal(err)
			}
			before = d
		}},
	}
	db, err := duckdb.Open(ctx, r, duckdb.Options{})
	if err != nil {
		b.Fatal(err)
	}
	after, err = report.Collect(ctx, db, duckdb.ReportOptions{})
	db.Close()
	if err != nil {
		b.Fatal(err)
	}
	times := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		for range 3 {
			for _, o := range ops {
				t0 := time.Now()
				o.run()
				times[o.name] = append(times[o.name], time.Since(t0).Seconds())
			}
		}
	}
	b.StopTimer()
	for name, t := range after.Tables {
		bt := before.Tables[name]
		if len(bt.Rows) != len(t.Rows) {
			b.Errorf("%s: %d rows, %d before", name, len(t.Rows), len(bt.Rows))
			continue
		}
		for i := range t.Rows {
			for j := range t.Rows[i] {
				if !sameCell(t.Rows[i][j], bt.Rows[i][j]) {
					b.Errorf("%s row %d %s: %v, %v before", name, i, t.Columns[j], t.Rows[i][j], bt.Rows[i][j])
				}
			}
		}
	}
	for _, o := range ops {
		ts := slices.Clone(times[o.name])
		slices.Sort(ts)
		med := ts[len(ts)/2]
		b.Logf("%-22s median %8.2f s (min %8.2f, max %8.2f, %d runs)", o.name, med, ts[0], ts[len(ts)-1], len(ts))
		b.ReportMetric(med, o.name+"-s")
		b.ReportMetric(ts[0], o.name+"-min-s")
		b.ReportMetric(ts[len(ts)-1], o.name+"-max-s")
	}
}

// sameCell compares two report cells; numbers within rounding (DuckDB's
// parallel sums add in no fixed order).
func sameCell(a, b any) bool {
	x, ok1 := report.Num(a)
	y, ok2 := report.Num(b)
	if ok1 && ok2 {
		return math.Abs(x-y) <= 1e-9*math.Max(1, math.Max(math.Abs(x), math.Abs(y)))
	}
	return report.FormatCell(a) == report.FormatCell(b)
}
