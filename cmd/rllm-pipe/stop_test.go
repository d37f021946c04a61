package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// stopRecords returns groups of 4 one-step trajectories; the last group
// of every eight has only 3 trajectories, so that open groups are left at
// the end of the input (partial groups, min-group-size 2).
func stopRecords(groups int) [][]byte {
	var out [][]byte
	for g := range groups {
		n := 4
		if g%8 == 7 {
			n = 3
		}
		for tr := range n {
			id := fmt.Sprintf("g%d-t%d", g, tr)
			out = append(out,
				fmt.Appendf(nil, `{"type":"step","step_id":"%s-s0","task_id":"g%d","trajectory_id":"%s","step_index":0,"policy_version":0,"prompt_ids":[1,2,3],"response_ids":[4,5],"response_logprobs":[-0.5,-0.25]}`, id, g, id),
				fmt.Appendf(nil, `{"type":"trajectory","trajectory_id":"%s","task_id":"g%d","reward":%d,"num_steps":1}`, id, g, tr%2))
		}
	}
	return out
}

// outputAccount returns, for an output root, the step and trajectory ids
// of the committed rows and the raw records of the dead letters.
func outputAccount(t *testing.T, out string) (steps, trajs map[string]int, letters []schemas.DeadLetterLine) {
	t.Helper()
	r, err := local.OpenReader(out)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := r.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	steps, trajs = map[string]int{}, map[string]int{}
	for _, e := range entries {
		err := parquet.ReadFile(context.Background(), filepath.Join(out, filepath.FromSlash(e.Path)), []string{"step_id", "trajectory_id"}, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
			s, tr := rec.Column(0).(*array.String), rec.Column(1).(*array.String)
			for i := range int(rec.NumRows()) {
				steps[s.Value(i)]++
				trajs[tr.Value(i)] = 1
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	files, _ := filepath.Glob(filepath.Join(out, "_dlq", "*.jsonl"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range bytes.Split(bytes.TrimSpace(data), []byte("\n")) {
			if len(line) == 0 {
				continue
			}
			var dl schemas.DeadLetterLine
			if err := json.Unmarshal(line, &dl); err != nil {
				t.Fatalf("dead letter %q: %v", line, err)
			}
			letters = append(letters, dl)
		}
	}
	return steps, trajs, letters
}

// TestStopStdinWritesEverythingRead stops `ingest --from -` with SIGTERM
// while stdin stays open, after the whole input was read (and a last
// line cut short): every record read is written or dead-lettered, none
// twice, the run exits 0 and says so.
func TestStopStdinWritesEverythingRead(t *testing.T) {
	bin := e2eBinary(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	stats := filepath.Join(dir, "stats.json")
	records := stopRecords(500)
	cut := []byte(`{"type":"step","step_id":"cut`)

	cmd := exec.Command(bin, "ingest", "--from", "-", "--to", out, "--group-size", "4", "--min-group-size", "2",
		"--flush-interval", "1h", "--stats-json", stats)
	cmd.Env = e2eEnv()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := bufio.NewWriter(stdin)
	for _, r := range records {
		w.Write(r)
		w.WriteByte('\n')
	}
	w.Write(cut) // no newline: a line the stop cuts short
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	// Everything is written into the pipe; give ingest time to read it,
	// then stop it with stdin still open.
	time.Sleep(2 * time.Second)
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("ingest did not stop within 60s of SIGTERM with stdin open\n%s", stderr.String())
	}
	stdin.Close()
	if err != nil {
		t.Fatalf("ingest: %v (want exit 0 after a clean stop)\n%s", err, stderr.String())
	}
	t.Logf("stopped in %s", time.Since(start))
	if !strings.Contains(stderr.String(), "every record read was written") {
		t.Errorf("the summary does not say that stdin was drained:\n%s", stderr.String())
	}

	steps, trajs, letters := outputAccount(t, out)
	lettered := map[string]int{}
	for _, dl := range letters {
		lettered[dl.Record]++
	}
	for _, r := range records {
		var rec struct{ Type, StepID, TrajectoryID string }
		var raw map[string]any
		_ = json.Unmarshal(r, &raw)
		rec.Type, _ = raw["type"].(string)
		rec.StepID, _ = raw["step_id"].(string)
		rec.TrajectoryID, _ = raw["trajectory_id"].(string)
		written := 0
		if rec.Type == "step" {
			written = steps[rec.StepID]
		} else {
			written = trajs[rec.TrajectoryID]
		}
		if n := written + lettered[string(r)]; n != 1 {
			t.Fatalf("record %s: written %d times, dead-lettered %d times (want once in all)", r, written, lettered[string(r)])
		}
	}
	if lettered[string(cut)] != 1 {
		t.Errorf("the line cut short by the stop is not a dead letter; letters: %d", len(letters))
	}
	var st struct {
		Stopped bool `json:"stopped_early"`
		Drained bool `json:"stdin_drained"`
	}
	data, err := os.ReadFile(stats)
	if err != nil || json.Unmarshal(data, &st) != nil || !st.Stopped || !st.Drained {
		t.Errorf("stats: %s (%v), want stopped_early and stdin_drained", data, err)
	}
}

// closedPort returns an address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestStopDuringS3Outage: an ingest whose S3 is unreachable ends on the
// first signal (exit 3, nothing committed is at risk: the file is read
// again by the next run), and on its own after --retry-for (exit 1, with
// the reason).
func TestStopDuringS3Outage(t *testing.T) {
	bin := e2eBinary(t)
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, append(bytes.Join(stopRecords(16), []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(e2eEnv(), "AWS_ENDPOINT_URL=http://"+closedPort(t), "AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=secret-key-value")

	t.Run("signal", func(t *testing.T) {
		code, stderr := signalWhileRetrying(t, bin, env, "ingest", "--from", in, "--to", "s3://bucket/run")
		if code != exitStopped {
			t.Fatalf("exit code %d, want %d (stopped before finishing)\n%s", code, exitStopped, e2eClip(stderr, 2000))
		}
		if strings.Contains(stderr, "secret-key-value") {
			t.Errorf("the secret key was logged")
		}
	})
	t.Run("retry-for", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "ingest", "--from", in, "--to", "s3://bucket/run", "--retry-for", "2s")
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		_ = cmd.Run()
		if ctx.Err() != nil {
			t.Fatalf("ingest went on retrying past --retry-for\n%s", e2eClip(stderr.String(), 2000))
		}
		if code := cmd.ProcessState.ExitCode(); code != exitFailure || !strings.Contains(stderr.String(), "unreachable for 2s") {
			t.Fatalf("exit code %d, want %d with the reason\n%s", code, exitFailure, e2eClip(stderr.String(), 2000))
		}
		// The error names the flag that sets the bound, as it is spelled.
		if !strings.Contains(stderr.String(), "--retry-for)") || strings.Contains(stderr.String(), "--s3-retry-for") {
			t.Fatalf("the give-up error does not name --retry-for\n%s", e2eClip(stderr.String(), 2000))
		}
	})
}

// TestNumericFlagsRefused runs ingest with hostile values of every
// numeric flag: each is a usage error naming the flag (exit 2), never a
// run with NaN advantages, a wrapped size or a thousand decoders.
func TestNumericFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, append(bytes.Join(stopRecords(2), []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	hostile := map[string][]string{
		"group-size":       {"0", "-1", "99999999999", "2000000"},
		"min-group-size":   {"0", "-5", "2000000"},
		"group-timeout":    {"-1s", "9999999h"},
		"max-open-groups":  {"0", "-1", "999999999"},
		"max-partitions":   {"0", "-1", "100000"},
		"shard-size":       {"9999999999GiB", "0", "-1MiB", "1", "NaN", "1e3", "12abc", "100GiB"},
		"max-record-bytes": {"9999999999GiB", "0", "2GiB", "1.5MiB"},
		"flush-interval":   {"0s", "-1s"},
		"decoders":         {"0", "-1", "100000"},
		"encoders":         {"0", "-3", "100000"},
		"zstd-level":       {"0", "-1", "23", "1000"},
		"kl-coef":          {"NaN", "Inf", "-Inf", "1e308", "-1e7"},
		"kl-clip":          {"NaN", "-1", "Inf"},
		"kl-discount":      {"NaN", "-0.1", "1.5", "Inf"},
		"retry-for":        {"0s", "-1m"},
	}
	for flag, values := range hostile {
		for _, v := range values {
			args := []string{"ingest", "--from", in, "--to", filepath.Join(dir, "out"), "--quiet", "--" + flag + "=" + v}
			if strings.HasPrefix(flag, "kl-") && flag != "kl-coef" {
				args = append(args, "--kl-coef", "0.1")
			}
			var stderr bytes.Buffer
			code := run(context.Background(), args, io.Discard, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), flag) {
				t.Errorf("--%s=%s: exit %d, want %d naming the flag; stderr: %s", flag, v, code, exitUsage, e2eClip(stderr.String(), 300))
			}
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "out")); len(entries) > 0 {
		t.Errorf("a refused run wrote to the output: %d entries", len(entries))
	}
}

// TestGenFlagsRefused: gen's numbers are range-checked too, and --turns
// is A..B or N.
func TestGenFlagsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--turns", "0..3"}, {"--turns", "5..2"}, {"--turns", "x"}, {"--turns", "3..y"},
		{"--resets", "NaN"}, {"--resets", "2"}, {"--parallel-tools", "-1"}, {"--observation-len", "-1"},
		{"--groups", "0"}, {"--group-size", "-1"}, {"--max-steps", "0"}, {"--duplicates", "Inf"}, {"--vocab", "3"}, {"--tokens", "zipf"},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), append([]string{"gen", "--quiet", "--to", filepath.Join(t.TempDir(), "x.jsonl")}, args...), io.Discard, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), strings.TrimPrefix(args[0], "--")) {
			t.Errorf("gen %v: exit %d, want %d naming the flag; stderr: %s", args, code, exitUsage, e2eClip(stderr.String(), 300))
		}
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"gen", "--quiet", "--groups", "1", "--group-size", "1", "--turns", "3..3", "--seed", "2"}, &out, io.Discard); code != 0 {
		t.Fatalf("gen --turns 3..3: exit %d", code)
	}
	if steps := bytes.Count(out.Bytes(), []byte(`"type":"step"`)); steps != 3 {
		t.Fatalf("gen --turns 3..3 wrote %d steps for one trajectory, want 3", steps)
	}
}

