package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest/gateway/gatewaytest"
	"github.com/rllm-pipe/rllm-pipe/schemas/bearer/bearertest"
)

const chatBody = `{"model":"Qwen/Qwen2.5-7B-Instruct","messages":[{"role":"user","content":"What is 6*7?"}]}`

func TestSplitSessionPath(t *testing.T) {
	for _, tc := range []struct {
		in, sid, tail string
		ok            bool
	}{
		{"abc/v1/chat/completions", "abc", "/v1/chat/completions", true},
		{"t42:3/v1/completions", "t42:3", "/v1/completions", true},
		{"harbor/hello-world:0/v1/chat/completions", "harbor/hello-world:0", "/v1/chat/completions", true},
		{"a/v1", "a", "/v1", true},
		{"a/v1/v1/models", "a", "/v1/v1/models", true},
		{"a/v10/v1/models", "a/v10", "/v1/models", true},
		{"x:1/generate", "x:1", "/generate", true},
		{"abc/traces", "", "", false},
		{"abc", "", "", false},
		{"/v1/models", "", "", false},
	} {
		sid, tail, ok := splitSessionPath(tc.in)
		if sid != tc.sid || tail != tc.tail || ok != tc.ok {
			t.Errorf("%q: got (%q, %q, %v), want (%q, %q, %v)", tc.in, sid, tail, ok, tc.sid, tc.tail, tc.ok)
		}
	}
}

// The agent did not ask for logprobs or token ids: the upstream gets them
// forced on, the agent gets logprobs back as null (as vLLM would answer
// it) and no token ids, the record has them.
func TestRewriteAndStrip(t *testing.T) {
	e := newEnv(t, nil)
	for _, stream := range []bool{false, true} {
		body := chatBody
		if stream {
			body = strings.Replace(body, `{"model"`, `{"stream":true,"model"`, 1)
		}
		code, b := e.do("POST", "/sessions/strip:0/v1/chat/completions", body)
		if code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		reqs := e.backend.Requests()
		var up map[string]any
		_ = json.Unmarshal(reqs[len(reqs)-1].Body, &up)
		if up["logprobs"] != true || up["return_token_ids"] != true {
			t.Fatalf("upstream request not rewritten: %s", reqs[len(reqs)-1].Body)
		}
		payloads := []string{string(b)}
		if stream {
			payloads = sseData(t, strings.NewReader(string(b)))
			payloads = payloads[:len(payloads)-1]
		}
		for _, p := range payloads {
			var r struct {
				PromptTokenIDs any `json:"prompt_token_ids"`
				Choices        []map[string]any
			}
			if err := json.Unmarshal([]byte(p), &r); err != nil {
				t.Fatalf("agent got bad JSON: %s", p)
			}
			if r.PromptTokenIDs != nil {
				t.Fatalf("prompt_token_ids not stripped: %s", p)
			}
			for _, c := range r.Choices {
				if c["token_ids"] != nil || c["logprobs"] != nil {
					t.Fatalf("token_ids/logprobs not stripped: %s", p)
				}
			}
		}
	}
	e.finish("strip:0", 0)
	st := steps(decodeAll(t, e.out.records()))
	if len(st) != 2 {
		t.Fatalf("%d steps", len(st))
	}
	for i, s := range st {
		if s.reason != "" || len(s.rec.Step.ResponseIDs) == 0 || len(s.rec.Step.ResponseLogprobs) != len(s.rec.Step.ResponseIDs) {
			t.Fatalf("step %d: reason %q ids %d", i, s.reason, len(s.rec.Step.ResponseIDs))
		}
	}
}

// A session's sampling params fill what the agent did not set; the agent's
// own values win (rLLM's default priority).
func TestSessionSamplingParams(t *testing.T) {
	e := newEnv(t, nil)
	e.mustJSON("POST", "/sessions", `{"session_id":"sp:0","sampling_params":{"temperature":0.6,"top_p":0.9}}`, 200, nil)
	e.mustJSON("POST", "/sessions/sp:0/v1/chat/completions", `{"model":"m","temperature":1.0,"messages":[]}`, 200, nil)
	reqs := e.backend.Requests()
	var up map[string]any
	_ = json.Unmarshal(reqs[len(reqs)-1].Body, &up)
	if up["temperature"] != 1.0 || up["top_p"] != 0.9 {
		t.Fatalf("upstream got %s", reqs[len(reqs)-1].Body)
	}
}

