package main

// An independent, deliberately simple reference implementation of the
// `rllm-pipe ingest` semantics, used by the end-to-end tests as the oracle.
//
// It shares no code with the program: every line is decoded with
// encoding/json into a map[string]any (UseNumber), validated field by field,
// and then pushed through a small in-memory simulation of the streaming
// assembler (a group is emitted the moment it holds group_size complete
// trajectories). Where the specification leaves the outcome open, the
// reference refuses to guess: it records an "ambiguity" and refIngest returns
// an error, so the test corpora are forced to stay on well-specified ground.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

const refMaxTokenID = 2147483647

// Dead-letter reason codes.
const (
	refMalformedJSON        = "malformed_json"
	refNotAnObject          = "not_an_object"
	refMissingField         = "missing_field"
	refWrongType            = "wrong_type"
	refUnknownType          = "unknown_type"
	refInvalidValue         = "invalid_value"
	refInvalidTokenID       = "invalid_token_id"
	refNonFinite            = "non_finite"
	refLengthMismatch       = "length_mismatch"
	refDuplicateConflict    = "duplicate_conflict"
	refInconsistent         = "inconsistent"
	refStepOutOfRange       = "step_out_of_range"
	refIncompleteTrajectory = "incomplete_trajectory"
	refIncompleteGroup      = "incomplete_group"
	refLate                 = "late"
)

var refAllReasons = []string{
	refMalformedJSON, refNotAnObject, refMissingField, refWrongType, refUnknownType,
	refInvalidValue, refInvalidTokenID, refNonFinite, refLengthMismatch,
	refDuplicateConflict, refInconsistent, refStepOutOfRange,
	refIncompleteTrajectory, refIncompleteGroup, refLate,
}

// refFault is a validation failure: a reason code and (for field-level
// faults) the field the error sentence must name.
type refFault struct {
	Reason string
	Field  string
}

// refDeadLetter is one expected dead letter.
type refDeadLetter struct {
	Line   int
	Reason string
	Field  string
	Raw    []byte
}

// refF32Pair holds the two acceptable float32 values of a decimal literal:
// float32(ParseFloat(s, 64)) and ParseFloat(s, 32) (they differ only in rare
// double-rounding cases).
type refF32Pair [2]float32

type refStep struct {
	Line          int
	StepID        string
	TaskID        string
	GroupKey      string
	Role          *string
	TrajID        string
	StepIndex     int64
	Policy        int64
	PromptIDs     []int64
	ResponseIDs   []int64
	Logprobs      []refF32Pair
	TokenVersions []int64
	HasTV         bool
	Teacher       []refF32Pair
	HasTeacher    bool
	Messages      any
	HasMessages   bool
	StepReward    *float64
	Done          *bool
	FinishReason  *string
	Model         *string
	CreatedAt     *time.Time
	Metadata      any
	HasMetadata   bool
}

type refTraj struct {
	Line        int
	TrajID      string
	TaskID      string
	GroupKey    string
	Role        *string
	Reward      float64
	NumSteps    int64
	Termination *string
	Signals     map[string]float64
	HasSignals  bool
	IsCorrect   *bool
	GroupSize   *int64
	Metadata    any
	HasMetadata bool
}

// refRow is the expected content of one Parquet row (one step).
type refRow struct {
	GroupID           string
	TaskID            string
	Role              *string
	RoleEmpty         bool // role was given as "": accept NULL or ""
	TrajectoryID      string
	StepID            string
	StepIndex         int64
	NumSteps          int64
	PolicyVersion     int64
	GroupVersion      int64
	PromptIDs         []int64
	ResponseIDs       []int64
	Logprobs          []refF32Pair
	TokenVersions     []int64
	HasTV             bool
	Teacher           []refF32Pair
	HasTeacher        bool
	Messages          any // normalized
	HasMessages       bool
	Reward            float64
	StepReward        *float64
	Advantage         float64
	GroupSize         int64
	ExpectedGroupSize int64
	Partial           bool
	FinishReason      *string
	Termination       *string
	Done              *bool
	IsCorrect         *bool
	Model             *string
	CreatedAt         *time.Time
	Metadata          any // normalized
	HasMetadata       bool
	TrajMetadata      any // normalized
	HasTrajMetadata   bool
	Signals           map[string]float64
	HasSignals        bool
	SourceFile        string
	SourceLine        int64
}

type refResult struct {
	Rows                map[string]*refRow // by step_id
	DeadLetters         map[int]*refDeadLetter
	DuplicateLines      []int
	RecordsRead         int
	UTF8Repaired        int
	GroupsWritten       int
	PartialGroups       int
	TrajectoriesWritten int
	// GroupEmitLine: group key -> line at which it was emitted (0 = at end).
	GroupEmitLine map[string]int
}

func (r *refResult) deadLetterCounts() map[string]int {
	m := map[string]int{}
	for _, d := range r.DeadLetters {
		m[d.Reason]++
	}
	return m
}

