package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// growingBackend answers chat calls as a multi-turn agent's would look:
// call k's prompt is call k-1's prompt and response and one new token,
// except call 3, a context reset.
type growingBackend struct {
	mu     sync.Mutex
	prompt []int64
	calls  int64
}

func (b *growingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.mu.Lock()
	k := b.calls
	b.calls++
	if k == 3 {
		b.prompt = []int64{1, 2} // reset
	}
	prompt := append(slices.Clone(b.prompt), 100+k)
	resp := []int64{200 + k, 300 + k}
	b.prompt = append(slices.Clone(prompt), resp...)
	b.mu.Unlock()
	lp := `[{"token":"a","logprob":-0.5},{"token":"b","logprob":-0.25}]`
	fmt.Fprintf(w, `{"id":"c%d","object":"chat.completion","model":"m","prompt_token_ids":%s,"choices":[{"index":0,"message":{"role":"assistant","content":"ab"},"finish_reason":"stop","token_ids":%s,"logprobs":{"content":%s}}]}`,
		k, jsonInts(prompt), jsonInts(resp), lp)
}

func jsonInts(v []int64) string { b, _ := json.Marshal(v); return string(b) }

// TestPromptDeltasOnTheWire: a step whose prompt extends the session's
// previous step's prompt and response is written as parent_step_id and
// prompt_delta_ids; the rebuilt prompts equal what the backend saw; a
// reset is written whole, marked as a prompt fork (metadata prompt_fork:
// where it diverges) and counted in the metrics; WholePrompts turns the
// deltas off, not the forks.
func TestPromptDeltasOnTheWire(t *testing.T) {
	for _, whole := range []bool{false, true} {
		up := httptest.NewServer(&growingBackend{prompt: []int64{1, 2}})
		e := newEnv(t, func(c *Config) { c.Upstreams = []string{up.URL}; c.WholePrompts = whole })
		var want [][]int64
		for k := range 5 {
			e.mustJSON("POST", "/sessions/task:0/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 200, nil)
			p := []int64{1, 2}
			if k > 0 && k != 3 {
				p = append(slices.Clone(want[k-1]), 200+int64(k-1), 300+int64(k-1))
			}
			want = append(want, append(p, 100+int64(k)))
		}
		e.finish("task:0", 1)
		var d ingest.Decoder
		got := map[string][]int64{}
		deltas := 0
		for _, r := range e.out.records() {
			rec, err := d.Decode(r.Line)
			if err != nil {
				t.Fatalf("record does not decode: %v: %s", err, r.Line)
			}
			s := rec.Step
			if s == nil {
				continue
			}
			var prompt []int64
			if s.ParentStepID != "" {
				deltas++
				parent := got[s.ParentStepID]
				if parent == nil {
					t.Fatalf("%s: parent %s not written before it", s.StepID, s.ParentStepID)
				}
				prompt = slices.Concat(parent, int64s(s.PromptDeltaIDs))
			} else {
				prompt = int64s(s.PromptIDs)
			}
			if !slices.Equal(prompt, want[s.StepIndex]) {
				t.Fatalf("whole=%v step %d: prompt %v, want %v", whole, s.StepIndex, prompt, want[s.StepIndex])
			}
			var meta struct {
				PromptFork *promptFork `json:"prompt_fork"`
			}
			if err := json.Unmarshal(s.Metadata, &meta); err != nil {
				t.Fatal(err)
			}
			var fork *promptFork
			if s.StepIndex == 3 { // [1 2 103] after step 2's prompt and its 2 response tokens
				fork = &promptFork{At: 2, PrevTokens: len(want[2]) + 2}
			}
			if fmt.Sprint(meta.PromptFork) != fmt.Sprint(fork) {
				t.Errorf("whole=%v step %d: prompt_fork %v, want %v", whole, s.StepIndex, meta.PromptFork, fork)
			}
			got[s.StepID] = slices.Concat(prompt, int64s(s.ResponseIDs))
		}
		if wantDeltas := map[bool]int{false: 3, true: 0}[whole]; deltas != wantDeltas {
			t.Fatalf("whole=%v: %d steps written as deltas, want %d", whole, deltas, wantDeltas)
		}
		if _, body := e.do("GET", "/metrics", ""); !strings.Contains(string(body), "rllm_gateway_prompt_forks_total 1\n") {
			t.Errorf("whole=%v: metrics lack one fork:\n%s", whole, body)
		}
		up.Close()
	}
}

func int64s(v []int32) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// stampingBackend answers as a rollout engine that stamps the weight
// version it generated with (root "weight_version"; a stream's first
// chunk), as rLLM's gateway reads it: a number, a decimal string, or
// absent (plain vLLM); "bad" is not a version.
type stampingBackend struct{ version string }

func (b stampingBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ Stream bool }
	_ = json.NewDecoder(r.Body).Decode(&req)
	wv := ""
	if b.version != "" {
		wv = `"weight_version":` + b.version + `,`
	}
	if !req.Stream {
		fmt.Fprintf(w, `{"id":"c","object":"chat.completion","model":"m",%s"prompt_token_ids":[1,2],"choices":[{"index":0,"message":{"role":"assistant","content":"ab"},"finish_reason":"stop","token_ids":[3,4],"logprobs":{"content":[{"token":"a","logprob":-0.5},{"token":"b","logprob":-0.25}]}}]}`, wv)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",%s\"prompt_token_ids\":[1,2],\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"a\"},\"token_ids\":[3],\"logprobs\":{\"content\":[{\"token\":\"a\",\"logprob\":-0.5}]}}]}\n\n", wv)
	fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",%s\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"},\"token_ids\":[4],\"logprobs\":{\"content\":[{\"token\":\"b\",\"logprob\":-0.25}]},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", wv)
}

