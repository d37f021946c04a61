package gateway

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TestEveryFixtureRecorded sends each fixture's request through a session
// and checks what the agent got (the upstream bytes, unchanged, since the
// fixtures ask for logprobs and token ids) and the Step record as ingest
// reads it: ids, logprobs, message, finish reason, or the dead-letter reason.
func TestEveryFixtureRecorded(t *testing.T) {
	e := newEnv(t, nil)
	for _, name := range sortedNames(e.fx) {
		f := e.fx[name]
		t.Run(name, func(t *testing.T) {
			e.t = t
			sid := "task-" + name + ":0"
			path := "/sessions/" + sid + f.Path
			if f.Path == "/generate" {
				path = "/sessions/" + sid + "/generate"
			}
			before := len(e.out.records())
			resp := e.req("POST", path, string(f.Request), "X-Fixture", name)
			if f.Streaming() {
				got := sseData(t, resp.Body)
				resp.Body.Close()
				if !reflect.DeepEqual(got, f.SSEData) {
					t.Fatalf("agent stream differs from upstream:\n got %q\nwant %q", got, f.SSEData)
				}
			} else {
				var b strings.Builder
				_, _ = fmt.Fprint(&b, readAll(t, resp))
				if b.String() != string(f.Response) {
					t.Fatalf("agent body differs from upstream")
				}
			}
			e.finish(sid, 1)
			recs := decodeAll(t, e.out.records()[before:])
			st := steps(recs)
			if len(st) != 1 || len(recs) != 2 {
				t.Fatalf("want 1 step + 1 trajectory, got %d records", len(recs))
			}
			s := st[0]
			x := f.Expect
			if x.PromptIDs != nil && !reflect.DeepEqual(ints(s.raw["prompt_ids"]), x.PromptIDs) {
				t.Errorf("prompt_ids %v, want %v", s.raw["prompt_ids"], x.PromptIDs)
			}
			if x.ResponseIDs != nil && !reflect.DeepEqual(ints(s.raw["response_ids"]), x.ResponseIDs) {
				t.Errorf("response_ids %v, want %v", s.raw["response_ids"], x.ResponseIDs)
			}
			if got := s.raw["finish_reason"]; got != x.FinishReason {
				t.Errorf("finish_reason %v, want %q", got, x.FinishReason)
			}
			meta, _ := s.raw["metadata"].(map[string]any)
			if x.DeadLetter != "" {
				if s.reason != x.DeadLetter {
					t.Errorf("ingest reason %q, want %q", s.reason, x.DeadLetter)
				}
				want := "missing_token_ids"
				if x.NullLogprobPositions != nil {
					want = "null_logprob"
				}
				if meta["gateway_reject"] != want {
					t.Errorf("metadata.gateway_reject %v, want %s", meta["gateway_reject"], want)
				}
				if x.NullLogprobPositions != nil && fmt.Sprint(meta["null_logprob_positions"]) != fmt.Sprint(toAny(x.NullLogprobPositions)) {
					t.Errorf("null positions %v, want %v", meta["null_logprob_positions"], x.NullLogprobPositions)
				}
				if x.NullLogprobPositions != nil {
					// Nulls in place: one entry per response token, the
					// others as the upstream gave them.
					lps, _ := s.raw["response_logprobs"].([]any)
					var nulls []int
					var rest []float64
					for i, v := range lps {
						if v == nil {
							nulls = append(nulls, i)
						} else {
							rest = append(rest, v.(float64))
						}
					}
					if len(lps) != len(ints(s.raw["response_ids"])) || fmt.Sprint(nulls) != fmt.Sprint(x.NullLogprobPositions) ||
						(x.ResponseLogprobs != nil && !reflect.DeepEqual(rest, x.ResponseLogprobs)) {
						t.Errorf("response_logprobs %v: want nulls at %v in place", lps, x.NullLogprobPositions)
					}
				}
			} else {
				if s.reason != "" {
					t.Fatalf("ingest rejects the step: %s: %s", s.reason, mustJSON(s.raw))
				}
				if !reflect.DeepEqual(floats(s.raw["response_logprobs"]), x.ResponseLogprobs) {
					t.Errorf("logprobs %v, want %v", s.raw["response_logprobs"], x.ResponseLogprobs)
				}
				if s.rec.Step.PolicyVersion != 0 || s.rec.Step.StepIndex != 0 {
					t.Errorf("policy %d index %d", s.rec.Step.PolicyVersion, s.rec.Step.StepIndex)
				}
			}
			if x.ResponseMessage != nil {
				if got := lastMessage(t, s); !jsonEqual(got, x.ResponseMessage) {
					t.Errorf("response message %s, want %s", got, x.ResponseMessage)
				}
				var req struct{ Messages []json.RawMessage }
				_ = json.Unmarshal(f.Request, &req)
				if msgs, _ := s.raw["messages"].([]any); len(msgs) != len(req.Messages)+1 {
					t.Errorf("messages: %d, want the request's %d + 1", len(msgs), len(req.Messages))
				}
			}
			if x.Choices > 1 && meta["n"] != float64(x.Choices) {
				t.Errorf("metadata.n %v, want %d", meta["n"], x.Choices)
			}
			tr := recs[1] // records reach the output in any order
			if recs[0].raw["type"] == "trajectory" {
				tr = recs[0]
			}
			if tr.raw["type"] != "trajectory" || tr.reason != "" || tr.raw["num_steps"] != 1.0 || tr.raw["task_id"] != "task-"+name {
				t.Errorf("trajectory %s (reason %q)", mustJSON(tr.raw), tr.reason)
			}
			if at, ok := schemas.FinishedAt(tr.rec.Trajectory.Metadata); !ok || time.Since(at) > time.Minute || time.Since(at) < 0 {
				t.Errorf("trajectory metadata.finished_at %v (%v), want when the finish came", at, ok)
			}
			// A trajectory with a step written to be dead-lettered says so:
			// ingest closes its group without waiting for it.
			if want := int64(min(len(x.DeadLetter), 1)); tr.rec.Trajectory.RejectedSteps != want {
				t.Errorf("trajectory rejected_steps %d, want %d", tr.rec.Trajectory.RejectedSteps, want)
			}
		})
	}
}

func toAny(v []int) []any {
	out := make([]any, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

func sortedNames[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sortStrings(out)
	return out
}