// ---------------------------------------------------------------------------
// Parsing

// refReplaceBareNonFinite rewrites Python's bare NaN / Infinity / -Infinity
// number tokens (outside strings) into the overflowing literal 1e999, which
// encoding/json accepts syntactically (as a json.Number) and which the
// validators then classify as non-finite.
func refReplaceBareNonFinite(line []byte) []byte {
	// Without either word there is nothing to rewrite: the line as it is
	// (the byte loop below is most of the reference's time under -race).
	if !bytes.Contains(line, []byte("NaN")) && !bytes.Contains(line, []byte("Infinity")) {
		return line
	}
	type tok struct{ from, to string }
	toks := []tok{{"-Infinity", "-1e999"}, {"Infinity", "1e999"}, {"NaN", "1e999"}}
	isBefore := func(i int) bool {
		if i == 0 {
			return true
		}
		return strings.IndexByte(" \t\r\n,:[", line[i-1]) >= 0
	}
	isAfter := func(j int) bool {
		if j >= len(line) {
			return true
		}
		return strings.IndexByte(" \t\r\n,]}", line[j]) >= 0
	}
	out := make([]byte, 0, len(line))
	inStr, esc := false, false
	for i := 0; i < len(line); i++ {
		c := line[i]
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			out = append(out, c)
			continue
		}
		if c == '"' {
			inStr = true
			out = append(out, c)
			continue
		}
		matched := false
		for _, t := range toks {
			if bytes.HasPrefix(line[i:], []byte(t.from)) && isBefore(i) && isAfter(i+len(t.from)) {
				out = append(out, t.to...)
				i += len(t.from) - 1
				matched = true
				break
			}
		}
		if !matched {
			out = append(out, c)
		}
	}
	return out
}

func refIsBlankLine(line []byte) bool {
	for _, c := range line {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

// refParse decodes a line into a JSON object or returns a fault.
func refParse(line []byte) (map[string]any, *refFault) {
	pre := refReplaceBareNonFinite(line)
	if !json.Valid(pre) {
		return nil, &refFault{Reason: refMalformedJSON}
	}
	dec := json.NewDecoder(bytes.NewReader(pre))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, &refFault{Reason: refMalformedJSON}
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, &refFault{Reason: refNotAnObject}
	}
	return m, nil
}

// ---------------------------------------------------------------------------
// Field validation

type refValidator struct {
	m   map[string]any
	amb *[]string
}

func (v *refValidator) get(k string) (any, bool) {
	x, ok := v.m[k]
	if !ok || x == nil {
		return nil, false
	}
	return x, true
}

func (v *refValidator) ambiguous(format string, args ...any) {
	*v.amb = append(*v.amb, fmt.Sprintf(format, args...))
}

func (v *refValidator) reqString(k string) (string, *refFault) {
	x, ok := v.get(k)
	if !ok {
		return "", &refFault{refMissingField, k}
	}
	s, ok := x.(string)
	if !ok {
		return "", &refFault{refWrongType, k}
	}
	if s == "" {
		return "", &refFault{refInvalidValue, k}
	}
	return s, nil
}

func (v *refValidator) optString(k string) (*string, *refFault) {
	x, ok := v.get(k)
	if !ok {
		return nil, nil
	}
	s, ok := x.(string)
	if !ok {
		return nil, &refFault{refWrongType, k}
	}
	return &s, nil
}

// intValue converts a JSON value to an integer. ok=false means wrong_type.
func (v *refValidator) intValue(k string, x any) (int64, bool) {
	n, ok := x.(json.Number)
	if !ok {
		return 0, false
	}
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		return i, true
	}
	r, ok := new(big.Rat).SetString(string(n))
	if !ok || !r.IsInt() {
		return 0, false
	}
	if !r.Num().IsInt64() {
		v.ambiguous("field %s: integral value %s does not fit int64", k, n)
		return 0, false
	}
	return r.Num().Int64(), true
}

func (v *refValidator) reqNonNegInt(k string, min int64) (int64, *refFault) {
	x, ok := v.get(k)
	if !ok {
		return 0, &refFault{refMissingField, k}
	}
	i, ok := v.intValue(k, x)
	if !ok {
		return 0, &refFault{refWrongType, k}
	}
	if i < min {
		return 0, &refFault{refInvalidValue, k}
	}
	return i, nil
}

func (v *refValidator) optNonNegInt(k string, min int64) (*int64, *refFault) {
	if _, ok := v.get(k); !ok {
		return nil, nil
	}
	i, f := v.reqNonNegInt(k, min)
	if f != nil {
		return nil, f
	}
	return &i, nil
}

func (v *refValidator) array(k string, required bool) ([]any, bool, *refFault) {
	x, ok := v.get(k)
	if !ok {
		if required {
			return nil, false, &refFault{refMissingField, k}
		}
		return nil, false, nil
	}
	a, ok := x.([]any)
	if !ok {
		return nil, false, &refFault{refWrongType, k}
	}
	return a, true, nil
}

