package rllmdata

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// The schema of rLLM's gateway SQLite store (rllm_model_gateway
// store/sqlite_store.py), as it creates it.
const gatewaySchema = `
PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS traces (
    trace_id   TEXT PRIMARY KEY,
    data       TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trace_sessions (
    trace_id   TEXT NOT NULL,
    session_id TEXT NOT NULL,
    run_id     TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    PRIMARY KEY (trace_id, session_id),
    FOREIGN KEY (trace_id) REFERENCES traces(trace_id) ON DELETE CASCADE
);
CREATE TABLE IF NOT EXISTS runs (
    run_id     TEXT PRIMARY KEY,
    started_at REAL NOT NULL,
    ended_at   REAL,
    metadata   TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS idx_ts_session ON trace_sessions(session_id);
CREATE INDEX IF NOT EXISTS idx_ts_session_time ON trace_sessions(session_id, created_at ASC);
CREATE INDEX IF NOT EXISTS idx_traces_time ON traces(created_at);
`

// trace is one row to store: a TraceRecord (as a map, dumped as rLLM's
// json.dumps does) and the store's created_at.
type trace struct {
	session string
	at      float64
	data    map[string]any
}

func traceData(id, session string, prompt, completion []int, logprobs any, version any) map[string]any {
	return map[string]any{
		"trace_id": id, "session_id": session, "model": "qwen", "messages": []any{map[string]any{"role": "user", "content": "hi " + id}},
		"prompt_token_ids": prompt, "response_message": map[string]any{"role": "assistant", "content": "ok " + id},
		"completion_token_ids": completion, "logprobs": logprobs, "finish_reason": "stop", "weight_version": version,
		"latency_ms": 12.5, "token_counts": map[string]int{"prompt": len(prompt), "completion": len(completion)},
		"timestamp": 1.7e9, "metadata": map[string]any{}, "raw_request": map[string]any{"tools": []any{map[string]any{"type": "function"}}},
	}
}

