package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
)

// shardRow is one committed step, read back independently of the export.
type shardRow struct {
	stepID, task, group, traj string
	index                     int32
	reward, advantage         float64
	filtered                  bool
	messages                  string
	prompt, response          []int32
	logprobs, teacher, tokAdv []float32
	hasTeacher, hasTokAdv     bool
}

// readCommitted reads every row of the shards the manifest under root lists.
func readCommitted(t *testing.T, root string) []shardRow {
	t.Helper()
	entries, err := local.ReadManifest(root)
	if err != nil {
		t.Fatal(err)
	}
	var rows []shardRow
	for _, e := range entries {
		if e.Path == "" {
			continue
		}
		err := parquet.ReadFile(context.Background(), filepath.Join(root, e.Path), nil, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
			col := func(n string) arrow.Array { return rec.Column(rec.Schema().FieldIndices(n)[0]) }
			str := func(n string) *array.String { return col(n).(*array.String) }
			i32 := func(l *array.List, i int) []int32 {
				s, e := l.ValueOffsets(i)
				return append([]int32{}, l.ListValues().(*array.Int32).Int32Values()[s:e]...)
			}
			f32 := func(l *array.List, i int) []float32 {
				s, e := l.ValueOffsets(i)
				return append([]float32{}, l.ListValues().(*array.Float32).Float32Values()[s:e]...)
			}
			teacher, tokAdv := col("teacher_logprobs").(*array.List), col("token_advantages").(*array.List)
			for i := 0; i < int(rec.NumRows()); i++ {
				r := shardRow{
					stepID: str("step_id").Value(i), task: str("task_id").Value(i), group: str("group_id").Value(i), traj: str("trajectory_id").Value(i),
					index: col("step_index").(*array.Int32).Value(i), reward: col("reward").(*array.Float64).Value(i),
					advantage: col("advantage").(*array.Float64).Value(i), filtered: str("filter_reason").IsValid(i),
					messages: str("messages").Value(i), prompt: i32(col("prompt_ids").(*array.List), i),
					response: i32(col("response_ids").(*array.List), i), logprobs: f32(col("response_logprobs").(*array.List), i),
					hasTeacher: teacher.IsValid(i), hasTokAdv: tokAdv.IsValid(i),
				}
				if r.hasTeacher {
					r.teacher = f32(teacher, i)
				}
				if r.hasTokAdv {
					r.tokAdv = f32(tokAdv, i)
				}
				rows = append(rows, r)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return rows
}

type trajInfo struct {
	task     string
	reward   float64
	filtered bool
	last     shardRow // the step of highest index
}

func trajectoriesOf(rows []shardRow) map[string]*trajInfo {
	out := map[string]*trajInfo{}
	for _, r := range rows {
		ti := out[r.traj]
		if ti == nil {
			ti = &trajInfo{task: r.task, reward: r.reward, last: r}
			out[r.traj] = ti
		}
		ti.filtered = ti.filtered || r.filtered
		if r.index >= ti.last.index {
			ti.last = r
		}
	}
	return out
}

// expectChosen is the SFT selection, computed directly.
func expectChosen(trajs map[string]*trajInfo, minReward *float64, bestOfN int, includeFiltered bool) map[string]bool {
	byTask := map[string][]string{}
	for id, ti := range trajs {
		if (ti.filtered && !includeFiltered) || (minReward != nil && ti.reward < *minReward) {
			continue
		}
		byTask[ti.task] = append(byTask[ti.task], id)
	}
	out := map[string]bool{}
	for _, ids := range byTask {
		sort.Slice(ids, func(a, b int) bool {
			if trajs[ids[a]].reward != trajs[ids[b]].reward {
				return trajs[ids[a]].reward > trajs[ids[b]].reward
			}
			return ids[a] < ids[b]
		})
		if bestOfN > 0 && len(ids) > bestOfN {
			ids = ids[:bestOfN]
		}
		for _, id := range ids {
			out[id] = true
		}
	}
	return out
}

func readJSONLines(t *testing.T, path string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<28)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	return out
}

func TestExportSFTChoosesLikeAnIndependentComputation(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in, out := filepath.Join(work, "in.jsonl"), filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "gen", "--groups", "60", "--group-size", "4", "--seed", "11", "--to", in); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "4", "--filter", "truncated", "--quiet"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	trajs := trajectoriesOf(readCommitted(t, out))
	filtered := 0
	for _, ti := range trajs {
		if ti.filtered {
			filtered++
		}
	}
	if filtered == 0 || filtered == len(trajs) {
		t.Fatalf("%d of %d trajectories filtered: the test needs some of each", filtered, len(trajs))
	}
	half, one := 0.5, 1.0
	for _, tc := range []struct {
		name            string
		flags           []string
		minReward       *float64
		bestOfN         int
		includeFiltered bool
	}{
		{"all unfiltered", nil, nil, 0, false},
		{"min reward", []string{"--min-reward", "0.5"}, &half, 0, false},
		{"best of 2", []string{"--best-of-n", "2"}, nil, 2, false},
		{"best of 1 above 1, filtered too", []string{"--best-of-n", "1", "--min-reward", "1", "--include-filtered"}, &one, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := expectChosen(trajs, tc.minReward, tc.bestOfN, tc.includeFiltered)
			dest := filepath.Join(t.TempDir(), "sft.jsonl")
			args := append([]string{"export", "sft", "--from", out, "--to", dest, "--with-ids"}, tc.flags...)
			if r := e2eRun(t, bin, work, args...); r.code != 0 {
				t.Fatal(r.stderr)
			}
			rows := readJSONLines(t, dest)
			got := map[string]bool{}
			for _, row := range rows {
				id := row["trajectory_id"].(string)
				if got[id] {
					t.Errorf("trajectory %s exported twice", id)
				}
				got[id] = true
				// The conversation is the last step's messages (each call's
				// messages extend the previous call's in these traces).
				var last any
				if err := json.Unmarshal([]byte(trajs[id].last.messages), &last); err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(row["messages"], last) {
					t.Errorf("trajectory %s: messages differ from its last step's", id)
				}
				if row["reward"].(float64) != trajs[id].reward {
					t.Errorf("trajectory %s: reward %v, want %v", id, row["reward"], trajs[id].reward)
				}
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("exported %d trajectories, want %d (%d in common)", len(got), len(want), common(got, want))
			}
		})
	}
}