func (v *refValidator) tokenIDs(k string) ([]int64, *refFault) {
	a, _, f := v.array(k, true)
	if f != nil {
		return nil, f
	}
	out := make([]int64, 0, len(a))
	for _, e := range a {
		i, ok := v.intValue(k, e)
		if !ok {
			return nil, &refFault{refWrongType, k}
		}
		if i < 0 || i > refMaxTokenID {
			return nil, &refFault{refInvalidTokenID, k}
		}
		out = append(out, i)
	}
	return out, nil
}

func (v *refValidator) optIntArray(k string) ([]int64, bool, *refFault) {
	a, present, f := v.array(k, false)
	if f != nil || !present {
		return nil, present, f
	}
	out := make([]int64, 0, len(a))
	for _, e := range a {
		i, ok := v.intValue(k, e)
		if !ok {
			return nil, true, &refFault{refWrongType, k}
		}
		if i < 0 {
			return nil, true, &refFault{refInvalidValue, k}
		}
		out = append(out, i)
	}
	return out, true, nil
}

// refFloat64Value: ok=false means wrong_type; finite=false means non_finite.
func refFloat64Value(x any) (f float64, ok, finite bool) {
	n, isNum := x.(json.Number)
	if !isNum {
		return 0, false, false
	}
	f, _ = strconv.ParseFloat(string(n), 64)
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, true, false
	}
	return f, true, true
}

func refLogprobValue(x any) (refF32Pair, bool, bool) {
	n, isNum := x.(json.Number)
	if !isNum {
		return refF32Pair{}, false, false
	}
	f64, _ := strconv.ParseFloat(string(n), 64)
	f32, _ := strconv.ParseFloat(string(n), 32)
	a, b := float32(f64), float32(f32)
	if math.IsInf(f64, 0) || math.IsNaN(f64) || math.IsInf(float64(a), 0) || math.IsInf(float64(b), 0) {
		return refF32Pair{}, true, false
	}
	return refF32Pair{a, b}, true, true
}

func (v *refValidator) logprobs(k string, required bool) ([]refF32Pair, bool, *refFault) {
	a, present, f := v.array(k, required)
	if f != nil || !present {
		return nil, present, f
	}
	out := make([]refF32Pair, 0, len(a))
	for _, e := range a {
		p, ok, finite := refLogprobValue(e)
		if !ok {
			return nil, true, &refFault{refWrongType, k}
		}
		if !finite {
			return nil, true, &refFault{refNonFinite, k}
		}
		out = append(out, p)
	}
	return out, true, nil
}

func (v *refValidator) optFloat(k string) (*float64, *refFault) {
	x, ok := v.get(k)
	if !ok {
		return nil, nil
	}
	f, ok, finite := refFloat64Value(x)
	if !ok {
		return nil, &refFault{refWrongType, k}
	}
	if !finite {
		return nil, &refFault{refNonFinite, k}
	}
	return &f, nil
}

func (v *refValidator) optBool(k string) (*bool, *refFault) {
	x, ok := v.get(k)
	if !ok {
		return nil, nil
	}
	b, ok := x.(bool)
	if !ok {
		return nil, &refFault{refWrongType, k}
	}
	return &b, nil
}

func (v *refValidator) optObject(k string) (map[string]any, bool, *refFault) {
	x, ok := v.get(k)
	if !ok {
		return nil, false, nil
	}
	o, ok := x.(map[string]any)
	if !ok {
		return nil, false, &refFault{refWrongType, k}
	}
	return o, true, nil
}

func (v *refValidator) groupKey(task string, groupID, role *string) string {
	if groupID != nil {
		if *groupID == "" {
			v.ambiguous("empty group_id")
		}
		return *groupID
	}
	if role != nil && *role != "" {
		return task + ":" + *role
	}
	return task
}