// The agent receives the first event while the stub still holds the last.
func TestStreamChunkByChunk(t *testing.T) {
	e := newEnv(t, nil)
	first, release := e.backend.HoldLast()
	resp := e.req("POST", "/sessions/ttft:0/v1/chat/completions", `{"stream":true,"messages":[]}`)
	defer resp.Body.Close()
	<-first
	br := bufio.NewReader(resp.Body)
	got := make(chan string, 1)
	go func() {
		line, _ := br.ReadString('\n')
		got <- line
	}()
	select {
	case line := <-got:
		if !strings.HasPrefix(line, "data: {") {
			t.Fatalf("first line %q", line)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the first event did not reach the agent while the upstream held the last")
	}
	close(release)
	rest, _ := io.ReadAll(br)
	if !strings.Contains(string(rest), "data: [DONE]") {
		t.Fatalf("stream did not end with [DONE]")
	}
}

// An agent that goes away mid-stream leaves a step marked as cut off.
func TestClientDisconnectMidStream(t *testing.T) {
	e := newEnv(t, nil)
	e.backend.SetChunkDelay(50 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/sessions/gone:0/v1/chat/completions", strings.NewReader(`{"stream":true,"messages":[]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for range 6 { // three events: the role, two tokens
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	waitFor(t, func() bool { return len(e.out.records()) == 1 })
	e.finish("gone:0", 0)
	st := steps(decodeAll(t, e.out.records()))
	meta := st[0].raw["metadata"].(map[string]any)
	if st[0].raw["finish_reason"] != "abort" || meta["cut_off"] != "client_disconnect" {
		t.Fatalf("step %s", mustJSON(st[0].raw))
	}
	if st[0].reason != "" {
		t.Fatalf("a consistent cut-off step is rejected: %s: %s", st[0].reason, mustJSON(st[0].raw))
	}
	if n := len(st[0].rec.Step.ResponseIDs); n == 0 || n >= 9 {
		t.Fatalf("cut-off step has %d response ids, want a part of 9", n)
	}
}

func TestUpstreamCutMidStream(t *testing.T) {
	e := newEnv(t, nil)
	e.backend.CutNextStream(4)
	resp := e.req("POST", "/sessions/cut:0/v1/chat/completions", `{"stream":true,"messages":[]}`)
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	e.finish("cut:0", 0)
	st := steps(decodeAll(t, e.out.records()))
	meta := st[0].raw["metadata"].(map[string]any)
	if len(st) != 1 || meta["cut_off"] != "upstream_cut" || st[0].raw["finish_reason"] != "abort" || len(st[0].rec.Step.ResponseIDs) != 3 {
		t.Fatalf("step %s", mustJSON(st[0].raw))
	}
}

// A stream that ends with an error event and [DONE] (vLLM's way of
// reporting a generation that failed midway) is recorded cut short, not as
// a whole answer, and is no parent for the next call's prompt delta.
func TestUpstreamErrorEventMidStream(t *testing.T) {
	e := newEnv(t, nil)
	e.backend.ErrorNextStream(4)
	resp := e.req("POST", "/sessions/ee:0/v1/chat/completions", `{"stream":true,"messages":[]}`)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "stub engine failure") {
		t.Fatalf("the error event did not reach the agent: %s", b)
	}
	e.mustJSON("POST", "/sessions/ee:0/v1/chat/completions", chatBody, 200, nil)
	e.finish("ee:0", 0)
	st := steps(decodeAll(t, e.out.records()))
	if len(st) != 2 {
		t.Fatalf("%d steps", len(st))
	}
	meta := st[0].raw["metadata"].(map[string]any)
	if meta["cut_off"] != "upstream_error" || st[0].raw["finish_reason"] != "abort" || len(st[0].rec.Step.ResponseIDs) != 3 {
		t.Fatalf("step %s", mustJSON(st[0].raw))
	}
	if _, ok := st[1].raw["parent_step_id"]; ok {
		t.Fatalf("a failed generation became the next call's parent: %s", mustJSON(st[1].raw))
	}
}

// A stream is bounded as a whole body is: past MaxResponseBytes it is
// stopped and recorded cut short.
func TestStreamTooLarge(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxResponseBytes = 600 })
	resp := e.req("POST", "/sessions/big:0/v1/chat/completions", `{"stream":true,"messages":[]}`)
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	e.finish("big:0", 0)
	st := steps(decodeAll(t, e.out.records()))
	if len(st) != 1 {
		t.Fatalf("%d steps", len(st))
	}
	meta := st[0].raw["metadata"].(map[string]any)
	if meta["cut_off"] != "too_large" || st[0].raw["finish_reason"] != "abort" {
		t.Fatalf("step %s", mustJSON(st[0].raw))
	}
	if !strings.Contains(metricsText(e), `rllm_gateway_errors_total{kind="upstream_too_large"} 1`) {
		t.Fatalf("not counted:\n%s", metricsText(e))
	}
}

