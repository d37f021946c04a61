package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
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
		"--prompt-len", "8", "--response-len", "4", "--observation-len", "3", "--seed", "5", "--to", in); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	by := readForkInput(t, in)
	var want []string
	for id, ss := range by {
		for _, s := range ss[1:] {
			if s.forkAt >= 0 {
				want = append(want, fmt.Sprintf("%s,%d,%d,%d", id, s.StepIndex, s.forkAt, s.prevTokens))
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

// forkStep is a step of generated traces with where its prompt forked
// from the one before (forkAt -1 when it extends it), and its tokens'
// versions (nil when the step has one).
type forkStep struct {
	Type          string  `json:"type"`
	TrajectoryID  string  `json:"trajectory_id"`
	TaskID        string  `json:"task_id"`
	StepIndex     int     `json:"step_index"`
	PolicyVersion int64   `json:"policy_version"`
	PromptIDs     []int64 `json:"prompt_ids"`
	ResponseIDs   []int64 `json:"response_ids"`
	TokenVersions []int64 `json:"token_versions"`

	forkAt, prevTokens int
}

// readForkInput is the reference walk: the generated traces' steps by
// trajectory in step order, each compared with the previous step's
// prompt + response token by token.
func readForkInput(t *testing.T, in string) map[string][]forkStep {
	t.Helper()
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string][]forkStep{}
	for _, l := range e2eSplitLines(data) {
		var s forkStep
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
	for _, ss := range by {
		slices.SortFunc(ss, func(a, b forkStep) int { return a.StepIndex - b.StepIndex })
		ss[0].forkAt = -1
		for i := 1; i < len(ss); i++ {
			prev := append(slices.Clone(ss[i-1].PromptIDs), ss[i-1].ResponseIDs...)
			p := ss[i].PromptIDs
			at := 0
			for at < len(p) && at < len(prev) && p[at] == prev[at] {
				at++
			}
			ss[i].forkAt, ss[i].prevTokens = -1, len(prev)
			if at < len(prev) {
				ss[i].forkAt = at
			}
		}
	}
	return by
}

// TestStepVersionsView: the step_versions view gives every response
// token's policy version, the oldest and newest, and where a new version
// begins, as the generated traces have them (steps of one version stored
// without token versions).
func TestStepVersionsView(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "t.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--groups", "20", "--group-size", "2", "--turns", "1..4", "--token-versions", "--policy-versions", "4",
		"--prompt-len", "8", "--response-len", "6", "--seed", "3", "--to", in); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	var want []string
	mixed := 0
	for _, ss := range readForkInput(t, in) {
		for _, s := range ss {
			vs := s.TokenVersions
			if vs == nil {
				vs = make([]int64, len(s.ResponseIDs))
				for i := range vs {
					vs[i] = s.PolicyVersion
				}
			}
			oldest, newest := min(s.PolicyVersion, slices.Min(vs)), max(s.PolicyVersion, slices.Max(vs))
			var changes []string
			for i := 1; i < len(vs); i++ {
				if vs[i] != vs[i-1] {
					changes = append(changes, fmt.Sprintf("%d:%d", i, vs[i]))
				}
			}
			if changes != nil {
				mixed++
			}
			want = append(want, fmt.Sprintf("%s|%d|%d|%v|%s", fmt.Sprintf("%s#%d", s.TrajectoryID, s.StepIndex), oldest, newest, vs, strings.Join(changes, " ")))
		}
	}
	slices.Sort(want)
	if mixed == 0 {
		t.Fatal("no step of mixed versions generated: the test needs some")
	}
	q := e2eRun(t, bin, work, "sql", "--from", out, "--format", "jsonl",
		"SELECT step_id, oldest_version, newest_version, response_versions, version_changes FROM step_versions")
	if q.code != 0 {
		t.Fatalf("sql: %s", q.stderr)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(q.stdout), "\n") {
		var r struct {
			StepID           string                        `json:"step_id"`
			Oldest           int64                         `json:"oldest_version"`
			Newest           int64                         `json:"newest_version"`
			ResponseVersions []int64                       `json:"response_versions"`
			Changes          []struct{ At, Version int64 } `json:"version_changes"`
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		var changes []string
		for _, c := range r.Changes {
			changes = append(changes, fmt.Sprintf("%d:%d", c.At, c.Version))
		}
		got = append(got, fmt.Sprintf("%s|%d|%d|%v|%s", r.StepID, r.Oldest, r.Newest, r.ResponseVersions, strings.Join(changes, " ")))
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("step_versions (%d rows):\n%s\nwant (%d):\n%s", len(got), strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
}

// TestUITrajectoryMarksForksAndVersions: the trajectory page, in headless
// Chromium, marks each step whose prompt forked at the token the
// reference walk finds (that token highlighted among the prompt's), and
// each response token's policy version, with the token where a new
// version begins marked.
func TestUITrajectoryMarksForksAndVersions(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "t.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--groups", "12", "--group-size", "2", "--turns", "2..6", "--resets", "0.4", "--token-versions",
		"--policy-versions", "3", "--prompt-len", "8", "--response-len", "6", "--observation-len", "3", "--seed", "9", "--to", in); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	by := readForkInput(t, in)
	version := map[string]int64{} // task → group version: its oldest token's
	for _, ss := range by {
		for _, s := range ss {
			v := s.PolicyVersion
			for _, tv := range s.TokenVersions {
				v = min(v, tv)
			}
			if w, ok := version[s.TaskID]; !ok || v < w {
				version[s.TaskID] = v
			}
		}
	}
	// Trajectories with a fork and a step of mixed versions first.
	var ids []string
	for id, ss := range by {
		fork, mixed := false, false
		for _, s := range ss {
			fork = fork || s.forkAt >= 0
			mixed = mixed || len(s.TokenVersions) > 0 && slices.Min(s.TokenVersions) != slices.Max(s.TokenVersions)
		}
		if fork && mixed {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) < 2 {
		t.Fatalf("%d trajectories with a fork and mixed token versions: the test needs some", len(ids))
	}
	ids = ids[:2]
	hs := liveServer(t, out, live.Options{PageSize: 1000})
	p := newPage(t)
	type shown struct {
		Fork    *int     `json:"fork"`
		Prev    *int     `json:"prev"`
		Forked  []string `json:"forked"` // the highlighted prompt token's position (title) and id
		Tokens  []string `json:"tokens"`
		V       []string `json:"v"`
		VChange []int    `json:"vchange"`
	}
	const js = `JSON.stringify([...document.querySelectorAll('section.step')].map(s => {
  const f = s.querySelector('.prompt-fork'), k = f && f.querySelector('.tok.forked');
  const toks = [...s.querySelectorAll('.tokens .tok')];
  return {fork: f ? +f.dataset.forkAt : null, prev: f ? +f.dataset.prevTokens : null,
    forked: k ? [k.title, k.textContent] : [],
    tokens: toks.map(e => e.textContent), v: toks.map(e => e.dataset.v ?? ''),
    vchange: toks.flatMap((e, i) => e.hasAttribute('data-vchange') ? [i] : [])};
}))`
	for _, id := range ids {
		ss := by[id]
		u := hs.URL + "/trajectory?" + url.Values{"g": {ss[0].TaskID}, "v": {fmt.Sprint(version[ss[0].TaskID])}, "t": {id}}.Encode()
		p.do(t, "open "+id, chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS(`section.step`)))
		var got []shown
		if err := json.Unmarshal([]byte(eval[string](t, p, js)), &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != len(ss) {
			t.Fatalf("%s: %d steps on the page, %d in the input", id, len(got), len(ss))
		}
		for i, s := range ss {
			g, where := got[i], fmt.Sprintf("%s step %d", id, s.StepIndex)
			switch {
			case s.forkAt < 0 && g.Fork != nil:
				t.Errorf("%s: marked as forked at %d; it extends the step before", where, *g.Fork)
			case s.forkAt >= 0 && (g.Fork == nil || *g.Fork != s.forkAt || *g.Prev != s.prevTokens):
				t.Errorf("%s: fork %v of %v shown, the reference forks at %d of %d", where, g.Fork, g.Prev, s.forkAt, s.prevTokens)
			case s.forkAt >= 0 && s.forkAt < len(s.PromptIDs) && !slices.Equal(g.Forked, []string{fmt.Sprintf("prompt token %d", s.forkAt), fmt.Sprint(s.PromptIDs[s.forkAt])}):
				t.Errorf("%s: highlighted prompt token %v, want position %d id %d", where, g.Forked, s.forkAt, s.PromptIDs[s.forkAt])
			}
			var wantV []string
			var wantChange []int
			for j, v := range s.TokenVersions {
				wantV = append(wantV, fmt.Sprint(v))
				if j > 0 && v != s.TokenVersions[j-1] {
					wantChange = append(wantChange, j)
				}
			}
			if wantV == nil || slices.Min(s.TokenVersions) == slices.Max(s.TokenVersions) && slices.Min(s.TokenVersions) == s.PolicyVersion {
				// One version: stored as the step's, no per-token marks.
				wantV = make([]string, len(s.ResponseIDs))
				for j := range wantV {
					wantV[j] = ""
				}
			}
			if !slices.Equal(g.V, wantV) || !slices.Equal(g.VChange, wantChange) {
				t.Errorf("%s: token versions %v (changes at %v), the input's %v (changes at %v)", where, g.V, g.VChange, wantV, wantChange)
			}
		}
	}
	if errs, _ := p.seen(); len(errs) > 0 {
		t.Errorf("console errors: %q", errs)
	}
}
