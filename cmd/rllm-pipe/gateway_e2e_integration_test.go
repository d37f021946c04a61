package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/ingest/gateway/gatewaytest"
)

// gwCall is one agent call as the agent made it: which session, in which
// order, answered from which fixture, under which weight version.
type gwCall struct {
	session string
	index   int
	fixture string
	version int64
}

// gwFixtures are the trainable fixtures the agents draw their calls from
// (streaming and not, chat and completions, tools, reasoning, n=2).
var gwFixtures = []string{
	"vllm_chat", "vllm_chat_stream", "vllm_chat_tools", "vllm_chat_tools_stream",
	"vllm_chat_reasoning", "vllm_chat_reasoning_stream", "vllm_completions", "vllm_completions_stream", "vllm_chat_n2",
}

// TestIntegrationGatewayKafkaS3Consume runs the capture path end to end
// with real processes and services: many concurrent agents (Go HTTP
// clients, streaming and not, several calls per session, rewards posted
// with finish, a weight-version change between two phases) → `rllm-pipe
// gateway --to kafka://` in front of the Go stub backend → `rllm-pipe
// ingest` from Kafka into MinIO → `rllm-pipe consume`; every call the
// agents made is delivered exactly once, equal call by call to what the
// stub returned for it, with the version in force when it was dispatched.
func TestIntegrationGatewayKafkaS3Consume(t *testing.T) {
	brokers, endpoint := integrationEnv(t)
	bin := e2eBinary(t)
	if out, err := exec.Command(bin, "gateway", "--help").CombinedOutput(); err != nil {
		t.Skipf("this rllm-pipe has no gateway command yet: %v\n%s", err, out)
	}
	fixtures, err := gatewaytest.Load(filepath.Join(e2eModuleRoot(t), "ingest", "gateway", "testdata"))
	if err != nil {
		t.Fatal(err)
	}
	backend := gatewaytest.NewBackend(fixtures)
	stub := httptest.NewServer(backend)
	defer stub.Close()

	work := t.TempDir()
	id := benchID()
	topic, prefix := "gateway-"+id, "gateway-"+id
	ready := filepath.Join(work, "ready")
	gw := exec.Command(bin, "gateway", "--listen", "127.0.0.1:0", "--upstream", stub.URL,
		"--to", "kafka://"+brokers+"/"+topic, "--group-size", "4", "--ready-file", ready)
	gw.Env = serviceEnv()
	var gwErr syncBuffer
	gw.Stderr = &gwErr
	if err := gw.Start(); err != nil {
		t.Fatal(err)
	}
	gwDone := make(chan error, 1)
	go func() { gwDone <- gw.Wait() }()
	defer func() {
		if gw.ProcessState == nil {
			gw.Process.Kill()
			<-gwDone
		}
	}()
	base := "http://" + gwWaitReady(t, ready, gwDone, &gwErr)

	const tasks, rollouts, perPhase = 12, 4, 2
	client := &http.Client{Timeout: 60 * time.Second}
	var (
		mu    sync.Mutex
		calls []gwCall
	)
	rewards := map[string]float64{}
	// Two phases of calls in every session; between them, the weight
	// version goes from 0 to 7 (no call in flight: the version at dispatch
	// is known for every call).
	runPhase := func(phase int, version int64) {
		var wg sync.WaitGroup
		errs := make(chan error, tasks*rollouts)
		for k := range tasks {
			for r := range rollouts {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sid := fmt.Sprintf("gw-task-%d:%d", k, r)
					for j := range perPhase {
						idx := phase*perPhase + j
						name := gwFixtures[(k*7+r*3+idx)%len(gwFixtures)]
						if err := gwAgentCall(client, base, sid, fixtures[name]); err != nil {
							errs <- fmt.Errorf("%s call %d (%s): %w", sid, idx, name, err)
							return
						}
						mu.Lock()
						calls = append(calls, gwCall{session: sid, index: idx, fixture: name, version: version})
						mu.Unlock()
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	runPhase(0, 0)
	gwPost(t, client, base+"/admin/weight_version", `{"weight_version":7}`)
	runPhase(1, 7)
	for k := range tasks {
		for r := range rollouts {
			sid := fmt.Sprintf("gw-task-%d:%d", k, r)
			rewards[sid] = float64(r) / 2
			gwPost(t, client, base+"/sessions/"+sid+"/finish", fmt.Sprintf(`{"reward":%g,"is_correct":%t,"termination_reason":"env_done"}`, rewards[sid], r > 1))
		}
	}
	if got, want := backend.Calls(), int64(len(calls)); got != want {
		t.Fatalf("the stub served %d calls, the agents made %d", got, want)
	}
	if err := terminate(t, gw, gwDone, &gwErr); err != nil {
		t.Fatalf("gateway: %v\n%s", err, gwErr.String())
	}

	// Kafka → MinIO: every record (a step per call, a trajectory per
	// session) settled, then a graceful stop.
	records := int64(len(calls) + tasks*rollouts)
	cfg, err := s3.ParseURL("s3://rllm-pipe-test/" + prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = endpoint
	cleanupS3(t, cfg)
	ing := exec.Command(bin, "ingest", "--from", "kafka://"+brokers+"/"+topic+"?group=g-"+id,
		"--to", "s3://rllm-pipe-test/"+prefix, "--group-size", "4", "--flush-interval", "300ms", "--quiet")
	ing.Env = serviceEnv()
	var ingErr syncBuffer
	ing.Stderr = &ingErr
	if err := ing.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for settledCount(t, cfg) < records {
		if time.Now().After(deadline) {
			ing.Process.Kill()
			ing.Wait()
			t.Fatalf("%d of %d records settled after 3 minutes\n%s", settledCount(t, cfg), records, ingErr.String())
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err := terminate(t, ing, waitChan(ing), &ingErr); err != nil {
		t.Fatalf("ingest: %v\n%s", err, ingErr.String())
	}

	// consume: every committed group once, as Arrow.
	arrowOut := filepath.Join(work, "batches.arrow")
	cons := exec.Command(bin, "consume", "--from", "s3://rllm-pipe-test/"+prefix, "--consumer-group", "c-"+id,
		"--format", "arrow", "--to", arrowOut)
	cons.Env = serviceEnv()
	var consOut bytes.Buffer
	cons.Stdout, cons.Stderr = &consOut, &consOut
	if err := cons.Start(); err != nil {
		t.Fatal(err)
	}
	disarm := watchdog(cons, 3*time.Minute)
	err = cons.Wait()
	disarm()
	if err != nil {
		t.Fatalf("consume: %v\n%s", err, consOut.String())
	}
	rows := gwReadRows(t, arrowOut)

	// Trajectory ids are {session_id}@{incarnation}: calls are found by
	// session and step index.
	byID, seen := map[string]gwRow{}, map[string]bool{}
	for _, r := range rows {
		if seen[r.stepID] {
			t.Fatalf("step %s delivered twice", r.stepID)
		}
		seen[r.stepID] = true
		sid := r.trajectoryID[:max(0, strings.LastIndexByte(r.trajectoryID, '@'))]
		byID[fmt.Sprintf("%s#%d", sid, r.stepIndex)] = r
	}
	if len(rows) != len(calls) {
		t.Errorf("%d rows delivered for %d calls", len(rows), len(calls))
	}
	for _, c := range calls {
		sid := c.session
		r, ok := byID[fmt.Sprintf("%s#%d", sid, c.index)]
		if !ok {
			t.Errorf("%s call %d (%s): not delivered", sid, c.index, c.fixture)
			continue
		}
		want := fixtures[c.fixture].Expect
		task, _, _ := strings.Cut(sid, ":")
		switch {
		case !strings.HasPrefix(r.trajectoryID, sid+"@") || r.stepID != fmt.Sprintf("%s#%d", r.trajectoryID, c.index) || r.taskID != task || r.stepIndex != c.index:
			t.Errorf("%s call %d: row is trajectory %q task %q step %d", sid, c.index, r.trajectoryID, r.taskID, r.stepIndex)
		case r.policyVersion != c.version:
			t.Errorf("%s call %d: policy_version %d, dispatched under %d", sid, c.index, r.policyVersion, c.version)
		case !slices.Equal(r.promptIDs, want.PromptIDs):
			t.Errorf("%s call %d (%s): prompt_ids %v, the stub returned %v", sid, c.index, c.fixture, r.promptIDs, want.PromptIDs)
		case !slices.Equal(r.responseIDs, want.ResponseIDs):
			t.Errorf("%s call %d (%s): response_ids %v, the stub returned %v", sid, c.index, c.fixture, r.responseIDs, want.ResponseIDs)
		case !gwSameLogprobs(r.logprobs, want.ResponseLogprobs):
			t.Errorf("%s call %d (%s): response_logprobs %v, the stub returned %v", sid, c.index, c.fixture, r.logprobs, want.ResponseLogprobs)
		case r.finishReason != want.FinishReason:
			t.Errorf("%s call %d (%s): finish_reason %q, the stub returned %q", sid, c.index, c.fixture, r.finishReason, want.FinishReason)
		case r.reward != rewards[sid]:
			t.Errorf("%s call %d: reward %g, posted %g", sid, c.index, r.reward, rewards[sid])
		}
	}
	if !t.Failed() {
		t.Logf("%d sessions, %d calls: each delivered once, equal to the stub's answer", tasks*rollouts, len(calls))
	}
}

// gwWaitReady waits for the gateway's ready file (its bound address).
func gwWaitReady(t *testing.T, path string, done <-chan error, stderr *syncBuffer) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && len(bytes.TrimSpace(b)) > 0 {
			return string(bytes.TrimSpace(b))
		}
		select {
		case err := <-done:
			t.Fatalf("gateway exited before listening: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway did not listen in 30s\n%s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func gwPost(t *testing.T, c *http.Client, url, body string) {
	t.Helper()
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d %s", url, resp.StatusCode, b)
	}
}

// gwAgentCall makes one call as an agent would: the fixture's request
// (stream as the fixture is) to the session's base URL, reading the whole
// answer, SSE event by event when streamed.
func gwAgentCall(c *http.Client, base, session string, f *gatewaytest.Fixture) error {
	var req map[string]any
	if err := json.Unmarshal(f.Request, &req); err != nil {
		return err
	}
	delete(req, "logprobs") // the gateway adds what it needs
	delete(req, "return_token_ids")
	req["stream"] = f.Streaming()
	body, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/sessions/"+session+f.Path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("X-Fixture", f.Name)
	resp, err := c.Do(hr)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if !f.Streaming() {
		var out struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			return err
		}
		if len(out.Choices) == 0 {
			return fmt.Errorf("no choices")
		}
		return nil
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var events int
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events++
			if data == "[DONE]" {
				if events != len(f.SSEData) {
					return fmt.Errorf("%d SSE events, the stub sent %d", events, len(f.SSEData))
				}
				return nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return fmt.Errorf("stream ended without [DONE] after %d events", events)
}

// gwRow is what the test checks of one delivered step.
type gwRow struct {
	stepID, trajectoryID, taskID, finishReason string
	stepIndex                                  int
	policyVersion                              int64
	promptIDs, responseIDs                     []int64
	logprobs                                   []float32
	reward                                     float64
}

// gwReadRows reads consume's Arrow IPC stream, rebuilding prompts stored
// as a delta from their predecessor (schemas.ColPromptPrefixLen).
func gwReadRows(t *testing.T, path string) []gwRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rd, err := ipc.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Release()
	var rows []gwRow
	type prefixed struct {
		row   int
		delta []int64
	}
	var deltas []prefixed
	for rd.Next() {
		rec := rd.RecordBatch()
		col := func(name string) arrow.Array {
			idx := rec.Schema().FieldIndices(name)
			if len(idx) == 0 {
				t.Fatalf("consume's batches have no %s column", name)
			}
			return rec.Column(idx[0])
		}
		str := func(name string, i int) string {
			a := col(name).(*array.String)
			if a.IsNull(i) {
				return ""
			}
			return a.Value(i)
		}
		ints := func(name string, i int) []int64 {
			l := col(name).(*array.List)
			if l.IsNull(i) {
				return nil
			}
			vals := l.ListValues().(*array.Int32)
			lo, hi := l.ValueOffsets(i)
			out := make([]int64, 0, hi-lo)
			for j := lo; j < hi; j++ {
				out = append(out, int64(vals.Value(int(j))))
			}
			return out
		}
		for i := 0; i < int(rec.NumRows()); i++ {
			l := col("response_logprobs").(*array.List)
			vals := l.ListValues().(*array.Float32)
			lo, hi := l.ValueOffsets(i)
			r := gwRow{
				stepID: str("step_id", i), trajectoryID: str("trajectory_id", i), taskID: str("task_id", i),
				finishReason:  str("finish_reason", i),
				stepIndex:     int(col("step_index").(*array.Int32).Value(i)),
				policyVersion: col("policy_version").(*array.Int64).Value(i),
				promptIDs:     ints("prompt_ids", i), responseIDs: ints("response_ids", i),
				logprobs: slices.Clone(vals.Float32Values()[lo:hi]),
				reward:   col("reward").(*array.Float64).Value(i),
			}
			if col("prompt_prefix_len").(*array.Int32).Value(i) > 0 {
				deltas = append(deltas, prefixed{len(rows), ints("prompt_delta_ids", i)})
			}
			rows = append(rows, r)
		}
	}
	if err := rd.Err(); err != nil {
		t.Fatal(err)
	}
	// A delta's predecessor is the same trajectory's previous step (whole
	// once the steps before it are).
	slices.SortFunc(deltas, func(a, b prefixed) int { return rows[a.row].stepIndex - rows[b.row].stepIndex })
	at := map[string]int{}
	for i, r := range rows {
		at[fmt.Sprintf("%s#%d", r.trajectoryID, r.stepIndex)] = i
	}
	for _, d := range deltas {
		r := &rows[d.row]
		p, ok := at[fmt.Sprintf("%s#%d", r.trajectoryID, r.stepIndex-1)]
		if !ok || rows[p].promptIDs == nil {
			t.Fatalf("step %s: prompt stored as a delta of a step not delivered before it", r.stepID)
		}
		r.promptIDs = slices.Concat(rows[p].promptIDs, rows[p].responseIDs, d.delta)
	}
	return rows
}

// gwSameLogprobs compares stored float32 logprobs with the stub's.
func gwSameLogprobs(got []float32, want []float64) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if math.Abs(float64(got[i])-want[i]) > 1e-6 {
			return false
		}
	}
	return true
}
