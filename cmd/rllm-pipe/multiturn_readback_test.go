package main

// Read-back of multi-turn agent traces through `rllm-pipe sql` (issue 16):
// chains with context resets, branches (two steps extending the same
// parent), edited histories (a prompt that extends while its messages do
// not), producer retries and shuffled arrival, sent as whole prompts and as
// wire deltas. Every step's full prompt_ids and messages in the steps view
// must equal the input.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// mtStep is one generated call: the whole record and, for the wire form,
// the parent it extends (-1: none, sent whole).
type mtStep struct {
	id       string
	prompt   []int32
	response []int32
	messages []map[string]any
	parent   int // index in the trajectory of the step it extends; -1 if none
	msgExt   bool
}

// mtTrajectory makes one trajectory of n calls. Each call extends the one
// before it (prompt + response + a tool observation) unless it is a reset
// (the task again plus a summary), a branch (it extends the call two back,
// as a retried tool call would) or an edited history (the prompt extends,
// the messages are rewritten).
func mtTrajectory(r *rand.Rand, traj string, n int) ([]mtStep, map[string]int) {
	toks := func(k int) []int32 {
		out := make([]int32, k)
		for i := range out {
			out[i] = int32(r.IntN(152000))
		}
		return out
	}
	cat := func(parts ...[]int32) []int32 {
		var out []int32
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	msg := func(role, content string) map[string]any { return map[string]any{"role": role, "content": content} }
	cloneMsgs := func(m []map[string]any) []map[string]any { return append([]map[string]any(nil), m...) }
	task := toks(20 + r.IntN(30))
	head := []map[string]any{msg("system", "You are an agent."), msg("user", "task "+traj+" — résumé ✓")}
	steps := make([]mtStep, 0, n)
	kinds := map[string]int{}
	for i := 0; i < n; i++ {
		s := mtStep{id: fmt.Sprintf("%s#%d", traj, i), response: toks(1 + r.IntN(12)), parent: -1}
		answer := msg("assistant", fmt.Sprintf("action %d of %s", i, traj))
		if i == 0 {
			s.prompt = task
			s.messages = append(cloneMsgs(head), answer)
			steps = append(steps, s)
			continue
		}
		obs := msg("tool", strings.Repeat("obs ", 1+r.IntN(5))+strconv.Itoa(i))
		switch p := r.Float64(); {
		case p < 0.15: // reset: the task again and a summary
			kinds["reset"]++
			s.prompt = cat(task, toks(5+r.IntN(10)))
			s.messages = append(cloneMsgs(head), msg("user", "summary so far "+strconv.Itoa(i)), answer)
		case p < 0.30 && i >= 2: // branch: extends the call two back
			kinds["branch"]++
			par := steps[i-2]
			s.parent, s.msgExt = i-2, true
			s.prompt = cat(par.prompt, par.response, toks(r.IntN(15)))
			s.messages = append(append(cloneMsgs(par.messages), obs), answer)
		case p < 0.38: // the prompt extends, the messages were rewritten
			kinds["edited"]++
			par := steps[i-1]
			s.parent = i - 1
			s.prompt = cat(par.prompt, par.response, toks(1+r.IntN(15)))
			s.messages = append(cloneMsgs(head), msg("user", "rewritten history "+strconv.Itoa(i)), answer)
		default: // extends the call before it
			kinds["extend"]++
			par := steps[i-1]
			s.parent, s.msgExt = i-1, true
			s.prompt = cat(par.prompt, par.response, toks(r.IntN(20))) // a delta may be empty
			s.messages = append(append(cloneMsgs(par.messages), obs), answer)
		}
		steps = append(steps, s)
	}
	return steps, kinds
}

func TestMultiTurnReadBackThroughSQL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := e2eBinary(t)
	work := t.TempDir()
	r := rand.New(rand.NewPCG(16, 4))
	const groups, groupSize = 5, 3
	want := map[string]mtStep{}
	var whole, wire [][]byte
	kinds := map[string]int{}
	for g := 0; g < groups; g++ {
		task := fmt.Sprintf("task%d", g)
		for k := 0; k < groupSize; k++ {
			traj := fmt.Sprintf("%s/r%d", task, k)
			steps, kk := mtTrajectory(r, traj, 4+r.IntN(12))
			for name, n := range kk {
				kinds[name] += n
			}
			for i, s := range steps {
				want[s.id] = s
				rec := map[string]any{"type": "step", "step_id": s.id, "task_id": task, "trajectory_id": traj,
					"step_index": i, "policy_version": 3, "response_ids": s.response,
					"response_logprobs": make([]float64, len(s.response))}
				w, h := mustJSON(t, rec, "prompt_ids", s.prompt, "messages", s.messages), []byte(nil)
				whole = append(whole, w)
				if s.parent >= 0 && s.msgExt {
					par := steps[s.parent]
					h = mustJSON(t, rec, "parent_step_id", par.id,
						"prompt_delta_ids", s.prompt[len(par.prompt)+len(par.response):],
						"messages_added", s.messages[len(par.messages):])
				} else if s.parent >= 0 {
					// The prompt as a delta, the rewritten messages whole.
					par := steps[s.parent]
					h = mustJSON(t, rec, "parent_step_id", par.id,
						"prompt_delta_ids", s.prompt[len(par.prompt)+len(par.response):], "messages", s.messages)
				} else {
					h = w
				}
				wire = append(wire, h)
			}
			tr := mustJSON(t, map[string]any{"type": "trajectory", "trajectory_id": traj, "task_id": task,
				"reward": float64(k), "num_steps": len(steps)})
			whole, wire = append(whole, tr), append(wire, tr)
		}
	}
	t.Logf("calls: %v", kinds)
	for _, k := range []string{"reset", "branch", "edited", "extend"} {
		if kinds[k] == 0 {
			t.Fatalf("the generated traces have no %s (kinds %v): change the seed", k, kinds)
		}
	}
	for name, lines := range map[string][][]byte{"whole": whole, "wire": wire} {
		t.Run(name, func(t *testing.T) {
			// Producer retries: exact repeats of a tenth of the lines; then
			// any order.
			lr := rand.New(rand.NewPCG(7, uint64(len(name))))
			sent := append([][]byte(nil), lines...)
			for _, l := range lines {
				if lr.IntN(10) == 0 {
					sent = append(sent, l)
				}
			}
			lr.Shuffle(len(sent), func(i, j int) { sent[i], sent[j] = sent[j], sent[i] })
			in := filepath.Join(work, name+".jsonl")
			if err := os.WriteFile(in, e2eJoinLines(sent), 0o644); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(work, "out-"+name)
			e2eIngest(t, bin, work, in, out, filepath.Join(work, name+".stats.json"), "--group-size", strconv.Itoa(groupSize), "--quiet")
			got := sqlJSONL(t, bin, work, out, "SELECT step_id, prompt_ids, messages FROM steps")
			if len(got) != len(want) {
				t.Fatalf("steps view: %d rows, want %d", len(got), len(want))
			}
			seen := map[string]bool{}
			for _, row := range got {
				var id string
				var prompt []int32
				var msgText string
				mustUnmarshal(t, row["step_id"], &id)
				mustUnmarshal(t, row["prompt_ids"], &prompt)
				mustUnmarshal(t, row["messages"], &msgText)
				w, ok := want[id]
				if !ok || seen[id] {
					t.Fatalf("steps view: step %q unexpected or repeated", id)
				}
				seen[id] = true
				if !reflect.DeepEqual(prompt, w.prompt) {
					t.Errorf("%s: prompt_ids %v\nwant %v", id, prompt, w.prompt)
				}
				var msgs, wantMsgs []any
				mustUnmarshal(t, []byte(msgText), &msgs)
				mustUnmarshal(t, mustJSON(t, w.messages), &wantMsgs)
				if !reflect.DeepEqual(msgs, wantMsgs) {
					t.Errorf("%s: messages %s\nwant %s", id, msgText, mustJSON(t, w.messages))
				}
			}
			// The store really holds deltas, and the branches, resets and
			// edited histories whole.
			counts := sqlJSONL(t, bin, work, out, "SELECT count(*) FILTER (WHERE prompt_prefix_len > 0) AS p, count(*) FILTER (WHERE messages_delta IS NOT NULL) AS m, count(*) AS n FROM stored_steps")
			var p, m, n int
			mustUnmarshal(t, counts[0]["p"], &p)
			mustUnmarshal(t, counts[0]["m"], &m)
			mustUnmarshal(t, counts[0]["n"], &n)
			if wantP, wantM := kinds["extend"]+kinds["edited"], kinds["extend"]; p != wantP || m != wantM || n != len(want) {
				t.Errorf("stored: %d prompt deltas, %d message deltas of %d rows; want %d, %d of %d", p, m, n, wantP, wantM, len(want))
			}
		})
	}
}

// mustJSON marshals v; with key-value pairs after it, v is a map copied
// with those keys set.
func mustJSON(t *testing.T, v any, kv ...any) []byte {
	t.Helper()
	if len(kv) > 0 {
		m := map[string]any{}
		for k, x := range v.(map[string]any) {
			m[k] = x
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		v = m
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustUnmarshal(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", e2eClip(string(b), 200), err)
	}
}

// sqlJSONL runs `rllm-pipe sql --format jsonl` and returns its rows.
func sqlJSONL(t *testing.T, bin, work, from, query string) []map[string]json.RawMessage {
	t.Helper()
	res := e2eRun(t, bin, work, "sql", "--from", from, "--format", "jsonl", query)
	if res.code != 0 {
		t.Fatalf("sql %q: exit %d\n%s", query, res.code, e2eClip(res.stderr, 4000))
	}
	var rows []map[string]json.RawMessage
	for _, l := range e2eSplitLines([]byte(res.stdout)) {
		if len(bytes.TrimSpace(l)) == 0 {
			continue
		}
		var row map[string]json.RawMessage
		mustUnmarshal(t, l, &row)
		rows = append(rows, row)
	}
	return rows
}
