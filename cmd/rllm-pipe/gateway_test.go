package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
	"github.com/rllm-pipe/rllm-pipe/ingest/gateway/gatewaytest"
)

// TestGatewayBorrowsIngestFlags: every pipeline flag the gateway takes from
// ingest exists there with the type ingestOptsFrom reads.
func TestGatewayBorrowsIngestFlags(t *testing.T) {
	o, err := ingestOptsFrom(newIngestCmd(context.Background()).Flags())
	if err != nil {
		t.Fatal(err)
	}
	if o.groupSize != 8 || o.estimator != "grpo" || o.shardSize != "256MiB" || o.flushInterval != 30*time.Second {
		t.Fatalf("ingest's defaults not read back: %+v", o)
	}
	cmd := newGatewayCmd(context.Background())
	for _, name := range pipelineFlags {
		if cmd.Flags().Lookup(name) == nil {
			t.Errorf("gateway has no --%s", name)
		}
	}
	// Set on the gateway's command line, each reaches the pipeline.
	if err := cmd.Flags().Parse([]string{"--full-prompts", "--shard-size", "1MiB", "--compact", "--group-size", "3"}); err != nil {
		t.Fatal(err)
	}
	o, err = ingestOptsFrom(cmd.Flags())
	if err != nil {
		t.Fatal(err)
	}
	if !o.fullPrompts || o.shardSize != "1MiB" || !o.compact || o.groupSize != 3 {
		t.Fatalf("gateway flags not read back: %+v", o)
	}
}

func TestGatewayUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
	}{
		"no upstream":                {args: []string{"--to", dir}},
		"no to":                      {args: []string{"--upstream", "http://127.0.0.1:1"}},
		"beyond loopback, no tokens": {args: []string{"--listen", "0.0.0.0:0", "--upstream", "http://127.0.0.1:1", "--to", filepath.Join(dir, "a.jsonl")}},
		"beyond loopback, agent token only": {
			args: []string{"--listen", "0.0.0.0:0", "--upstream", "http://127.0.0.1:1", "--to", filepath.Join(dir, "b.jsonl")},
			env:  map[string]string{"RLLM_PIPE_GATEWAY_AGENT_TOKEN": "secret-agent"},
		},
		"beyond loopback, short tokens": {
			args: []string{"--listen", "0.0.0.0:0", "--upstream", "http://127.0.0.1:1", "--to", filepath.Join(dir, "c.jsonl")},
			env:  map[string]string{"RLLM_PIPE_GATEWAY_AGENT_TOKEN": "secret-agent", "RLLM_PIPE_GATEWAY_ADMIN_TOKEN": "secret-admin-token-0123456789"},
		},
		"beyond loopback, one token for both": {
			args: []string{"--listen", "0.0.0.0:0", "--upstream", "http://127.0.0.1:1", "--to", filepath.Join(dir, "d.jsonl")},
			env:  map[string]string{"RLLM_PIPE_GATEWAY_AGENT_TOKEN": "secret-agent-0123456789", "RLLM_PIPE_GATEWAY_ADMIN_TOKEN": "secret-agent-0123456789"},
		},
		"bad size":           {args: []string{"--upstream", "http://127.0.0.1:1", "--to", dir, "--max-buffered-bytes", "lots"}},
		"missing token file": {args: []string{"--upstream", "http://127.0.0.1:1", "--to", dir, "--agent-token-file", filepath.Join(dir, "none")}},
		"upstream key unset": {args: []string{"--upstream", "http://127.0.0.1:1", "--to", dir, "--upstream-key-env", "RLLM_TEST_UPSTREAM_KEY_UNSET"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("RLLM_PIPE_GATEWAY_AGENT_TOKEN", "")
			t.Setenv("RLLM_PIPE_GATEWAY_ADMIN_TOKEN", "")
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			var stderr bytes.Buffer
			// A gateway that starts serving is stopped, and fails the test.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if code := run(ctx, append([]string{"gateway"}, tc.args...), io.Discard, &stderr); code != exitUsage {
				t.Fatalf("exit %d, want %d\n%s", code, exitUsage, stderr.String())
			}
			if strings.Contains(stderr.String(), "secret-agent") {
				t.Fatal("a token in the output")
			}
		})
	}
}

// The workers' API key comes from the environment variable named by
// --upstream-key-env, trimmed.
func TestGatewayUpstreamKeyEnv(t *testing.T) {
	t.Setenv("RLLM_TEST_UPSTREAM_KEY", " sk-upstream\n")
	o := gatewayOpts{upstream: "http://127.0.0.1:1", maxRequest: "1MiB", maxRequestBodies: "16MiB", maxBuffered: "16MiB", maxTraceBytes: "16MiB",
		shutdownTimeout: time.Second, kafkaPartitions: 1, upstreamKeyEnv: "RLLM_TEST_UPSTREAM_KEY", trainerPoll: time.Second, group: "default"}
	c, err := o.config(ingestOpts{}, false)
	if err != nil {
		t.Fatal(err)
	}
	if c.UpstreamKey != "sk-upstream" {
		t.Fatalf("upstream key %q", c.UpstreamKey)
	}
}