// tcpProxy forwards 127.0.0.1:<port> to target until Close, which ends
// every connection: an outage of the service behind it, without touching
// the service.
type tcpProxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
	down  bool
}

func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.down {
				p.mu.Unlock()
				c.Close()
				u.Close()
				return
			}
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			go func() { io.Copy(u, c); u.Close() }()
			go func() { io.Copy(c, u); c.Close() }()
		}
	}()
	t.Cleanup(p.Close)
	return p
}

func (p *tcpProxy) addr() string { return p.l.Addr().String() }

// Close takes the proxy down: the port refuses connections from now on.
func (p *tcpProxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	p.l.Close()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// s3StepIDs counts the committed rows of an S3 output by step id, and the
// trajectories written.
func s3StepIDs(t *testing.T, st *s3.Store) (steps, trajs map[string]int) {
	t.Helper()
	ctx := context.Background()
	entries, err := st.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	steps, trajs = map[string]int{}, map[string]int{}
	for _, e := range entries {
		r, err := st.ReadShard(ctx, e, []string{"step_id", "trajectory_id"}, memory.DefaultAllocator)
		if err != nil {
			t.Fatal(err)
		}
		for {
			rec, err := r.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			s, tr := rec.Column(0).(*array.String), rec.Column(1).(*array.String)
			for i := range int(rec.NumRows()) {
				steps[s.Value(i)]++
				trajs[tr.Value(i)] = 1
			}
		}
		r.Close()
	}
	return steps, trajs
}

// TestIntegrationStopStdinDuringS3Outage: `ingest --from -` to S3 loses
// its store mid-run (a proxy to MinIO killed), then gets SIGTERM with the
// default --retry-for. It must end promptly (exit 3), write every record
// it read but could not commit to the spill file it names, and never
// count as written what was not committed. Ingesting the spill file then
// completes the output: every record exactly once.
func TestIntegrationStopStdinDuringS3Outage(t *testing.T) {
	tg := newS3Target(t, "stdin-outage")
	bin := e2eBinary(t)
	dir := t.TempDir()
	proxy := newTCPProxy(t, strings.TrimPrefix(tg.endpoint, "http://"))
	spill := filepath.Join(dir, "unwritten.jsonl")
	stats := filepath.Join(dir, "stats.json")
	records := stopRecords(400)

	cmd := exec.Command(bin, "ingest", "--from", "-", "--to", tg.url, "--s3-endpoint", "http://"+proxy.addr(),
		"--group-size", "4", "--min-group-size", "2", "--flush-interval", "300ms", "--spill", spill, "--stats-json", stats)
	cmd.Env = e2eEnv()
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	feed := func(rs [][]byte) {
		w := bufio.NewWriter(stdin)
		for _, r := range rs {
			w.Write(r)
			w.WriteByte('\n')
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	half := len(records) / 2
	feed(records[:half])
	time.Sleep(3 * time.Second) // some shards committed
	proxy.Close()
	feed(records[half:])
	time.Sleep(2 * time.Second) // read, and retrying its commits
	start := time.Now()
	terminateWithin(t, cmd, done, &stderr, 30*time.Second) // its exit code is checked below
	stdin.Close()
	t.Logf("stopped %s after SIGTERM", time.Since(start))
	if code := cmd.ProcessState.ExitCode(); code != exitStopped {
		t.Fatalf("exit %d, want %d\n%s", code, exitStopped, e2eClip(stderr.String(), 3000))
	}
	out := stderr.String()
	if !strings.Contains(out, spill) || strings.Contains(out, "every record read was written") || strings.Contains(out, "run again to resume") {
		t.Errorf("the output does not name the spill file, or claims what is false:\n%s", e2eClip(out, 3000))
	}
	var st ingestStats
	data, err := os.ReadFile(stats)
	if err != nil || json.Unmarshal(data, &st) != nil {
		t.Fatalf("stats: %s %v", data, err)
	}
	if st.Drained || st.Spilled == 0 || st.SpillFile != spill {
		t.Errorf("stats: drained %v, spilled %d in %q; want not drained, records spilled to %s", st.Drained, st.Spilled, st.SpillFile, spill)
	}
	steps, _ := s3StepIDs(t, tg.open(t, "check"))
	var rows int64
	for _, n := range steps {
		rows += int64(n)
	}
	if rows != st.Rows {
		t.Errorf("stats say %d rows committed, the store has %d", st.Rows, rows)
	}
	if m := regexp.MustCompile(`written:\s+(\d+) steps`).FindStringSubmatch(out); m == nil || m[1] != strconv.FormatInt(rows, 10) {
		t.Errorf("the summary's written steps %v, want the %d committed\n%s", m, rows, e2eClip(out, 3000))
	}
	if spilled, _ := os.ReadFile(spill); int64(bytes.Count(spilled, []byte("\n"))) != st.Spilled {
		t.Errorf("spill file has %d lines, stats say %d", bytes.Count(spilled, []byte("\n")), st.Spilled)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*spool*")); len(left) > 0 {
		t.Errorf("spool segments left behind: %v", left)
	}

	// The spill file completes the output.
	ingestWithStats(t, bin, dir, nil, "--from", spill, "--to", tg.url, "--s3-endpoint", tg.endpoint, "--group-size", "4", "--min-group-size", "2")
	steps, trajs := s3StepIDs(t, tg.open(t, "check2"))
	for _, r := range records {
		var raw map[string]any
		_ = json.Unmarshal(r, &raw)
		if raw["type"] == "step" {
			if n := steps[raw["step_id"].(string)]; n != 1 {
				t.Fatalf("step %s written %d times after ingesting the spill file, want 1", raw["step_id"], n)
			}
		} else if trajs[raw["trajectory_id"].(string)] != 1 {
			t.Fatalf("trajectory %s not written after ingesting the spill file", raw["trajectory_id"])
		}
	}
}

// TestBurstOfVersionsDefaultFlags is the input: 5,000 distinct
// policy versions in about 1.5 MiB, ingested with the default flags (and
// with two encoders, as on a two-core machine, where MaxOpenShards is 8,
// below the default --max-partitions): a few shards and folders, not one
// per version.
func TestBurstOfVersionsDefaultFlags(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	var b bytes.Buffer
	for v := range 5000 {
		fmt.Fprintf(&b, `{"type":"step","step_id":"s%d","task_id":"t%d","trajectory_id":"tr%d","step_index":0,"policy_version":%d,"prompt_ids":[1,2,3],"response_ids":[4,5],"response_logprobs":[-0.5,-0.25]}`+"\n", v, v, v, v)
		fmt.Fprintf(&b, `{"type":"trajectory","trajectory_id":"tr%d","task_id":"t%d","reward":%d,"num_steps":1,"group_size":1}`+"\n", v, v, v%2)
	}
	if err := os.WriteFile(in, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, extra := range map[string][]string{"defaults": nil, "encoders-2": {"--encoders", "2"}} {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			var stderr bytes.Buffer
			if code := run(context.Background(), append([]string{"ingest", "--from", in, "--to", out, "--quiet"}, extra...), io.Discard, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			entries, err := local.ReadManifest(out)
			if err != nil {
				t.Fatal(err)
			}
			var shards, rows int64
			for _, e := range entries {
				if e.Path != "" {
					shards++
					rows += e.Rows
				}
			}
			folders, _ := filepath.Glob(filepath.Join(out, schemas.PartitionKey+"=*"))
			if rows != 5000 || shards > 32 || len(folders) > 16 {
				t.Fatalf("%d rows in %d shards and %d partition folders for 5,000 versions; want 5000 rows, at most 32 shards and 16 folders", rows, shards, len(folders))
			}
		})
	}
}

// TestReadersStopDuringS3Outage: export, consume and serve over an S3 store that
// is unreachable end on the first signal, not after --retry-for.
func TestReadersStopDuringS3Outage(t *testing.T) {
	bin := e2eBinary(t)
	dir := t.TempDir()
	env := append(e2eEnv(), "AWS_ENDPOINT_URL=http://"+closedPort(t), "AWS_ACCESS_KEY_ID=k", "AWS_SECRET_ACCESS_KEY=secret-key-value")
	for name, args := range map[string][]string{
		"export sft":     {"export", "sft", "--from", "s3://bucket/run", "--to", filepath.Join(dir, "sft.jsonl")},
		"export distill": {"export", "distill", "--from", "s3://bucket/run", "--to", filepath.Join(dir, "d.parquet")},
		"consume":        {"consume", "--from", "s3://bucket/run", "--to", filepath.Join(dir, "c.jsonl")},
		"serve":          {"serve", "--from", "s3://bucket/run", "--listen", "127.0.0.1:0"},
	} {
		t.Run(name, func(t *testing.T) {
			if code, stderr := signalWhileRetrying(t, bin, env, args...); code == 0 {
				t.Errorf("exit 0 with the store unreachable\n%s", e2eClip(stderr, 2000))
			}
		})
	}
}

// TestMoreNumericFlagsRefused: consume's, serve's, produce's and
// ingest's remaining numbers are range-checked too (they were replaced by
// the defaults, or consume --max-batches -1 consumed nothing and exited
// 0).
func TestMoreNumericFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.jsonl")
	if err := os.WriteFile(in, append(bytes.Join(stopRecords(2), []byte("\n")), '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	st := filepath.Join(dir, "st")
	for _, c := range []struct {
		flag string
		args []string
	}{
		{"max-batches", []string{"consume", "--from", st, "--max-batches", "-1"}},
		{"max-tokens", []string{"consume", "--from", st, "--max-tokens", "-5"}},
		{"max-inflight", []string{"consume", "--from", st, "--max-inflight", "0"}},
		{"max-inflight", []string{"consume", "--from", st, "--max-inflight", "-3"}},
		{"lease-timeout", []string{"consume", "--from", st, "--lease-timeout", "-1s"}},
		{"poll", []string{"consume", "--from", st, "--poll", "0s"}},
		{"max-version-lead", []string{"consume", "--from", st, "--max-version-lead", "-7"}},
		{"group-multiple", []string{"consume", "--from", st, "--batch-groups", "6", "--group-multiple", "4"}},
		{"group-multiple", []string{"consume", "--from", st, "--group-multiple", "-1"}},
		{"batch-groups", []string{"serve", "--from", st, "--listen", "127.0.0.1:0", "--batch-groups", "-2"}},
		{"max-tokens", []string{"serve", "--from", st, "--listen", "127.0.0.1:0", "--max-tokens", "-5"}},
		{"poll", []string{"serve", "--from", st, "--listen", "127.0.0.1:0", "--poll", "-1s"}},
		{"max-streams-per-host", []string{"serve", "--from", st, "--listen", "127.0.0.1:0", "--max-streams-per-host", "0"}},
		{"batch", []string{"produce", "--to", "kafka://127.0.0.1:1/t", "--batch", "0", in}},
		{"partitions", []string{"produce", "--to", "kafka://127.0.0.1:1/t", "--kafka-partitions", "-4", in}},
		{"memory-limit", []string{"ingest", "--from", in, "--to", st, "--memory-limit", "1B"}},
		{"memory-limit", []string{"ingest", "--from", in, "--to", st, "--memory-limit", "9999999999GiB"}},
		{"poll", []string{"ui", "--from", st, "--listen", "127.0.0.1:0", "--poll", "0s"}},
	} {
		var stderr bytes.Buffer
		code := run(context.Background(), c.args, io.Discard, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), c.flag) {
			t.Errorf("%v: exit %d, want %d naming --%s; stderr: %s", c.args, code, exitUsage, c.flag, e2eClip(stderr.String(), 300))
		}
	}
}

// signalWhileRetrying starts bin with args, sends SIGTERM once it is
// retrying an unreachable store (1.5 s in), and returns its exit code and
// stderr; the run fails t if the process goes on for 20 s after the
// signal, and errs if it took more than 10 s to stop.
func signalWhileRetrying(t *testing.T, bin string, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // retrying by now
	start := time.Now()
	terminateWithin(t, cmd, waitChan(cmd), &stderr, 20*time.Second) // the exit code is the caller's
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("stopped %s after the signal", took)
	}
	return cmd.ProcessState.ExitCode(), stderr.String()
}
