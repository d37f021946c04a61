package gateway

import (
	"fmt"
	"strings"
	"testing"
)

// The in-memory traces and finished sessions stay within MaxTraceBytes:
// finished sessions go first, oldest first (their traces, then the session,
// whose id is then refused as after DELETE), then open sessions' oldest
// traces; a finished session no longer keeps its last step's token ids;
// the output still has every record.
func TestTraceByteBound(t *testing.T) {
	// One call's trace, measured.
	probe := newEnv(t, nil)
	probe.mustJSON("POST", "/sessions/probe:0/v1/chat/completions", chatBody, 200, nil)
	probe.finish("probe:0", 1)
	_, one := probe.gw.sessions.usage()
	one -= probe.gw.sessions.get("probe:0").footprint()
	if one < 500 {
		t.Fatalf("a trace of %d bytes?", one)
	}

	limit := 5*one + one/2
	e := newEnv(t, func(c *Config) { c.MaxTraceBytes = limit })
	check := func(when string) {
		t.Helper()
		if _, b := e.gw.sessions.usage(); b > limit {
			t.Fatalf("%s: %d bytes held, bound %d", when, b, limit)
		}
	}
	call := func(sid string, want int) {
		t.Helper()
		if code, b := e.do("POST", "/sessions/"+sid+"/v1/chat/completions", chatBody); code != want {
			t.Fatalf("call to %s: %d, want %d: %s", sid, code, want, b)
		}
	}
	traceCount := func(sid string) int {
		t.Helper()
		var info SessionInfo
		e.mustJSON("GET", "/sessions/"+sid, "", 200, &info)
		return info.TraceCount
	}
	for _, sid := range []string{"a:0", "b:0"} {
		call(sid, 200)
		call(sid, 200)
		e.finish(sid, 1)
		check("finished " + sid)
		s := e.gw.sessions.get(sid)
		s.mu.Lock()
		last := s.last
		s.mu.Unlock()
		if last != nil {
			t.Fatalf("finished session %s keeps its last step's %d+%d token ids", sid, len(last.prompt), len(last.answer))
		}
	}
	// An open session grows: a's traces go, then a itself, then b's.
	call("c:0", 200)
	e.finish("c:0", 0) // (finished after a and b: evicted after them)
	for i := range 6 {
		sid := "d:0"
		call(sid, 200)
		e.mustJSON("POST", "/sessions/"+sid+"/finish", `{"reward":1}`, 200, nil)
		e.mustJSON("POST", "/sessions", `{"session_id":"d:0"}`, 200, nil) // the same id again, a new incarnation
		check(fmt.Sprintf("d call %d", i))
	}
	if code, _ := e.do("GET", "/sessions/a:0", ""); code != 404 {
		t.Fatalf("the oldest finished session is still held: %d", code)
	}
	call("a:0", 409) // evicted once finished: refused as after DELETE
	// A repeat of its finish (a client that lost the answer) is answered
	// as the first one was; a different body is a conflict; an id never
	// seen is not found.
	var fin struct {
		TrajectoryID string `json:"trajectory_id"`
		NumSteps     int64  `json:"num_steps"`
		Durable      bool   `json:"durable"`
	}
	e.mustJSON("POST", "/sessions/a:0/finish", `{"reward": 1, "is_correct": true, "termination_reason": "env_done"}`, 200, &fin)
	if !strings.HasPrefix(fin.TrajectoryID, "a:0@") || fin.NumSteps != 2 || !fin.Durable {
		t.Fatalf("repeated finish of an evicted session: %+v", fin)
	}
	e.mustJSON("POST", "/sessions/a:0/finish", `{"reward":0,"is_correct":true,"termination_reason":"env_done"}`, 409, nil)
	e.mustJSON("POST", "/sessions/never:0/finish", `{"reward":1}`, 404, nil)

	// Open sessions only: their oldest traces go.
	for range 8 {
		call("open:0", 200)
		call("open:1", 200)
	}
	e.mustJSON("POST", "/admin/flush", "", 200, nil)
	waitFor(t, func() bool { n, _ := e.gw.sessions.usage(); return n == traceCount("open:0")+traceCount("open:1") })
	check("open sessions")
	if n0, n1 := traceCount("open:0"), traceCount("open:1"); n0+n1 > 5 || n0+n1 < 4 || n0 < 2 || n1 < 2 {
		t.Fatalf("open sessions hold %d and %d traces, want the newest ~5 between them", n0, n1)
	}
	e.finish("open:0", 1)
	e.finish("open:1", 1)
	if st := steps(decodeAll(t, e.out.records())); len(st) != 4+1+6+16 {
		t.Fatalf("%d steps in the output, want 27", len(st))
	}
}