// policy_version is the weight version at dispatch; step_index the order.
func TestWeightVersionMidSession(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WeightVersion = 3 })
	e.mustJSON("POST", "/sessions/wv:0/v1/chat/completions", chatBody, 200, nil)
	var v map[string]int64
	e.mustJSON("POST", "/admin/weight_version", `{"weight_version":4}`, 200, &v)
	if v["weight_version"] != 4 {
		t.Fatalf("%v", v)
	}
	e.mustJSON("GET", "/admin/weight_version", "", 200, &v)
	if v["weight_version"] != 4 {
		t.Fatalf("%v", v)
	}
	e.mustJSON("POST", "/sessions/wv:0/v1/completions", `{"prompt":"x"}`, 200, nil)
	res := e.finish("wv:0", 1)
	if res["num_steps"] != 2.0 {
		t.Fatalf("finish %v", res)
	}
	ds := decodeAll(t, e.out.records())
	st := steps(ds)
	if len(st) != 2 {
		t.Fatalf("%d steps", len(st))
	}
	traj := trajectory(t, ds)
	tid, _ := traj.raw["trajectory_id"].(string)
	if !strings.HasPrefix(tid, "wv:0@") || res["trajectory_id"] != tid {
		t.Fatalf("trajectory id %q (finish answered %v)", tid, res["trajectory_id"])
	}
	for i, want := range []int64{3, 4} {
		s := st[i].rec.Step
		if st[i].reason != "" || s.PolicyVersion != want || s.StepIndex != int64(i) || s.StepID != fmt.Sprintf("%s#%d", tid, i) || s.TaskID != "wv" {
			t.Fatalf("step %d: %s", i, mustJSON(st[i].raw))
		}
	}
	if traj.raw["type"] != "trajectory" || traj.raw["num_steps"] != 2.0 || traj.raw["is_correct"] != true {
		t.Fatalf("trajectory %s", mustJSON(traj.raw))
	}
	for _, v := range []string{"-1", "9007199254740993", "9223372036854775807"} {
		if code, _ := e.do("POST", "/admin/weight_version", `{"weight_version":`+v+`}`); code != 400 {
			t.Fatalf("version %s: %d, want 400", v, code)
		}
	}
}

// Upstream errors reach the agent with their status; no step is recorded
// and the next call still gets index 0.
func TestUpstreamErrorPassedThrough(t *testing.T) {
	e := newEnv(t, nil)
	e.backend.FailNext(1, 500)
	code, b := e.do("POST", "/sessions/err:0/v1/chat/completions", chatBody)
	if code != 500 || !strings.Contains(string(b), "stub failure") {
		t.Fatalf("status %d: %s", code, b)
	}
	e.mustJSON("POST", "/sessions/err:0/v1/chat/completions", chatBody, 200, nil)
	e.finish("err:0", 1)
	st := steps(decodeAll(t, e.out.records()))
	if len(st) != 1 || st[0].rec.Step.StepIndex != 0 {
		t.Fatalf("steps %d", len(st))
	}
	if !strings.Contains(metricsText(e), `rllm_gateway_errors_total{kind="upstream_status"} 1`) {
		t.Fatalf("upstream error not counted:\n%s", metricsText(e))
	}
}

// A recorded call that records nothing (a body that is not JSON, a call
// the upstream refuses) leaves no session behind, and a session id that
// POST /sessions would refuse is refused on the agent routes too, before
// anything is kept: failing calls cannot grow the session table.
func TestFailedCallsLeaveNoSession(t *testing.T) {
	e := newEnv(t, nil)
	e.backend.FailNext(1, 400)
	if code, _ := e.do("POST", "/sessions/f1:0/v1/chat/completions", chatBody); code != 400 {
		t.Fatalf("upstream refusal: %d", code)
	}
	if code, _ := e.do("POST", "/sessions/f2:0/v1/chat/completions", "not json"); code != 400 {
		t.Fatalf("bad body: %d", code)
	}
	long := strings.Repeat("x", 600)
	if code, b := e.do("POST", "/sessions/"+long+"/v1/chat/completions", chatBody); code != 400 || !strings.Contains(string(b), "session_id") {
		t.Fatalf("a 600-byte id: %d %s", code, b)
	}
	if code, _ := e.do("POST", "/sessions/c/traces/v1/chat/completions", chatBody); code != 400 {
		t.Fatalf("an id ending in /traces: %d", code)
	}
	// Two failing calls that overlap: the one that did not create the
	// session is the last to fail, and removes it.
	e.backend.FailNext(2, 400)
	e.backend.SetDelay(100 * time.Millisecond)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { e.do("POST", "/sessions/f4:0/v1/chat/completions", chatBody) })
		time.Sleep(30 * time.Millisecond)
	}
	wg.Wait()
	e.backend.SetDelay(0)
	if n := e.gw.sessions.open(); n != 0 {
		t.Fatalf("%d sessions left by failed calls, want 0", n)
	}
	// A finish that has looked its session up holds it: the session's only
	// call failing meanwhile (here while the finish's body is still on its
	// way, before the finish marks the session finished) does not remove
	// it, so a repeat of the finish is answered as the first, not 404.
	e.backend.FailNext(1, 400)
	e.backend.SetDelay(150 * time.Millisecond)
	var fwg sync.WaitGroup
	fwg.Go(func() { e.do("POST", "/sessions/f5:0/v1/chat/completions", chatBody) })
	time.Sleep(50 * time.Millisecond)
	pr, pw := io.Pipe()
	finished := make(chan map[string]any, 1)
	fwg.Go(func() {
		resp, err := http.Post(e.srv.URL+"/sessions/f5:0/finish", "application/json", pr)
		if err != nil {
			t.Error(err)
			finished <- nil
			return
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Errorf("finish: %d %v", resp.StatusCode, err)
		}
		finished <- out
	})
	// The call has failed by now; the finish is still waiting for its body
	// (e.finish's, so that the repeat below is the same finish).
	time.Sleep(300 * time.Millisecond)
	_, _ = io.WriteString(pw, `{"reward":0,"is_correct":true,"termination_reason":"env_done"}`)
	pw.Close()
	first := <-finished
	fwg.Wait()
	e.backend.SetDelay(0)
	if again := e.finish("f5:0", 0); first == nil || again["trajectory_id"] != first["trajectory_id"] {
		t.Fatalf("repeat of the finish: %v, first %v", again, first)
	}
	// A session that recorded a call keeps it when a later call fails.
	e.mustJSON("POST", "/sessions/f3:0/v1/chat/completions", chatBody, 200, nil)
	e.backend.FailNext(1, 400)
	if code, _ := e.do("POST", "/sessions/f3:0/v1/chat/completions", chatBody); code != 400 {
		t.Fatalf("second call: %d", code)
	}
	if n := e.gw.sessions.open(); n != 1 {
		t.Fatalf("%d sessions, want f3:0's", n)
	}
	if res := e.finish("f3:0", 1); res["num_steps"] != 1.0 {
		t.Fatalf("finish %v", res)
	}
}