func common(a, b map[string]bool) int {
	n := 0
	for k := range a {
		if b[k] {
			n++
		}
	}
	return n
}

// Hand-made traces: a duplicated conversation, a context reset, tool calls.
func TestExportSFTConversationsDedupeAndTools(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	msg := func(role, content string) string { return fmt.Sprintf(`{"role":%q,"content":%q}`, role, content) }
	call := `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"python","arguments":"{\"code\":\"print(1)\",\"timeout\":5}"}}]}`
	var lines []string
	step := func(task, traj string, idx int, msgs ...string) {
		lines = append(lines, fmt.Sprintf(`{"type":"step","step_id":"%s#%d","task_id":%q,"trajectory_id":%q,"step_index":%d,"policy_version":0,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-0.5],"messages":[%s]}`,
			traj, idx, task, traj, idx, strings.Join(msgs, ",")))
	}
	traj := func(task, id string, steps int, reward float64) {
		lines = append(lines, fmt.Sprintf(`{"type":"trajectory","trajectory_id":%q,"task_id":%q,"reward":%v,"num_steps":%d}`, id, task, reward, steps))
	}
	// a/r0 and b/r0 say the same thing: one is a duplicate.
	step("a", "a/r0", 0, msg("user", "hi"), msg("assistant", "hello"))
	traj("a", "a/r0", 1, 1)
	step("a", "a/r1", 0, msg("user", "hi"), call)
	step("a", "a/r1", 1, msg("user", "hi"), call, `{"role":"tool","tool_call_id":"c1","content":"1"}`, msg("assistant", "it is 1"))
	traj("a", "a/r1", 2, 0)
	step("b", "b/r0", 0, msg("user", "hi"), msg("assistant", "hello"))
	traj("b", "b/r0", 1, 1)
	// b/r1: the second call starts afresh (a summarised context): two conversations.
	step("b", "b/r1", 0, msg("user", "long task"), msg("assistant", "part one"))
	step("b", "b/r1", 1, msg("user", "summary of part one; go on"), msg("assistant", "part two"))
	traj("b", "b/r1", 2, 0.5)
	in := filepath.Join(work, "in.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	export := func(flags ...string) []map[string]any {
		dest := filepath.Join(t.TempDir(), "sft.jsonl")
		if r := e2eRun(t, bin, work, append([]string{"export", "sft", "--from", out, "--to", dest, "--with-ids"}, flags...)...); r.code != 0 {
			t.Fatal(r.stderr)
		}
		return readJSONLines(t, dest)
	}
	rows := export()
	per := map[string]int{}
	for _, r := range rows {
		per[r["trajectory_id"].(string)]++
	}
	if want := map[string]int{"a/r0": 1, "a/r1": 1, "b/r0": 1, "b/r1": 2}; !reflect.DeepEqual(per, want) {
		t.Errorf("rows per trajectory %v, want %v", per, want)
	}
	for _, r := range rows {
		tools, has := r["tools"]
		if r["trajectory_id"] != "a/r1" {
			if has {
				t.Errorf("%s has a tools column without calling tools", r["trajectory_id"])
			}
			continue
		}
		want := []any{map[string]any{"type": "function", "function": map[string]any{"name": "python", "parameters": map[string]any{
			"type": "object", "required": []any{"code", "timeout"},
			"properties": map[string]any{"code": map[string]any{"type": "string"}, "timeout": map[string]any{"type": "integer"}}}}}}
		if !reflect.DeepEqual(tools, want) {
			t.Errorf("tools %v, want %v", tools, want)
		}
		if n := len(r["messages"].([]any)); n != 4 {
			t.Errorf("a/r1: %d messages, want the last step's 4", n)
		}
	}
	if rows := export("--dedupe"); len(rows) != 4 {
		t.Errorf("--dedupe: %d rows, want 4 (a/r0 and b/r0 are one conversation)", len(rows))
	}
	// prompt-completion: the completion is the final assistant message.
	for _, r := range export("--format", "prompt-completion") {
		c := r["completion"].([]any)
		p := r["prompt"].([]any)
		if len(c) != 1 || c[0].(map[string]any)["role"] != "assistant" || p[len(p)-1].(map[string]any)["role"] == "assistant" {
			t.Errorf("%s: prompt %v / completion %v", r["trajectory_id"], p, c)
		}
	}
}