func (v *refValidator) step(line int) (*refStep, *refFault) {
	s := &refStep{Line: line}
	var f *refFault
	if s.StepID, f = v.reqString("step_id"); f != nil {
		return nil, f
	}
	if s.TaskID, f = v.reqString("task_id"); f != nil {
		return nil, f
	}
	groupID, f := v.optString("group_id")
	if f != nil {
		return nil, f
	}
	if s.Role, f = v.optString("role"); f != nil {
		return nil, f
	}
	if s.TrajID, f = v.reqString("trajectory_id"); f != nil {
		return nil, f
	}
	if s.StepIndex, f = v.reqNonNegInt("step_index", 0); f != nil {
		return nil, f
	}
	if s.Policy, f = v.reqNonNegInt("policy_version", 0); f != nil {
		return nil, f
	}
	if s.PromptIDs, f = v.tokenIDs("prompt_ids"); f != nil {
		return nil, f
	}
	if s.ResponseIDs, f = v.tokenIDs("response_ids"); f != nil {
		return nil, f
	}
	if s.Logprobs, _, f = v.logprobs("response_logprobs", true); f != nil {
		return nil, f
	}
	if s.TokenVersions, s.HasTV, f = v.optIntArray("token_versions"); f != nil {
		return nil, f
	}
	if s.Teacher, s.HasTeacher, f = v.logprobs("teacher_logprobs", false); f != nil {
		return nil, f
	}
	msgs, hasMsgs, f := v.array("messages", false)
	if f != nil {
		return nil, f
	}
	for _, e := range msgs {
		if _, ok := e.(map[string]any); !ok {
			return nil, &refFault{refWrongType, "messages"}
		}
	}
	s.HasMessages = hasMsgs
	if hasMsgs {
		s.Messages = refNormalizeJSON(msgs)
	}
	if s.StepReward, f = v.optFloat("reward"); f != nil {
		return nil, f
	}
	if s.Done, f = v.optBool("done"); f != nil {
		return nil, f
	}
	if s.FinishReason, f = v.optString("finish_reason"); f != nil {
		return nil, f
	}
	if s.Model, f = v.optString("model"); f != nil {
		return nil, f
	}
	ca, f := v.optString("created_at")
	if f != nil {
		return nil, f
	}
	if ca != nil {
		t, err := time.Parse(time.RFC3339Nano, *ca)
		if err != nil {
			return nil, &refFault{refInvalidValue, "created_at"}
		}
		if t.Nanosecond()%1000 != 0 {
			v.ambiguous("created_at %q has sub-microsecond precision", *ca)
		}
		t = t.UTC()
		s.CreatedAt = &t
	}
	md, hasMD, f := v.optObject("metadata")
	if f != nil {
		return nil, f
	}
	s.HasMetadata = hasMD
	if hasMD {
		s.Metadata = refNormalizeJSON(md)
	}
	if len(s.Logprobs) != len(s.ResponseIDs) {
		return nil, &refFault{refLengthMismatch, "response_logprobs"}
	}
	if s.HasTV && len(s.TokenVersions) != len(s.ResponseIDs) {
		return nil, &refFault{refLengthMismatch, "token_versions"}
	}
	if s.HasTeacher && len(s.Teacher) != len(s.ResponseIDs) {
		return nil, &refFault{refLengthMismatch, "teacher_logprobs"}
	}
	s.GroupKey = v.groupKey(s.TaskID, groupID, s.Role)
	return s, nil
}

func (v *refValidator) trajectory(line int) (*refTraj, *refFault) {
	t := &refTraj{Line: line}
	var f *refFault
	if t.TrajID, f = v.reqString("trajectory_id"); f != nil {
		return nil, f
	}
	if t.TaskID, f = v.reqString("task_id"); f != nil {
		return nil, f
	}
	x, ok := v.get("reward")
	if !ok {
		return nil, &refFault{refMissingField, "reward"}
	}
	r, isNum, finite := refFloat64Value(x)
	if !isNum {
		return nil, &refFault{refWrongType, "reward"}
	}
	if !finite {
		return nil, &refFault{refNonFinite, "reward"}
	}
	t.Reward = r
	if t.NumSteps, f = v.reqNonNegInt("num_steps", 1); f != nil {
		return nil, f
	}
	groupID, f := v.optString("group_id")
	if f != nil {
		return nil, f
	}
	if t.Role, f = v.optString("role"); f != nil {
		return nil, f
	}
	if t.Termination, f = v.optString("termination_reason"); f != nil {
		return nil, f
	}
	if t.Termination != nil {
		c := refTermination(*t.Termination)
		t.Termination = &c
	}
	sig, hasSig, f := v.optObject("signals")
	if f != nil {
		return nil, f
	}
	if hasSig {
		t.HasSignals = true
		t.Signals = map[string]float64{}
		for name, val := range sig {
			if val == nil {
				v.ambiguous("signals.%s is null", name)
			}
			fv, isNum, finite := refFloat64Value(val)
			if !isNum {
				return nil, &refFault{refWrongType, "signals"}
			}
			if !finite {
				return nil, &refFault{refNonFinite, "signals"}
			}
			t.Signals[name] = fv
		}
	}
	if t.IsCorrect, f = v.optBool("is_correct"); f != nil {
		return nil, f
	}
	if t.GroupSize, f = v.optNonNegInt("group_size", 1); f != nil {
		return nil, f
	}
	md, hasMD, f := v.optObject("metadata")
	if f != nil {
		return nil, f
	}
	t.HasMetadata = hasMD
	if hasMD {
		t.Metadata = refNormalizeJSON(md)
	}
	t.GroupKey = v.groupKey(t.TaskID, groupID, t.Role)
	return t, nil
}