// writeStore builds a gateway store at path with the given traces (raw
// strings are stored as they are, for malformed rows).
func writeStore(t testing.TB, path string, traces []trace, raw map[string]string) {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(gatewaySchema); err != nil {
		t.Fatal(err)
	}
	for _, tr := range traces {
		b, err := json.Marshal(tr.data)
		if err != nil {
			t.Fatal(err)
		}
		id := tr.data["trace_id"].(string)
		if r, ok := raw[id]; ok {
			b = []byte(r)
		}
		if _, err := db.Exec(`INSERT INTO traces (trace_id, data, created_at) VALUES (?, ?, ?)`, id, string(b), tr.at); err != nil {
			t.Fatal(err)
		}
		if tr.session != "" {
			if _, err := db.Exec(`INSERT INTO trace_sessions (trace_id, session_id, run_id, created_at) VALUES (?, ?, 'run1', ?)`, id, tr.session, tr.at); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// collect is an Output that keeps everything.
type collect struct {
	lines   []string
	letters []schemas.DeadLetter
}

func (c *collect) Record(_ string, line []byte) error {
	c.lines = append(c.lines, string(line))
	return nil
}

func (c *collect) DeadLetter(d schemas.DeadLetter) error {
	c.letters = append(c.letters, d)
	return nil
}

// decoded returns the collected records, decoded by the pipeline's
// decoder, by step id and trajectory id.
func (c *collect) decoded(t *testing.T) (map[string]*schemas.Step, map[string]*schemas.Trajectory) {
	t.Helper()
	steps, trajs := map[string]*schemas.Step{}, map[string]*schemas.Trajectory{}
	var d ingest.Decoder
	for _, l := range c.lines {
		rec, err := d.Decode([]byte(l))
		if err != nil {
			t.Fatalf("written line rejected: %v: %s", err, l)
		}
		if rec.Step != nil {
			if steps[rec.Step.StepID] != nil {
				t.Fatalf("step %s written twice", rec.Step.StepID)
			}
			steps[rec.Step.StepID] = rec.Step
		} else {
			if trajs[rec.Trajectory.TrajectoryID] != nil {
				t.Fatalf("trajectory %s written twice", rec.Trajectory.TrajectoryID)
			}
			trajs[rec.Trajectory.TrajectoryID] = rec.Trajectory
		}
	}
	return steps, trajs
}

func (c *collect) reasons() map[schemas.Reason]int {
	m := map[schemas.Reason]int{}
	for _, d := range c.letters {
		m[d.Reason]++
	}
	return m
}

func TestImportTraces(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway_traces.db")
	link := traceData("c2", "t1:1", nil, []int{31, 32}, []float64{-0.3, -0.4}, 5)
	link["prompt_delta_token_ids"] = []int{9}
	link["parent_trace_id"] = "c1"
	link["prompt_token_ids"] = []int{}
	noVersion := traceData("d1", "t2:0", []int{1}, []int{2}, []float64{-2}, nil)
	traces := []trace{
		// Inserted out of order: step_index follows created_at.
		{"t1:0", 20, traceData("a2", "t1:0", []int{1, 2, 3, 11, 4}, []int{12, 13}, []float64{-0.5, -0.25}, 4)},
		{"t1:0", 10, traceData("a1", "t1:0", []int{1, 2, 3}, []int{11}, []float64{-0.125}, 3)},
		{"t1:1", 10, traceData("c1", "t1:1", []int{7, 8}, []int{21, 22}, []float64{-0.1, -0.2}, 4)},
		{"t1:1", 11, link},
		{"t2:0", 10, noVersion},
		// A null logprob entry: the whole step is a dead letter, never shortened.
		{"t2:0", 11, traceData("d2", "t2:0", []int{1}, []int{5, 6, 7}, []any{-0.1, nil, -0.3}, 2)},
		// rLLM's silent drop: fewer logprobs than tokens.
		{"t2:0", 12, traceData("d3", "t2:0", []int{1}, []int{5, 6, 7}, []float64{-0.1, -0.3}, 2)},
		{"t2:0", 13, traceData("d4", "t2:0", []int{1}, []int{5}, []float64{-0.1}, 2)},
		// No reward for this session.
		{"t3:0", 10, traceData("e1", "t3:0", []int{1}, []int{5}, []float64{-0.1}, 2)},
		// Orphan: no trace_sessions row; its data names the session.
		{"", 30, traceData("f1", "t4:0", []int{1}, []int{6}, []float64{-0.6}, 1)},
	}
	writeStore(t, path, traces, map[string]string{"d4": `{"trace_id": "d4", "prompt_token_ids": [1,`})
	var rw Rewards
	yes := true
	rw.Set("t1:0", Outcome{Reward: 1, IsCorrect: &yes, TerminationReason: "ENV_DONE", Signals: map[string]float64{"acc": 1}})
	rw.Set("t1:1", Outcome{Reward: 0})
	rw.Set("t2:0", Outcome{Reward: 0.5})
	rw.Set("t4:0", Outcome{Reward: 0.25})
	rw.Set("nobody", Outcome{Reward: 1})

	var c collect
	sum, err := ImportTraces(context.Background(), path, Options{Rewards: rw, GroupSize: 2}, &c)
	if err != nil {
		t.Fatal(err)
	}
	steps, trajs := c.decoded(t)
	// d1 has no version and no --policy-version: dead letter.
	wantReasons := map[schemas.Reason]int{schemas.ReasonWrongType: 1, schemas.ReasonLengthMismatch: 1, schemas.ReasonMalformedJSON: 1, schemas.ReasonMissingField: 2}
	if got := c.reasons(); !reflect.DeepEqual(got, wantReasons) {
		for _, d := range c.letters {
			t.Logf("dead letter %s: %s", d.Reason, d.Error)
		}
		t.Fatalf("dead letters %v, want %v", got, wantReasons)
	}
	if sum.Steps != 6 || sum.Trajectories != 4 || sum.Sources != 5 || sum.Unscored != 1 || sum.UnusedRewards != 1 || sum.Dead() != 5 {
		t.Fatalf("summary %+v", sum)
	}
	a1, a2 := steps["a1"], steps["a2"]
	if a1 == nil || a2 == nil || a1.StepIndex != 0 || a2.StepIndex != 1 || a1.TaskID != "t1" || a1.TrajectoryID != "t1:0" ||
		a1.PolicyVersion != 3 || a2.PolicyVersion != 4 || !reflect.DeepEqual(a2.ResponseLogprobs, []float32{-0.5, -0.25}) ||
		!reflect.DeepEqual(a2.PromptIDs, []int32{1, 2, 3, 11, 4}) || a1.Model != "qwen" || a1.FinishReason != "stop" || !a1.HasCreatedAt {
		t.Fatalf("a1 %+v\na2 %+v", a1, a2)
	}
	var msgs []map[string]any
	if err := json.Unmarshal(a1.Messages, &msgs); err != nil || len(msgs) != 2 || msgs[1]["content"] != "ok a1" {
		t.Fatalf("messages %s", a1.Messages)
	}
	if !strings.Contains(string(a1.Metadata), `"latency_ms":12.5`) || !strings.Contains(string(a1.Metadata), `"tools":[`) {
		t.Fatalf("metadata %s", a1.Metadata)
	}
	// The delta chain: c1's prompt and completion, then c2's delta.
	if c2 := steps["c2"]; c2 == nil || !reflect.DeepEqual(c2.PromptIDs, []int32{7, 8, 21, 22, 9}) || c2.StepIndex != 1 {
		t.Fatalf("c2 %+v", c2)
	}
	if f1 := steps["f1"]; f1 == nil || f1.TrajectoryID != "t4:0" || f1.TaskID != "t4" {
		t.Fatalf("orphan f1 %+v", f1)
	}
	tr := trajs["t1:0"]
	if tr == nil || tr.NumSteps != 2 || tr.Reward != 1 || !tr.HasIsCorrect || !tr.IsCorrect || tr.TerminationReason != "ENV_DONE" || tr.GroupSize != 2 || len(tr.Signals) != 1 {
		t.Fatalf("t1:0 %+v", tr)
	}
	// t2:0 keeps all four calls in num_steps: the pipeline sees it
	// incomplete rather than a shorter run.
	if tr := trajs["t2:0"]; tr == nil || tr.NumSteps != 4 {
		t.Fatalf("t2:0 %+v", tr)
	}
	if trajs["t3:0"] != nil || steps["e1"] == nil {
		t.Fatal("unscored session: steps written, trajectory a dead letter")
	}
	for _, d := range c.letters {
		if d.Source.File != path || (d.Reason != schemas.ReasonMissingField && d.Source.Line == 0) {
			t.Fatalf("dead letter without its source: %+v", d)
		}
	}
}

func TestImportTracesPolicyVersionAndDuplicates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "g.db")
	writeStore(t, path, []trace{{"s:0", 1, traceData("x1", "s:0", []int{1}, []int{2}, []float64{-1}, nil)}}, nil)
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	// The same trace in a second session.
	if _, err := db.Exec(`INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES ('x1', 's:1', 2)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	var rw Rewards
	rw.Set("s:0", Outcome{Reward: 1})
	rw.Set("s:1", Outcome{Reward: 0})
	var c collect
	if _, err := ImportTraces(context.Background(), path, Options{Rewards: rw, PolicyVersion: 7, HasPolicyVersion: true}, &c); err != nil {
		t.Fatal(err)
	}
	steps, trajs := c.decoded(t)
	if len(c.letters) != 0 || len(steps) != 2 || len(trajs) != 2 || steps["x1"].PolicyVersion != 7 || steps["x1@s:1"] == nil {
		t.Fatalf("steps %v trajs %v letters %v", steps, trajs, c.letters)
	}
}

func TestImportTracesNotAStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "other.db")
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE traces (id INTEGER)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if _, err := ImportTraces(context.Background(), path, Options{}, &collect{}); err == nil || !strings.Contains(err.Error(), "not an rLLM gateway trace store") {
		t.Fatalf("err %v", err)
	}
}

// episode builds an Episode dict shaped like rllm.types.Episode's
// model_dump (what `rllm eval` saves).
func episode(id string, correct bool, term string, trajs ...map[string]any) map[string]any {
	return map[string]any{"id": id, "task": map[string]any{"id": "ignored", "instruction": "q"}, "termination_reason": term,
		"is_correct": correct, "trajectories": trajs, "artifacts": map[string]any{}, "metrics": map[string]any{}, "metadata": map[string]any{}, "eval_idx": 0}
}

func traj(uid, name string, reward any, steps ...map[string]any) map[string]any {
	return map[string]any{"uid": uid, "name": name, "task": nil, "steps": steps, "reward": reward, "input": nil, "output": nil, "signals": map[string]float64{"accuracy": 1}, "metadata": nil}
}

func step(id string, prompt, response []int, logprobs any, version any) map[string]any {
	return map[string]any{"id": id, "input": nil, "output": nil, "action": nil, "reward": 0.5, "done": false, "metadata": nil,
		"prompt_ids": prompt, "response_ids": response, "logprobs": logprobs, "routing_matrices": nil,
		"chat_completions": []any{map[string]any{"role": "user", "content": "q"}, map[string]any{"role": "assistant", "content": "a"}},
		"observation":      nil, "thought": "", "model_response": "a", "model_output": nil, "mc_return": 0.0, "advantage": nil, "weight_version": version}
}

func writeEpisodes(t *testing.T, dir string, eps ...map[string]any) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dir, "episodes"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i, ep := range eps {
		b, err := json.MarshalIndent(ep, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Join(dir, "episodes", "episode_"+strings.Repeat("0", 5)+string(rune('0'+i))+"_task.json")
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestImportEpisodes(t *testing.T) {
	dir := t.TempDir()
	noTokens := step("n1", nil, nil, nil, nil)
	fromOutput := step("m1", nil, nil, nil, nil)
	fromOutput["model_output"] = map[string]any{"prompt_ids": []int{1, 2}, "completion_ids": []int{3}, "logprobs": []float64{-0.75}, "finish_reason": "length", "weight_version": 9}
	writeEpisodes(t, dir,
		episode("q1:0", true, "env_done",
			traj("u1", "solver", 1.0, step("s1", []int{1, 2}, []int{3, 4}, []float64{-0.5, -0.25}, 2), step("s2", []int{1, 2, 3, 4, 5}, []int{6}, []float64{-1}, 3)),
			traj("u2", "default_traj_name", 0.0, fromOutput)),
		episode("q1:1", false, "max_turns_exceeded",
			traj("u3", "solver", nil, step("s3", []int{1}, []int{2, 3}, []any{-0.5, nil}, 2))),
		episode("q2:0", false, "TerminationReason.TIMEOUT",
			traj("u4", "solver", 0.0, noTokens)),
	)
	// A file that is not JSON.
	if err := os.WriteFile(filepath.Join(dir, "episodes", "episode_000009_bad.json"), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	var rw Rewards
	rw.Set("q1:1", Outcome{Reward: 0.25})
	var c collect
	sum, err := ImportEpisodes(context.Background(), dir, Options{Rewards: rw}, &c)
	if err != nil {
		t.Fatal(err)
	}
	steps, trajs := c.decoded(t)
	want := map[schemas.Reason]int{schemas.ReasonWrongType: 1, schemas.ReasonMissingField: 1, schemas.ReasonMalformedJSON: 1}
	if got := c.reasons(); !reflect.DeepEqual(got, want) {
		for _, d := range c.letters {
			t.Logf("dead letter %s: %s", d.Reason, d.Error)
		}
		t.Fatalf("dead letters %v, want %v", got, want)
	}
	if sum.Sources != 4 || sum.Steps != 3 || sum.Trajectories != 4 {
		t.Fatalf("summary %+v", sum)
	}
	s1, s2 := steps["s1"], steps["s2"]
	if s1 == nil || s2 == nil || s1.TaskID != "q1" || s1.Role != "solver" || s1.Key() != "q1:solver" || s1.TrajectoryID != "u1" ||
		s2.StepIndex != 1 || s2.PolicyVersion != 3 || !s1.HasReward || s1.Reward != 0.5 || !reflect.DeepEqual(s1.ResponseLogprobs, []float32{-0.5, -0.25}) {
		t.Fatalf("s1 %+v\ns2 %+v", s1, s2)
	}
	if m1 := steps["m1"]; m1 == nil || m1.Role != "" || m1.PolicyVersion != 9 || m1.FinishReason != "length" || !reflect.DeepEqual(m1.PromptIDs, []int32{1, 2}) {
		t.Fatalf("m1 %+v", m1)
	}
	if tr := trajs["u1"]; tr == nil || tr.Reward != 1 || tr.NumSteps != 2 || !tr.IsCorrect || !tr.HasIsCorrect || tr.TerminationReason != "ENV_DONE" || tr.Role != "solver" {
		t.Fatalf("u1 %+v", tr)
	}
	if tr := trajs["u3"]; tr == nil || tr.Reward != 0.25 || tr.IsCorrect || !tr.HasIsCorrect || tr.TerminationReason != "MAX_TURNS_EXCEEDED" {
		t.Fatalf("u3 (reward from --rewards) %+v", tr)
	}
	if tr := trajs["u4"]; tr == nil || tr.TerminationReason != "TIMEOUT" {
		t.Fatalf("u4 %+v", tr)
	}
}

func TestReadRewards(t *testing.T) {
	good := `{"session_id":"a:0","reward":1,"is_correct":true,"termination_reason":"env_done","signals":{"x":0.5}}

{"episode_id":"b:0","reward":-0.5}
`
	rw, err := ReadRewards(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	o, ok := rw.lookup("a:0")
	if rw.Len() != 2 || !ok || o.Reward != 1 || o.IsCorrect == nil || !*o.IsCorrect || o.TerminationReason != "ENV_DONE" || o.Signals["x"] != 0.5 {
		t.Fatalf("%+v", o)
	}
	for name, bad := range map[string]string{
		"no id":     `{"reward":1}`,
		"no reward": `{"id":"a"}`,
		"nan":       `{"id":"a","reward":NaN}`,
		"twice":     "{\"id\":\"a\",\"reward\":1}\n{\"id\":\"a\",\"reward\":1}",
		"not json":  `{"id":`,
	} {
		if _, err := ReadRewards(strings.NewReader(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