func metricsText(e *env) string {
	_, b := e.do("GET", "/metrics", "")
	return string(b)
}

// Plain /v1 calls are forwarded and counted, not recorded.
func TestPlainV1NotRecorded(t *testing.T) {
	e := newEnv(t, nil)
	e.mustJSON("POST", "/v1/chat/completions", chatBody, 200, nil)
	e.mustJSON("GET", "/v1/models", "", 200, nil)
	e.mustJSON("GET", "/sessions/pm:0/v1/models", "", 200, nil)
	e.mustJSON("POST", "/admin/flush", "", 200, nil)
	if n := len(e.out.records()); n != 0 {
		t.Fatalf("%d records from unrecorded calls", n)
	}
	m := metricsText(e)
	for _, want := range []string{`rllm_gateway_calls_total{kind="plain"} 2`, `rllm_gateway_calls_total{kind="passthrough"} 1`} {
		if !strings.Contains(m, want) {
			t.Fatalf("missing %s in\n%s", want, m)
		}
	}
}

// Agent routes take the agent's or the admin's token (as rLLM's gateway
// does), management routes the admin's only; either header works
// (Authorization: Bearer, x-api-key). Neither reaches the upstream, which
// gets the upstream key instead; no token is logged.
func TestTokens(t *testing.T) {
	var logs bytes.Buffer
	var logMu sync.Mutex
	e := newEnv(t, func(c *Config) {
		c.AgentToken, c.AdminToken, c.UpstreamKey = "agent-secret", "admin-secret", "upstream-secret"
		c.Log = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	const bearer, xkey = "Authorization", "X-Api-Key"
	calls := 0
	for _, tc := range []struct {
		method, path, body, header, token string
		want                              int
	}{
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody, bearer, "", 401},
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody, bearer, "agent-secret", 200},
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody, bearer, "admin-secret", 200},
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody, xkey, "agent-secret", 200},
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody, xkey, "admin-secret", 200},
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody, xkey, "upstream-secret", 401},
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody, "bearer-lower", "agent-secret", 200},
		{"POST", "/v1/chat/completions", chatBody, bearer, "agent-secret-", 401},
		{"POST", "/v1/chat/completions", chatBody, bearer, "admin-secret", 200},
		{"GET", "/sessions", "", bearer, "agent-secret", 401},
		{"GET", "/sessions", "", xkey, "agent-secret", 401},
		{"GET", "/sessions", "", bearer, "admin-secret", 200},
		{"GET", "/sessions", "", xkey, "admin-secret", 200},
		{"GET", "/metrics", "", bearer, "", 401},
		{"POST", "/admin/weight_version", `{"weight_version":2}`, bearer, "agent-secret", 401},
		{"POST", "/records", `{"type":"step"}`, bearer, "agent-secret", 200}, // workers post records as agents do
		{"POST", "/records", `{"type":"step"}`, xkey, "agent-secret", 200},
		{"POST", "/records", `{"type":"step"}`, bearer, "", 401},
		{"POST", "/records", `{"type":"step"}`, bearer, "agent-secret-", 401},
		{"GET", "/health", "", bearer, "", 200},
	} {
		hdr := []string{}
		switch {
		case tc.token == "":
		case tc.header == "bearer-lower":
			hdr = []string{"Authorization", "bearer " + tc.token}
		case tc.header == bearer:
			hdr = []string{bearer, "Bearer " + tc.token}
		default:
			hdr = []string{tc.header, tc.token}
		}
		if code, b := e.do(tc.method, tc.path, tc.body, hdr...); code != tc.want {
			t.Errorf("%s %s with %s %q: %d, want %d: %s", tc.method, tc.path, tc.header, tc.token, code, tc.want, b)
		}
		if tc.want == 200 && strings.Contains(tc.path, "/v1/") {
			calls++
		}
	}
	reqs := e.backend.Requests()
	if len(reqs) != calls {
		t.Fatalf("%d upstream requests, want %d", len(reqs), calls)
	}
	for _, r := range reqs {
		if r.Header.Get("Authorization") != "Bearer upstream-secret" || r.Header.Get("X-Api-Key") != "" {
			t.Fatalf("the upstream got Authorization %q, x-api-key %q", r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"))
		}
	}
	e.backend.FailNext(1, 401) // an upstream refusing the key: passed on, logged without it
	e.do("POST", "/sessions/tk:0/v1/chat/completions", chatBody, bearer, "Bearer agent-secret")
	logMu.Lock()
	defer logMu.Unlock()
	for _, secret := range []string{"agent-secret", "admin-secret", "upstream-secret"} {
		if strings.Contains(logs.String(), secret) {
			t.Fatalf("a token is in the log:\n%s", logs.String())
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestBodyTooLarge(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxRequestBytes = 1024 })
	big := `{"messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`
	for _, p := range []string{"/sessions/big:0/v1/chat/completions", "/v1/chat/completions", "/sessions", "/records"} {
		if code, b := e.do("POST", p, big); code != 413 {
			t.Errorf("%s: %d, want 413: %s", p, code, b)
		}
	}
	if e.backend.Calls() != 0 {
		t.Fatalf("an oversized body reached the upstream")
	}
}

// The output fails: records wait in the buffer, beyond its bound agents get
// 503, finish cannot answer 200; once the output is back every call the
// agent got a 200 for has exactly one step, and finish returns 200.
func TestOutputFailingNothingLost(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxBufferedBytes = 8 << 10
		c.FinishTimeout = 300 * time.Millisecond
	})
	e.out.setFail(true)
	ok, refused := 0, 0
	for i := 0; i < 40 && refused == 0; i++ {
		code, b := e.do("POST", "/sessions/down:0/v1/chat/completions", chatBody)
		switch code {
		case 200:
			ok++
		case 503:
			refused++
			if !strings.Contains(string(b), "buffer_full") {
				t.Fatalf("503 without a clear error: %s", b)
			}
		default:
			t.Fatalf("status %d: %s", code, b)
		}
	}
	if refused == 0 || ok == 0 {
		t.Fatalf("ok %d refused %d: the bound was not enforced", ok, refused)
	}
	code, _ := e.do("POST", "/sessions/down:0/finish", `{"reward":1}`)
	if code != 503 {
		t.Fatalf("finish answered %d while the output is down", code)
	}
	if !strings.Contains(metricsText(e), `rllm_gateway_errors_total{kind="output_write"}`) {
		t.Fatal("output errors not counted")
	}
	e.out.setFail(false)
	// The same body waits again, and answers 200 once the output caught
	// up: a client repeats it while it answers 503 (each wait is bounded
	// by FinishTimeout, shorter than the output's retry on a busy machine).
	for attempt := 0; ; attempt++ {
		code, b := e.do("POST", "/sessions/down:0/finish", `{"reward":1}`)
		if code == 200 {
			break
		}
		if code != 503 || attempt == 50 {
			t.Fatalf("finish after the output came back: status %d after %d attempts: %s", code, attempt+1, b)
		}
	}
	ds := decodeAll(t, e.out.records())
	st := steps(ds)
	seen := map[string]bool{}
	for _, s := range st {
		if seen[s.rec.Step.StepID] {
			t.Fatalf("step %s written twice", s.rec.Step.StepID)
		}
		seen[s.rec.Step.StepID] = true
	}
	if len(st) != ok || len(ds) != ok+1 {
		t.Fatalf("%d steps, %d records for %d acknowledged calls", len(st), len(ds), ok)
	}
	if tr := trajectory(t, ds); tr.raw["num_steps"] != float64(ok) {
		t.Fatalf("trajectory %s", mustJSON(tr.raw))
	}
	// A finish with another body is refused.
	if code, _ := e.do("POST", "/sessions/down:0/finish", `{"reward":0}`); code != 409 {
		t.Fatalf("a different second finish: %d", code)
	}
	// A call after finish is refused, not recorded out of range.
	if code, _ := e.do("POST", "/sessions/down:0/v1/chat/completions", chatBody); code != 409 {
		t.Fatalf("a call after finish: %d", code)
	}
}