// refNormalizeJSON maps a decoded JSON value (UseNumber) to a form in which
// numbers compare by exact value ("1.10" == "1.1", "1e3" == "1000").
func refNormalizeJSON(x any) any {
	switch t := x.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, v := range t {
			m[k] = refNormalizeJSON(v)
		}
		return m
	case []any:
		a := make([]any, len(t))
		for i, v := range t {
			a[i] = refNormalizeJSON(v)
		}
		return a
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(t)); ok {
			return "#num:" + r.RatString()
		}
		return "#num?" + string(t)
	case float64:
		return "#num:" + new(big.Rat).SetFloat64(t).RatString()
	default:
		return x
	}
}

// refParseNormalizedJSON decodes JSON text (as written by the program) into the
// normalized form.
func refParseNormalizedJSON(s string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if dec.More() {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return refNormalizeJSON(v), nil
}

// ---------------------------------------------------------------------------
// Streaming simulation

type refTrajState struct {
	id       string
	task     string
	gkey     string
	rec      *refTraj
	steps    map[int64]*refStep
	lines    []int // accepted record lines
	complete bool
}

type refGroupState struct {
	key          string
	size         *int64
	sawNoSize    bool // an accepted trajectory record without group_size
	trajs        []*refTrajState
	completeList []*refTrajState
	emitted      bool
}

type refIngestor struct {
	file     string
	defSize  int64
	minSize  int
	lines    [][]byte
	res      *refResult
	amb      []string
	stepByID map[string]*refStep
	// The line of the accepted copy of each step and trajectory id: a
	// later record under the id is compared with it (canonical JSON of
	// the whole record, and of its known fields), the canonical forms
	// built only then (building them for every record was most of the
	// reference's time under -race).
	stepFirst  map[string]int
	trajFirst  map[string]int
	trajs      map[string]*refTrajState
	groups     map[string]*refGroupState
	groupOrder []string
	utf8Lines  map[int]bool
}

// refIngest runs the reference over the input lines (without their '\n').
func refIngest(lines [][]byte, sourceFile string, groupSize, minGroupSize int) (*refResult, error) {
	in := &refIngestor{
		file: sourceFile, defSize: int64(groupSize), minSize: minGroupSize, lines: lines,
		res: &refResult{
			Rows: map[string]*refRow{}, DeadLetters: map[int]*refDeadLetter{},
			GroupEmitLine: map[string]int{},
		},
		stepByID: map[string]*refStep{}, stepFirst: map[string]int{}, trajFirst: map[string]int{},
		trajs: map[string]*refTrajState{}, groups: map[string]*refGroupState{},
		utf8Lines: map[int]bool{},
	}
	for i, raw := range lines {
		in.process(i+1, raw)
	}
	in.finish()
	for line := range in.utf8Lines {
		if dl, ok := in.res.DeadLetters[line]; ok {
			in.amb = append(in.amb, fmt.Sprintf("line %d: repaired (invalid UTF-8) record later dead-lettered as %s: is it counted as utf8_repaired?", line, dl.Reason))
		} else {
			in.res.UTF8Repaired++
		}
	}
	if len(in.amb) > 0 {
		return in.res, fmt.Errorf("reference: input hits %d unspecified case(s):\n  %s", len(in.amb), strings.Join(in.amb, "\n  "))
	}
	return in.res, nil
}

func (in *refIngestor) deadLetter(line int, reason, field string) {
	if _, dup := in.res.DeadLetters[line]; dup {
		in.amb = append(in.amb, fmt.Sprintf("line %d dead-lettered twice", line))
		return
	}
	in.res.DeadLetters[line] = &refDeadLetter{Line: line, Reason: reason, Field: field, Raw: in.lines[line-1]}
}

func (in *refIngestor) group(key string) *refGroupState {
	g := in.groups[key]
	if g == nil {
		g = &refGroupState{key: key}
		in.groups[key] = g
		in.groupOrder = append(in.groupOrder, key)
	}
	return g
}

func refCanonical(x any) string {
	b, err := json.Marshal(x)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func (in *refIngestor) process(line int, raw []byte) {
	if refIsBlankLine(raw) {
		return
	}
	in.res.RecordsRead++
	m, f := refParse(raw)
	if f != nil {
		// Not parsed, so nothing was repaired (or kept).
		in.deadLetter(line, f.Reason, f.Field)
		return
	}
	accepted := in.classify(line, m)
	if !utf8.Valid(raw) {
		if accepted {
			in.utf8Lines[line] = true
		} else {
			in.amb = append(in.amb, fmt.Sprintf("line %d: invalid UTF-8 in a parsed record that was not kept: is it counted as utf8_repaired?", line))
		}
	}
}

// classify validates a parsed record and runs it through the assembler; it
// reports whether the record was accepted (kept).
func (in *refIngestor) classify(line int, m map[string]any) bool {
	v := &refValidator{m: m, amb: &in.amb}
	tv, ok := v.get("type")
	if !ok {
		in.deadLetter(line, refMissingField, "type")
		return false
	}
	typ, ok := tv.(string)
	if !ok {
		in.deadLetter(line, refWrongType, "type")
		return false
	}
	switch typ {
	case "step":
		s, f := v.step(line)
		if f != nil {
			in.deadLetter(line, f.Reason, f.Field)
			return false
		}
		return in.acceptStep(line, s, m)
	case "trajectory":
		t, f := v.trajectory(line)
		if f != nil {
			in.deadLetter(line, f.Reason, f.Field)
			return false
		}
		return in.acceptTraj(line, t, m)
	default:
		in.deadLetter(line, refUnknownType, "type")
		return false
	}
}

func (in *refIngestor) duplicate(line int) {
	in.res.DuplicateLines = append(in.res.DuplicateLines, line)
}

// canonicalAt is the canonical JSON of the record at line (parsed again).
func (in *refIngestor) canonicalAt(line int) string {
	m, f := refParse(in.lines[line-1])
	if f != nil {
		panic(fmt.Sprintf("line %d was accepted but does not parse: %s", line, f.Reason))
	}
	return refCanonical(m)
}

func (in *refIngestor) acceptStep(line int, s *refStep, m map[string]any) bool {
	if first, seen := in.stepFirst[s.StepID]; seen {
		if in.canonicalAt(first) == refCanonical(m) {
			in.duplicate(line)
			return false
		}
		if refCanonical(in.stepByID[s.StepID].withoutLine()) == refCanonical(s.withoutLine()) {
			in.amb = append(in.amb, fmt.Sprintf("line %d: step %q differs from its first copy only in unknown fields / number spelling", line, s.StepID))
		}
		if g := in.groups[s.GroupKey]; g != nil && g.emitted {
			in.amb = append(in.amb, fmt.Sprintf("line %d: conflicting step for an emitted group: late or duplicate_conflict?", line))
		}
		in.deadLetter(line, refDuplicateConflict, "")
		return false
	}
	tr := in.trajs[s.TrajID]
	if tr != nil && (tr.task != s.TaskID || tr.gkey != s.GroupKey) {
		if g := in.groups[tr.gkey]; g.emitted {
			in.amb = append(in.amb, fmt.Sprintf("line %d: inconsistent step for an emitted group: late or inconsistent?", line))
		}
		in.deadLetter(line, refInconsistent, "")
		return false
	}
	g := in.group(s.GroupKey)
	if g.emitted {
		if tr != nil {
			in.amb = append(in.amb, fmt.Sprintf("line %d: new step for an already emitted trajectory %q", line, s.TrajID))
		}
		in.deadLetter(line, refLate, "")
		return false
	}
	if tr != nil {
		if _, taken := tr.steps[s.StepIndex]; taken {
			in.deadLetter(line, refDuplicateConflict, "")
			return false
		}
		if tr.rec != nil && s.StepIndex >= tr.rec.NumSteps {
			in.deadLetter(line, refStepOutOfRange, "")
			return false
		}
	}
	if tr == nil {
		tr = &refTrajState{id: s.TrajID, task: s.TaskID, gkey: s.GroupKey, steps: map[int64]*refStep{}}
		in.trajs[s.TrajID] = tr
		g.trajs = append(g.trajs, tr)
	}
	tr.steps[s.StepIndex] = s
	tr.lines = append(tr.lines, line)
	in.stepByID[s.StepID] = s
	in.stepFirst[s.StepID] = line
	in.afterAccept(line, tr, g)
	return true
}

func (s *refStep) withoutLine() refStep {
	c := *s
	c.Line = 0
	return c
}

func (t *refTraj) withoutLine() refTraj {
	c := *t
	c.Line = 0
	return c
}

func (in *refIngestor) acceptTraj(line int, t *refTraj, m map[string]any) bool {
	if first, seen := in.trajFirst[t.TrajID]; seen {
		if in.canonicalAt(first) == refCanonical(m) {
			in.duplicate(line)
			return false
		}
		if refCanonical(in.trajs[t.TrajID].rec.withoutLine()) == refCanonical(t.withoutLine()) {
			in.amb = append(in.amb, fmt.Sprintf("line %d: trajectory %q differs from its first copy only in unknown fields / number spelling", line, t.TrajID))
		}
		if g := in.groups[t.GroupKey]; g != nil && g.emitted {
			in.amb = append(in.amb, fmt.Sprintf("line %d: conflicting trajectory for an emitted group: late or duplicate_conflict?", line))
		}
		in.deadLetter(line, refDuplicateConflict, "")
		return false
	}
	tr := in.trajs[t.TrajID]
	if tr != nil && (tr.task != t.TaskID || tr.gkey != t.GroupKey) {
		if g := in.groups[tr.gkey]; g.emitted {
			in.amb = append(in.amb, fmt.Sprintf("line %d: inconsistent trajectory for an emitted group: late or inconsistent?", line))
		}
		in.deadLetter(line, refInconsistent, "")
		return false
	}
	g := in.group(t.GroupKey)
	if g.emitted {
		in.deadLetter(line, refLate, "")
		return false
	}
	if t.GroupSize != nil {
		if g.size != nil && *g.size != *t.GroupSize {
			in.deadLetter(line, refInconsistent, "")
			return false
		}
		// A record without group_size disagrees with nothing. Only a
		// size that differs from --group-size and shows up after size-less
		// records of the group is left open (retroactive or not?).
		if g.size == nil && g.sawNoSize && *t.GroupSize != in.defSize {
			in.amb = append(in.amb, fmt.Sprintf("line %d: group %q gets group_size %d (not the default) only after a trajectory record without it", line, g.key, *t.GroupSize))
		}
	}
	if tr != nil {
		for idx := range tr.steps {
			if idx >= t.NumSteps {
				in.amb = append(in.amb, fmt.Sprintf("line %d: trajectory %q arrives after a step with index %d >= num_steps", line, t.TrajID, idx))
			}
		}
	}
	if tr == nil {
		tr = &refTrajState{id: t.TrajID, task: t.TaskID, gkey: t.GroupKey, steps: map[int64]*refStep{}}
		in.trajs[t.TrajID] = tr
		g.trajs = append(g.trajs, tr)
	}
	tr.rec = t
	tr.lines = append(tr.lines, line)
	if t.GroupSize != nil {
		g.size = t.GroupSize
	} else {
		g.sawNoSize = true
	}
	in.trajFirst[t.TrajID] = line
	in.afterAccept(line, tr, g)
	return true
}

func (g *refGroupState) expected(def int64) int64 {
	if g.size != nil {
		return *g.size
	}
	return def
}

func (in *refIngestor) afterAccept(line int, tr *refTrajState, g *refGroupState) {
	if !tr.complete && tr.rec != nil && int64(len(tr.steps)) == tr.rec.NumSteps {
		tr.complete = true
		g.completeList = append(g.completeList, tr)
	}
	exp := g.expected(in.defSize)
	switch {
	case int64(len(g.completeList)) == exp:
		for _, other := range g.trajs {
			if !other.complete {
				in.amb = append(in.amb, fmt.Sprintf("line %d: group %q emitted while trajectory %q is incomplete", line, g.key, other.id))
			}
		}
		in.emit(g, false)
		in.res.GroupEmitLine[g.key] = line
	case int64(len(g.completeList)) > exp:
		in.amb = append(in.amb, fmt.Sprintf("line %d: group %q has more complete trajectories than its size", line, g.key))
	}
}

// refGRPO: rLLM's GRPO normalisation (population std, eps 1e-6; a
// group of one uses mean 0, std 1).
func refGRPO(rewards []float64) []float64 {
	n := float64(len(rewards))
	mean, std := 0.0, 1.0
	if len(rewards) > 1 {
		sum := 0.0
		for _, r := range rewards {
			sum += r
		}
		mean = sum / n
		ss := 0.0
		for _, r := range rewards {
			ss += (r - mean) * (r - mean)
		}
		std = math.Sqrt(ss / n)
	}
	out := make([]float64, len(rewards))
	for i, r := range rewards {
		out[i] = (r - mean) / (std + 1e-6)
	}
	return out
}

func (in *refIngestor) emit(g *refGroupState, partial bool) {
	g.emitted = true
	trajs := g.completeList
	rewards := make([]float64, len(trajs))
	groupVersion := int64(math.MaxInt64)
	for i, tr := range trajs {
		rewards[i] = tr.rec.Reward
		for _, s := range tr.steps {
			// A group is as stale as its oldest token.
			for _, v := range append([]int64{s.Policy}, s.TokenVersions...) {
				groupVersion = min(groupVersion, v)
			}
		}
	}
	adv := refGRPO(rewards)
	in.res.GroupsWritten++
	if partial {
		in.res.PartialGroups++
	}
	in.res.TrajectoriesWritten += len(trajs)
	for i, tr := range trajs {
		t := tr.rec
		for _, s := range tr.steps {
			row := &refRow{
				GroupID:           g.key,
				TaskID:            s.TaskID,
				Role:              s.Role,
				TrajectoryID:      s.TrajID,
				StepID:            s.StepID,
				StepIndex:         s.StepIndex,
				NumSteps:          t.NumSteps,
				PolicyVersion:     s.Policy,
				GroupVersion:      groupVersion,
				PromptIDs:         s.PromptIDs,
				ResponseIDs:       s.ResponseIDs,
				Logprobs:          s.Logprobs,
				TokenVersions:     s.TokenVersions,
				HasTV:             s.HasTV && slices.ContainsFunc(s.TokenVersions, func(v int64) bool { return v != s.Policy }), // uniform: stored as absent
				Teacher:           s.Teacher,
				HasTeacher:        s.HasTeacher,
				Messages:          s.Messages,
				HasMessages:       s.HasMessages,
				Reward:            t.Reward,
				StepReward:        s.StepReward,
				Advantage:         adv[i],
				GroupSize:         int64(len(trajs)),
				ExpectedGroupSize: g.expected(in.defSize),
				Partial:           partial,
				FinishReason:      s.FinishReason,
				Termination:       t.Termination,
				Done:              s.Done,
				IsCorrect:         t.IsCorrect,
				Model:             s.Model,
				CreatedAt:         s.CreatedAt,
				Metadata:          s.Metadata,
				HasMetadata:       s.HasMetadata,
				TrajMetadata:      t.Metadata,
				HasTrajMetadata:   t.HasMetadata,
				Signals:           t.Signals,
				HasSignals:        t.HasSignals,
				SourceFile:        in.file,
				SourceLine:        int64(s.Line),
			}
			if s.Role != nil && *s.Role == "" {
				row.Role, row.RoleEmpty = nil, true
			}
			if _, dup := in.res.Rows[s.StepID]; dup {
				in.amb = append(in.amb, fmt.Sprintf("step_id %q emitted twice", s.StepID))
			}
			in.res.Rows[s.StepID] = row
		}
	}
}

func (in *refIngestor) finish() {
	for _, key := range in.groupOrder {
		g := in.groups[key]
		if g.emitted {
			continue
		}
		in.res.GroupEmitLine[key] = 0
		if len(g.completeList) >= in.minSize {
			in.emit(g, true)
			for _, tr := range g.trajs {
				if !tr.complete {
					for _, l := range tr.lines {
						in.deadLetter(l, refIncompleteTrajectory, "")
					}
				}
			}
			continue
		}
		for _, tr := range g.trajs {
			for _, l := range tr.lines {
				in.deadLetter(l, refIncompleteGroup, "")
			}
		}
	}
}

// ---------------------------------------------------------------------------
// Self-tests of the reference (no binary needed).

func TestReferenceGRPOLiteral(t *testing.T) {
	adv := refGRPO([]float64{1, 0, 0, 0})
	want := []float64{1.732046807578115, -0.5773489358593717, -0.5773489358593717, -0.5773489358593717}
	for i := range want {
		if math.Abs(adv[i]-want[i]) > 1e-12 {
			t.Errorf("advantage[%d] = %.17g, want %.17g", i, adv[i], want[i])
		}
	}
	if a := refGRPO([]float64{0.7}); math.Abs(a[0]-0.7/(1+1e-6)) > 1e-15 {
		t.Errorf("group of one: %v", a)
	}
	if a := refGRPO([]float64{2, 2, 2}); a[0] != 0 || a[1] != 0 || a[2] != 0 {
		t.Errorf("equal rewards: %v", a)
	}
}

func TestReferenceParsing(t *testing.T) {
	cases := []struct {
		line, reason string
	}{
		{`{"a":NaN}`, ""},
		{`{"a":[Infinity,-Infinity]}`, ""},
		{`{"a":"NaN"}`, ""},
		{`{"a":nan}`, refMalformedJSON},
		{`{"a":NaNa}`, refMalformedJSON},
		{`{"a":-NaN}`, refMalformedJSON},
		{`{"a":+Infinity}`, refMalformedJSON},
		{`{"a":1} x`, refMalformedJSON},
		{"{\"a\":\"x\ty\"}", refMalformedJSON},
		{"{\"a\":\"\xff\"}", ""},
		{"{\"a\":1}\xff", refMalformedJSON},
		{`NaN`, refNotAnObject},
		{`[1]`, refNotAnObject},
		{`null`, refNotAnObject},
	}
	for _, c := range cases {
		_, f := refParse([]byte(c.line))
		got := ""
		if f != nil {
			got = f.Reason
		}
		if got != c.reason {
			t.Errorf("refParse(%q) = %q, want %q", c.line, got, c.reason)
		}
	}
	m, f := refParse([]byte("{\"s\":\"a\xe2\x82b\"}"))
	if f != nil || m["s"] != "a\uFFFD\uFFFDb" {
		t.Errorf("utf8 repair: %q %v", m["s"], f)
	}
}

// refSortedKeys is a small helper used in diagnostics.
func refSortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// refTermination is the stored form of a termination reason: rLLM's seven
// reasons, in any case and with or without Python's "TerminationReason."
// prefix, upper case; anything else as sent.
func refTermination(r string) string {
	u := strings.ToUpper(r)
	u = strings.TrimPrefix(u, "TERMINATIONREASON.")
	switch u {
	case "MAX_PROMPT_LENGTH_EXCEEDED", "MAX_RESPONSE_LENGTH_EXCEEDED", "ENV_DONE", "MAX_TURNS_EXCEEDED", "TIMEOUT", "UNKNOWN", "ERROR":
		return u
	}
	return r
}
