package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest/gateway/gatewaytest"
)

// The periodic health checks: a worker whose /health fails is marked
// unhealthy and its sessions go to the other one with no error; once it
// answers again it is healthy and its sessions come back to it.
func TestHealthCheckLoop(t *testing.T) {
	fx := fixtures(t)
	b1, b2 := gatewaytest.NewBackend(fx), gatewaytest.NewBackend(fx)
	u1, u2 := httptest.NewServer(b1), httptest.NewServer(b2)
	defer u1.Close()
	defer u2.Close()
	gw, err := New(Config{Upstreams: []string{u1.URL, u2.URL}, HealthInterval: 20 * time.Millisecond}, &memOutput{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw.Handler())
	defer func() {
		srv.Close()
		_ = gw.Close(context.Background())
	}()
	post := func(sid string) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/sessions/"+sid+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", sid, resp.StatusCode)
		}
	}
	healthy := func() []bool {
		var out []bool
		for _, w := range gw.pool.list() {
			out = append(out, w.Healthy)
		}
		return out
	}
	round := func() (c1, c2 int64) {
		a1, a2 := b1.Calls(), b2.Calls()
		for i := range 20 {
			post(fmt.Sprintf("hc-%d:0", i))
		}
		return b1.Calls() - a1, b2.Calls() - a2
	}
	before1, before2 := round()
	if before1 == 0 || before2 == 0 {
		t.Fatalf("sessions not spread: %d and %d", before1, before2)
	}

	b1.SetHealthy(false)
	waitFor(t, func() bool { h := healthy(); return !h[0] && h[1] })
	if c1, c2 := round(); c1 != 0 || c2 != 20 {
		t.Fatalf("with worker 0 unhealthy: %d and %d calls, want 0 and 20", c1, c2)
	}

	b1.SetHealthy(true)
	waitFor(t, func() bool { h := healthy(); return h[0] && h[1] })
	if c1, c2 := round(); c1 != before1 || c2 != before2 {
		t.Fatalf("after recovery: %d and %d calls, want the sessions back as before (%d and %d)", c1, c2, before1, before2)
	}
}
