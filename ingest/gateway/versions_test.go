package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
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
			// Where the engine stamps its tokens, the gateway's own version
			// (3) is not theirs: the step is at its first token's.
			at := 3
			if tc.bump {
				at = 5
			}
			e.mustJSON("POST", "/admin/weight_version", fmt.Sprintf(`{"weight_version":%d}`, at), 200, nil)
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

// TestSamplingRecorded: each step records the sampling parameters its call
// was sent with — the agent's, the session's defaults for the others —
// and the engine's logprobs mode when it stamps one (removed from the
// agent's answer, like its weight version).
func TestSamplingRecorded(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","model":"m","logprobs_mode":"raw_logprobs","prompt_token_ids":[1,2],"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop","token_ids":[3],"logprobs":{"content":[{"logprob":-0.5}]}}]}`)
	}))
	defer up.Close()
	e := newEnv(t, func(c *Config) { c.Upstreams = []string{up.URL} })
	e.mustJSON("POST", "/sessions", `{"session_id":"smp:0","sampling_params":{"temperature":0.6,"top_k":20}}`, 200, nil)
	code, body := e.do("POST", "/sessions/smp:0/v1/chat/completions", `{"model":"m","temperature":1.0,"top_p":0.9,"seed":7,"messages":[{"role":"user","content":"hi"}]}`)
	if code != 200 || strings.Contains(string(body), "logprobs_mode") {
		t.Fatalf("status %d, the agent's answer %s", code, body)
	}
	e.finish("smp:0", 1)
	st := steps(decodeAll(t, e.out.records()))
	var meta struct {
		Sampling map[string]any `json:"sampling"`
	}
	if err := json.Unmarshal(st[0].rec.Step.Metadata, &meta); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"temperature": 1.0, "top_p": 0.9, "seed": 7.0, "top_k": 20.0, "logprobs_mode": "raw_logprobs"}
	if fmt.Sprint(meta.Sampling) != fmt.Sprint(want) {
		t.Fatalf("sampling %v, want %v", meta.Sampling, want)
	}
}
