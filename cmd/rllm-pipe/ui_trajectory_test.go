package main

// The trajectory browser in headless Chromium, checked against the
// generated input lines: a trajectory's steps with their messages, tool
// calls, token ids, reward and advantage; its tokens coloured by logprob,
// teacher logprob and token advantage; and the task, reason and reward
// filters driven through the form.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
)

// inStep is a step of the generated input.
type inStep struct {
	Index          int64             `json:"step_index"`
	PolicyVersion  int64             `json:"policy_version"`
	FinishReason   string            `json:"finish_reason"`
	Messages       []json.RawMessage `json:"messages"`
	ResponseIDs    []int64           `json:"response_ids"`
	Logprobs       []float64         `json:"response_logprobs"`
	TeacherLogprob []float64         `json:"teacher_logprobs"`
}

// inTraj is a trajectory of the generated input.
type inTraj struct {
	id, task string
	reward   float64
	steps    []inStep
}

// readInput reads the generated input's trajectories by id.
func readInput(t *testing.T, in string) map[string]*inTraj {
	t.Helper()
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]*inTraj{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var head struct {
			Type         string  `json:"type"`
			TaskID       string  `json:"task_id"`
			TrajectoryID string  `json:"trajectory_id"`
			Reward       float64 `json:"reward"`
		}
		if err := json.Unmarshal(sc.Bytes(), &head); err != nil {
			t.Fatalf("input: %v", err)
		}
		tr := out[head.TrajectoryID]
		if tr == nil {
			tr = &inTraj{id: head.TrajectoryID, task: head.TaskID}
			out[head.TrajectoryID] = tr
		}
		switch head.Type {
		case "step":
			var s inStep
			if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
				t.Fatalf("input step: %v", err)
			}
			tr.steps = append(tr.steps, s)
		case "trajectory":
			tr.reward = head.Reward
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, tr := range out {
		slices.SortFunc(tr.steps, func(a, b inStep) int { return int(a.Index - b.Index) })
	}
	return out
}

// shownMessage is a message as the page should show it: role, text and
// tool calls as "name(arguments)".
type shownMessage struct {
	Role      string   `json:"role"`
	Text      string   `json:"text"`
	ToolCalls []string `json:"tool_calls"`
}

