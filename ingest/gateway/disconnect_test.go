package gateway

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An agent that leaves before the backend answered (a non-streaming call,
// or a stream whose headers had not arrived) still has its call recorded:
// the whole answer the backend gave, with its own finish reason, marked
// metadata.cut_off = client_disconnect. Without the detached upstream
// context the call was cancelled with the agent and no step was written.
func TestClientDisconnectBeforeAnswer(t *testing.T) {
	for _, tc := range []struct {
		name, body string
	}{
		{"non-streaming", chatBody},
		{"stream before headers", `{"stream":true,"messages":[{"role":"user","content":"What is 6*7?"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			e.backend.SetDelay(300 * time.Millisecond)
			ctx := giveUpOnceReceived(t, e)
			req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/sessions/nsd:0/v1/chat/completions", strings.NewReader(tc.body))
			if resp, err := http.DefaultClient.Do(req); err == nil || !errors.Is(err, context.Canceled) {
				if resp != nil {
					resp.Body.Close()
				}
				t.Fatalf("the agent should have given up: %v", err)
			}
			waitFor(t, func() bool { return len(e.out.records()) == 1 })
			if res := e.finish("nsd:0", 1); res["num_steps"] != 1.0 {
				t.Fatalf("finish %v", res)
			}
			st := steps(decodeAll(t, e.out.records()))
			if len(st) != 1 {
				t.Fatalf("%d steps", len(st))
			}
			meta := st[0].raw["metadata"].(map[string]any)
			if meta["cut_off"] != "client_disconnect" || st[0].raw["finish_reason"] != "stop" || st[0].reason != "" {
				t.Fatalf("step (%s) %s", st[0].reason, mustJSON(st[0].raw))
			}
			if n := len(st[0].rec.Step.ResponseIDs); n != 9 {
				t.Fatalf("%d response ids, want the whole answer's 9", n)
			}
			if e.backend.Calls() != 1 {
				t.Fatalf("backend calls %d", e.backend.Calls())
			}
		})
	}
}

// A call whose agent left is not held forever: the upstream request ends
// AbandonedCallTimeout later, and nothing is recorded (nothing came back).
func TestAbandonedCallTimeout(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.AbandonedCallTimeout = 100 * time.Millisecond })
	e.backend.SetDelay(3 * time.Second)
	ctx := giveUpOnceReceived(t, e)
	req, _ := http.NewRequestWithContext(ctx, "POST", e.srv.URL+"/sessions/ab:0/v1/chat/completions", strings.NewReader(chatBody))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the agent should have given up")
	}
	start := time.Now()
	if res := e.finish("ab:0", 0); res["num_steps"] != 0.0 {
		t.Fatalf("finish %v", res)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("finish waited %v for an abandoned call", d)
	}
}

// giveUpOnceReceived is an agent's context that ends once the backend has
// the call (the agent leaves while the backend works on it).
func giveUpOnceReceived(t *testing.T, e *env) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		defer cancel()
		for e.backend.Calls() == 0 && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
	}()
	return ctx
}