// TestEngineWeightVersion: a version the engine stamps on its response is
// the step's policy_version (the gateway's own, set by the admin route,
// is the fallback), and the agent does not see it; token ids it did not
// ask for are removed, logprobs null.
func TestEngineWeightVersion(t *testing.T) {
	for _, tc := range []struct {
		stamp string
		want  int64
	}{{"", 3}, {"7", 7}, {`"8"`, 8}, {`"bad"`, 3}, {"-1", 3}, {"9.0", 9}, {"1e1", 10}, {`" 11 "`, 11}, {"4.5", 3}, {`"3.0"`, 3}, {"null", 3}} {
		for _, stream := range []bool{false, true} {
			up := httptest.NewServer(stampingBackend{tc.stamp})
			e := newEnv(t, func(c *Config) { c.Upstreams = []string{up.URL} })
			e.mustJSON("POST", "/admin/weight_version", `{"weight_version":3}`, 200, nil)
			code, body := e.do("POST", "/sessions/wv:0/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":"hi"}]}`, stream))
			if code != 200 {
				t.Fatalf("status %d: %s", code, body)
			}
			payloads := []string{string(body)}
			if stream {
				payloads = sseData(t, strings.NewReader(string(body)))
				payloads = payloads[:len(payloads)-1]
			}
			for _, p := range payloads {
				var m map[string]any
				if err := json.Unmarshal([]byte(p), &m); err != nil {
					t.Fatalf("agent got bad JSON: %s", p)
				}
				_, wv := m["weight_version"]
				_, pti := m["prompt_token_ids"]
				if wv || pti {
					t.Fatalf("stamp %s stream %t: the agent sees weight_version or prompt_token_ids: %s", tc.stamp, stream, p)
				}
				for _, c := range m["choices"].([]any) {
					ch := c.(map[string]any)
					lp, hasLP := ch["logprobs"]
					if _, ok := ch["token_ids"]; ok || !hasLP || lp != nil {
						t.Fatalf("stamp %s stream %t: token_ids kept or logprobs not null: %s", tc.stamp, stream, p)
					}
				}
			}
			e.finish("wv:0", 1)
			st := steps(decodeAll(t, e.out.records()))
			if len(st) != 1 || st[0].rec.Step.PolicyVersion != tc.want {
				t.Fatalf("stamp %s stream %t: %d steps, policy_version %d, want %d", tc.stamp, stream, len(st), st[0].rec.Step.PolicyVersion, tc.want)
			}
			up.Close()
		}
	}
}
