package gateway

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// A record the output refuses (RefusedError) is replaced by its stub,
// which ingest dead-letters under the record's own ids, and the others of
// its batch are written: nothing stalls behind it. Should the output
// refuse the stub too, it is dropped, counted, and still nothing stalls.
func TestOutputRefusesRecord(t *testing.T) {
	for _, refuseStubs := range []bool{false, true} {
		t.Run(fmt.Sprint("refuse-stubs=", refuseStubs), func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.FinishTimeout = 5 * time.Second })
			e.out.mu.Lock()
			e.out.refuse = func(r Record) bool {
				return bytes.Contains(r.Line, []byte(`"b#0"`)) && (refuseStubs || !bytes.Contains(r.Line, []byte("gateway_reject")))
			}
			e.out.mu.Unlock()
			var lines strings.Builder
			for _, id := range []string{"a", "b", "c"} {
				fmt.Fprintf(&lines, `{"type":"step","step_id":"%s#0","task_id":"t","trajectory_id":"%s","step_index":0,"policy_version":1,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-0.5]}`+"\n", id, id)
			}
			start := time.Now()
			var res map[string]int
			e.mustJSON("POST", "/records", lines.String(), 200, &res)
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("POST /records took %v behind a refused record", took)
			}
			e.mustJSON("POST", "/sessions/after:0/v1/chat/completions", chatBody, 200, nil)
			e.finish("after:0", 1)
			byID := map[string]decoded{}
			for _, d := range decodeAll(t, e.out.records()) {
				byID[fmt.Sprint(d.raw["step_id"])] = d
			}
			for _, id := range []string{"a#0", "c#0"} {
				if d, ok := byID[id]; !ok || d.reason != "" {
					t.Fatalf("%s: written %v, reason %q", id, ok, d.reason)
				}
			}
			stub, ok := byID["b#0"]
			switch {
			case refuseStubs && ok:
				t.Fatalf("a refused stub was written: %v", stub.raw)
			case !refuseStubs && (!ok || stub.reason != "missing_field" || stub.raw["trajectory_id"] != "b" ||
				stub.raw["metadata"].(map[string]any)["gateway_reject"] != "too_large"):
				t.Fatalf("the refused record's stub: %v (reason %q)", stub.raw, stub.reason)
			}
			want := `rllm_gateway_errors_total{kind="output_refused"} 1`
			if refuseStubs {
				want = `rllm_gateway_errors_total{kind="output_refused"} 2`
			}
			if !strings.Contains(metricsText(e), want) {
				t.Fatalf("want %s in\n%s", want, metricsText(e))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if err := e.gw.queue.drain(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// MaxRecordBytes: a recorded step larger is written as its stub (and is
// no parent of the next call's delta); a POST /records line larger is
// refused whole (413); a CR in a posted line is taken out; a finish whose
// trajectory record would be larger is refused and may be repeated
// smaller.
func TestMaxRecordBytes(t *testing.T) {
	// The size of the fixture's step and trajectory lines.
	e0 := newEnv(t, nil)
	e0.mustJSON("POST", "/sessions/m:0/v1/chat/completions", chatBody, 200, nil)
	e0.finish("m:0", 1)
	var stepLen, trajLen int
	for _, r := range e0.out.records() {
		if bytes.Contains(r.Line, []byte(`"type":"step"`)) {
			stepLen = len(r.Line)
		} else {
			trajLen = len(r.Line)
		}
	}
	if stepLen <= trajLen+100 {
		t.Fatalf("fixture: step %d bytes, trajectory %d", stepLen, trajLen)
	}
	limit := trajLen + 100
	e := newEnv(t, func(c *Config) { c.MaxRecordBytes = limit })
	e.mustJSON("POST", "/sessions/m:0/v1/chat/completions", chatBody, 200, nil)
	e.mustJSON("POST", "/sessions/m:0/v1/chat/completions", chatBody, 200, nil)
	big := `{"reward":1,"metadata":{"notes":"` + strings.Repeat("x", limit) + `"}}`
	if code, b := e.do("POST", "/sessions/m:0/finish", big); code != 413 || !strings.Contains(string(b), "too_large") {
		t.Fatalf("a finish over the bound: %d %s", code, b)
	}
	e.finish("m:0", 1)
	st := steps(decodeAll(t, e.out.records()))
	if len(st) != 2 {
		t.Fatalf("%d steps", len(st))
	}
	for i, s := range st {
		meta, _ := s.raw["metadata"].(map[string]any)
		if s.reason != "missing_field" || meta["gateway_reject"] != "too_large" || s.raw["step_index"] != float64(i) {
			t.Fatalf("step %d: %v (reason %q)", i, s.raw, s.reason)
		}
		if _, ok := s.raw["parent_step_id"]; ok {
			t.Fatalf("step %d is a delta of a stub: %v", i, s.raw)
		}
	}
	if !strings.Contains(metricsText(e), `rllm_gateway_rejected_steps_total{reason="too_large"} 2`) {
		t.Fatalf("not counted:\n%s", metricsText(e))
	}
	n := len(e.out.records())
	line := `{"type":"step","step_id":"p#0","x":"` + strings.Repeat("y", limit) + `"}`
	if code, b := e.do("POST", "/records", `{"type":"step","step_id":"q#0"}`+"\n"+line+"\n"); code != 413 || !strings.Contains(string(b), `"line":2`) {
		t.Fatalf("a posted line over the bound: %d %s", code, b)
	}
	e.mustJSON("POST", "/records", "{\"type\":\"step\",\r\"step_id\":\"r#0\"}\r\n", 200, nil)
	recs := e.out.records()
	if len(recs) != n+1 || string(recs[n].Line) != `{"type":"step","step_id":"r#0"}` {
		t.Fatalf("after the posts: %d records (want %d), last %q", len(recs), n+1, recs[len(recs)-1].Line)
	}
}