// Distillation: scored steps are exported with token advantages; groups
// with unscored steps become wire records that, once a teacher fills them,
// ingest again into the same groups.
func TestExportDistillRoundTrip(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--groups", "30", "--group-size", "4", "--teacher", "--seed", "5", "--to", in); r.code != 0 {
		t.Fatal(r.stderr)
	}
	// Strip the teacher from the steps of every third task.
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	var kept [][]byte
	for _, l := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatal(err)
		}
		if m["type"] == "step" {
			n, _ := strconv.Atoi(strings.TrimLeft(strings.TrimPrefix(m["task_id"].(string), "task-"), "0"))
			if n%3 == 0 {
				delete(m, "teacher_logprobs")
				l, _ = json.Marshal(m)
			}
		}
		kept = append(kept, l)
	}
	if err := os.WriteFile(in, append(bytes.Join(kept, []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "4", "--kl-coef", "1", "--quiet"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	orig := readCommitted(t, out)
	scored, unscoredGroups := 0, map[string]bool{}
	for _, r := range orig {
		if r.hasTeacher {
			scored++
		} else {
			unscoredGroups[r.group] = true
		}
	}
	if scored == 0 || len(unscoredGroups) == 0 {
		t.Fatalf("%d scored steps, %d unscored groups: the test needs both", scored, len(unscoredGroups))
	}

	dest := filepath.Join(work, "distill.parquet")
	if r := e2eRun(t, bin, work, "export", "distill", "--from", out, "--to", dest, "--kl-coef", "0.5", "--kl-clip", "1",
		"--requests", strings.TrimSuffix(dest, ".parquet")+".requests.jsonl"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	byStep := map[string]shardRow{}
	for _, r := range orig {
		byStep[r.stepID] = r
	}
	n := 0
	err = parquet.ReadFile(context.Background(), dest, nil, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
		sid := rec.Column(4).(*array.String)
		adv := rec.Column(12).(*array.Float64)
		ta := rec.Column(13).(*array.List)
		vals := ta.ListValues().(*array.Float32).Float32Values()
		for i := 0; i < int(rec.NumRows()); i++ {
			n++
			o := byStep[sid.Value(i)]
			if !o.hasTeacher || adv.Value(i) != o.advantage {
				t.Errorf("step %s: exported without teacher or with another advantage", o.stepID)
			}
			s, e := ta.ValueOffsets(i)
			if int(e-s) != len(o.response) {
				t.Fatalf("step %s: %d token advantages for %d tokens", o.stepID, e-s, len(o.response))
			}
			for k := range o.response { // advantage + clip(0.5·(teacher − student), ±1), no discount
				d := 0.5 * (float64(o.teacher[k]) - float64(o.logprobs[k]))
				want := o.advantage + math.Max(-1, math.Min(1, d))
				if math.Abs(float64(vals[int(s)+k])-want) > 1e-5 {
					t.Fatalf("step %s token %d: %v, want %v", o.stepID, k, vals[int(s)+k], want)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != scored {
		t.Errorf("%d steps exported, want the %d scored", n, scored)
	}

	// The teacher scores the requests (here: student logprob − 0.25).
	reqs := readJSONLines(t, strings.TrimSuffix(dest, ".parquet")+".requests.jsonl")
	groups := map[string]bool{}
	var filled []string
	for _, m := range reqs {
		if m["type"] == "step" {
			groups[m["group_id"].(string)] = true
			if _, ok := m["teacher_logprobs"]; !ok {
				var tl []any
				for _, lp := range m["response_logprobs"].([]any) {
					tl = append(tl, lp.(float64)-0.25)
				}
				m["teacher_logprobs"] = tl
			}
		}
		l, _ := json.Marshal(m)
		filled = append(filled, string(l))
	}
	if !reflect.DeepEqual(groups, unscoredGroups) {
		t.Errorf("requests cover %d groups, want the %d with unscored steps", len(groups), len(unscoredGroups))
	}
	in2 := filepath.Join(work, "scored.jsonl")
	if err := os.WriteFile(in2, []byte(strings.Join(filled, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out2 := filepath.Join(work, "out2")
	if r := e2eRun(t, bin, work, "ingest", "--from", in2, "--to", out2, "--group-size", "4", "--kl-coef", "1", "--quiet"); r.code != 0 || !strings.Contains(r.stderr, "") {
		t.Fatal(r.stderr)
	}
	again := readCommitted(t, out2)
	if len(again) == 0 {
		t.Fatal("nothing re-ingested")
	}
	for _, r := range again {
		o, ok := byStep[r.stepID]
		if !ok || !unscoredGroups[r.group] {
			t.Fatalf("step %s re-ingested but not requested", r.stepID)
		}
		// Same records, same group, same advantage: only the teacher is new.
		if r.advantage != o.advantage || !reflect.DeepEqual(r.prompt, o.prompt) || !reflect.DeepEqual(r.response, o.response) ||
			!reflect.DeepEqual(r.logprobs, o.logprobs) || r.messages != o.messages || r.reward != o.reward || !r.hasTeacher {
			t.Fatalf("step %s changed in the round trip", r.stepID)
		}
	}
	want := 0
	for _, r := range orig {
		if unscoredGroups[r.group] {
			want++
		}
	}
	if len(again) != want {
		t.Errorf("%d steps re-ingested, want %d", len(again), want)
	}
}

// TestExportRefusesStoreOutputs: an export may not write into the store it
// reads — over the manifest, into another reserved folder, over a shard,
// onto the root — whether named plainly, relatively or through a link;
// the store is left as it was and still reads.
func TestExportRefusesStoreOutputs(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in, out := filepath.Join(work, "in.jsonl"), filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "gen", "--groups", "8", "--group-size", "4", "--teacher", "--seed", "3", "--to", in); r.code != 0 {
		t.Fatal(r.stderr)
	}
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatal(r.stderr)
	}
	manifest := filepath.Join(out, "_manifest", "shards.jsonl")
	entries, err := local.ReadManifest(out)
	if err != nil || len(entries) == 0 || entries[0].Path == "" {
		t.Fatalf("manifest %v (%v)", entries, err)
	}
	shard := filepath.Join(out, filepath.FromSlash(entries[0].Path))
	if err := os.Symlink(out, filepath.Join(work, "link")); err != nil {
		t.Fatal(err)
	}
	before := sqlSnapshot(t, out)
	for _, c := range []struct {
		dir  string
		args []string
	}{
		{work, []string{"sft", "--to", manifest}},
		{out, []string{"sft", "--to", "_manifest/shards.jsonl"}},
		{work, []string{"sft", "--to", filepath.Join(work, "link", "_manifest", "shards.jsonl")}},
		{work, []string{"sft", "--to", filepath.Join(out, "policy=0", "..", "_dlq", "x.jsonl")}},
		{work, []string{"sft", "--to", filepath.Join(out, "_tmp", "sft.parquet")}},
		{work, []string{"sft", "--to", shard}},
		{work, []string{"sft", "--to", filepath.Join(work, "sft.jsonl"), "--stats-json", filepath.Join(out, "_manifest", "state.json")}},
		{work, []string{"distill", "--to", shard}},
		{work, []string{"distill", "--to", filepath.Join(work, "d.parquet"), "--requests", manifest}},
	} {
		args := append([]string{"export"}, c.args...)
		args = append(args, "--from", out, "--quiet")
		r := e2eRun(t, bin, c.dir, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "output inside the store") {
			t.Errorf("%q in %s: exit %d, want 2 and a refusal\n%s", args, c.dir, r.code, r.stderr)
		}
	}
	if after := sqlSnapshot(t, out); after != before {
		t.Errorf("the store changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	for _, p := range []string{filepath.Join(work, "sft.jsonl"), filepath.Join(work, "d.parquet")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s written although another output was refused (%v)", p, err)
		}
	}
	// Beside the store, and a plain file in its root, are fine.
	for _, to := range []string{filepath.Join(work, "sft.jsonl"), filepath.Join(out, "sft.jsonl")} {
		if r := e2eRun(t, bin, work, "export", "sft", "--from", out, "--to", to, "--quiet"); r.code != 0 {
			t.Errorf("export sft --to %s: exit %d\n%s", to, r.code, r.stderr)
		}
	}
	if r := e2eRun(t, bin, work, "sql", "--from", out, "SELECT count(*) FROM steps"); r.code != 0 {
		t.Errorf("the store no longer reads: exit %d\n%s", r.code, r.stderr)
	}
}

// TestExportNumericFlagsRefused: export's numbers are range-checked as
// ingest's are: a NaN or infinite λ, a discount above 1, a negative clip
// or a NaN reward floor is a usage error naming the flag (exit 2), never
// a dataset of NaN advantages.
func TestExportNumericFlagsRefused(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	gen := filepath.Join(work, "gen.jsonl")
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "gen", "--to", gen, "--groups", "4", "--group-size", "2", "--seed", "1", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	if r := e2eRun(t, bin, work, "ingest", "--from", gen, "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	for _, c := range []struct {
		cmd, flag string
		values    []string
	}{
		{"distill", "kl-coef", []string{"NaN", "Inf", "-Inf", "1e308"}},
		{"distill", "kl-clip", []string{"NaN", "-1", "Inf"}},
		{"distill", "kl-discount", []string{"NaN", "5", "-0.1"}},
		{"sft", "min-reward", []string{"NaN", "Inf", "-Inf"}},
		{"sft", "best-of-n", []string{"-1", "99999999999"}},
	} {
		for _, v := range c.values {
			dst := filepath.Join(work, "x."+map[string]string{"distill": "parquet", "sft": "jsonl"}[c.cmd])
			r := e2eRun(t, bin, work, "export", c.cmd, "--from", out, "--to", dst, "--quiet", "--"+c.flag+"="+v)
			if r.code != exitUsage || !strings.Contains(r.stderr, c.flag) {
				t.Errorf("export %s --%s=%s: exit %d, want %d naming the flag; stderr: %s", c.cmd, c.flag, v, r.code, exitUsage, e2eClip(r.stderr, 300))
			}
			if _, err := os.Stat(dst); err == nil {
				t.Errorf("export %s --%s=%s wrote %s", c.cmd, c.flag, v, dst)
				os.Remove(dst)
			}
		}
	}
}