// Two upstreams: sessions stick to one; when it dies they move to the
// other and the agent sees no error.
func TestStickyAndFallback(t *testing.T) {
	fx := fixtures(t)
	b1, b2 := gatewaytest.NewBackend(fx), gatewaytest.NewBackend(fx)
	u1, u2 := httptest.NewServer(b1), httptest.NewServer(b2)
	defer u2.Close()
	out := &memOutput{}
	gw, err := New(Config{Upstreams: []string{u1.URL, u2.URL + "/v1"}, HealthInterval: -1}, out)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	defer func() {
		srv.Close()
		_ = gw.Close(context.Background())
	}()
	post := func(sid string) int {
		resp, err := http.Post(srv.URL+"/sessions/"+sid+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for round := 0; round < 3; round++ {
		for i := 0; i < 20; i++ {
			post(fmt.Sprintf("sticky-%d:0", i))
		}
	}
	if c1, c2 := b1.Calls(), b2.Calls(); c1%3 != 0 || c2%3 != 0 || c1 == 0 || c2 == 0 {
		t.Fatalf("calls %d and %d: sessions not sticky or not spread", c1, c2)
	}
	u1.Close()
	before2 := b2.Calls()
	for i := 0; i < 20; i++ {
		if code := post(fmt.Sprintf("sticky-%d:0", i)); code != 200 {
			t.Fatalf("session %d got %d after a worker died", i, code)
		}
	}
	if b2.Calls()-before2 != 20 {
		t.Fatalf("the live worker took %d of 20", b2.Calls()-before2)
	}
	var ws []WorkerInfo
	resp, _ := http.Get(srv.URL + "/admin/workers")
	_ = json.NewDecoder(resp.Body).Decode(&ws)
	resp.Body.Close()
	if len(ws) != 2 || ws[0].Healthy || !ws[1].Healthy || ws[1].APIPath != "/v1" {
		t.Fatalf("workers %+v", ws)
	}
}

// Adding a worker moves only the sessions it now wins; removing it moves
// them back, no other.
func TestPoolStickiness(t *testing.T) {
	p := newPool(http.DefaultClient, -1, "", nil)
	defer p.stop()
	for i := range 4 {
		if _, err := p.add(fmt.Sprint(i), fmt.Sprintf("http://127.0.0.1:%d", 9000+i), "", "", 1); err != nil {
			t.Fatal(err)
		}
	}
	owner := map[string]string{}
	for i := range 2000 {
		sid := fmt.Sprintf("task-%d:%d", i/8, i%8)
		owner[sid] = p.pick(sid, nil).id
	}
	if _, err := p.add("new", "http://127.0.0.1:9100", "", "", 1); err != nil {
		t.Fatal(err)
	}
	moved := 0
	for sid, was := range owner {
		now := p.pick(sid, nil).id
		if now != was {
			if now != "new" {
				t.Fatalf("%s moved from %s to %s, not to the new worker", sid, was, now)
			}
			moved++
		}
	}
	if moved < 250 || moved > 550 {
		t.Fatalf("%d of 2000 sessions moved, want about 1/5", moved)
	}
	p.remove("new")
	for sid, was := range owner {
		if now := p.pick(sid, nil).id; now != was {
			t.Fatalf("%s did not return to %s", sid, was)
		}
	}
}

func TestManagementAPI(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.GroupSize = 8 })
	var created map[string]string
	e.mustJSON("POST", "/sessions", `{"session_id":"ns/t1:0","metadata":{"task_id":"t1","group_id":"t1:solver","role":"solver","group_size":4}}`, 200, &created)
	if created["session_id"] != "ns/t1:0" || created["url"] != "/sessions/ns/t1:0/v1" {
		t.Fatalf("%v", created)
	}
	e.mustJSON("POST", "/sessions", `{}`, 200, &created)
	if len(created["session_id"]) != 32 {
		t.Fatalf("generated id %v", created)
	}
	if code, _ := e.do("POST", "/sessions", `{"session_id":"bad/v1/x"}`); code != 400 {
		t.Fatalf("ambiguous id accepted: %d", code)
	}
	e.mustJSON("POST", "/sessions/ns/t1:0/v1/chat/completions", chatBody, 200, nil)
	e.mustJSON("POST", "/sessions/ns/t1:0/v1/chat/completions", chatBody, 200, nil)
	var info SessionInfo
	e.mustJSON("GET", "/sessions/ns/t1:0", "", 200, &info)
	if info.SessionID != "ns/t1:0" || info.TraceCount != 2 || info.CreatedAt == 0 {
		t.Fatalf("%+v", info)
	}
	var list []SessionInfo
	e.mustJSON("GET", "/sessions?limit=1", "", 200, &list)
	if len(list) != 1 || list[0].SessionID != "ns/t1:0" {
		t.Fatalf("%+v", list)
	}
	var traces []TraceRecord
	e.mustJSON("GET", "/sessions/ns/t1:0/traces", "", 200, &traces)
	if len(traces) != 2 || traces[0].SessionID != "ns/t1:0" || len(traces[0].CompletionTokenIDs) != 9 ||
		len(traces[0].Logprobs) != 9 || len(traces[0].PromptTokenIDs) == 0 || len(traces[1].TraceID) != 32 || traces[0].TraceID == traces[1].TraceID {
		t.Fatalf("traces %+v", traces)
	}
	id1 := traces[1].TraceID
	e.mustJSON("GET", "/sessions/ns/t1:0/traces?limit=1", "", 200, &traces)
	if len(traces) != 1 {
		t.Fatalf("limit: %d", len(traces))
	}
	var tr TraceRecord
	e.mustJSON("GET", "/traces/"+id1, "", 200, &tr)
	if tr.TraceID != id1 || strings.ContainsAny(tr.TraceID, "/:#%") {
		t.Fatalf("%+v", tr)
	}
	if code, _ := e.do("GET", "/traces/nope", ""); code != 404 {
		t.Fatalf("unknown trace: %d", code)
	}
	e.mustJSON("POST", "/traces/query", `{"session_ids":["ns/t1:0","nope"]}`, 200, &traces)
	if len(traces) != 2 {
		t.Fatalf("query: %d", len(traces))
	}
	e.finish("ns/t1:0", 0.5)
	ds := decodeAll(t, e.out.records())
	for _, d := range ds {
		if d.reason != "" || d.raw["task_id"] != "t1" || d.raw["group_id"] != "t1:solver" || d.raw["role"] != "solver" {
			t.Fatalf("record %s (%s)", mustJSON(d.raw), d.reason)
		}
	}
	if tr := trajectory(t, ds); tr.raw["group_size"] != 4.0 || e.out.records()[0].Key != "t1:solver" {
		t.Fatalf("group size / key: %s", mustJSON(tr.raw))
	}
	// workers
	var added map[string]string
	e.mustJSON("POST", "/admin/workers", `{"url":"http://127.0.0.1:1/v1","worker_id":"w9","model_name":"m"}`, 200, &added)
	if added["worker_id"] != "w9" || added["url"] != "http://127.0.0.1:1" || added["api_path"] != "/v1" {
		t.Fatalf("%v", added)
	}
	var health struct {
		Workers        []WorkerInfo
		Healthy, Total int
	}
	e.mustJSON("GET", "/health/workers", "", 200, &health)
	if health.Total != 2 {
		t.Fatalf("%+v", health)
	}
	e.mustJSON("DELETE", "/admin/workers/w9", "", 200, nil)
	if code, _ := e.do("DELETE", "/admin/workers/w9", ""); code != 404 {
		t.Fatalf("second remove: %d", code)
	}
	if code, _ := e.do("POST", "/admin/workers", `{}`); code != 400 {
		t.Fatalf("worker without url: %d", code)
	}
	var flushed map[string]string
	e.mustJSON("POST", "/admin/flush", "", 200, &flushed)
	if flushed["status"] != "flushed" {
		t.Fatalf("%v", flushed)
	}
	e.mustJSON("POST", "/admin/reload", "", 200, nil)
	var del map[string]int
	e.mustJSON("DELETE", "/sessions/ns/t1:0", "", 200, &del)
	if del["deleted"] != 2 {
		t.Fatalf("%v", del)
	}
	if code, _ := e.do("GET", "/sessions/ns/t1:0", ""); code != 404 {
		t.Fatalf("deleted session: %d", code)
	}
	e.mustJSON("POST", "/sessions/batch_delete", `{"session_ids":["`+created["session_id"]+`"]}`, 200, &del)
	var h map[string]string
	e.mustJSON("GET", "/health", "", 200, &h)
	if h["status"] != "ok" {
		t.Fatalf("%v", h)
	}
}

