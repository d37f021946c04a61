package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPromptForksView: the prompt_forks view lists exactly the steps whose
// prompt does not begin with the previous step's prompt + response, at the
// first token where they differ — against a walk of the generated traces
// (multi-turn with context resets) written here.
func TestPromptForksView(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "t.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--groups", "12", "--group-size", "2", "--turns", "2..6", "--resets", "0.3",
		"--prompt-len", "8", "--response-len", "4", "--observation-len", "3", "--seed", "5", "--out", in); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	// The reference: steps by trajectory, in step order.
	type step struct {
		Type         string  `json:"type"`
		TrajectoryID string  `json:"trajectory_id"`
		StepIndex    int     `json:"step_index"`
		PromptIDs    []int64 `json:"prompt_ids"`
		ResponseIDs  []int64 `json:"response_ids"`
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string][]step{}
	for _, l := range e2eSplitLines(data) {
		var s step
		if err := json.Unmarshal(l, &s); err != nil {
			t.Fatal(err)
		}
		if s.Type == "step" {
			if s.PromptIDs == nil {
				t.Fatalf("a delta step in the traces: the reference walks whole prompts")
			}
			by[s.TrajectoryID] = append(by[s.TrajectoryID], s)
		}
	}
	var want []string
	for id, ss := range by {
		slices.SortFunc(ss, func(a, b step) int { return a.StepIndex - b.StepIndex })
		for i := 1; i < len(ss); i++ {
			prev := append(slices.Clone(ss[i-1].PromptIDs), ss[i-1].ResponseIDs...)
			p := ss[i].PromptIDs
			at := 0
			for at < len(p) && at < len(prev) && p[at] == prev[at] {
				at++
			}
			if at < len(prev) {
				want = append(want, fmt.Sprintf("%s,%d,%d,%d", id, ss[i].StepIndex, at, len(prev)))
			}
		}
	}
	slices.Sort(want)
	q := e2eRun(t, bin, work, "sql", "--from", out, "--format", "csv", "SELECT trajectory_id, step_index, fork_at, prev_tokens FROM prompt_forks ORDER BY 1, 2")
	if q.code != 0 {
		t.Fatalf("sql: %s", q.stderr)
	}
	got := strings.Split(strings.TrimSpace(q.stdout), "\n")[1:]
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Fatalf("prompt_forks:\n%s\nwant (%d):\n%s", strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
	t.Logf("%d forks in %d trajectories", len(want), len(by))
	// The report: trajectories by their number of forks.
	perTraj := map[string]int{}
	for _, w := range want {
		perTraj[strings.Split(w, ",")[0]]++
	}
	byForks := map[int]int{}
	for id := range by {
		byForks[perTraj[id]]++
	}
	var wantReport []string
	for k, n := range byForks {
		wantReport = append(wantReport, fmt.Sprintf("%d,%d", k, n))
	}
	slices.Sort(wantReport)
	q = e2eRun(t, bin, work, "sql", "--from", out, "--format", "csv", "--report", "prompt-forks")
	if q.code != 0 {
		t.Fatalf("sql --report prompt-forks: %s", q.stderr)
	}
	var gotReport []string
	for _, l := range strings.Split(strings.TrimSpace(q.stdout), "\n")[1:] {
		f := strings.Split(l, ",")
		gotReport = append(gotReport, f[0]+","+f[1])
	}
	slices.Sort(gotReport)
	if !slices.Equal(gotReport, wantReport) {
		t.Errorf("prompt-forks report (forks,trajectories) %v, want %v", gotReport, wantReport)
	}
}
