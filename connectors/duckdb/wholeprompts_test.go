package duckdb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// deltaStep is a step as the writer stores it under prefix deltas
// (schemas.ColPromptPrefixLen), with its whole prompt and messages.
type deltaStep struct {
	traj              string
	index             int
	prompt, response  []int // whole prompt
	messages          string
	extends, extendsM bool // stored as a delta of the step before
}

// stored returns the stored prompt columns of s given the step
// before it in its trajectory (nil for none).
func (s deltaStep) stored(prev *deltaStep) (prefixLen int, promptIDs, deltaIDs, messages, messagesDelta string) {
	promptIDs, deltaIDs, prefixLen = listOf(s.prompt), "[]::INTEGER[]", 0
	if s.extends {
		prefixLen = len(prev.prompt) + len(prev.response)
		promptIDs, deltaIDs = "NULL", listOf(s.prompt[prefixLen:])
	}
	messages, messagesDelta = sqlString(s.messages), "NULL"
	if s.extendsM {
		messages, messagesDelta = "NULL", sqlString(s.messages[len(prev.messages)-1:])
	}
	return prefixLen, promptIDs, deltaIDs, messages, messagesDelta
}

// TestStepsRebuildWholePrompts: the steps view gives every step's whole
// prompt and messages back from the deltas of a shard: chains of several
// steps (each delta on the whole chain before it, not only the step
// before), a chain broken by a context reset and started again, messages
// that extend while prompts do not, two trajectories interleaved in one
// shard, and a second shard whose chains are its own.
func TestStepsRebuildWholePrompts(t *testing.T) {
	shards := map[string][]deltaStep{
		"policy=1/shard-0.parquet": {
			{traj: "a", index: 0, prompt: []int{1, 2}, response: []int{3}, messages: `[{"u":1}]`},
			{traj: "b", index: 0, prompt: []int{50}, response: []int{51, 52}, messages: `[{"u":50}]`},
			{traj: "a", index: 1, prompt: []int{1, 2, 3, 4}, response: []int{5}, messages: `[{"u":1},{"a":3},{"u":4}]`, extends: true, extendsM: true},
			{traj: "b", index: 1, prompt: []int{50, 51, 52, 53}, response: []int{54}, messages: `[{"u":50},{"u":53}]`, extends: true, extendsM: true},
			{traj: "a", index: 2, prompt: []int{1, 2, 3, 4, 5, 6, 7}, response: []int{8}, messages: `[{"u":1},{"a":3},{"u":4},{"u":6}]`, extends: true, extendsM: true},
			// A context reset: a new chain.
			{traj: "a", index: 3, prompt: []int{90}, response: []int{91}, messages: `[{"s":90}]`},
			{traj: "a", index: 4, prompt: []int{90, 91, 92}, response: []int{93}, messages: `[{"s":90},{"u":92}]`, extends: true, extendsM: true},
			// A re-rendered prompt whose messages still extend.
			{traj: "a", index: 5, prompt: []int{7, 7}, response: []int{94}, messages: `[{"s":90},{"u":92},{"u":95}]`, extendsM: true},
			{traj: "a", index: 6, prompt: []int{7, 7, 94, 96}, response: []int{97}, messages: `[{"x":0}]`, extends: true},
		},
		"policy=1/shard-1.parquet": {
			{traj: "c", index: 0, prompt: []int{60}, response: []int{61}, messages: `[{"u":60}]`},
			{traj: "c", index: 1, prompt: []int{60, 61, 62}, response: []int{63}, messages: `[{"u":60},{"u":62}]`, extends: true, extendsM: true},
			{traj: "c", index: 2, prompt: []int{60, 61, 62, 63, 64}, response: []int{65}, messages: `[{"u":60},{"u":62},{"u":64}]`, extends: true, extendsM: true},
		},
	}
	root := filepath.Join(t.TempDir(), "out")
	if err := os.MkdirAll(filepath.Join(root, "policy=1"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w, err := OpenLocal(ctx, t.TempDir(), Options{AllowHostFiles: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var entries []schemas.ShardEntry
	want := map[string]string{}
	for _, rel := range []string{"policy=1/shard-0.parquet", "policy=1/shard-1.parquet"} {
		last := map[string]*deltaStep{}
		var values []string
		for i := range shards[rel] {
			s := &shards[rel][i]
			n, p, d, m, md := s.stored(last[s.traj])
			last[s.traj] = s
			id := fmt.Sprintf("%s#%d", s.traj, s.index)
			values = append(values, fmt.Sprintf("('g', 'task', %s, %s, %d, 7, 1, 1, %s, %s, %s, %d, %s, %s, %s, 1.0, 0.0, 1, 1, false)",
				sqlString(s.traj), sqlString(id), s.index, p, listOf(s.response), floatsOf(len(s.response)), n, d, m, md))
			want[id] = fmt.Sprint(s.prompt) + " " + s.messages
		}
		for _, q := range []string{
			"CREATE OR REPLACE TABLE t AS SELECT * EXCLUDE (shard) FROM steps WHERE false",
			`INSERT INTO t (group_id, task_id, trajectory_id, step_id, step_index, num_steps, policy_version, group_version,
  prompt_ids, response_ids, response_logprobs, prompt_prefix_len, prompt_delta_ids, messages, messages_delta,
  reward, advantage, group_size, expected_group_size, partial) VALUES ` + strings.Join(values, ",\n"),
			"COPY t TO " + sqlString(filepath.Join(root, filepath.FromSlash(rel))) + " (FORMAT parquet)",
		} {
			if _, err := w.SQL().ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", clip(q, 200), err)
			}
		}
		info, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, schemas.ShardEntry{Path: rel, Rows: int64(len(values)), Bytes: info.Size(), Groups: 1,
			PolicyVersion: 1, RunID: "a", SchemaVersion: schemas.SchemaVersion})
	}
	writeManifest(t, root, entries)

	d, err := OpenLocal(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := queryStrings(t, d, `SELECT step_id || '=' || replace(prompt_ids::VARCHAR, ',', '') || ' ' || messages FROM steps ORDER BY step_id`)
	var wantRows []string
	for id, v := range want {
		wantRows = append(wantRows, id+"="+v)
	}
	slices.Sort(wantRows)
	if !slices.Equal(got, wantRows) {
		t.Errorf("steps:\n got %q\nwant %q", got, wantRows)
	}
}

func listOf(ids []int) string {
	var parts []string
	for _, id := range ids {
		parts = append(parts, fmt.Sprint(id))
	}
	return "[" + strings.Join(parts, ", ") + "]::INTEGER[]"
}

func floatsOf(n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat("-0.5, ", n), ", ") + "]::FLOAT[]"
}
