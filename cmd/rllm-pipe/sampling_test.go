package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRequireSampling: consume --require-sampling delivers only the groups
// every step of which was sampled as required (metadata.sampling, as the
// gateway records it; numbers compared as numbers) and counts the others,
// in both layouts.
func TestRequireSampling(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	var lines []string
	meta := map[string][2]string{ // group -> the two steps' metadata
		"ok":      {`{"sampling":{"temperature":1.0,"logprobs_mode":"raw_logprobs"}}`, `{"sampling":{"temperature":1,"logprobs_mode":"raw_logprobs","top_p":0.9}}`},
		"hot":     {`{"sampling":{"temperature":1.0,"logprobs_mode":"raw_logprobs"}}`, `{"sampling":{"temperature":0.7,"logprobs_mode":"raw_logprobs"}}`},
		"unknown": {`{"session_id":"x"}`, `{"sampling":{"temperature":1.0,"logprobs_mode":"raw_logprobs"}}`},
	}
	for g, ms := range meta {
		for r, m := range ms {
			id := fmt.Sprintf("%s/%d", g, r)
			lines = append(lines,
				fmt.Sprintf(`{"type":"step","step_id":"%s#0","task_id":"%s","trajectory_id":"%s","step_index":0,"policy_version":1,"prompt_ids":[1,2],"response_ids":[3],"response_logprobs":[-0.5],"metadata":%s}`, id, g, id, m),
				fmt.Sprintf(`{"type":"trajectory","trajectory_id":"%s","task_id":"%s","reward":%d,"num_steps":1}`, id, g, r))
		}
	}
	in := filepath.Join(work, "in.jsonl")
	if err := os.WriteFile(in, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", out, "--group-size", "2", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	for _, layout := range []string{"steps", "trajectories"} {
		stats := filepath.Join(work, layout+".json")
		r := e2eRun(t, bin, work, "consume", "--from", out, "--consumer-group", layout, "--layout", layout,
			"--require-sampling", "temperature=1, logprobs_mode=raw_logprobs", "--stats-json", stats)
		if r.code != 0 {
			t.Fatalf("consume: %s", r.stderr)
		}
		var groups []string
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var b struct{ Groups []string }
			if err := json.Unmarshal([]byte(l), &b); err != nil {
				t.Fatalf("consume line %q: %v", l, err)
			}
			groups = append(groups, b.Groups...)
		}
		var st struct {
			Skipped int64 `json:"groups_skipped_sampling"`
			Acked   int64 `json:"groups_acked"`
		}
		data, _ := os.ReadFile(stats)
		if err := json.Unmarshal(data, &st); err != nil {
			t.Fatal(err)
		}
		if len(groups) != 1 || !strings.Contains(groups[0], "ok") || st.Skipped != 2 || st.Acked != 1 {
			t.Errorf("%s: delivered %v, acknowledged %d, skipped for sampling %d; want the ok group, 1, 2", layout, groups, st.Acked, st.Skipped)
		}
	}
	// The step_sampling view: the recorded parameters as columns, NULL
	// where a step has none.
	q := e2eRun(t, bin, work, "sql", "--from", out, "--format", "csv",
		"SELECT step_id, temperature, top_p, logprobs_mode FROM step_sampling ORDER BY step_id")
	if q.code != 0 {
		t.Fatalf("sql: %s", q.stderr)
	}
	want := "step_id,temperature,top_p,logprobs_mode\nhot/0#0,1,,raw_logprobs\nhot/1#0,0.7,,raw_logprobs\n" +
		"ok/0#0,1,,raw_logprobs\nok/1#0,1,0.9,raw_logprobs\nunknown/0#0,,,\nunknown/1#0,1,,raw_logprobs"
	if got := strings.TrimSpace(q.stdout); got != want {
		t.Errorf("step_sampling:\n%s\nwant:\n%s", got, want)
	}
	if r := e2eRun(t, bin, work, "consume", "--from", out, "--require-sampling", "temperature"); r.code != exitUsage {
		t.Errorf("--require-sampling temperature: exit %d, want %d", r.code, exitUsage)
	}
}