func TestPostRecords(t *testing.T) {
	e := newEnv(t, nil)
	lines := `{"type":"step","step_id":"a#0","task_id":"a","trajectory_id":"a/0","step_index":0,"policy_version":1,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-0.5]}
{"type":"trajectory","trajectory_id":"a/0","task_id":"a","group_id":"ga","reward":1,"num_steps":1}
`
	var res map[string]int
	e.mustJSON("POST", "/records", lines, 200, &res)
	recs := e.out.records()
	if res["accepted"] != 2 || len(recs) != 2 || recs[0].Key != "a" || recs[1].Key != "ga" {
		t.Fatalf("%v %v", res, recs)
	}
	code, b := e.do("POST", "/records", lines+"not json\n")
	if code != 400 || !strings.Contains(string(b), `"line":3`) || len(e.out.records()) != 2 {
		t.Fatalf("%d %s: a bad line must refuse the whole body", code, b)
	}
	// A body of no records is taken at once and leaves nothing pending:
	// flush and Close do not wait on it.
	for _, body := range []string{"", "\n \n"} {
		var res map[string]int
		e.mustJSON("POST", "/records", body, 200, &res)
		if res["accepted"] != 0 {
			t.Fatalf("empty body: %v", res)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := e.gw.queue.drain(ctx); err != nil {
		t.Fatalf("after empty bodies: %v", err)
	}
}

func TestTraceBounds(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxTracesPerSession, c.MaxTraces = 2, 3 })
	for range 3 {
		e.mustJSON("POST", "/sessions/tb:0/v1/chat/completions", chatBody, 200, nil)
	}
	var info SessionInfo
	e.mustJSON("GET", "/sessions/tb:0", "", 200, &info)
	if info.TraceCount != 2 {
		t.Fatalf("per-session bound: %d", info.TraceCount)
	}
	e.finish("tb:0", 1)
	for range 2 {
		e.mustJSON("POST", "/sessions/tb:1/v1/chat/completions", chatBody, 200, nil)
	}
	e.mustJSON("GET", "/sessions/tb:0", "", 200, &info)
	if info.TraceCount != 1 {
		t.Fatalf("the finished session should lose traces first: %d", info.TraceCount)
	}
	e.mustJSON("GET", "/sessions/tb:1", "", 200, &info)
	if info.TraceCount != 2 {
		t.Fatalf("open session: %d", info.TraceCount)
	}
	if st := steps(decodeAll(t, e.out.records())); len(st) != 5 {
		t.Fatalf("evicting traces lost records: %d steps, want 5", len(st))
	}
}

