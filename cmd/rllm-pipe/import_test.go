package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	_ "github.com/mattn/go-sqlite3"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// impRow is one committed row of the shards, as the import test checks it.
type impRow struct {
	traj     string
	version  int64
	logprobs []float32
	reward   float64
	correct  *bool
	term     string
}

// impShards reads every committed row of out by step id; a step committed
// twice fails the test.
func impShards(t *testing.T, out string) map[string]impRow {
	t.Helper()
	r, err := local.OpenReader(out)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := r.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]impRow{}
	cols := []string{"step_id", "trajectory_id", "policy_version", "response_logprobs", "reward", "is_correct", "termination_reason"}
	for _, e := range entries {
		err := parquet.ReadFile(context.Background(), filepath.Join(out, filepath.FromSlash(e.Path)), cols, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
			ids, trs := rec.Column(0).(*array.String), rec.Column(1).(*array.String)
			vers, lps := rec.Column(2).(*array.Int64), rec.Column(3).(*array.List)
			rew, cor, term := rec.Column(4).(*array.Float64), rec.Column(5).(*array.Boolean), rec.Column(6).(*array.String)
			vals := lps.ListValues().(*array.Float32)
			for i := range int(rec.NumRows()) {
				id := ids.Value(i)
				if _, dup := rows[id]; dup {
					t.Errorf("step %s committed twice", id)
				}
				start, end := lps.ValueOffsets(i)
				row := impRow{traj: trs.Value(i), version: vers.Value(i), reward: rew.Value(i),
					logprobs: append([]float32{}, vals.Float32Values()[start:end]...)}
				if cor.IsValid(i) {
					v := cor.Value(i)
					row.correct = &v
				}
				if term.IsValid(i) {
					row.term = term.Value(i)
				}
				rows[id] = row
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return rows
}

// impStore writes a store with the exact schema of rLLM's gateway
// (rllm_model_gateway/store/sqlite_store.py): sessions task{g}:{r} of two
// calls each, the second carrying its parent's conversation.
func impStore(t *testing.T, path string, groups, rollouts int, nullAt string) {
	t.Helper()
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE traces (trace_id TEXT PRIMARY KEY, data TEXT NOT NULL, created_at REAL NOT NULL)`,
		`CREATE TABLE trace_sessions (trace_id TEXT NOT NULL, session_id TEXT NOT NULL, run_id TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL,
			PRIMARY KEY (trace_id, session_id), FOREIGN KEY (trace_id) REFERENCES traces(trace_id) ON DELETE CASCADE)`,
		`CREATE INDEX idx_ts_session_time ON trace_sessions(session_id, created_at ASC)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	at := 1.7e9
	for g := range groups {
		for r := range rollouts {
			session := fmt.Sprintf("task%d:%d", g, r)
			for call := range 2 {
				id := fmt.Sprintf("tr-%d-%d-%d", g, r, call)
				var logprobs any = []float64{-0.5 - float64(call), -0.25}
				if id == nullAt {
					logprobs = []any{-0.5, nil}
				}
				data, _ := json.Marshal(map[string]any{
					"trace_id": id, "session_id": session, "model": "m", "messages": []any{map[string]any{"role": "user", "content": "q"}},
					"prompt_token_ids": []int{1, 2, 3 + call}, "response_message": map[string]any{"role": "assistant", "content": "a"},
					"completion_token_ids": []int{40 + g, 50 + r}, "logprobs": logprobs, "finish_reason": "stop",
					"weight_version": 6 + call, "latency_ms": 3.0, "timestamp": at,
				})
				at++
				if _, err := db.Exec(`INSERT INTO traces VALUES (?, ?, ?)`, id, string(data), at); err != nil {
					t.Fatal(err)
				}
				if _, err := db.Exec(`INSERT INTO trace_sessions (trace_id, session_id, created_at) VALUES (?, ?, ?)`, id, session, at); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// TestImportRLLMTraces: a gateway store, piped through the real binary
// (import | ingest --from -), lands in the shards with every step exactly
// once, with its ids, logprobs, versions and its session's reward; the
// step with a null logprob entry is a dead letter and its trajectory is
// not committed shortened.
func TestImportRLLMTraces(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	db := filepath.Join(work, "gateway_traces.db")
	impStore(t, db, 3, 2, "tr-2-1-1")
	var rw bytes.Buffer
	for g := range 3 {
		for r := range 2 {
			fmt.Fprintf(&rw, `{"session_id":"task%d:%d","reward":%d,"is_correct":%v,"termination_reason":"env_done"}`+"\n", g, r, r, r == 1)
		}
	}
	rewards := filepath.Join(work, "rewards.jsonl")
	if err := os.WriteFile(rewards, rw.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, dlq := filepath.Join(work, "out"), filepath.Join(work, "import-dlq.jsonl")
	imp := exec.Command(bin, "import", "rllm", "--from", db, "--rewards", rewards, "--dlq", dlq, "--to", "-")
	ing := exec.Command(bin, "ingest", "--from", "-", "--to", out, "--group-size", "2", "--quiet")
	imp.Env, ing.Env = e2eEnv(), e2eEnv()
	pipe, err := imp.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	ing.Stdin = pipe
	var impErr, ingErr bytes.Buffer
	imp.Stderr, ing.Stderr = &impErr, &ingErr
	if err := ing.Start(); err != nil {
		t.Fatal(err)
	}
	defer watchdog(ing, 3*time.Minute)()
	if err := imp.Start(); err != nil {
		t.Fatal(err)
	}
	defer watchdog(imp, 3*time.Minute)()
	if err := imp.Wait(); err != nil {
		t.Fatalf("import: %v\n%s", err, impErr.String())
	}
	if err := ing.Wait(); err != nil {
		t.Fatalf("ingest: %v\n%s", err, ingErr.String())
	}
	if !strings.Contains(impErr.String(), "6 sessions read: 11 steps and 6 trajectories written, 1 dead letters (wrong_type 1)") {
		t.Fatalf("summary: %s", impErr.String())
	}
	letters, err := os.ReadFile(dlq)
	if err != nil {
		t.Fatal(err)
	}
	var dl schemas.DeadLetterLine
	if err := json.Unmarshal(bytes.TrimSpace(letters), &dl); err != nil || dl.Reason != schemas.ReasonWrongType || !strings.Contains(dl.Record, `"step_id":"tr-2-1-1"`) {
		t.Fatalf("dead letter %s (%v)", letters, err)
	}

	rows := impShards(t, out)
	// Group task2 is short of its second trajectory's last step: it is not
	// committed (stdin ends it as a partial group or incomplete dead letters).
	want := map[string]impRow{}
	yes, no := true, false
	for g := range 2 {
		for r := range 2 {
			for call := range 2 {
				c := &no
				if r == 1 {
					c = &yes
				}
				want[fmt.Sprintf("tr-%d-%d-%d", g, r, call)] = impRow{traj: fmt.Sprintf("task%d:%d", g, r), version: int64(6 + call),
					logprobs: []float32{-0.5 - float32(call), -0.25}, reward: float64(r), correct: c, term: "ENV_DONE"}
			}
		}
	}
	for id, w := range want {
		if g, ok := rows[id]; !ok || !reflect.DeepEqual(g, w) {
			t.Errorf("step %s: got %+v, want %+v", id, g, w)
		}
	}
	for id, r := range rows {
		if _, ok := want[id]; !ok && !strings.HasPrefix(id, "tr-2-0-") {
			t.Errorf("unexpected row %s %+v", id, r)
		}
		if id == "tr-2-1-1" {
			t.Errorf("the step with a null logprob was committed")
		}
	}
}

// TestImportRLLMEpisodes: an rllm eval run directory, imported to a file
// and ingested from it.
func TestImportRLLMEpisodes(t *testing.T) {
	work := t.TempDir()
	epDir := filepath.Join(work, "bench_model_20260101", "episodes")
	if err := os.MkdirAll(epDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		task, attempt := i/2, i%2
		ep := map[string]any{"id": fmt.Sprintf("q%d:%d", task, attempt), "task": map[string]any{"id": fmt.Sprint(task)},
			"termination_reason": "max_turns_exceeded", "is_correct": attempt == 0, "eval_idx": i,
			"trajectories": []any{map[string]any{"uid": fmt.Sprintf("u%d", i), "name": "solver", "reward": float64(1 - attempt),
				"signals": map[string]float64{"accuracy": float64(1 - attempt)},
				"steps": []any{map[string]any{"id": fmt.Sprintf("s%d", i), "prompt_ids": []int{1, 2}, "response_ids": []int{3},
					"logprobs": []float64{-0.125}, "chat_completions": []any{map[string]any{"role": "user", "content": "q"}},
					"reward": 0.0, "done": true, "weight_version": nil}}}},
		}
		b, _ := json.Marshal(ep)
		if err := os.WriteFile(filepath.Join(epDir, fmt.Sprintf("episode_%06d_%d.json", i, task)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lines, out := filepath.Join(work, "lines.jsonl"), filepath.Join(work, "out")
	var stderr bytes.Buffer
	// No version in the data: --policy-version is the one.
	if code := run(context.Background(), []string{"import", "rllm", "--from", filepath.Dir(epDir), "--to", lines, "--policy-version", "12", "--group-size", "2"}, io.Discard, &stderr); code != 0 {
		t.Fatalf("import: %d %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "4 episode files read: 4 steps and 4 trajectories written, 0 dead letters") {
		t.Fatalf("summary %s", stderr.String())
	}
	if code := run(context.Background(), []string{"ingest", "--from", lines, "--to", out, "--quiet"}, io.Discard, &stderr); code != 0 {
		t.Fatalf("ingest: %d %s", code, stderr.String())
	}
	rows := impShards(t, out)
	if len(rows) != 4 {
		t.Fatalf("rows %+v", rows)
	}
	for i := range 4 {
		r := rows[fmt.Sprintf("s%d", i)]
		if r.traj != fmt.Sprintf("u%d", i) || r.version != 12 || r.reward != float64(1-i%2) || r.correct == nil || *r.correct != (i%2 == 0) || r.term != "MAX_TURNS_EXCEEDED" {
			t.Errorf("s%d: %+v", i, r)
		}
	}
}

func TestImportRLLMUsage(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "rewards.jsonl")
	if err := os.WriteFile(bad, []byte(`{"reward":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][]string{
		"no from":          {"import", "rllm"},
		"stdin":            {"import", "rllm", "--from", "-"},
		"missing":          {"import", "rllm", "--from", filepath.Join(dir, "nope")},
		"negative version": {"import", "rllm", "--from", dir, "--policy-version", "-1"},
		"group size":       {"import", "rllm", "--from", dir, "--group-size", "-2"},
		"bad rewards":      {"import", "rllm", "--from", dir, "--rewards", bad},
		"dlq stdout":       {"import", "rllm", "--from", dir, "--dlq", "-"},
	} {
		var stderr bytes.Buffer
		if code := run(context.Background(), args, io.Discard, &stderr); code != exitUsage {
			t.Errorf("%s: exit %d, want %d (%s)", name, code, exitUsage, stderr.String())
		}
	}
}
