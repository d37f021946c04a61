package gateway

import (
	"strings"
	"testing"
)

// A session id used again — after finish and POST /sessions, after DELETE,
// in a gateway started again — writes new trajectory and step ids, so that
// ingest never takes the second incarnation's records for retries or late
// duplicates of the first's. A call to a finished session, or to one
// deleted after it finished, is refused until POST /sessions starts it
// again.
func TestSessionIDReuse(t *testing.T) {
	e := newEnv(t, nil)
	call := func(e *env, sid string, want int) {
		t.Helper()
		if code, b := e.do("POST", "/sessions/"+sid+"/v1/chat/completions", chatBody); code != want {
			t.Fatalf("call to %s: %d, want %d: %s", sid, code, want, b)
		}
	}
	call(e, "reuse:0", 200)
	call(e, "reuse:0", 200)
	first := e.finish("reuse:0", 1)
	call(e, "reuse:0", 409) // finished

	// Started again by POST /sessions, without DELETE.
	e.mustJSON("POST", "/sessions", `{"session_id":"reuse:0"}`, 200, nil)
	call(e, "reuse:0", 200)
	second := e.finish("reuse:0", 0)

	// Deleted once finished: refused, not a new trajectory nobody finishes.
	e.mustJSON("DELETE", "/sessions/reuse:0", "", 200, nil)
	call(e, "reuse:0", 409)
	e.mustJSON("POST", "/sessions/batch_delete", `{"session_ids":["reuse:0"]}`, 200, nil)
	call(e, "reuse:0", 409)
	e.mustJSON("POST", "/sessions", `{"session_id":"reuse:0"}`, 200, nil)
	call(e, "reuse:0", 200)
	third := e.finish("reuse:0", 1)

	// Deleted while open: the next call starts a new incarnation.
	call(e, "open:0", 200)
	e.mustJSON("DELETE", "/sessions/open:0", "", 200, nil)
	call(e, "open:0", 200)
	e.finish("open:0", 1)

	// A gateway started again knows nothing of the first one's sessions.
	e2 := newEnv(t, nil)
	call(e2, "reuse:0", 200)
	fourth := e2.finish("reuse:0", 1)

	recs := append(e.out.records(), e2.out.records()...)
	ds := decodeAll(t, recs)
	stepIDs, trajIDs := map[string]bool{}, map[string]bool{}
	numSteps := map[string]float64{}
	for _, d := range ds {
		if d.reason != "" {
			t.Fatalf("rejected %s: %s", d.reason, mustJSON(d.raw))
		}
		tid := d.raw["trajectory_id"].(string)
		switch d.raw["type"] {
		case "step":
			id := d.raw["step_id"].(string)
			if stepIDs[id] {
				t.Fatalf("step id %s written twice", id)
			}
			stepIDs[id] = true
			if !strings.HasPrefix(id, tid+"#") {
				t.Fatalf("step %s of trajectory %s", id, tid)
			}
		case "trajectory":
			if trajIDs[tid] {
				t.Fatalf("trajectory id %s written twice", tid)
			}
			trajIDs[tid] = true
			numSteps[tid] = d.raw["num_steps"].(float64)
		}
		want := strings.SplitN(tid, ":", 2)[0]
		if d.raw["task_id"] != want {
			t.Fatalf("task_id %v of %s", d.raw["task_id"], tid)
		}
	}
	if len(stepIDs) != 7 || len(trajIDs) != 5 { // open:0's first incarnation was never finished
		t.Fatalf("%d steps, %d trajectories; want 7 and 5", len(stepIDs), len(trajIDs))
	}
	for i, f := range []map[string]any{first, second, third, fourth} {
		tid := f["trajectory_id"].(string)
		if !strings.HasPrefix(tid, "reuse:0@") || numSteps[tid] != []float64{2, 1, 1, 1}[i] {
			t.Fatalf("incarnation %d: %v (trajectory has %v steps)", i, f, numSteps[tid])
		}
	}
}

// TestCreateOpenSessionAgain: POST /sessions for a session open with
// recorded calls answers 200 when it asks for what the session has (a
// retry, whatever its spacing and member order) and 409 when it asks for other metadata or
// sampling params: the steps recorded carry the session's identity, so
// it cannot change midway (it was answered 200 and silently kept).
// Finished, the id starts again with whatever it asks for.
func TestCreateOpenSessionAgain(t *testing.T) {
	e := newEnv(t, nil)
	const create = `{"session_id":"again:0","metadata":{"task_id":"t","group_size":4},"sampling_params":{"temperature":0.7}}`
	e.mustJSON("POST", "/sessions", create, 200, nil)
	e.mustJSON("POST", "/sessions/again:0/v1/chat/completions", chatBody, 200, nil)
	e.mustJSON("POST", "/sessions", create, 200, nil)
	e.mustJSON("POST", "/sessions", `{"session_id": "again:0", "sampling_params": {"temperature": 0.70}, "metadata": {"group_size": 4, "task_id": "t"}}`, 200, nil)
	for _, other := range []string{
		`{"session_id":"again:0","metadata":{"task_id":"u","group_size":4},"sampling_params":{"temperature":0.7}}`,
		`{"session_id":"again:0","metadata":{"task_id":"t","group_size":8},"sampling_params":{"temperature":0.7}}`,
		`{"session_id":"again:0","metadata":{"task_id":"t","group_size":4},"sampling_params":{"temperature":1.0}}`,
		`{"session_id":"again:0","metadata":{"task_id":"t","group_size":4,"note":"x"},"sampling_params":{"temperature":0.7}}`,
		`{"session_id":"again:0"}`,
	} {
		if code, b := e.do("POST", "/sessions", other); code != 409 {
			t.Errorf("POST /sessions %s for the open session: %d %s, want 409", other, code, b)
		}
	}
	e.finish("again:0", 1)
	e.mustJSON("POST", "/sessions", `{"session_id":"again:0","metadata":{"task_id":"u"}}`, 200, nil)
}
