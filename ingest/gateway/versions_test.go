package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// versionBackend answers four tokens (3, 4, 5, 6) generated across a
// weight update after the second: streamed, each chunk stamped with its
// weight_version (5, 5, 6, 6) or, with gatewayBump, unstamped, the test
// moving the gateway's own version between the chunks; non-streamed, with
// output_versions per token (SGLang/AReaL style).
type versionBackend struct {
	bump func() // with gatewayBump: called between the second and third chunk
}

func (b versionBackend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ Stream bool }
	_ = json.NewDecoder(r.Body).Decode(&req)
	if !req.Stream {
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","model":"m","prompt_token_ids":[1,2],"choices":[{"index":0,"message":{"role":"assistant","content":"abcd"},"finish_reason":"stop","token_ids":[3,4,5,6],"output_versions":[5,5,6,6],"logprobs":{"content":[{"logprob":-0.5},{"logprob":-0.5},{"logprob":-0.5},{"logprob":-0.5}]}}]}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for i, tok := range []int{3, 4, 5, 6} {
		if i == 2 && b.bump != nil {
			// The first two chunks are out: once the gateway has read them
			// (it has no reason to take 200 ms), its version moves.
			time.Sleep(200 * time.Millisecond)
			b.bump()
		}
		wv := ""
		if b.bump == nil {
			wv = fmt.Sprintf(`"weight_version":%d,`, 5+i/2)
		}
		prompt, finish := "", ""
		if i == 0 {
			prompt = `"prompt_token_ids":[1,2],`
		}
		if i == 3 {
			finish = `,"finish_reason":"stop"`
		}
		fmt.Fprintf(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",%s%s\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"token_ids\":[%d],\"logprobs\":{\"content\":[{\"logprob\":-0.5}]}%s}]}\n\n", wv, prompt, tok, finish)
		fl.Flush()
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// TestTokenVersionsAcrossAWeightUpdate: a generation that crosses a weight
// update is one step whose tokens carry the versions that produced them —
// from the engine's per-chunk weight_version, from the gateway's own
// version moving between chunks, or from a non-streamed answer's
// output_versions — with the step at its first token's version (its group
// judged by its oldest) and where the version changed in its metadata.
func TestTokenVersionsAcrossAWeightUpdate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stream bool
		bump   bool
	}{{"stream stamped", true, false}, {"stream, the gateway's version moves", true, true}, {"output_versions", false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			var e *env
			b := versionBackend{}
			if tc.bump {
				b.bump = func() { e.mustJSON("POST", "/admin/weight_version", `{"weight_version":6}`, 200, nil) }
			}
			up := httptest.NewServer(b)
			defer up.Close()
			e = newEnv(t, func(c *Config) { c.Upstreams = []string{up.URL} })
			e.mustJSON("POST", "/admin/weight_version", `{"weight_version":5}`, 200, nil)
			code, body := e.do("POST", "/sessions/tv:0/v1/chat/completions", fmt.Sprintf(`{"model":"m","stream":%t,"messages":[{"role":"user","content":"hi"}]}`, tc.stream))
			if code != 200 {
				t.Fatalf("status %d: %s", code, body)
			}
			if strings.Contains(string(body), "output_versions") || strings.Contains(string(body), "weight_version") {
				t.Fatalf("the agent sees the versions: %s", body)
			}
			e.finish("tv:0", 1)
			st := steps(decodeAll(t, e.out.records()))
			if len(st) != 1 || st[0].reason != "" {
				t.Fatalf("%d steps: %+v", len(st), st)
			}
			s := st[0].rec.Step
			if s.PolicyVersion != 5 || fmt.Sprint(s.TokenVersions) != "[5 5 6 6]" || s.OldestVersion() != 5 {
				t.Fatalf("policy_version %d, token_versions %v; want 5, [5 5 6 6]", s.PolicyVersion, s.TokenVersions)
			}
			var meta struct {
				VersionChanges []versionChange `json:"version_changes"`
			}
			if err := json.Unmarshal(s.Metadata, &meta); err != nil || fmt.Sprint(meta.VersionChanges) != "[{2 6}]" {
				t.Fatalf("metadata %s: version_changes %v, want [{2 6}]", s.Metadata, meta.VersionChanges)
			}
			if runs := fmt.Sprint(st[0].raw["token_versions"]); runs != "[[5 2] [6 2]]" {
				t.Errorf("token_versions on the wire %s, want the runs [[5 2] [6 2]]", runs)
			}
		})
	}
}

// TestPromptForksRecorded: a step whose prompt does not extend the
// previous step's prompt and answer (here a context reset) carries where
// they diverge in its metadata, with or without deltas on the wire, and
// is counted in the metrics; steps that extend carry nothing.
func TestPromptForksRecorded(t *testing.T) {
	for _, whole := range []bool{false, true} {
		up := httptest.NewServer(&growingBackend{prompt: []int64{1, 2}})
		e := newEnv(t, func(c *Config) { c.Upstreams = []string{up.URL}; c.WholePrompts = whole })
		var prompts [][]int64
		for k := range 5 {
			e.mustJSON("POST", "/sessions/fork:0/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 200, nil)
			p := []int64{1, 2}
			if k > 0 && k != 3 {
				p = append(slices.Clone(prompts[k-1]), 200+int64(k-1), 300+int64(k-1))
			}
			prompts = append(prompts, append(p, 100+int64(k)))
		}
		e.finish("fork:0", 1)
		st := steps(decodeAll(t, e.out.records()))
		if len(st) != 5 {
			t.Fatalf("%d steps", len(st))
		}
		for k, s := range st {
			var meta struct {
				PromptFork *promptFork `json:"prompt_fork"`
			}
			if err := json.Unmarshal(s.rec.Step.Metadata, &meta); err != nil {
				t.Fatal(err)
			}
			var want *promptFork
			if k == 3 { // [1 2 103] after [1 2 100 200 300 101 201 301 102] + [202 302]
				want = &promptFork{At: 2, PrevTokens: len(prompts[2]) + 2}
			}
			if fmt.Sprint(meta.PromptFork) != fmt.Sprint(want) {
				t.Errorf("whole %t step %d: prompt_fork %v, want %v", whole, k, meta.PromptFork, want)
			}
		}
		_, body := e.do("GET", "/metrics", "")
		if !strings.Contains(string(body), "rllm_gateway_prompt_forks_total 1\n") {
			t.Errorf("whole %t: metrics lack one fork:\n%s", whole, body)
		}
		up.Close()
	}
}
