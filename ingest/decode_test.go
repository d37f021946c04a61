package ingest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

const goodStep = `{"type":"step","step_id":"s1","task_id":"t1","trajectory_id":"tr1","step_index":0,"policy_version":3,"prompt_ids":[1,2,3],"response_ids":[4,5],"response_logprobs":[-0.5,-1.25]}`
const goodTraj = `{"type":"trajectory","trajectory_id":"tr1","task_id":"t1","reward":1.0,"num_steps":2}`

// with replaces or adds fields of a JSON object (raw values).
func with(base string, kv ...string) string {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(base), &m); err != nil {
		panic(err)
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "<delete>" {
			delete(m, kv[i])
			continue
		}
		m[kv[i]] = json.RawMessage(kv[i+1])
	}
	// Assemble by hand: values may hold Python tokens that encoding/json
	// refuses to write.
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		b.Write(m[k])
	}
	b.WriteByte('}')
	return b.String()
}

// TestDecodePromptDelta: a step may send its prompt as a delta of an
// earlier step (parent_step_id, prompt_delta_ids) instead of prompt_ids.
func TestDecodePromptDelta(t *testing.T) {
	var d Decoder
	line := with(with(with(goodStep, "prompt_ids", "<delete>"), "prompt_delta_ids", "[7,8]"), "parent_step_id", `"s0"`)
	r, err := d.Decode([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if s := r.Step; s.PromptIDs != nil || s.ParentStepID != "s0" || len(s.PromptDeltaIDs) != 2 || s.PromptDeltaIDs[1] != 8 {
		t.Fatalf("%+v", s)
	}
	// The decoder is reused: a whole-prompt step after it carries no delta.
	r, err = d.Decode([]byte(goodStep))
	if err != nil || r.Step.ParentStepID != "" || r.Step.PromptDeltaIDs != nil || len(r.Step.PromptIDs) != 3 {
		t.Fatalf("%+v %v", r.Step, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	cases := []struct {
		name  string
		line  string
		want  schemas.Reason
		field string
	}{
		{"truncated", goodStep[:40], schemas.ReasonMalformedJSON, ""},
		{"trailing garbage", goodStep + "x", schemas.ReasonMalformedJSON, ""},
		{"two objects", goodStep + goodStep, schemas.ReasonMalformedJSON, ""},
		{"bare word", "hello", schemas.ReasonMalformedJSON, ""},
		{"single quotes", `{'type':'step'}`, schemas.ReasonMalformedJSON, ""},
		{"trailing comma", `{"type":"step",}`, schemas.ReasonMalformedJSON, ""},
		{"raw control char in string", "{\"type\":\"st\x01ep\"}", schemas.ReasonMalformedJSON, ""},
		{"leading zero number", with(goodStep, "step_index", "0") + `{"a":01}`, schemas.ReasonMalformedJSON, ""},
		{"array", `[1,2,3]`, schemas.ReasonNotAnObject, ""},
		{"string", `"step"`, schemas.ReasonNotAnObject, ""},
		{"number", `42`, schemas.ReasonNotAnObject, ""},
		{"null", `null`, schemas.ReasonNotAnObject, ""},
		{"no type", with(goodStep, "type", "<delete>"), schemas.ReasonMissingField, "type"},
		{"type null", with(goodStep, "type", "null"), schemas.ReasonMissingField, "type"},
		{"type number", with(goodStep, "type", "1"), schemas.ReasonWrongType, "type"},
		{"unknown type", with(goodStep, "type", `"episode"`), schemas.ReasonUnknownType, "type"},
		{"no step_id", with(goodStep, "step_id", "<delete>"), schemas.ReasonMissingField, "step_id"},
		{"null step_id", with(goodStep, "step_id", "null"), schemas.ReasonMissingField, "step_id"},
		{"empty step_id", with(goodStep, "step_id", `""`), schemas.ReasonInvalidValue, "step_id"},
		{"numeric task_id", with(goodStep, "task_id", `7`), schemas.ReasonWrongType, "task_id"},
		{"no response_logprobs", with(goodStep, "response_logprobs", "<delete>"), schemas.ReasonMissingField, "response_logprobs"},
		{"string step_index", with(goodStep, "step_index", `"0"`), schemas.ReasonWrongType, "step_index"},
		{"fractional step_index", with(goodStep, "step_index", `1.5`), schemas.ReasonWrongType, "step_index"},
		{"negative step_index", with(goodStep, "step_index", `-1`), schemas.ReasonInvalidValue, "step_index"},
		{"policy_version over int64", with(goodStep, "policy_version", `9223372036854775808`), schemas.ReasonInvalidValue, "policy_version"},
		{"policy_version 1e30", with(goodStep, "policy_version", `1e30`), schemas.ReasonInvalidValue, "policy_version"},
		{"NaN step_index", with(goodStep, "step_index", `NaN`), schemas.ReasonWrongType, "step_index"},
		{"negative policy_version", with(goodStep, "policy_version", `-2`), schemas.ReasonInvalidValue, "policy_version"},
		{"prompt_ids not array", with(goodStep, "prompt_ids", `"1 2 3"`), schemas.ReasonWrongType, "prompt_ids"},
		{"no prompt at all", with(goodStep, "prompt_ids", "<delete>"), schemas.ReasonMissingField, "prompt_ids"},
		{"prompt and delta", with(with(goodStep, "prompt_delta_ids", "[4]"), "parent_step_id", `"s0"`), schemas.ReasonInvalidValue, "prompt_delta_ids"},
		{"delta without parent", with(with(goodStep, "prompt_ids", "<delete>"), "prompt_delta_ids", "[4]"), schemas.ReasonMissingField, "parent_step_id"},
		{"parent without delta", with(with(goodStep, "prompt_ids", "<delete>"), "parent_step_id", `"s0"`), schemas.ReasonMissingField, "prompt_delta_ids"},
		{"parent is the step", with(with(with(goodStep, "prompt_ids", "<delete>"), "prompt_delta_ids", "[4]"), "parent_step_id", `"s1"`), schemas.ReasonInvalidParent, "parent_step_id"},
		{"parent not a string", with(with(with(goodStep, "prompt_ids", "<delete>"), "prompt_delta_ids", "[4]"), "parent_step_id", `7`), schemas.ReasonWrongType, "parent_step_id"},
		{"messages and messages_added", with(with(with(with(with(goodStep, "prompt_ids", "<delete>"), "prompt_delta_ids", "[4]"), "parent_step_id", `"s0"`), "messages_added", `[{"role":"tool"}]`), "messages", `[{"role":"user"}]`), schemas.ReasonInvalidValue, "messages_added"},
		{"messages_added without parent", with(goodStep, "messages_added", `[{"role":"tool"}]`), schemas.ReasonMissingField, "parent_step_id"},
		{"messages_added not objects", with(with(with(with(goodStep, "prompt_ids", "<delete>"), "prompt_delta_ids", "[4]"), "parent_step_id", `"s0"`), "messages_added", `[1]`), schemas.ReasonWrongType, "messages_added"},
		{"delta id out of range", with(with(with(goodStep, "prompt_ids", "<delete>"), "prompt_delta_ids", "[-1]"), "parent_step_id", `"s0"`), schemas.ReasonInvalidTokenID, "prompt_delta_ids"},
		{"prompt id string", with(goodStep, "prompt_ids", `[1,"2"]`), schemas.ReasonWrongType, "prompt_ids"},
		{"prompt id null", with(goodStep, "prompt_ids", `[1,null]`), schemas.ReasonWrongType, "prompt_ids"},
		{"prompt id fractional", with(goodStep, "prompt_ids", `[1,2.5]`), schemas.ReasonWrongType, "prompt_ids"},
		{"negative token id", with(goodStep, "response_ids", `[4,-5]`), schemas.ReasonInvalidTokenID, "response_ids"},
		{"token id over int32", with(goodStep, "response_ids", `[4,2147483648]`), schemas.ReasonInvalidTokenID, "response_ids"},
		{"huge token id", with(goodStep, "response_ids", `[4,1e30]`), schemas.ReasonInvalidTokenID, "response_ids"},
		{"NaN logprob", strings.Replace(goodStep, "-1.25", "NaN", 1), schemas.ReasonNonFinite, "response_logprobs"},
		{"Infinity logprob", strings.Replace(goodStep, "-1.25", "-Infinity", 1), schemas.ReasonNonFinite, "response_logprobs"},
		{"overflow logprob", strings.Replace(goodStep, "-1.25", "-1e999", 1), schemas.ReasonNonFinite, "response_logprobs"},
		{"float32 overflow logprob", strings.Replace(goodStep, "-1.25", "-1e39", 1), schemas.ReasonNonFinite, "response_logprobs"},
		{"string logprob", with(goodStep, "response_logprobs", `[-0.5,"x"]`), schemas.ReasonWrongType, "response_logprobs"},
		{"short logprobs", with(goodStep, "response_logprobs", `[-0.5]`), schemas.ReasonLengthMismatch, "response_logprobs"},
		{"long token_versions", with(goodStep, "token_versions", `[1,2,3]`), schemas.ReasonLengthMismatch, "token_versions"},
		{"negative token_version", with(goodStep, "token_versions", `[1,-2]`), schemas.ReasonInvalidValue, "token_versions"},
		{"long token_version runs", with(goodStep, "token_versions", `[[1,2],3]`), schemas.ReasonLengthMismatch, "token_versions"},
		{"empty token_version run", with(goodStep, "token_versions", `[[1,0],[2,2]]`), schemas.ReasonInvalidValue, "token_versions"},
		{"token_version run of three", with(goodStep, "token_versions", `[[1,1,1],2]`), schemas.ReasonInvalidValue, "token_versions"},
		{"huge token_version run", with(goodStep, "token_versions", `[[1,1e15]]`), schemas.ReasonInvalidValue, "token_versions"},
		{"negative token_version in a run", with(goodStep, "token_versions", `[[-1,2]]`), schemas.ReasonInvalidValue, "token_versions"},
		{"short teacher", with(goodStep, "teacher_logprobs", `[-1]`), schemas.ReasonLengthMismatch, "teacher_logprobs"},
		{"NaN teacher", with(goodStep, "teacher_logprobs", `[-1,NaN]`), schemas.ReasonNonFinite, "teacher_logprobs"},
		{"messages object", with(goodStep, "messages", `{"role":"user"}`), schemas.ReasonWrongType, "messages"},
		{"messages of strings", with(goodStep, "messages", `["hi"]`), schemas.ReasonWrongType, "messages"},
		{"metadata array", with(goodStep, "metadata", `[1]`), schemas.ReasonWrongType, "metadata"},
		{"done string", with(goodStep, "done", `"yes"`), schemas.ReasonWrongType, "done"},
		{"bad created_at", with(goodStep, "created_at", `"yesterday"`), schemas.ReasonInvalidValue, "created_at"},
		{"NaN step reward", with(goodStep, "reward", `NaN`), schemas.ReasonNonFinite, "reward"},
		{"traj no reward", with(goodTraj, "reward", "<delete>"), schemas.ReasonMissingField, "reward"},
		{"traj reward string", with(goodTraj, "reward", `"1"`), schemas.ReasonWrongType, "reward"},
		{"traj reward Infinity", with(goodTraj, "reward", `Infinity`), schemas.ReasonNonFinite, "reward"},
		{"traj reward overflow", with(goodTraj, "reward", `1e400`), schemas.ReasonNonFinite, "reward"},
		{"traj num_steps 0", with(goodTraj, "num_steps", `0`), schemas.ReasonInvalidValue, "num_steps"},
		{"traj no num_steps", with(goodTraj, "num_steps", "<delete>"), schemas.ReasonMissingField, "num_steps"},
		{"traj group_size 0", with(goodTraj, "group_size", `0`), schemas.ReasonInvalidValue, "group_size"},
		{"traj group_size over int32", with(goodTraj, "group_size", `4294967298`), schemas.ReasonInvalidValue, "group_size"},
		{"traj rejected_steps negative", with(goodTraj, "rejected_steps", `-1`), schemas.ReasonInvalidValue, "rejected_steps"},
		{"traj rejected_steps string", with(goodTraj, "rejected_steps", `"1"`), schemas.ReasonWrongType, "rejected_steps"},
		{"traj num_steps over int32", with(goodTraj, "num_steps", `2147483648`), schemas.ReasonInvalidValue, "num_steps"},
		{"step_index over int32", with(goodStep, "step_index", `2147483648`), schemas.ReasonInvalidValue, "step_index"},
		{"traj signals array", with(goodTraj, "signals", `[1]`), schemas.ReasonWrongType, "signals"},
		{"traj signal string", with(goodTraj, "signals", `{"a":"b"}`), schemas.ReasonWrongType, "signals"},
		{"traj signal NaN", with(goodTraj, "signals", `{"a":NaN}`), schemas.ReasonNonFinite, "signals"},
		{"traj is_correct number", with(goodTraj, "is_correct", `1`), schemas.ReasonWrongType, "is_correct"},
		{"traj empty task", with(goodTraj, "task_id", `""`), schemas.ReasonInvalidValue, "task_id"},
		{"deep nesting", with(goodStep, "x", strings.Repeat("[", 600)+strings.Repeat("]", 600)), schemas.ReasonTooLarge, ""},
	}
	var d Decoder
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := d.Decode([]byte(tc.line))
			var re *schemas.RejectError
			if !errors.As(err, &re) {
				t.Fatalf("Decode(%s) = %v, want reject %s", tc.line, err, tc.want)
			}
			if re.Reason != tc.want || re.Field != tc.field {
				t.Fatalf("Decode(%s): reason %s field %q (%v), want %s field %q", tc.line, re.Reason, re.Field, re, tc.want, tc.field)
			}
		})
	}
}

func TestDecodeStep(t *testing.T) {
	line := `{"metadata":{"k":[1,{"x":null}]},"type":"step","step_id":"s\u00e9","task_id":"t1","role":"solver","trajectory_id":"tr1",` +
		`"step_index":1.0,"policy_version":1e1,"prompt_ids":[],"response_ids":[0,2147483647],"response_logprobs":[-0.5,-1.25e-3],` +
		`"token_versions":[9,10],"teacher_logprobs":[-0.25,0],"messages":[{"role":"assistant","content":"hi","tool_calls":[{"id":"c"}]}],` +
		`"reward":0.5,"done":true,"finish_reason":"stop","model":"m","created_at":"2026-01-02T03:04:05.123456789+01:00","unknown":{"deep":[1,2]},"num_steps":"ignored for steps"}`
	var d Decoder
	rec, err := d.Decode([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := schemas.Step{
		StepID: "sé", TaskID: "t1", Role: "solver", TrajectoryID: "tr1", StepIndex: 1, PolicyVersion: 10,
		PromptIDs: []int32{}, ResponseIDs: []int32{0, math.MaxInt32}, ResponseLogprobs: []float32{-0.5, -1.25e-3},
		TokenVersions: []int64{9, 10}, HasTokenVersions: true, TeacherLogprobs: []float32{-0.25, 0}, HasTeacher: true,
		Messages: []byte(`[{"role":"assistant","content":"hi","tool_calls":[{"id":"c"}]}]`),
		Metadata: []byte(`{"k":[1,{"x":null}]}`),
		Reward:   0.5, HasReward: true, Done: true, HasDone: true, FinishReason: "stop", Model: "m",
		CreatedAt: 1767319445123456, HasCreatedAt: true,
	}
	if rec.Type != schemas.TypeStep || !reflect.DeepEqual(*rec.Step, want) {
		t.Fatalf("got %+v\nwant %+v", *rec.Step, want)
	}
	if rec.Step.Key() != "t1:solver" {
		t.Fatalf("group key %q", rec.Step.Key())
	}
	// The decoder's buffers are reused: a second decode must not change
	// the first record.
	if _, err := d.Decode([]byte(strings.ReplaceAll(goodStep, "[4,5]", "[7,7]"))); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*rec.Step, want) {
		t.Fatal("first record changed by a later Decode")
	}
}

func TestIntValue(t *testing.T) {
	cases := []struct {
		tok  string
		want int64
		err  error
	}{
		{"0", 0, nil}, {"-0", 0, nil}, {"7", 7, nil}, {"-12", -12, nil}, {"3.0", 3, nil}, {"3.000", 3, nil},
		{"1e3", 1000, nil}, {"1E+3", 1000, nil}, {"2.5e1", 25, nil}, {"9.21e18", 9210000000000000000, nil},
		{"9223372036854775807", math.MaxInt64, nil}, {"-9223372036854775808", math.MinInt64, nil},
		{"0.0e5", 0, nil}, {"0.000", 0, nil}, {"1200e-2", 12, nil},
		{"1.5", 0, errNotInteger}, {"1e-400", 0, errNotInteger}, {"1.0000000000000000001", 0, errNotInteger},
		{"1.00000000000000000000000000000000001", 0, errNotInteger}, {"NaN", 0, errNotInteger}, {"-Infinity", 0, errNotInteger},
		{"9223372036854775808", 0, errRange}, {"1e400", 0, errRange}, {"1e19", 0, errRange},
		{"123456789012345678901234567890", 0, errRange}, {"18446744073709551616", 0, errRange},
	}
	for _, tc := range cases {
		got, err := intValue([]byte(tc.tok))
		if err != tc.err || got != tc.want {
			t.Errorf("intValue(%s) = %d, %v; want %d, %v", tc.tok, got, err, tc.want, tc.err)
		}
	}
}

// token_versions may come run-length encoded: [version, count] pairs,
// mixed with single versions.
func TestDecodeTokenVersionRuns(t *testing.T) {
	var d Decoder
	for in, want := range map[string]string{
		`[[2,2]]`: "[2 2]", `[[2,1],3]`: "[2 3]", `[2,[3,1]]`: "[2 3]", `[2,3]`: "[2 3]",
	} {
		rec, err := d.Decode([]byte(with(goodStep, "token_versions", in)))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if got := fmt.Sprint(rec.Step.TokenVersions); got != want || !rec.Step.HasTokenVersions {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

func TestDecodeIntBounds(t *testing.T) {
	var d Decoder
	for _, v := range []string{"9223372036854775807", "0", "9007199254740993", "1e18", "20.000"} {
		rec, err := d.Decode([]byte(with(goodStep, "policy_version", v)))
		if err != nil {
			t.Fatalf("policy_version %s: %v", v, err)
		}
		want, _ := strconv.ParseFloat(v, 64)
		if v == "9223372036854775807" && rec.Step.PolicyVersion != math.MaxInt64 ||
			v == "9007199254740993" && rec.Step.PolicyVersion != 9007199254740993 ||
			float64(rec.Step.PolicyVersion) != want && len(v) < 16 {
			t.Fatalf("policy_version %s decoded as %d", v, rec.Step.PolicyVersion)
		}
	}
}

func TestDecodeTrajectory(t *testing.T) {
	line := with(goodTraj, "group_id", `"g"`, "signals", `{"acc":1,"fmt":-0.5}`, "is_correct", "false", "group_size", "4",
		"termination_reason", `"TIMEOUT"`, "metadata", `{"a":"b"}`, "prompt_ids", `"ignored"`, "rejected_steps", "1")
	var d Decoder
	rec, err := d.Decode([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	tr := rec.Trajectory
	if rec.Type != schemas.TypeTrajectory || tr.Key() != "g" || tr.GroupSize != 4 || tr.NumSteps != 2 || tr.Reward != 1 ||
		!tr.HasIsCorrect || tr.IsCorrect || tr.TerminationReason != "TIMEOUT" || string(tr.Metadata) != `{"a":"b"}` || tr.RejectedSteps != 1 {
		t.Fatalf("got %+v", tr)
	}
	if len(tr.Signals) != 2 || tr.Signals[0] != (schemas.Signal{Name: "acc", Value: 1}) || tr.Signals[1] != (schemas.Signal{Name: "fmt", Value: -0.5}) {
		t.Fatalf("signals %+v", tr.Signals)
	}
}

// TestDecodeTerminationReason: rLLM's lower-case reasons (and any other
// spelling of the same names) are stored in their canonical upper-case
// form; other values are kept as sent.
func TestDecodeTerminationReason(t *testing.T) {
	cases := []struct{ in, want string }{
		{"max_prompt_length_exceeded", "MAX_PROMPT_LENGTH_EXCEEDED"},
		{"max_response_length_exceeded", "MAX_RESPONSE_LENGTH_EXCEEDED"},
		{"env_done", "ENV_DONE"},
		{"max_turns_exceeded", "MAX_TURNS_EXCEEDED"},
		{"timeout", "TIMEOUT"},
		{"unknown", "UNKNOWN"},
		{"error", "ERROR"},
		{"ENV_DONE", "ENV_DONE"},
		{"Env_Done", "ENV_DONE"},
		{"TerminationReason.ENV_DONE", "ENV_DONE"},
		{"TerminationReason.timeout", "TIMEOUT"},
		{"TerminationReason.", "TerminationReason."},
		{"env_done ", "env_done "},
		{"envdone", "envdone"},
		{"MAX_TOKENS", "MAX_TOKENS"},
		{"custom reason", "custom reason"},
		{"", ""},
		{"érror", "érror"},
	}
	var d Decoder
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			v, _ := json.Marshal(c.in)
			rec, err := d.Decode([]byte(with(goodTraj, "termination_reason", string(v))))
			if err != nil {
				t.Fatal(err)
			}
			if got := rec.Trajectory.TerminationReason; got != c.want {
				t.Fatalf("termination_reason %q stored as %q, want %q", c.in, got, c.want)
			}
		})
	}
}

// TestDecodeIsCorrect: is_correct is a trajectory field (true, false or
// null); on a step record it is ignored, whatever its value, so rLLM
// step dicts that carry it are never rejected for it.
func TestDecodeIsCorrect(t *testing.T) {
	cases := []struct {
		name         string
		line         string
		has, correct bool
	}{
		{"traj true", with(goodTraj, "is_correct", "true"), true, true},
		{"traj false", with(goodTraj, "is_correct", "false"), true, false},
		{"traj null", with(goodTraj, "is_correct", "null"), false, false},
		{"traj absent", goodTraj, false, false},
		{"traj lower-case reason and is_correct", with(goodTraj, "is_correct", "true", "termination_reason", `"env_done"`), true, true},
		{"step true", with(goodStep, "is_correct", "true"), false, false},
		{"step string", with(goodStep, "is_correct", `"yes"`), false, false},
	}
	var d Decoder
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec, err := d.Decode([]byte(c.line))
			if err != nil {
				t.Fatal(err)
			}
			if rec.Type == schemas.TypeStep {
				return
			}
			if tr := rec.Trajectory; tr.HasIsCorrect != c.has || tr.IsCorrect != c.correct {
				t.Fatalf("is_correct: has %v value %v, want %v %v", tr.HasIsCorrect, tr.IsCorrect, c.has, c.correct)
			}
		})
	}
}

func TestDecodeRepairsRawJSONEscapes(t *testing.T) {
	var d Decoder
	line := with(goodStep, "metadata", `{"lone":"\ud800x","pair":"\ud83d\ude00","kept":"\\ud800","\udc00":1}`)
	rec, err := d.Decode([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"lone":"\ufffdx","pair":"\ud83d\ude00","kept":"\\ud800","\ufffd":1}`
	if got := string(rec.Step.Metadata); got != want || rec.Repaired == 0 {
		t.Fatalf("metadata %s (repaired %d), want %s", got, rec.Repaired, want)
	}
	var m map[string]any
	if err := json.Unmarshal(rec.Step.Metadata, &m); err != nil || m["pair"] != "😀" || m["kept"] != `\ud800` {
		t.Fatalf("%v %v", m, err)
	}
	// Signals with a repeated name keep the last value.
	rec, err = d.Decode([]byte(with(goodTraj, "signals", `{"x":1,"y":3,"x":2}`)))
	if err != nil {
		t.Fatal(err)
	}
	if sg := rec.Trajectory.Signals; len(sg) != 2 || sg[0].Name != "x" || sg[0].Value != 2 || sg[1].Value != 3 {
		t.Fatalf("signals %+v", sg)
	}
}

func TestDecodeRepairsUTF8(t *testing.T) {
	line := strings.Replace(goodStep, `"t1"`, "\"t\xff1\"", 1)
	line = with(line, "messages", "[{\"content\":\"a\xc3\"}]", "model", `"\ud800x"`)
	var d Decoder
	rec, err := d.Decode([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	s := rec.Step
	if s.TaskID != "t\uFFFD1" || s.Model != "\uFFFDx" || !utf8.Valid(s.Messages) || rec.Repaired == 0 {
		t.Fatalf("task %q model %q messages %q repaired %d", s.TaskID, s.Model, s.Messages, rec.Repaired)
	}
	var m []map[string]string
	if err := json.Unmarshal(s.Messages, &m); err != nil || m[0]["content"] != "a\uFFFD" {
		t.Fatalf("messages %q: %v", s.Messages, err)
	}
}

// encodeStep writes s back to the wire format with encoding/json.
func encodeStep(s *schemas.Step) []byte {
	m := map[string]any{
		"type": "step", "step_id": s.StepID, "task_id": s.TaskID, "trajectory_id": s.TrajectoryID,
		"step_index": s.StepIndex, "policy_version": s.PolicyVersion, "prompt_ids": s.PromptIDs,
		"response_ids": s.ResponseIDs, "response_logprobs": s.ResponseLogprobs,
	}
	if s.GroupID != "" {
		m["group_id"] = s.GroupID
	}
	if s.Role != "" {
		m["role"] = s.Role
	}
	if s.HasTokenVersions {
		m["token_versions"] = s.TokenVersions
	}
	if s.HasTeacher {
		m["teacher_logprobs"] = s.TeacherLogprobs
	}
	if s.Messages != nil {
		m["messages"] = json.RawMessage(s.Messages)
	}
	if s.Metadata != nil {
		m["metadata"] = json.RawMessage(s.Metadata)
	}
	if s.HasReward {
		m["reward"] = s.Reward
	}
	if s.HasDone {
		m["done"] = s.Done
	}
	if s.FinishReason != "" {
		m["finish_reason"] = s.FinishReason
	}
	if s.Model != "" {
		m["model"] = s.Model
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

// hasPythonTokens reports bare NaN/Infinity tokens outside strings.
func hasPythonTokens(b []byte) bool {
	in, esc := false, false
	for i, c := range b {
		switch {
		case esc:
			esc = false
		case in && c == '\\':
			esc = true
		case c == '"':
			in = !in
		case !in && (c == 'N' || c == 'I'):
			_ = i
			return true
		}
	}
	return false
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		goodStep, goodTraj, with(goodStep, "messages", `[{"role":"user","content":"x"}]`),
		with(goodTraj, "signals", `{"a":1}`), `[]`, `{}`, `{"type":"step"}`, "\xff", `{"type":"step","step_id":"\ud800"}`,
		strings.Replace(goodStep, "-1.25", "NaN", 1), goodStep[:50],
		with(goodTraj, "termination_reason", `"env_done"`, "is_correct", "true"),
		with(goodTraj, "termination_reason", `"TerminationReason.max_turns_exceeded"`),
		with(goodTraj, "termination_reason", `"Timeout"`, "is_correct", "null"),
		with(goodStep, "is_correct", "false"),
	} {
		f.Add([]byte(s))
	}
	seeds, _ := readLines("testdata/seed.jsonl")
	for _, s := range seeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var d Decoder
		rec, err := d.Decode(line)
		validJSON := json.Valid(line)
		if err != nil {
			var re *schemas.RejectError
			if !errors.As(err, &re) || re.Reason == "" {
				t.Fatalf("untyped error %v", err)
			}
			// The decoder agrees with encoding/json on what is JSON.
			if validJSON && re.Reason == schemas.ReasonMalformedJSON {
				t.Fatalf("encoding/json accepts %q but decoder says %v", line, re)
			}
			if !validJSON && re.Reason != schemas.ReasonMalformedJSON && re.Reason != schemas.ReasonTooLarge && !hasPythonTokens(line) && utf8.Valid(line) {
				t.Fatalf("encoding/json rejects %q but decoder says %v", line, re)
			}
			return
		}
		if !validJSON && !hasPythonTokens(line) && utf8.Valid(line) {
			t.Fatalf("decoder accepted invalid JSON %q", line)
		}
		switch rec.Type {
		case schemas.TypeStep:
			s := rec.Step
			for _, str := range []string{s.StepID, s.TaskID, s.GroupID, s.Role, s.TrajectoryID, s.FinishReason, s.Model} {
				if !utf8.ValidString(str) {
					t.Fatalf("invalid UTF-8 kept: %q", str)
				}
			}
			if !utf8.Valid(s.Messages) || !utf8.Valid(s.Metadata) {
				t.Fatal("invalid UTF-8 in raw JSON")
			}
			if len(s.ResponseLogprobs) != len(s.ResponseIDs) || s.StepIndex < 0 || s.PolicyVersion < 0 || s.StepID == "" {
				t.Fatalf("invariant broken: %+v", s)
			}
			for _, v := range s.ResponseLogprobs {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatal("non-finite logprob accepted")
				}
			}
			// Round trip: what the decoder produced, written back with
			// encoding/json, decodes to the same step.
			if bytes.Contains(s.Messages, []byte("N")) || bytes.Contains(s.Metadata, []byte("I")) {
				return // raw JSON with Python tokens is not re-encodable by encoding/json
			}
			again, err := d.Decode(encodeStep(s))
			if err != nil {
				t.Fatalf("re-encoded step rejected: %v", err)
			}
			a := *again.Step
			a.Messages, a.Metadata, a.CreatedAt, a.HasCreatedAt = s.Messages, s.Metadata, s.CreatedAt, s.HasCreatedAt
			if !reflect.DeepEqual(a, *s) {
				t.Fatalf("round trip changed the step:\n%+v\n%+v", a, *s)
			}
		case schemas.TypeTrajectory:
			tr := rec.Trajectory
			if tr.NumSteps < 1 || math.IsNaN(tr.Reward) || math.IsInf(tr.Reward, 0) || tr.TrajectoryID == "" || tr.TaskID == "" {
				t.Fatalf("invariant broken: %+v", tr)
			}
			// A known reason is stored only in its canonical form.
			for _, r := range terminationReasons {
				name := strings.TrimPrefix(tr.TerminationReason, rllmEnumPrefix)
				ascii := strings.IndexFunc(name, func(c rune) bool { return c >= utf8.RuneSelf }) < 0
				if ascii && strings.EqualFold(name, r) && tr.TerminationReason != r {
					t.Fatalf("termination_reason %q not canonical (%s)", tr.TerminationReason, r)
				}
			}
		default:
			t.Fatalf("no type: %+v", rec)
		}
	})
}

func readLines(path string) ([][]byte, error) {
	src, err := OpenFile(path, 0)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	var out [][]byte
	for {
		c, err := src.Read(t0)
		for _, r := range c.Records {
			out = append(out, bytes.Clone(r.Data)) // Data lives until Close
		}
		if err != nil {
			return out, nil
		}
	}
}

// TestDecodeSpans: a step's prompt_ids, response_ids and messages values
// are located in the line as written (whitespace and all); absent or null
// ones are not.
func TestDecodeSpans(t *testing.T) {
	var d Decoder
	line := []byte(`{"type":"step", "step_id":"s","task_id":"t","trajectory_id":"x","step_index":0,"policy_version":0,` +
		`"messages" : [ {"role":"user","content":"]"} ] ,"prompt_ids":[ 1, 2 ],"response_ids":[3],"response_logprobs":[-0.5]}`)
	rec, err := d.Decode(line)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		s    Span
		want string
	}{
		{"prompt_ids", rec.Spans.Prompt, `[ 1, 2 ]`},
		{"response_ids", rec.Spans.Response, `[3]`},
		{"messages", rec.Spans.Messages, `[ {"role":"user","content":"]"} ]`},
	} {
		if !c.s.Valid() || string(line[c.s.Lo:c.s.Hi]) != c.want {
			t.Errorf("%s: span %+v, want %s", c.name, c.s, c.want)
		}
	}
	rec, err = d.Decode([]byte(`{"type":"step","step_id":"s","task_id":"t","trajectory_id":"x","step_index":1,"policy_version":0,` +
		`"parent_step_id":"p","prompt_delta_ids":[4],"messages":null,"response_ids":[3],"response_logprobs":[-0.5]}`))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Spans.Prompt.Valid() || rec.Spans.Messages.Valid() || !rec.Spans.Response.Valid() {
		t.Errorf("spans of a delta without messages: %+v", rec.Spans)
	}
}

// TestDecodeFieldNamedTwice: a known field named twice in one record is
// refused (invalid_value), whichever the values (a later null included),
// instead of one of them silently counting; an unknown one is ignored,
// and so is a field the record's type does not use.
func TestDecodeFieldNamedTwice(t *testing.T) {
	const head = `{"type":"step","step_id":"s","task_id":"t","trajectory_id":"x","step_index":1,"policy_version":0,"response_ids":[3],"response_logprobs":[-0.5]`
	for _, c := range []struct {
		rest   string
		reason schemas.Reason
	}{
		{`,"prompt_ids":[1,2],"prompt_ids":null,"parent_step_id":"p","prompt_delta_ids":[3]}`, schemas.ReasonInvalidValue},
		{`,"prompt_ids" : [1] , "prompt_ids" :  [2]}`, schemas.ReasonInvalidValue},
		{`,"prompt_ids":[1],"messages":[{"role":"user"}],"messages":[{"role":"tool"}]}`, schemas.ReasonInvalidValue},
		{`,"prompt_ids":[1],"extra":1,"extra":2}`, ""},
		{`,"prompt_ids":[1],"num_steps":2,"num_steps":3}`, ""},
	} {
		var d Decoder
		_, err := d.Decode([]byte(head + c.rest))
		var re *schemas.RejectError
		switch {
		case c.reason == "" && err != nil:
			t.Errorf("%s: %v, want accepted", c.rest, err)
		case c.reason != "" && (!errors.As(err, &re) || re.Reason != c.reason):
			t.Errorf("%s: %v, want %s", c.rest, err, c.reason)
		}
	}
}

// A signals object of many names (past the decoder's linear scan), with
// repeats: each name once, in order of first appearance, with its last
// value; and the decoder, reused, starts the next object afresh.
func TestDecodeManySignals(t *testing.T) {
	var d Decoder
	for _, n := range []int{3, 16, 17, 300} {
		var obj strings.Builder
		obj.WriteByte('{')
		want := map[string]float64{}
		var order []string
		for i := range 2 * n {
			name := fmt.Sprintf("s%d", (i*7)%n)
			if i > 0 {
				obj.WriteByte(',')
			}
			fmt.Fprintf(&obj, "%q:%d", name, i)
			if _, ok := want[name]; !ok {
				order = append(order, name)
			}
			want[name] = float64(i)
		}
		obj.WriteByte('}')
		r, err := d.Decode([]byte(with(goodTraj, "signals", obj.String())))
		if err != nil {
			t.Fatalf("%d names: %v", n, err)
		}
		got := r.Trajectory.Signals
		if len(got) != len(order) {
			t.Fatalf("%d names: %d signals, want %d", n, len(got), len(order))
		}
		for i, sg := range got {
			if sg.Name != order[i] || sg.Value != want[sg.Name] {
				t.Fatalf("%d names: signal %d is %s=%v, want %s=%v", n, i, sg.Name, sg.Value, order[i], want[order[i]])
			}
		}
	}
}

func BenchmarkDecodeManySignals(b *testing.B) {
	for _, n := range []int{10, 1000, 10000, 40000, 100000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			var obj strings.Builder
			obj.WriteByte('{')
			for i := range n {
				if i > 0 {
					obj.WriteByte(',')
				}
				fmt.Fprintf(&obj, `"signal%d":%d`, i, i)
			}
			obj.WriteByte('}')
			line := []byte(with(goodTraj, "signals", obj.String()))
			var d Decoder
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				if _, err := d.Decode(line); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/signal")
		})
	}
}

// Number tokens past longNumber read as their exact value rounded once,
// as math/big says, where strconv.ParseFloat alone loses the decimal
// point of a mantissa of more than 800 integer digits.
func TestFloatValueLongNumbers(t *testing.T) {
	zeros := func(n int) string { return strings.Repeat("0", n) }
	toks := []string{
		"1" + zeros(800) + "e-800",
		"-1" + zeros(800) + "e-800",
		"1" + zeros(900) + "e-900",
		"1" + zeros(5000) + "e-5000",
		"12345" + zeros(1000) + "e-1004",
		"1" + zeros(1000) + ".5e-1000",
		"0." + zeros(1000) + "15e1001",
		"0." + zeros(2000),
		"-0." + zeros(2000),
		"3" + zeros(799) + "1e-800",
		"1." + strings.Repeat("7", 3000),
		"2" + zeros(1000) + "E+5",
		"2" + zeros(1000) + "e-400",
		"1" + zeros(1000),
		"9" + strings.Repeat("9", 1000) + "e-1001",
	}
	for _, tok := range toks {
		got, err := floatValue([]byte(tok))
		if err != nil {
			t.Fatalf("%.40s...: %v", tok, err)
		}
		r, ok := new(big.Rat).SetString(tok)
		if !ok {
			t.Fatalf("big.Rat cannot read %.40s...", tok)
		}
		want, _ := r.Float64()
		if strings.HasPrefix(tok, "-") && want == 0 {
			want = math.Copysign(0, -1)
		}
		if math.Float64bits(got) != math.Float64bits(want) && !(math.IsInf(got, 1) && math.IsInf(want, 1)) {
			t.Errorf("%.40s... (%d bytes): %v, want %v", tok, len(tok), got, want)
		}
		// The same token in a logprob list (the list's own fast path and
		// its fallback), as float32.
		if math.Abs(want) > math.MaxFloat32 {
			continue
		}
		var d Decoder
		rec, err := d.Decode([]byte(with(goodStep, "response_logprobs", "["+tok+",-0.5]")))
		if err != nil {
			t.Fatalf("%.40s... in a list: %v", tok, err)
		}
		if lp := rec.Step.ResponseLogprobs; len(lp) != 2 || math.Float32bits(lp[0]) != math.Float32bits(float32(want)) {
			t.Errorf("%.40s... in a list: %v, want %v", tok, lp, float32(want))
		}
	}
}