// wantMessage is how the page shows an input message.
func wantMessage(t *testing.T, raw json.RawMessage) shownMessage {
	t.Helper()
	var m struct {
		Role      string          `json:"role"`
		Content   json.RawMessage `json:"content"`
		ToolCalls []struct {
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	out := shownMessage{Role: m.Role, ToolCalls: []string{}}
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		out.Text = s
	}
	for _, tc := range m.ToolCalls {
		out.ToolCalls = append(out.ToolCalls, tc.Function.Name+"("+tc.Function.Arguments+")")
	}
	return out
}

// Independent buckets of the colourings (the page's legend).
func wantLogprobClass(prefix string, lp float64) string {
	switch {
	case lp > -0.1:
		return prefix + "0"
	case lp > -1:
		return prefix + "1"
	case lp > -3:
		return prefix + "2"
	}
	return prefix + "3"
}

func wantAdvantageClass(a float64) string {
	switch {
	case a <= -1:
		return "adn2"
	case a < -0.1:
		return "adn1"
	case a <= 0.1:
		return "ad0"
	case a < 1:
		return "adp1"
	}
	return "adp2"
}

// grpoAdvantages computes, from the input alone, every trajectory's
// GRPO advantage (rLLM's: (r − mean) / (population std + 1e-6) over its
// task's group).
func grpoAdvantages(trajs map[string]*inTraj) map[string]float64 {
	rewards := map[string][]float64{}
	for _, tr := range trajs {
		rewards[tr.task] = append(rewards[tr.task], tr.reward)
	}
	out := map[string]float64{}
	for id, tr := range trajs {
		r := rewards[tr.task]
		var sum, ss float64
		for _, v := range r {
			sum += v
		}
		mean := sum / float64(len(r))
		for _, v := range r {
			ss += (v - mean) * (v - mean)
		}
		out[id] = (tr.reward - mean) / (math.Sqrt(ss/float64(len(r))) + 1e-6)
	}
	return out
}

// pageStep is a step as read from the trajectory page.
type pageStep struct {
	Step      string         `json:"step"`
	Reward    string         `json:"reward"`
	Advantage string         `json:"advantage"`
	Messages  []shownMessage `json:"messages"`
	Tokens    []string       `json:"tokens"`
	Classes   []string       `json:"classes"`
}

const readStepsJS = `JSON.stringify([...document.querySelectorAll('section.step')].map(s => ({
  step: s.dataset.step,
  reward: s.querySelector('.reward').textContent,
  advantage: s.querySelector('.advantage').textContent,
  messages: [...s.querySelectorAll('.msg')].map(m => ({role: m.querySelector('b').textContent,
    text: m.querySelector('pre') ? m.querySelector('pre').textContent : '',
    tool_calls: [...m.querySelectorAll('.toolcall code')].map(c => c.textContent)})),
  tokens: [...s.querySelectorAll('.tokens .tok')].map(e => e.textContent),
  classes: [...s.querySelectorAll('.tokens .tok')].map(e => [...e.classList].filter(c => c !== 'tok').join(' ')),
})))`

func readSteps(t *testing.T, p *page) []pageStep {
	t.Helper()
	var out []pageStep
	if err := json.Unmarshal([]byte(eval[string](t, p, readStepsJS)), &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// waitJS polls a boolean expression in the page for up to 20 seconds.
func waitJS(t *testing.T, p *page, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !eval[bool](t, p, expr) {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %s (%s)", what, expr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestUITrajectoryAgainstInput(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "60", "--group-size", "4", "--policy-versions", "3",
		"--seed", "11", "--prompt-len", "40", "--response-len", "20", "--teacher", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	from := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4",
		"--filter", "zero-variance,truncated", "--kl-coef", "0.1", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	trajs := readInput(t, in)
	adv := grpoAdvantages(trajs)
	version := map[string]int64{} // task → group version: its steps' least policy version
	for _, tr := range trajs {
		for _, s := range tr.steps {
			if v, ok := version[tr.task]; !ok || s.PolicyVersion < v {
				version[tr.task] = s.PolicyVersion
			}
		}
	}
	// Trajectories with a tool-call step and teacher logprobs, several
	// steps first.
	var ids []string
	for id, tr := range trajs {
		tool := false
		for _, s := range tr.steps {
			tool = tool || s.FinishReason == "tool_calls"
		}
		if tool && len(tr.steps) > 1 && len(tr.steps[0].TeacherLogprob) > 0 {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	if len(ids) < 3 {
		t.Fatalf("%d trajectories with tool calls and teacher logprobs: the test needs some", len(ids))
	}
	ids = ids[:3]

	hs := liveServer(t, from, live.Options{PageSize: 1000})
	p := newPage(t)
	for _, id := range ids {
		tr := trajs[id]
		u := hs.URL + "/trajectory?" + url.Values{"g": {tr.task}, "v": {strconv.FormatInt(version[tr.task], 10)}, "t": {id}}.Encode()
		p.do(t, "open "+id, chromedp.Navigate(u), chromedp.WaitVisible(chromedp.CSS(`section.step`)))
		if m := eval[string](t, p, `document.getElementById('legend').dataset.mode`); m != "logprob" {
			t.Errorf("%s: colouring %q by default, want logprob", id, m)
		}
		modes := eval[[]string](t, p, `[...document.querySelectorAll('#colour-modes a')].map(a => a.dataset.mode)`)
		if strings.Join(modes, ",") != "logprob,teacher,advantage" {
			t.Errorf("%s: colour modes %v", id, modes)
		}
		// Token advantages as stored (--kl-coef): the advantage colouring's input.
		res := e2eRun(t, bin, work, "sql", "--from", from, "--format", "jsonl",
			"SELECT step_index, token_advantages FROM steps WHERE trajectory_id = '"+id+"' ORDER BY step_index")
		if res.code != 0 {
			t.Fatalf("sql: %s", res.stderr)
		}
		var tokenAdv [][]float64
		for _, l := range strings.Split(strings.TrimSpace(res.stdout), "\n") {
			var r struct {
				TokenAdvantages []float64 `json:"token_advantages"`
			}
			if err := json.Unmarshal([]byte(l), &r); err != nil {
				t.Fatal(err)
			}
			tokenAdv = append(tokenAdv, r.TokenAdvantages)
		}
		for _, mode := range []string{"logprob", "teacher", "advantage"} {
			if mode != "logprob" {
				p.do(t, "colour by "+mode, chromedp.Click(chromedp.CSS(`#colour-modes a[data-mode=`+mode+`]`)))
				waitJS(t, p, "the "+mode+" colouring", `document.getElementById('legend')?.dataset.mode === '`+mode+`'`)
			}
			steps := readSteps(t, p)
			if len(steps) != len(tr.steps) {
				t.Fatalf("%s: %d steps on the page, %d in the input", id, len(steps), len(tr.steps))
			}
			for i, s := range tr.steps {
				ps := steps[i]
				where := fmt.Sprintf("%s step %d (%s)", id, s.Index, mode)
				if ps.Step != strconv.FormatInt(s.Index, 10) {
					t.Errorf("%s: shown as step %s", where, ps.Step)
				}
				if mode == "logprob" {
					var want []shownMessage
					for _, m := range s.Messages {
						want = append(want, wantMessage(t, m))
					}
					wj, _ := json.Marshal(want)
					gj, _ := json.Marshal(ps.Messages)
					if string(wj) != string(gj) {
						t.Errorf("%s: messages\n%s\nin the input:\n%s", where, gj, wj)
					}
					if r, err := strconv.ParseFloat(ps.Reward, 64); err != nil || math.Abs(r-tr.reward) > 5e-4*math.Max(1, math.Abs(tr.reward)) {
						t.Errorf("%s: reward %s, the input's %v", where, ps.Reward, tr.reward)
					}
					if a, err := strconv.ParseFloat(ps.Advantage, 64); err != nil || math.Abs(a-adv[id]) > 5e-4*math.Max(1, math.Abs(adv[id])) {
						t.Errorf("%s: advantage %s, GRPO over the input's group %v", where, ps.Advantage, adv[id])
					}
				}
				var wantIDs []string
				for _, x := range s.ResponseIDs {
					wantIDs = append(wantIDs, strconv.FormatInt(x, 10))
				}
				if strings.Join(ps.Tokens, ",") != strings.Join(wantIDs, ",") {
					t.Errorf("%s: token ids %v, the input's %v", where, ps.Tokens, wantIDs)
				}
				var wantClasses []string
				for j := range s.ResponseIDs {
					switch mode {
					case "logprob":
						wantClasses = append(wantClasses, wantLogprobClass("lp", float64(float32(s.Logprobs[j]))))
					case "teacher":
						wantClasses = append(wantClasses, wantLogprobClass("tp", float64(float32(s.TeacherLogprob[j]))))
					case "advantage":
						wantClasses = append(wantClasses, wantAdvantageClass(tokenAdv[i][j]))
					}
				}
				if strings.Join(ps.Classes, ",") != strings.Join(wantClasses, ",") {
					t.Errorf("%s: token classes %v, want %v", where, ps.Classes, wantClasses)
				}
			}
			legend := eval[[]string](t, p, `[...document.querySelectorAll('#legend .tok')].map(e => [...e.classList].filter(c => c !== 'tok').join(' '))`)
			if want := map[string]string{"logprob": "lp0 lp1 lp2 lp3", "teacher": "tp0 tp1 tp2 tp3 na", "advantage": "adn2 adn1 ad0 adp1 adp2"}[mode]; strings.Join(legend, " ") != want {
				t.Errorf("%s: legend of %s: %v, want %s", id, mode, legend, want)
			}
			// The classes are coloured: an unsure token differs from a sure one.
			if mode == "teacher" && id == ids[0] {
				bg := eval[[]string](t, p, `['tp0','tp3'].map(c => getComputedStyle(document.querySelector('#legend .'+c)).backgroundColor)`)
				if bg[0] == bg[1] {
					t.Errorf("teacher legend: tp0 and tp3 share the background %s", bg[0])
				}
				p.screenshot(t, "ui-trajectory-teacher.png")
			}
		}
	}

	// The filters, through the form.
	count := func(keep func(tr *inTraj) bool) int {
		n := 0
		for _, tr := range trajs {
			if keep(tr) {
				n++
			}
		}
		return n
	}
	filter := func(values map[string]string) [][]string {
		t.Helper()
		p.do(t, "open trajectories", chromedp.Navigate(hs.URL+"/trajectories"), chromedp.WaitVisible(chromedp.CSS(`#filters`)))
		// Typed into the fields, empty on a fresh page.
		for k, v := range values {
			p.do(t, "type "+k, chromedp.SendKeys(chromedp.CSS(`#filters input[name=`+k+`]`), v))
		}
		p.do(t, "filter", chromedp.Submit(chromedp.CSS(`#filters`)))
		var first string
		for k, v := range values {
			first = url.Values{k: {v}}.Encode()
			break
		}
		waitJS(t, p, "the filtered page", `location.search.includes(`+strconv.Quote(first)+`) && !!document.getElementById('trajectories')`)
		return browserRows(eval[string](t, p, `document.body.innerHTML`))
	}
	task := trajs[ids[0]].task
	rows := filter(map[string]string{"task": task})
	if want := count(func(tr *inTraj) bool { return tr.task == task }); len(rows) != want {
		t.Errorf("task=%s: %d rows, the input has %d trajectories", task, len(rows), want)
	}
	for _, r := range rows {
		if r[3] != task {
			t.Errorf("task=%s shows a trajectory of %s", task, r[3])
		}
	}
	rows = filter(map[string]string{"reason": "truncated"})
	truncated := func(tr *inTraj) bool {
		for _, s := range tr.steps {
			if s.FinishReason == "length" {
				return true
			}
		}
		return false
	}
	if want := count(truncated); len(rows) != want || want == 0 {
		t.Errorf("reason=truncated: %d rows, the input has %d truncated trajectories", len(rows), want)
	}
	for _, r := range rows {
		if !truncated(trajs[r[2]]) {
			t.Errorf("reason=truncated shows %s, not truncated in the input", r[2])
		}
	}
	rows = filter(map[string]string{"min_reward": "0.5", "max_reward": "1"})
	inRange := func(tr *inTraj) bool { return tr.reward >= 0.5 && tr.reward <= 1 }
	if want := count(inRange); len(rows) != want || want == 0 {
		t.Errorf("0.5 ≤ reward ≤ 1: %d rows, the input has %d trajectories", len(rows), want)
	}
	for _, r := range rows {
		if !inRange(trajs[r[2]]) {
			t.Errorf("0.5 ≤ reward ≤ 1 shows %s, reward %v in the input", r[2], trajs[r[2]].reward)
		}
	}
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

// TestUITrajectoryOfOverlappingRuns: two runs whose trajectory ids
// overlap, ingested into one root. A trajectory's page shows the steps of
// the first shard holding it (by path), as the trajectories view counts
// them, not both runs' steps interleaved.
func TestUITrajectoryOfOverlappingRuns(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	from := filepath.Join(work, "out")
	for _, seed := range []string{"1", "2"} {
		in := filepath.Join(work, "in"+seed+".jsonl")
		if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "6", "--group-size", "4", "--seed", seed, "--quiet"); r.code != 0 {
			t.Fatalf("gen: %s", r.stderr)
		}
		if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--quiet"); r.code != 0 {
			t.Fatalf("ingest: %s", r.stderr)
		}
	}
	// Keys held by more than one shard, with the first shard's step count.
	rows := sqlRows(t, bin, work, nil, "--from", from, `SELECT group_id, group_version, trajectory_id, arg_min(n, shard) AS first, sum(n) AS all_steps
FROM (SELECT group_id, group_version, trajectory_id, shard, count(*) AS n FROM steps GROUP BY ALL)
GROUP BY ALL HAVING count(*) > 1 AND arg_min(n, shard) <> sum(n) ORDER BY ALL`)
	if len(rows) == 0 {
		t.Fatal("no trajectory key is held by two shards: the test needs some")
	}
	view := map[string]string{}
	for _, r := range sqlRows(t, bin, work, nil, "--from", from, "SELECT trajectory_id, group_version, steps FROM trajectories") {
		view[fmt.Sprint(r["trajectory_id"], "@", r["group_version"])] = fmt.Sprint(r["steps"])
	}
	hs := liveServer(t, from, live.Options{PageSize: 1000})
	for _, r := range rows[:min(3, len(rows))] {
		key := fmt.Sprint(r["trajectory_id"], "@", r["group_version"])
		if view[key] != fmt.Sprint(r["first"]) {
			t.Errorf("%s: the trajectories view counts %s steps, the first shard holds %v", key, view[key], r["first"])
		}
		u := hs.URL + "/trajectory?" + url.Values{"g": {fmt.Sprint(r["group_id"])}, "v": {fmt.Sprint(r["group_version"])}, "t": {fmt.Sprint(r["trajectory_id"])}}.Encode()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if n := strings.Count(string(page), `<section class="step"`); fmt.Sprint(n) != fmt.Sprint(r["first"]) {
			t.Errorf("%s: %d steps on its page, the first shard holds %v (%v in all)", key, n, r["first"], r["all_steps"])
		}
	}
}

// TestUIPageKeepsLeadingNewlines: a message whose text starts with a
// newline keeps it on the trajectory page (an HTML parser drops the
// newline right after <pre>, so the page writes one of its own first);
// and the browser's icon request is answered, not a 404 in the console.
// TestUIPageShowsText checks that record text shows as it is: a leading
// newline kept, and the Unicode bidirectional controls written out as
// \uNNNN (as sql's table does) instead of reordering the page.
func TestUIPageShowsText(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	rec := `{"type":"step","step_id":"t/r\u202e0#0","task_id":"t","trajectory_id":"t/r\u202e0","step_index":0,"policy_version":0,"prompt_ids":[1,2],"response_ids":[3],"response_logprobs":[-0.1],"messages":[{"role":"user","content":"\nafter one newline"},{"role":"assistant","content":"\n\nafter two"},{"role":"user","content":"run \u202egnp.exe\u202c or \u2067x\u2069"}]}
{"type":"trajectory","trajectory_id":"t/r\u202e0","task_id":"t","reward":1,"num_steps":1}
`
	if err := os.WriteFile(in, []byte(rec), 0o644); err != nil {
		t.Fatal(err)
	}
	from := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "1", "--min-group-size", "1", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	hs := liveServer(t, from, live.Options{})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	_, page := get("/trajectory?" + url.Values{"g": {"t"}, "v": {"0"}, "t": {"t/r\u202e0"}}.Encode())
	for _, want := range []string{"<pre>\n\nafter one newline</pre>", "<pre>\n\n\nafter two</pre>",
		"<pre>\nrun \\u202egnp.exe\\u202c or \\u2067x\\u2069</pre>", `t/r\u202e0`} {
		if !strings.Contains(page, want) {
			t.Errorf("the trajectory page does not hold %q", want)
		}
	}
	_, list := get("/trajectories?" + url.Values{"g": {"t"}, "v": {"0"}}.Encode())
	if !strings.Contains(list, `t/r\u202e0`) {
		t.Errorf("the trajectories page does not show the id's control")
	}
	for name, p := range map[string]string{"trajectory": page, "trajectories": list} {
		if i := strings.IndexAny(p, "\u202e\u202c\u2067\u2069"); i >= 0 {
			t.Errorf("the %s page holds a bidirectional control at %d: %q", name, i, p[max(0, i-40):min(len(p), i+40)])
		}
	}
	if code, _ := get("/favicon.ico"); code != http.StatusNoContent {
		t.Errorf("/favicon.ico: %d", code)
	}
}
