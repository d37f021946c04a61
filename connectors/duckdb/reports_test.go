package duckdb

import (
	"context"
	"strings"
	"testing"
)

// TestFilteredReportsSplitReasons: a trajectory two filters marked is
// stored with filter_reason "zero_variance,truncated"; the filtered
// reports count its group under each reason, never under the joined
// string as a third one.
func TestFilteredReportsSplitReasons(t *testing.T) {
	d, err := OpenLocal(context.Background(), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// g0 (v0, s0): a both reasons, b zero_variance. g1 (v0, s1): a
	// truncated, b kept. g2 (v1, s1): kept.
	synthetic(t, d, "group_id, group_version, trajectory_id, step_index, reward, filter_reason, shard",
		[]string{"('g0', 0, 'a', 0, 1, 'zero_variance,truncated', 's0')", "('g0', 0, 'b', 0, 1, 'zero_variance', 's0')",
			"('g1', 0, 'a', 0, 1, 'truncated', 's1')", "('g1', 0, 'b', 0, 0, NULL, 's1')",
			"('g2', 1, 'a', 0, 1, NULL, 's1')"},
		[]string{"(0, 's0')", "(1, 's1')"})
	if _, err := d.SQL().Exec(`UPDATE shards SET committed_at = TIMESTAMPTZ '2026-01-02 03:04:00+00' + to_seconds(seq)`); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(reportRows(t, d, ReportFilteredByVersion), "\n")
	want := strings.Join([]string{
		`{"group_version":0,"filter_reason":"(kept)","groups":1}`,
		`{"group_version":0,"filter_reason":"truncated","groups":2}`,
		`{"group_version":0,"filter_reason":"zero_variance","groups":1}`,
		`{"group_version":1,"filter_reason":"(kept)","groups":1}`,
	}, "\n")
	if got != want {
		t.Errorf("filtered-by-version:\n%s\nwant:\n%s", got, want)
	}
	got = strings.Join(reportRows(t, d, ReportFilteredOverTime), "\n")
	want = strings.Join([]string{
		`{"seq":0,"committed_at":"2026-01-02T03:04:00Z","filter_reason":"truncated","groups":1,"cumulative_groups":1}`,
		`{"seq":0,"committed_at":"2026-01-02T03:04:00Z","filter_reason":"zero_variance","groups":1,"cumulative_groups":1}`,
		`{"seq":1,"committed_at":"2026-01-02T03:04:01Z","filter_reason":"(kept)","groups":2,"cumulative_groups":2}`,
		`{"seq":1,"committed_at":"2026-01-02T03:04:01Z","filter_reason":"truncated","groups":1,"cumulative_groups":2}`,
	}, "\n")
	if got != want {
		t.Errorf("filtered-over-time:\n%s\nwant:\n%s", got, want)
	}
}

// TestAdvantageMeanWithoutRoundingNoise: a group's advantages that sum to
// 0 in exact arithmetic (0.1 + 0.2 - 0.3) but not in floating point show
// a mean of exactly 0, and the same in every run.
func TestAdvantageMeanWithoutRoundingNoise(t *testing.T) {
	d, err := OpenLocal(context.Background(), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	synthetic(t, d, "group_id, group_version, trajectory_id, step_index, reward, advantage, estimator, shard",
		[]string{"('g0', 0, 'a', 0, 1, 0.1, 'grpo', 's0')", "('g0', 0, 'b', 0, 1, 0.2, 'grpo', 's0')", "('g0', 0, 'c', 0, 0, -0.3, 'grpo', 's0')",
			"('g1', 0, 'a', 0, 1, -0.1, 'rloo', 's0')", "('g1', 0, 'b', 0, 1, -0.2, 'rloo', 's0')", "('g1', 0, 'c', 0, 0, 0.3, 'rloo', 's0')"},
		[]string{"(0, 's0')"})
	rows := reportRows(t, d, ReportAdvantage)
	if len(rows) != 2 {
		t.Fatalf("%d rows: %v", len(rows), rows)
	}
	for _, r := range rows {
		if !strings.Contains(r, `"mean":0,`) {
			t.Errorf("mean not exactly 0: %s", r)
		}
	}
}