// gatewayProc is a gateway started as a binary.
type gatewayProc struct {
	cmd    *exec.Cmd
	done   chan error
	stderr *syncBuffer
	base   string
}

func startGateway(t *testing.T, bin string, env []string, args ...string) *gatewayProc {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := exec.Command(bin, append([]string{"gateway", "--listen", "127.0.0.1:0", "--ready-file", ready}, args...)...)
	cmd.Env = env
	g := &gatewayProc{cmd: cmd, done: make(chan error, 1), stderr: &syncBuffer{}}
	cmd.Stderr = g.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { g.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
	})
	g.base = "http://" + gwWaitReady(t, ready, g.done, g.stderr)
	return g
}

// stop sends the first signal and waits for a clean exit.
func (g *gatewayProc) stop(t *testing.T) {
	t.Helper()
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-g.done:
		if err != nil {
			t.Fatalf("gateway: %v\n%s", err, g.stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("gateway did not stop\n%s", g.stderr.String())
	}
}

// kill ends the gateway with SIGKILL (a crash).
func (g *gatewayProc) kill() {
	g.cmd.Process.Kill()
	<-g.done
}

func TestGatewayShardRootBinary(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	gatewayShardRoot(t, e2eEnv(), []string{"--to", root}, func() store.Reader {
		r, err := local.OpenReader(root)
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}

func TestIntegrationGatewayShardRootS3(t *testing.T) {
	target := newS3Target(t, "gateway")
	args := append([]string{"--to", target.url, "--wal-dir", filepath.Join(t.TempDir(), "wal")}, target.flags()...)
	gatewayShardRoot(t, serviceEnv(), args, func() store.Reader { return target.open(t, "check") })
}

// gatewayShardRoot runs `rllm-pipe gateway --to ROOT` (the pipeline
// in-process) as a binary in front of the stub backend: sessions of three
// tasks through HTTP, streaming and not, rewards posted with finish, a
// stop, then the shards. A task whose second rollout comes only after a
// restart is committed then; sessions acknowledged before a SIGKILL are
// committed after the next start; nothing is committed twice.
func gatewayShardRoot(t *testing.T, env, to []string, reader func() store.Reader) {
	bin := e2eBinary(t)
	fixtures, stub := gwStub(t)
	args := append([]string{"--upstream", stub.URL, "--group-size", "2", "--flush-interval", "100ms", "--wal-file-bytes", "80KiB"}, to...)
	client := &http.Client{Timeout: time.Minute}
	session := func(base, sid string, calls int) {
		for j := range calls {
			name := []string{"vllm_chat", "vllm_chat_stream", "vllm_completions"}[j%3]
			if err := gwAgentCall(client, base, sid, fixtures[name]); err != nil {
				t.Fatalf("%s call %d (%s): %v", sid, j, name, err)
			}
		}
		gwPost(t, client, base+"/sessions/"+sid+"/finish", fmt.Sprintf(`{"reward":%d,"is_correct":true,"termination_reason":"env_done"}`, len(sid)%2))
	}
	check := func(want int, g *gatewayProc) {
		t.Helper()
		steps := storetest.StepCounts(t, reader())
		if len(steps) != want {
			t.Fatalf("%d steps committed, want %d\n%s", len(steps), want, g.stderr.String())
		}
		for id, n := range steps {
			if n != 1 {
				t.Errorf("step %s committed %d times", id, n)
			}
		}
	}

	g := startGateway(t, bin, env, args...)
	var wg sync.WaitGroup
	for k := range 3 {
		for r := range 2 {
			wg.Go(func() { session(g.base, fmt.Sprintf("task-%d:%d", k, r), 2+r) })
		}
	}
	wg.Wait()
	session(g.base, "late:0", 2) // its group's other rollout comes after the restart
	g.stop(t)
	check(15, g) // 3 tasks of 2+3 calls; late's group still open

	g = startGateway(t, bin, env, args...)
	session(g.base, "late:1", 3)
	session(g.base, "task-9:0", 1)
	session(g.base, "task-9:1", 1)
	g.kill() // every finish was answered: those records are durable
	g = startGateway(t, bin, env, args...)
	g.stop(t)
	check(15+2+3+2, g)
}

// TestGatewayRecordLogBinary: `--to PATH.jsonl` writes a record log that
// `rllm-pipe ingest --from` reads; ingesting it again after the gateway
// appended more commits each step once.
func TestGatewayRecordLogBinary(t *testing.T) {
	bin := e2eBinary(t)
	fixtures, stub := gwStub(t)
	work := t.TempDir()
	logPath, root := filepath.Join(work, "traces.jsonl"), filepath.Join(work, "data")
	client := &http.Client{Timeout: time.Minute}
	run := func(task string) {
		g := startGateway(t, bin, e2eEnv(), "--upstream", stub.URL, "--to", logPath, "--group-size", "2")
		for r := range 2 {
			sid := fmt.Sprintf("%s:%d", task, r)
			if err := gwAgentCall(client, g.base, sid, fixtures["vllm_chat"]); err != nil {
				t.Fatal(err)
			}
			gwPost(t, client, g.base+"/sessions/"+sid+"/finish", `{"reward":1}`)
		}
		g.stop(t)
		res := e2eRun(t, bin, work, "ingest", "--from", logPath, "--to", root, "--quiet")
		if res.code != 0 {
			t.Fatalf("ingest: exit %d\n%s", res.code, res.stderr)
		}
	}
	run("a")
	run("b")
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	steps := storetest.StepCounts(t, r)
	if len(steps) != 4 {
		t.Fatalf("%d steps committed, want 4: %v", len(steps), steps)
	}
	for id, n := range steps {
		if n != 1 {
			t.Errorf("step %s committed %d times", id, n)
		}
	}
}

// TestGatewayHelpRecordsToken: the help says what the gateway does
// (ingest/gateway's TestTokens): POST /records takes the agent token
// (workers that build their own records are agents too), not only the
// admin's.
func TestGatewayHelpRecordsToken(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), []string{"gateway", "--help"}, &out, io.Discard); code != 0 {
		t.Fatalf("gateway --help: exit %d", code)
	}
	help := strings.Join(strings.Fields(out.String()), " ")
	agent, admin, ok := strings.Cut(help, "--admin-token-file")
	if !ok {
		t.Fatalf("the help names no --admin-token-file:\n%s", out.String())
	}
	_, agent, _ = strings.Cut(agent, "--agent-token-file")
	admin, _, _ = strings.Cut(admin, ")")
	if !strings.Contains(agent, "/records") || strings.Contains(admin, "/records") {
		t.Errorf("the help puts POST /records under the admin token; the gateway takes the agent's:\nagent: %s\nadmin: %s", agent, admin)
	}
}

// TestGatewayRejectedStepClosesItsGroup: a session whose call had a null
// logprob cannot be trained on; its finish says so, and its group is
// committed as soon as the other rollout is in, not at --group-timeout
// (10 minutes by default). The failed trajectory and its steps are dead
// letters, rejected_step.
func TestGatewayRejectedStepClosesItsGroup(t *testing.T) {
	t.Parallel()
	bin := e2eBinary(t)
	fixtures, stub := gwStub(t)
	root := filepath.Join(t.TempDir(), "data")
	g := startGateway(t, bin, e2eEnv(), "--upstream", stub.URL, "--to", root, "--group-size", "3", "--min-group-size", "1", "--flush-interval", "100ms")
	client := &http.Client{Timeout: time.Minute}
	for r, calls := range [][]string{{"vllm_chat", "vllm_chat"}, {"vllm_chat", "vllm_chat_null_logprob"}, {"vllm_chat_stream"}} {
		sid := fmt.Sprintf("task-0:%d", r)
		for _, name := range calls {
			if err := gwAgentCall(client, g.base, sid, fixtures[name]); err != nil {
				t.Fatalf("%s %s: %v", sid, name, err)
			}
		}
		gwPost(t, client, g.base+"/sessions/"+sid+"/finish", `{"reward":1}`)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := local.OpenReader(root)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(storetest.StepCounts(t, r)); n == 3 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d steps committed after 30 s, want 3 (the group of the two complete rollouts)\n%s", n, g.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	g.stop(t)
	dlq, err := filepath.Glob(filepath.Join(root, "_dlq", "*.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]int{}
	for _, f := range dlq {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
			var e struct{ Reason string }
			if len(l) > 0 && json.Unmarshal(l, &e) == nil {
				reasons[e.Reason]++
			}
		}
	}
	// The null-logprob step (wrong_type at decode), the session's other
	// step and its trajectory (rejected_step).
	if reasons["wrong_type"] != 1 || reasons["rejected_step"] != 2 || len(reasons) != 2 {
		t.Errorf("dead letters by reason %v, want wrong_type 1, rejected_step 2", reasons)
	}
}

// gwStub loads the gateway fixtures and serves them from a stub backend
// (closed when the test ends).
func gwStub(t *testing.T) (map[string]*gatewaytest.Fixture, *httptest.Server) {
	t.Helper()
	fixtures, err := gatewaytest.Load(filepath.Join(e2eModuleRoot(t), "ingest", "gateway", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	stub := httptest.NewServer(gatewaytest.NewBackend(fixtures))
	t.Cleanup(stub.Close)
	return fixtures, stub
}

// gwWeightVersion is the gateway's weight version (GET /admin/weight_version).
func gwWeightVersion(t *testing.T, c *http.Client, base string) int64 {
	t.Helper()
	var v struct {
		WeightVersion int64 `json:"weight_version"`
	}
	resp, err := c.Get(base + "/admin/weight_version")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v.WeightVersion
}