// Concurrent sessions, each numbered in order, none lost.
func TestConcurrentSessions(t *testing.T) {
	e := newEnv(t, nil)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sid := fmt.Sprintf("cc-%d:0", i)
			for range 3 {
				resp, err := http.Post(e.srv.URL+"/sessions/"+sid+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true,"messages":[]}`))
				if err == nil {
					_, _ = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
			}
			resp, err := http.Post(e.srv.URL+"/sessions/"+sid+"/finish", "application/json", strings.NewReader(`{"reward":1}`))
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	ds := decodeAll(t, e.out.records())
	if len(ds) != 16*4 {
		t.Fatalf("%d records, want 64", len(ds))
	}
	idx := map[string][]int64{}
	for _, d := range ds {
		if d.reason != "" {
			t.Fatalf("rejected: %s", d.reason)
		}
		if d.rec.Step != nil {
			idx[d.rec.Step.TrajectoryID] = append(idx[d.rec.Step.TrajectoryID], d.rec.Step.StepIndex)
		}
	}
	for id, xs := range idx {
		slices.Sort(xs)
		if fmt.Sprint(xs) != "[0 1 2]" {
			t.Fatalf("%s: indices %v", id, xs)
		}
	}
}

func TestCloseDrains(t *testing.T) {
	fx := fixtures(t)
	up := httptest.NewServer(gatewaytest.NewBackend(fx))
	defer up.Close()
	out := &memOutput{}
	gw, err := New(Config{Upstreams: []string{up.URL}, HealthInterval: 10 * time.Millisecond}, out)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	resp, err := http.Post(srv.URL+"/sessions/cl:0/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	srv.Close()
	if err := gw.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := gw.Close(context.Background()); err != nil {
		t.Fatal("second close:", err)
	}
	if len(out.records()) != 1 || !out.closed {
		t.Fatalf("close did not drain and close the output: %d", len(out.records()))
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A call's answer reaches the agent before the gateway records it: a trace
// list the agent asks for right after (as rLLM's client does) waits for the
// recording, streamed or not, instead of missing the call.
func TestTracesListAnsweredCalls(t *testing.T) {
	e := newEnv(t, nil)
	e.gw.beforeRecord = func() { time.Sleep(300 * time.Millisecond) }
	for i, stream := range []bool{false, true} {
		body := chatBody
		if stream {
			body = strings.Replace(body, `{"model"`, `{"stream":true,"model"`, 1)
		}
		if code, b := e.do("POST", "/sessions/tr:0/v1/chat/completions", body); code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		// On a connection of its own, as the agent's client and rLLM's are
		// two (one connection serves its requests in turn).
		list := func(method, path, body string) []TraceRecord {
			c := &http.Client{Transport: &http.Transport{}}
			defer c.CloseIdleConnections()
			req, err := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var traces []TraceRecord
			if err := json.NewDecoder(resp.Body).Decode(&traces); err != nil {
				t.Fatal(err)
			}
			return traces
		}
		if n := len(list("GET", "/sessions/tr:0/traces", "")); n != i+1 {
			t.Fatalf("stream %t: %d traces listed right after the call, want %d", stream, n, i+1)
		}
		// Across sessions too: a call answered in another session is
		// listed by a query of both.
		if code, b := e.do("POST", "/sessions/tr:1/v1/chat/completions", body); code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		if n := len(list("POST", "/traces/query", `{"session_ids":["tr:0","tr:1"]}`)); n != 2*(i+1) {
			t.Fatalf("stream %t: %d traces queried right after the calls, want %d", stream, n, 2*(i+1))
		}
	}
}

// TestTokensSuite: the bearer header rule every server shares, on an
// agent route and a management route (the x-api-key header is
// TestTokens').
func TestTokensSuite(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AgentToken, c.AdminToken = bearertest.Token, "admin-"+bearertest.Token })
	for _, route := range []struct{ method, path, body string }{
		{"POST", "/sessions/tk:0/v1/chat/completions", chatBody},
		{"POST", "/records", `{"type":"step"}`},
	} {
		t.Run(route.path, func(t *testing.T) {
			bearertest.Run(t, func(t *testing.T, header string) bool {
				var hdr []string
				if header != "" {
					hdr = []string{"Authorization", header}
				}
				code, _ := e.do(route.method, route.path, route.body, hdr...)
				return code == 200
			})
		})
	}
}

// A call's policy_version is the weight version when it was dispatched,
// not when its response ended (rLLM PR #622): a version published while
// the upstream is still generating does not reach the step.
func TestWeightVersionAtDispatch(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WeightVersion = 3 })
	first, release := e.backend.HoldLast()
	done := make(chan error, 1)
	go func() {
		resp := e.req("POST", "/sessions/wvd:0/v1/chat/completions", `{"stream":true,"messages":[]}`)
		_, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- err
	}()
	<-first // the upstream is generating
	e.mustJSON("POST", "/admin/weight_version", `{"weight_version":5}`, 200, nil)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	e.finish("wvd:0", 1)
	st := steps(decodeAll(t, e.out.records()))
	if len(st) != 1 {
		t.Fatalf("%d steps, want 1", len(st))
	}
	if got := st[0].rec.Step.PolicyVersion; got != 3 {
		t.Fatalf("policy_version %d, want 3 (the version at dispatch)", got)
	}
}
