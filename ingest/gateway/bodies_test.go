package gateway

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawPost opens a connection to the gateway and sends the head of a POST
// to path with the given Content-Length and the first n bytes of its
// body (of a JSON string, so that the whole body would be valid), and
// returns the connection, still open.
func rawPost(t *testing.T, e *env, path string, length, n int) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, length)
	if _, err := c.Write([]byte(head + strings.Repeat(" ", n))); err != nil {
		t.Fatal(err)
	}
	return c
}

// status reads the status of the answer on c, within a few seconds.
func status(t *testing.T, c net.Conn) int {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The request bodies held at once are bounded across requests: bodies
// that do not fit beside those being read are answered 503 at once, and
// their room comes back when a request ends; a Content-Length over the
// per-request bound is refused before a byte of the body is read.
func TestRequestBodiesBounded(t *testing.T) {
	const perRequest, all = 1 << 20, 2 << 20
	e := newEnv(t, func(c *Config) { c.MaxRequestBytes, c.MaxRequestBodiesBytes = perRequest, all })
	const path = "/sessions/big:0/v1/chat/completions"

	over := rawPost(t, e, path, 64<<20, 10)
	if got := status(t, over); got != http.StatusRequestEntityTooLarge {
		t.Fatalf("a Content-Length over the bound: %d, want 413 before the body is sent", got)
	}

	// Two bodies being sent, 900 KB each: most of the budget.
	slow1 := rawPost(t, e, path, 900<<10, 100<<10)
	slow2 := rawPost(t, e, path, 900<<10, 100<<10)
	time.Sleep(200 * time.Millisecond) // both read and held
	if held := e.gw.bodies.inUse(); held < 1800<<10 {
		t.Fatalf("%d bytes held for two 900 KB bodies", held)
	}
	third := rawPost(t, e, path, 500<<10, 0)
	if got := status(t, third); got != http.StatusServiceUnavailable {
		t.Fatalf("a body past what the others leave: %d, want 503", got)
	}
	if code, _ := e.do("POST", path, chatBody); code != http.StatusOK {
		t.Fatalf("a small call beside them: %d, want 200", code)
	}

	// One ends (its body is cut: 400); its room is free again.
	slow1.Close()
	deadline := time.Now().Add(5 * time.Second)
	for e.gw.bodies.inUse() > 1000<<10 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if held := e.gw.bodies.inUse(); held > 1000<<10 {
		t.Fatalf("%d bytes still held after one of two bodies ended", held)
	}
	fourth := rawPost(t, e, path, 500<<10, 500<<10)
	if got := status(t, fourth); got == http.StatusServiceUnavailable {
		t.Fatal("refused after the room came back")
	}
	slow2.Close()
	if !strings.Contains(metricsText(e), `rllm_gateway_errors_total{kind="bodies_full"} 1`) {
		t.Errorf("the refusal is not counted:\n%s", metricsText(e))
	}
}
