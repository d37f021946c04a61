package main

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TestCrashRestartExactlyOnce kills ingest with SIGKILL at random moments,
// restarts it over the same input each time, and checks that in the end
// every valid step is committed exactly once with the right advantage and
// every bad line is dead-lettered exactly once.
func TestCrashRestartExactlyOnce(t *testing.T) {
	t.Parallel() // see main_test.go
	if testing.Short() {
		t.Skip("crash loop: long")
	}
	bin := e2eBinary(t)
	work := t.TempDir()
	gen := filepath.Join(work, "gen.jsonl")
	r := e2eRun(t, bin, work, "gen", "--to", gen, "--groups", "500", "--group-size", "4", "--duplicates", "0.02",
		"--prompt-len", "48", "--response-len", "24", "--seed", "11", "--quiet")
	if r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	data, err := os.ReadFile(gen)
	if err != nil {
		t.Fatal(err)
	}
	// Sprinkle bad records through the stream.
	var lines [][]byte
	for i, l := range e2eSplitLines(data) {
		lines = append(lines, l)
		switch i % 97 {
		case 13:
			lines = append(lines, []byte(fmt.Sprintf(`{"type":"step","step_id":"broken-%d"`, i)))
		case 57:
			lines = append(lines, []byte(fmt.Sprintf(`[%d]`, i)))
		}
	}
	in := filepath.Join(work, "in.jsonl")
	if err := os.WriteFile(in, e2eJoinLines(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	ref, err := refIngest(lines, in, 4, 2)
	if err != nil {
		t.Fatalf("reference: %v", err)
	}

	out := filepath.Join(work, "out")
	args := []string{"ingest", "--from", in, "--to", out, "--group-size", "4", "--flush-interval", "30ms",
		"--shard-size", "64KiB", "--decoders", "1", "--quiet"}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	kills := 0
	for attempt := 0; ; attempt++ {
		if attempt > 200 {
			t.Fatal("ingest never finished")
		}
		cmd := exec.Command(bin, args...)
		cmd.Env = e2eEnv()
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer watchdog(cmd, 3*time.Minute)()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		if kills < 12 {
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("ingest failed: %v\n%s", err, stderr.String())
				}
				t.Logf("run %d finished before its kill", attempt)
				// Start over the kill loop on finished output only when
				// enough kills happened; otherwise keep killing reruns.
				if kills >= 10 {
					goto verify
				}
				continue
			case <-time.After(time.Duration(30+rng.IntN(400)) * time.Millisecond):
				cmd.Process.Kill() // SIGKILL: no cleanup runs
				<-done
				kills++
				continue
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("final ingest failed: %v\n%s", err, stderr.String())
		}
		break
	}
verify:
	t.Logf("%d kills", kills)

	// Shards: exactly the manifest's, each step exactly once.
	entries, err := local.ReadManifest(out)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range entries {
		if e.Path != "" {
			listed[e.Path] = true
		}
	}
	files := e2eCommittedFiles(t, out)
	if len(files) != len(listed) {
		t.Fatalf("%d committed files, manifest lists %d", len(files), len(listed))
	}
	var paths []string
	for _, f := range files {
		if !listed[f] {
			t.Fatalf("%s is not in the manifest", f)
		}
		paths = append(paths, filepath.Join(out, f))
	}
	checkStepsExactlyOnce(t, paths, ref)

	// Dead letters: every bad line exactly once, over all files.
	dl := map[int]int{}
	dlqFiles, _ := filepath.Glob(filepath.Join(out, "_dlq", "*.jsonl"))
	for _, p := range dlqFiles {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var l schemas.DeadLetterLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			dl[int(l.Source.Line)]++
		}
		f.Close()
	}
	for line, d := range ref.DeadLetters {
		if dl[line] != 1 {
			t.Errorf("line %d (%s) dead-lettered %d times", line, d.Reason, dl[line])
		}
	}
	if len(dl) != len(ref.DeadLetters) {
		t.Errorf("%d lines dead-lettered, want %d", len(dl), len(ref.DeadLetters))
	}
	t.Logf("%d steps, %d dead letters, %d shards", len(ref.Rows), len(ref.DeadLetters), len(files))

	// The summary reads the same output (its manifest holds checkpoints
	// without shards too).
	sum := e2eRun(t, bin, work, "summary", "--from", out)
	if sum.code != 0 || !strings.Contains(sum.stdout, fmt.Sprintf("%d committed shards", len(files))) {
		t.Fatalf("summary: exit %d\n%s%s", sum.code, sum.stdout, sum.stderr)
	}
	if !strings.Contains(sum.stdout, fmt.Sprintf(" %d ", len(ref.Rows))) {
		t.Errorf("summary does not report %d steps:\n%s", len(ref.Rows), sum.stdout)
	}
}

// checkStepsExactlyOnce reads the shards at paths with DuckDB and checks
// that every valid step of ref appears exactly once, with its advantage,
// and nothing else does.
func checkStepsExactlyOnce(t *testing.T, paths []string, ref *refResult) {
	t.Helper()
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(fmt.Sprintf("SELECT step_id, advantage FROM read_parquet(%s, hive_partitioning=false)", e2eSQLList(paths)))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]int{}
	for rows.Next() {
		var id string
		var adv float64
		if err := rows.Scan(&id, &adv); err != nil {
			t.Fatal(err)
		}
		seen[id]++
		if exp, ok := ref.Rows[id]; !ok {
			t.Errorf("step %s is not a valid step", id)
		} else if math.Abs(exp.Advantage-adv) > 1e-6 {
			t.Errorf("step %s: advantage %v, want %v", id, adv, exp.Advantage)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	missing, doubled := 0, 0
	for id := range ref.Rows {
		switch seen[id] {
		case 0:
			missing++
		case 1:
		default:
			doubled++
		}
	}
	if missing > 0 || doubled > 0 {
		t.Fatalf("%d steps missing, %d committed more than once (of %d)", missing, doubled, len(ref.Rows))
	}
}
