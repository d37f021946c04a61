package gateway

import (
	"net/http"
	"strings"
	"testing"
)

// TestForwardRoutes: besides the recorded endpoints, only the routes of
// Config.Forward reach the workers; any other call (an inference server's
// admin routes, which the gateway would call with the upstream key) is
// answered 404 without an upstream request.
func TestForwardRoutes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		forward []string
		method  string
		path    string
		sent    bool
	}{
		{"models", nil, "GET", "/v1/models", true},
		{"a model", nil, "GET", "/v1/models/m", true},
		{"models in a session", nil, "GET", "/sessions/fw:0/v1/models", true},
		{"embeddings", nil, "POST", "/v1/embeddings", true},
		{"chat outside a session", nil, "POST", "/v1/chat/completions", true},
		{"an adapter load", nil, "POST", "/v1/load_lora_adapter", false},
		{"an adapter load in a session", nil, "POST", "/sessions/fw:0/v1/unload_lora_adapter", false},
		{"models by another method", nil, "DELETE", "/v1/models", false},
		{"chat by GET", nil, "GET", "/v1/chat/completions", false},
		{"dot segments", nil, "GET", "/v1/models/../load_lora_adapter", false},
		{"doubled slash", nil, "GET", "/v1/models//x", false},
		{"dot segments encoded twice", nil, "GET", "/v1/models/%252e%252e/load_lora_adapter", false},
		{"a backslash", nil, "GET", `/v1/models/..\load_lora_adapter`, false},
		{"every route", []string{"*"}, "POST", "/v1/load_lora_adapter", true},
		{"a route added", []string{"POST /v1/load_lora_adapter"}, "POST", "/v1/load_lora_adapter", true},
		{"a route added, others not", []string{"POST /v1/load_lora_adapter"}, "GET", "/v1/models", false},
		{"a prefix, any method", []string{"/v1/admin/*"}, "PUT", "/v1/admin/x/y", true},
		{"a prefix is not its parent", []string{"/v1/admin/*"}, "PUT", "/v1/administer", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Forward = tc.forward })
			code, body := e.do(tc.method, tc.path, "")
			sent := len(e.backend.Requests()) > 0
			if sent != tc.sent {
				t.Fatalf("%s %s: reached the worker: %v, want %v (status %d: %s)", tc.method, tc.path, sent, tc.sent, code, body)
			}
			if !tc.sent && (code != 404 || !strings.Contains(string(body), "does not forward")) {
				t.Fatalf("%s %s: %d %s, want 404 saying it is not forwarded", tc.method, tc.path, code, body)
			}
		})
	}
	// What reaches the worker is the path the gateway checked: escaped
	// again, never decoded a second time.
	for _, tc := range []struct{ path, want string }{
		{"/v1/models/a%3Fb", "/v1/models/a?b"}, // was cut at the ?, the rest sent as a query
		{"/v1/models/a%23b", "/v1/models/a#b"},
		{"/v1/models/Qwen%2FQwen3-8B", "/v1/models/Qwen/Qwen3-8B"},
		{"/v1/models/..%3F", "/v1/models/..?"}, // was a ".." segment
	} {
		e := newEnv(t, nil)
		if code, b := e.do("GET", tc.path, ""); code == 404 && strings.Contains(string(b), "does not forward") {
			t.Errorf("GET %s: not forwarded", tc.path)
			continue
		}
		reqs := e.backend.Requests()
		if len(reqs) != 1 || reqs[0].Path != tc.want {
			t.Errorf("GET %s: the worker got %+v, want one request for %q", tc.path, reqs, tc.want)
		}
	}
	for _, bad := range []string{"/admin", "FETCH /v1/x", "GET v1/models", ""} {
		if _, err := New(Config{Upstreams: []string{"http://127.0.0.1:1"}, Forward: []string{bad}}, &memOutput{}); err == nil {
			t.Errorf("New with Forward %q: no error", bad)
		}
	}
}

// TestHopByHopHeaders: the headers a call's Connection header names stay
// with the gateway, in both directions, besides the fixed hop-by-hop
// ones; the others go through.
func TestHopByHopHeaders(t *testing.T) {
	for _, tc := range []struct {
		name       string
		in         http.Header
		gone, kept []string
	}{
		{"named", http.Header{"Connection": {"X-Hop"}, "X-Hop": {"1"}, "X-Kept": {"2"}}, []string{"Connection", "X-Hop"}, []string{"X-Kept"}},
		{"a list, any case, blanks", http.Header{"Connection": {" keep-alive , x-hop,,X-Other "}, "X-Hop": {"1"}, "X-Other": {"2"}, "Keep-Alive": {"timeout=5"}, "X-Kept": {"3"}},
			[]string{"X-Hop", "X-Other", "Keep-Alive"}, []string{"X-Kept"}},
		{"two Connection lines", http.Header{"Connection": {"X-A", "X-B"}, "X-A": {"1"}, "X-B": {"2"}, "Content-Type": {"application/json"}},
			[]string{"X-A", "X-B"}, []string{"Content-Type"}},
		{"none", http.Header{"X-Kept": {"1"}, "Te": {"trailers"}}, []string{"Te"}, []string{"X-Kept"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, always := range [][]string{dropRequestHeaders, dropResponseHeaders} {
				h := tc.in.Clone()
				dropHeaders(h, always)
				for _, g := range tc.gone {
					if h.Get(g) != "" {
						t.Errorf("%s kept: %v", g, h)
					}
				}
				for _, k := range tc.kept {
					if h.Get(k) != tc.in.Get(k) {
						t.Errorf("%s dropped: %v", k, h)
					}
				}
			}
		})
	}

	// Through the gateway: the upstream never sees a header the agent
	// marked as hop-by-hop.
	e := newEnv(t, nil)
	if code, b := e.do("POST", "/sessions/hop:0/v1/chat/completions", chatBody,
		"Connection", "X-Agent-Secret", "X-Agent-Secret", "s", "X-Trace", "t"); code != 200 {
		t.Fatalf("%d: %s", code, b)
	}
	reqs := e.backend.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d upstream requests, want 1", len(reqs))
	}
	if h := reqs[0].Header; h.Get("X-Agent-Secret") != "" || h.Get("X-Trace") != "t" {
		t.Errorf("upstream headers %v: want X-Trace, not X-Agent-Secret", h)
	}
}
