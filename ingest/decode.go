package ingest

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// field identifies a known wire field. Fields of both record types share
// one table because "type" may come last in the object.
type field uint8

const (
	fNone field = iota
	fType
	fStepID
	fTaskID
	fGroupID
	fRole
	fTrajectoryID
	fStepIndex
	fPolicyVersion
	fPromptIDs
	fResponseIDs
	fResponseLogprobs
	fTokenVersions
	fTeacherLogprobs
	fMessages
	fReward
	fDone
	fFinishReason
	fModel
	fCreatedAt
	fMetadata
	fNumSteps
	fTerminationReason
	fSignals
	fIsCorrect
	fGroupSize
	fPromptDeltaIDs
	fParentStepID
	fMessagesAdded
	fRejectedSteps
	numFields
)

var fieldNames = [numFields]string{
	fType: "type", fStepID: "step_id", fTaskID: "task_id", fGroupID: "group_id", fRole: "role",
	fTrajectoryID: "trajectory_id", fStepIndex: "step_index", fPolicyVersion: "policy_version",
	fPromptIDs: "prompt_ids", fResponseIDs: "response_ids", fResponseLogprobs: "response_logprobs",
	fTokenVersions: "token_versions", fTeacherLogprobs: "teacher_logprobs", fMessages: "messages",
	fReward: "reward", fDone: "done", fFinishReason: "finish_reason", fModel: "model",
	fCreatedAt: "created_at", fMetadata: "metadata", fNumSteps: "num_steps",
	fTerminationReason: "termination_reason", fSignals: "signals", fIsCorrect: "is_correct",
	fGroupSize: "group_size", fPromptDeltaIDs: "prompt_delta_ids", fParentStepID: "parent_step_id",
	fMessagesAdded: "messages_added", fRejectedSteps: "rejected_steps",
}

const (
	forStep = 1 << iota
	forTraj
)

// fieldUse says which record types read a field; a field unknown to the
// record's type is ignored, even when malformed.
var fieldUse = [numFields]uint8{
	fType: forStep | forTraj, fStepID: forStep, fTaskID: forStep | forTraj, fGroupID: forStep | forTraj,
	fRole: forStep | forTraj, fTrajectoryID: forStep | forTraj, fStepIndex: forStep,
	fPolicyVersion: forStep, fPromptIDs: forStep, fResponseIDs: forStep, fResponseLogprobs: forStep,
	fTokenVersions: forStep, fTeacherLogprobs: forStep, fMessages: forStep, fReward: forStep | forTraj,
	fDone: forStep, fFinishReason: forStep, fModel: forStep, fCreatedAt: forStep, fMetadata: forStep | forTraj,
	fNumSteps: forTraj, fTerminationReason: forTraj, fSignals: forTraj, fIsCorrect: forTraj, fGroupSize: forTraj,
	fPromptDeltaIDs: forStep, fParentStepID: forStep, fMessagesAdded: forStep, fRejectedSteps: forTraj,
}

// requiredStep: prompt_ids may instead be prompt_delta_ids with
// parent_step_id (finishStep checks that).
var requiredStep = []field{fStepID, fTaskID, fTrajectoryID, fStepIndex, fPolicyVersion, fResponseIDs, fResponseLogprobs}
var requiredTraj = []field{fTrajectoryID, fTaskID, fReward, fNumSteps}

func lookupField(name []byte) field {
	// A switch on string(name) compiles to a jump table without allocating.
	switch string(name) {
	case "type":
		return fType
	case "step_id":
		return fStepID
	case "task_id":
		return fTaskID
	case "group_id":
		return fGroupID
	case "role":
		return fRole
	case "trajectory_id":
		return fTrajectoryID
	case "step_index":
		return fStepIndex
	case "policy_version":
		return fPolicyVersion
	case "prompt_ids":
		return fPromptIDs
	case "response_ids":
		return fResponseIDs
	case "response_logprobs":
		return fResponseLogprobs
	case "token_versions":
		return fTokenVersions
	case "teacher_logprobs":
		return fTeacherLogprobs
	case "messages":
		return fMessages
	case "reward":
		return fReward
	case "done":
		return fDone
	case "finish_reason":
		return fFinishReason
	case "model":
		return fModel
	case "created_at":
		return fCreatedAt
	case "metadata":
		return fMetadata
	case "num_steps":
		return fNumSteps
	case "termination_reason":
		return fTerminationReason
	case "signals":
		return fSignals
	case "is_correct":
		return fIsCorrect
	case "group_size":
		return fGroupSize
	case "prompt_delta_ids":
		return fPromptDeltaIDs
	case "parent_step_id":
		return fParentStepID
	case "messages_added":
		return fMessagesAdded
	case "rejected_steps":
		return fRejectedSteps
	}
	return fNone
}

// Record is one decoded wire record: exactly one of Step and Trajectory is
// set, according to Type. Repaired counts text repaired to valid UTF-8.
type Record struct {
	Type       schemas.RecordType
	Step       *schemas.Step
	Trajectory *schemas.Trajectory
	Repaired   int
	// Spans are where a step's prompt_ids, response_ids and messages
	// values lie in the line (from '[' to ']' inclusive; Span.Valid false
	// when absent or null), for keeping a held record as its differences
	// from the record before it.
	Spans Spans
}

// Spans locates values in a decoded line.
type Spans struct {
	Prompt, Response, Messages Span
}

// Span is a byte range [Lo, Hi) of a line; the zero Span is absent.
type Span struct{ Lo, Hi int32 }

// Valid reports whether the span locates a value.
func (s Span) Valid() bool { return s.Hi > s.Lo }

// Decoder turns one JSON line into a Record. It is not safe for concurrent
// use; give each goroutine its own. The records it returns own their
// memory: nothing aliases the input line or the decoder's buffers.
type Decoder struct {
	lx      lexer
	seen    [numFields]bool
	named   [numFields]bool // fields the object names, null or not
	errs    []fieldErr
	typ     []byte
	ints    []int32
	floats  []float32
	int64s  []int64
	signals []schemas.Signal
	// signalIdx indexes the names in signals once they are many.
	signalIdx map[string]int

	step  schemas.Step
	traj  schemas.Trajectory
	spans Spans
}

type fieldErr struct {
	f   field
	err *schemas.RejectError
}

// Decode parses line. A bad record yields a *schemas.RejectError.
func (d *Decoder) Decode(line []byte) (Record, error) {
	d.lx.reset(line)
	d.seen = [numFields]bool{}
	d.named = [numFields]bool{}
	d.errs = d.errs[:0]
	d.typ = d.typ[:0]
	d.step = schemas.Step{}
	d.traj = schemas.Trajectory{}
	d.spans = Spans{}

	if err := d.object(); err != nil {
		if errors.Is(err, errNotObject) {
			return Record{}, schemas.Rejectf(schemas.ReasonNotAnObject, "", "record is valid JSON but not an object")
		}
		return Record{}, d.syntaxReject(err)
	}
	if !d.lx.end() {
		return Record{}, schemas.Rejectf(schemas.ReasonMalformedJSON, "", "unexpected data after the object at byte %d", d.lx.pos)
	}

	var use uint8
	var rt schemas.RecordType
	switch {
	case !d.seen[fType]:
		return Record{}, schemas.Rejectf(schemas.ReasonMissingField, "type", "record has no \"type\"")
	case d.firstErr(fType) != nil:
		return Record{}, d.firstErr(fType)
	case string(d.typ) == "step":
		use, rt = forStep, schemas.TypeStep
	case string(d.typ) == "trajectory":
		use, rt = forTraj, schemas.TypeTrajectory
	default:
		return Record{}, schemas.Rejectf(schemas.ReasonUnknownType, "type", "unknown record type %q (want step or trajectory)", d.typ)
	}
	for _, e := range d.errs {
		if fieldUse[e.f]&use != 0 {
			return Record{}, e.err
		}
	}
	if rt == schemas.TypeStep {
		if err := d.finishStep(); err != nil {
			return Record{}, err
		}
		s := d.step
		return Record{Type: rt, Step: &s, Repaired: d.lx.repaired, Spans: d.spans}, nil
	}
	if err := d.finishTraj(); err != nil {
		return Record{}, err
	}
	t := d.traj
	return Record{Type: rt, Trajectory: &t, Repaired: d.lx.repaired}, nil
}

func (d *Decoder) firstErr(f field) *schemas.RejectError {
	for _, e := range d.errs {
		if e.f == f {
			return e.err
		}
	}
	return nil
}

func (d *Decoder) syntaxReject(err error) *schemas.RejectError {
	if errors.Is(err, errTooDeep) {
		return schemas.Rejectf(schemas.ReasonTooLarge, "", "JSON nested deeper than %d levels", maxDepth)
	}
	if d.lx.pos >= len(d.lx.buf) {
		return schemas.Rejectf(schemas.ReasonMalformedJSON, "", "invalid JSON: unexpected end of record")
	}
	return schemas.Rejectf(schemas.ReasonMalformedJSON, "", "invalid JSON at byte %d", d.lx.pos)
}

// object parses the top-level object, dispatching known fields.
func (d *Decoder) object() error {
	if c := d.lx.peek(); c != '{' {
		if c == 0 {
			return errSyntax
		}
		// Tell a valid non-object apart from garbage.
		if err := d.lx.skip(0); err != nil {
			return err
		}
		if !d.lx.end() {
			return errSyntax
		}
		return errNotObject
	}
	d.lx.pos++
	if d.lx.peek() == '}' {
		d.lx.pos++
		return nil
	}
	for {
		name, err := d.lx.str()
		if err != nil {
			return err
		}
		f := lookupField(name)
		if err := d.lx.expect(':'); err != nil {
			return err
		}
		switch {
		case f == fNone:
			if err := d.lx.skip(1); err != nil {
				return err
			}
		case d.named[f]:
			// Which of two values counts is anyone's guess: neither.
			d.lx.ws()
			if err := d.reject(f, d.lx.pos, schemas.ReasonInvalidValue, "%s appears twice in the record", fieldNames[f]); err != nil {
				return err
			}
		default:
			d.named[f] = true
			if err := d.value(f); err != nil {
				return err
			}
		}
		switch d.lx.peek() {
		case ',':
			d.lx.pos++
		case '}':
			d.lx.pos++
			return nil
		default:
			return errSyntax
		}
	}
}

var errNotObject = errors.New("not an object")

// reject records a value error of field f and skips the rest of its value
// (from the position saved in start) so that syntax is still checked.
func (d *Decoder) reject(f field, start int, reason schemas.Reason, format string, args ...any) error {
	d.errs = append(d.errs, fieldErr{f, schemas.Rejectf(reason, fieldNames[f], format, args...)})
	d.lx.pos = start
	return d.lx.skip(1)
}

// isNull consumes a null literal if one is at the cursor.
func (d *Decoder) isNull() (bool, error) {
	if d.lx.peek() != 'n' {
		return false, nil
	}
	return true, d.lx.literal("null")
}

// value parses the value of a known field.
func (d *Decoder) value(f field) error {
	d.lx.ws()
	start := d.lx.pos
	null, err := d.isNull()
	if err != nil || null {
		// null means absent, for optional and required fields alike.
		d.seen[f] = false
		return err
	}
	d.seen[f] = true
	c := d.lx.peek()
	switch f {
	case fType:
		if c != '"' {
			return d.reject(f, start, schemas.ReasonWrongType, "type must be a string")
		}
		b, err := d.lx.str()
		d.typ = append(d.typ[:0], b...)
		return err
	case fStepID, fTaskID, fGroupID, fRole, fTrajectoryID, fFinishReason, fModel, fTerminationReason, fCreatedAt, fParentStepID:
		if c != '"' {
			return d.reject(f, start, schemas.ReasonWrongType, "%s must be a string", fieldNames[f])
		}
		b, err := d.lx.str()
		if err != nil {
			return err
		}
		return d.setString(f, start, b)
	case fStepIndex, fPolicyVersion, fNumSteps, fGroupSize, fRejectedSteps:
		v, rerr, err := d.intField(f)
		if err != nil {
			return err
		}
		if rerr != nil {
			return d.reject(f, start, rerr.Reason, "%v", rerr.Err)
		}
		switch f {
		case fStepIndex:
			d.step.StepIndex = v
		case fPolicyVersion:
			d.step.PolicyVersion = v
		case fNumSteps:
			d.traj.NumSteps = v
		case fGroupSize:
			d.traj.GroupSize = v
		case fRejectedSteps:
			d.traj.RejectedSteps = v
		}
		return nil
	case fReward:
		tok, err := d.numberToken(f, start)
		if err != nil || tok == nil {
			return err
		}
		v, err := floatValue(tok)
		if err != nil {
			return err
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return d.reject(f, start, schemas.ReasonNonFinite, "reward is %s, not a finite number", tok)
		}
		d.step.Reward, d.step.HasReward, d.traj.Reward = v, true, v
		return nil
	case fDone, fIsCorrect:
		var v bool
		switch c {
		case 't':
			v = true
			err = d.lx.literal("true")
		case 'f':
			err = d.lx.literal("false")
		default:
			return d.reject(f, start, schemas.ReasonWrongType, "%s must be true or false", fieldNames[f])
		}
		if f == fDone {
			d.step.Done, d.step.HasDone = v, true
		} else {
			d.traj.IsCorrect, d.traj.HasIsCorrect = v, true
		}
		return err
	case fPromptIDs, fResponseIDs, fPromptDeltaIDs:
		err := d.tokenList(f, start)
		if err == nil {
			switch f {
			case fPromptIDs:
				d.spans.Prompt = Span{int32(start), int32(d.lx.pos)}
			case fResponseIDs:
				d.spans.Response = Span{int32(start), int32(d.lx.pos)}
			}
		}
		return err
	case fResponseLogprobs, fTeacherLogprobs:
		return d.floatList(f, start)
	case fTokenVersions:
		return d.versionList(f, start)
	case fMessages, fMetadata, fMessagesAdded:
		want := byte('[')
		if f == fMetadata {
			want = '{'
		}
		if c != want {
			kind := "an array of objects"
			if f == fMetadata {
				kind = "an object"
			}
			return d.reject(f, start, schemas.ReasonWrongType, "%s must be %s", fieldNames[f], kind)
		}
		before := d.lx.repaired
		if f != fMetadata {
			ok, err := d.arrayOfObjects()
			if err != nil {
				return err
			}
			if !ok {
				return d.reject(f, start, schemas.ReasonWrongType, "%s must be an array of objects", fieldNames[f])
			}
		} else if err := d.lx.skip(1); err != nil {
			return err
		}
		raw := d.lx.rawCopy(start, before)
		switch f {
		case fMessages:
			d.step.Messages = raw
			d.spans.Messages = Span{int32(start), int32(d.lx.pos)}
		case fMessagesAdded:
			d.step.MessagesAdded = raw
		default:
			d.step.Metadata, d.traj.Metadata = raw, raw
		}
		return nil
	case fSignals:
		return d.signalObject(f, start)
	}
	return d.lx.skip(1)
}

func (d *Decoder) setString(f field, start int, b []byte) error {
	switch f {
	case fStepID:
		d.step.StepID = string(b)
	case fTaskID:
		d.step.TaskID = string(b)
		d.traj.TaskID = d.step.TaskID
	case fGroupID:
		d.step.GroupID = string(b)
		d.traj.GroupID = d.step.GroupID
	case fRole:
		d.step.Role = string(b)
		d.traj.Role = d.step.Role
	case fTrajectoryID:
		d.step.TrajectoryID = string(b)
		d.traj.TrajectoryID = d.step.TrajectoryID
	case fFinishReason:
		d.step.FinishReason = string(b)
	case fParentStepID:
		d.step.ParentStepID = string(b)
	case fModel:
		d.step.Model = string(b)
	case fTerminationReason:
		d.traj.TerminationReason = CanonicalTermination(b)
	case fCreatedAt:
		t, err := time.Parse(time.RFC3339Nano, string(b))
		if err != nil {
			return d.reject(f, start, schemas.ReasonInvalidValue, "created_at %q is not an RFC 3339 time", b)
		}
		d.step.CreatedAt, d.step.HasCreatedAt = t.UnixMicro(), true
	}
	return nil
}

// numberToken reads a number, or records wrong_type and returns a nil token.
func (d *Decoder) numberToken(f field, start int) ([]byte, error) {
	c := d.lx.peek()
	if c != '-' && c != 'N' && c != 'I' && (c < '0' || c > '9') {
		return nil, d.reject(f, start, schemas.ReasonWrongType, "%s must be a number", fieldNames[f])
	}
	return d.lx.numToken()
}

// intField reads a non-negative integer. A value error is returned as
// rerr; err is a syntax error.
func (d *Decoder) intField(f field) (v int64, rerr *schemas.RejectError, err error) {
	c := d.lx.peek()
	if c != '-' && c != 'N' && c != 'I' && (c < '0' || c > '9') {
		return 0, schemas.Rejectf(schemas.ReasonWrongType, fieldNames[f], "%s must be an integer", fieldNames[f]), nil
	}
	tok, err := d.lx.numToken()
	if err != nil {
		return 0, nil, err
	}
	v, verr := intValue(tok)
	switch {
	case errors.Is(verr, errSyntax):
		return 0, nil, verr
	case errors.Is(verr, errRange):
		return 0, schemas.Rejectf(schemas.ReasonInvalidValue, fieldNames[f], "%s is %s, outside the 64-bit integer range", fieldNames[f], tok), nil
	case verr != nil:
		return 0, schemas.Rejectf(schemas.ReasonWrongType, fieldNames[f], "%s is %s, not an integer", fieldNames[f], tok), nil
	case v < 0:
		return 0, schemas.Rejectf(schemas.ReasonInvalidValue, fieldNames[f], "%s is %d, must be >= 0", fieldNames[f], v), nil
	case (f == fNumSteps || f == fGroupSize) && v < 1:
		return 0, schemas.Rejectf(schemas.ReasonInvalidValue, fieldNames[f], "%s is %d, must be >= 1", fieldNames[f], v), nil
	case (f == fStepIndex || f == fNumSteps || f == fGroupSize || f == fRejectedSteps) && v > math.MaxInt32:
		// Stored as INT32 columns: a larger value would wrap.
		return 0, schemas.Rejectf(schemas.ReasonInvalidValue, fieldNames[f], "%s is %d, beyond 2^31-1", fieldNames[f], v), nil
	}
	return v, nil, nil
}

// list iterates the elements of a JSON array, calling elem with the index
// of each element at the cursor. It returns the first error of elem.
func (d *Decoder) list(elem func(i int) error) error {
	if err := d.lx.expect('['); err != nil {
		return err
	}
	if d.lx.peek() == ']' {
		d.lx.pos++
		return nil
	}
	for i := 0; ; i++ {
		if err := elem(i); err != nil {
			return err
		}
		switch d.lx.peek() {
		case ',':
			d.lx.pos++
		case ']':
			d.lx.pos++
			return nil
		default:
			return errSyntax
		}
	}
}

// valueErr carries a value error out of a list callback.
type valueErr struct{ r *schemas.RejectError }

func (e valueErr) Error() string { return e.r.Error() }

// finishList turns a list error into either a recorded field error (value
// errors) or a syntax error.
func (d *Decoder) finishList(f field, start int, err error) error {
	var ve valueErr
	if errors.As(err, &ve) {
		d.errs = append(d.errs, fieldErr{f, ve.r})
		d.lx.pos = start
		return d.lx.skip(1)
	}
	return err
}

func (d *Decoder) tokenList(f field, start int) error {
	if d.lx.peek() != '[' {
		return d.reject(f, start, schemas.ReasonWrongType, "%s must be an array of token ids", fieldNames[f])
	}
	if fastLists {
		if ints, ok := d.lx.fastInts(d.ints[:0]); ok {
			d.ints = ints
			d.setTokens(f)
			return nil
		}
	}
	d.ints = d.ints[:0]
	err := d.list(func(i int) error {
		c := d.lx.peek()
		if c != '-' && c != 'N' && c != 'I' && (c < '0' || c > '9') {
			return valueErr{schemas.Rejectf(schemas.ReasonWrongType, fieldNames[f], "%s[%d] is not a number", fieldNames[f], i)}
		}
		tok, err := d.lx.numToken()
		if err != nil {
			return err
		}
		v, verr := intValue(tok)
		switch {
		case errors.Is(verr, errSyntax):
			return verr
		case errors.Is(verr, errNotInteger):
			return valueErr{schemas.Rejectf(schemas.ReasonWrongType, fieldNames[f], "%s[%d] is %s, not an integer", fieldNames[f], i, tok)}
		case verr != nil || v < 0 || v > math.MaxInt32:
			return valueErr{schemas.Rejectf(schemas.ReasonInvalidTokenID, fieldNames[f], "%s[%d] is %s, outside [0, 2147483647]", fieldNames[f], i, tok)}
		}
		d.ints = append(d.ints, int32(v))
		return nil
	})
	if err != nil {
		return d.finishList(f, start, err)
	}
	d.setTokens(f)
	return nil
}

// setTokens stores a copy of d.ints as the step's field f, never nil ([] is
// a list, not an absent one). make then copy from a local compiles to one
// exact-size allocation that is not zeroed first (makeslicecopy; the
// compiler does not match the pattern on a field, hence src); append would
// round up to a size class and clear the tail.
func (d *Decoder) setTokens(f field) {
	src := d.ints
	ids := make([]int32, len(src))
	copy(ids, src)
	switch f {
	case fPromptIDs:
		d.step.PromptIDs = ids
	case fPromptDeltaIDs:
		d.step.PromptDeltaIDs = ids
	default:
		d.step.ResponseIDs = ids
	}
}

func (d *Decoder) floatList(f field, start int) error {
	if d.lx.peek() != '[' {
		return d.reject(f, start, schemas.ReasonWrongType, "%s must be an array of numbers", fieldNames[f])
	}
	if fastLists {
		if floats, ok := d.lx.fastFloats(d.floats[:0]); ok {
			d.floats = floats
			d.setFloats(f)
			return nil
		}
	}
	d.floats = d.floats[:0]
	err := d.list(func(i int) error {
		c := d.lx.peek()
		if c != '-' && c != 'N' && c != 'I' && (c < '0' || c > '9') {
			return valueErr{schemas.Rejectf(schemas.ReasonWrongType, fieldNames[f], "%s[%d] is not a number", fieldNames[f], i)}
		}
		tok, err := d.lx.numToken()
		if err != nil {
			return err
		}
		v, err := floatValue(tok)
		if err != nil {
			return err
		}
		v32 := float32(v)
		if math.IsNaN(v) || math.IsInf(float64(v32), 0) {
			return valueErr{schemas.Rejectf(schemas.ReasonNonFinite, fieldNames[f], "%s[%d] is %s, not a finite float32", fieldNames[f], i, tok)}
		}
		d.floats = append(d.floats, v32)
		return nil
	})
	if err != nil {
		return d.finishList(f, start, err)
	}
	d.setFloats(f)
	return nil
}

// setFloats stores a copy of d.floats as the step's field f (as setTokens).
func (d *Decoder) setFloats(f field) {
	src := d.floats
	vals := make([]float32, len(src))
	copy(vals, src)
	if f == fResponseLogprobs {
		d.step.ResponseLogprobs = vals
	} else {
		d.step.TeacherLogprobs, d.step.HasTeacher = vals, true
	}
}

// versionList reads token_versions: one version per response token, each
// element an integer or, run-length encoded, a pair [version, count] for
// count tokens in a row at version (the two forms may mix).
func (d *Decoder) versionList(f field, start int) error {
	if d.lx.peek() != '[' {
		return d.reject(f, start, schemas.ReasonWrongType, "token_versions must be an array of integers or [version, count] runs")
	}
	d.int64s = d.int64s[:0]
	one := func(i int) (int64, error) {
		v, rerr, err := d.intField(f)
		if err != nil {
			return 0, err
		}
		if rerr != nil {
			rerr.Err = fmt.Errorf("token_versions[%d]: %w", i, rerr.Err)
			return 0, valueErr{rerr}
		}
		return v, nil
	}
	err := d.list(func(i int) error {
		if d.lx.peek() != '[' {
			v, err := one(i)
			if err != nil {
				return err
			}
			d.int64s = append(d.int64s, v)
			return nil
		}
		var run []int64
		if err := d.list(func(int) error {
			v, err := one(i)
			run = append(run, v)
			return err
		}); err != nil {
			return err
		}
		if len(run) != 2 || run[1] < 1 || run[1] > maxVersionRun-int64(len(d.int64s)) {
			return valueErr{schemas.Rejectf(schemas.ReasonInvalidValue, "token_versions",
				"token_versions[%d]: a run is [version, count] with 1 <= count and at most %d tokens in all", i, maxVersionRun)}
		}
		for range run[1] {
			d.int64s = append(d.int64s, run[0])
		}
		return nil
	})
	if err != nil {
		return d.finishList(f, start, err)
	}
	d.step.TokenVersions = append([]int64{}, d.int64s...)
	d.step.HasTokenVersions = true
	return nil
}

// maxVersionRun bounds the tokens token_versions' runs expand to (a run's
// count is the client's: it must not size an allocation beyond reason).
const maxVersionRun = 1 << 22

// arrayOfObjects checks (and consumes) an array whose elements are all
// objects. ok is false for any other element kind.
func (d *Decoder) arrayOfObjects() (ok bool, err error) {
	ok = true
	err = d.list(func(int) error {
		if d.lx.peek() != '{' {
			ok = false
		}
		return d.lx.skip(2)
	})
	return ok, err
}

func (d *Decoder) signalObject(f field, start int) error {
	if d.lx.peek() != '{' {
		return d.reject(f, start, schemas.ReasonWrongType, "signals must be an object of numbers")
	}
	d.lx.pos++
	d.signals = d.signals[:0]
	clear(d.signalIdx)
	if d.lx.peek() == '}' {
		d.lx.pos++
		d.traj.Signals, d.traj.HasSignals = []schemas.Signal{}, true
		return nil
	}
	for {
		name, err := d.lx.str()
		if err != nil {
			return err
		}
		nameStr := string(name)
		if err := d.lx.expect(':'); err != nil {
			return err
		}
		c := d.lx.peek()
		if c != '-' && c != 'N' && c != 'I' && (c < '0' || c > '9') {
			return d.reject(f, start, schemas.ReasonWrongType, "signals[%q] must be a number", nameStr)
		}
		tok, err := d.lx.numToken()
		if err != nil {
			return err
		}
		v, err := floatValue(tok)
		if err != nil {
			return err
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return d.reject(f, start, schemas.ReasonNonFinite, "signals[%q] is %s, not a finite number", nameStr, tok)
		}
		// A repeated name keeps its last value, as JSON decoders do; a MAP
		// with duplicate keys would confuse readers. Names are looked up
		// in the list while it is short, then in an index of it.
		if i, dup := d.signalIndex(nameStr); dup {
			d.signals[i].Value = v
		} else {
			d.signals = append(d.signals, schemas.Signal{Name: nameStr, Value: v})
		}
		switch d.lx.peek() {
		case ',':
			d.lx.pos++
		case '}':
			d.lx.pos++
			d.traj.Signals = append([]schemas.Signal{}, d.signals...)
			d.traj.HasSignals = true
			return nil
		default:
			return errSyntax
		}
	}
}

// signalIndex returns the place of signal name in d.signals, if it is
// there. Past signalScan names it keeps d.signalIdx, so that an object of
// many signals is not quadratic in them.
func (d *Decoder) signalIndex(name string) (int, bool) {
	const signalScan = 16
	if len(d.signals) < signalScan {
		for i := range d.signals {
			if d.signals[i].Name == name {
				return i, true
			}
		}
		return 0, false
	}
	if d.signalIdx == nil {
		d.signalIdx = map[string]int{}
	}
	if len(d.signalIdx) == 0 {
		for i, sg := range d.signals {
			d.signalIdx[sg.Name] = i
		}
	}
	i, ok := d.signalIdx[name]
	if !ok {
		d.signalIdx[name] = len(d.signals) // the caller appends it
	}
	return i, ok
}

func (d *Decoder) finishStep() error {
	for _, f := range requiredStep {
		if !d.seen[f] {
			return schemas.Rejectf(schemas.ReasonMissingField, fieldNames[f], "step record has no %s", fieldNames[f])
		}
	}
	s := &d.step
	if !d.seen[fParentStepID] {
		s.ParentStepID = ""
	}
	if !d.seen[fPromptDeltaIDs] {
		s.PromptDeltaIDs = nil
	}
	if !d.seen[fMessagesAdded] {
		s.MessagesAdded = nil
	}
	switch {
	case d.seen[fMessagesAdded] && d.seen[fMessages] && s.Messages != nil:
		return schemas.Rejectf(schemas.ReasonInvalidValue, "messages_added", "a step carries messages or messages_added, not both")
	case d.seen[fMessagesAdded] && !d.seen[fParentStepID]:
		return schemas.Rejectf(schemas.ReasonMissingField, "parent_step_id", "messages_added needs the parent_step_id whose messages it extends")
	}
	// The prompt: whole, or a delta of an earlier step of the trajectory
	// (its prompt and response, then these tokens).
	switch delta, parent := d.seen[fPromptDeltaIDs], d.seen[fParentStepID]; {
	case d.seen[fPromptIDs] && (delta || parent):
		return schemas.Rejectf(schemas.ReasonInvalidValue, "prompt_delta_ids", "a step carries prompt_ids or prompt_delta_ids with parent_step_id, not both")
	case d.seen[fPromptIDs]:
	case delta && !parent:
		return schemas.Rejectf(schemas.ReasonMissingField, "parent_step_id", "prompt_delta_ids needs the parent_step_id it extends")
	case parent && !delta:
		return schemas.Rejectf(schemas.ReasonMissingField, "prompt_delta_ids", "parent_step_id needs prompt_delta_ids")
	case !delta:
		return schemas.Rejectf(schemas.ReasonMissingField, "prompt_ids", "step record has no prompt_ids")
	case s.ParentStepID == "":
		return schemas.Rejectf(schemas.ReasonInvalidValue, "parent_step_id", "parent_step_id is empty")
	case s.ParentStepID == s.StepID:
		return schemas.Rejectf(schemas.ReasonInvalidParent, "parent_step_id", "parent_step_id %q is the step itself, not an earlier step of its trajectory", s.ParentStepID)
	}
	for _, id := range [...]struct {
		f field
		v string
	}{{fStepID, s.StepID}, {fTaskID, s.TaskID}, {fTrajectoryID, s.TrajectoryID}} {
		if id.v == "" {
			return schemas.Rejectf(schemas.ReasonInvalidValue, fieldNames[id.f], "%s is empty", fieldNames[id.f])
		}
	}
	n := len(s.ResponseIDs)
	if len(s.ResponseLogprobs) != n {
		return schemas.Rejectf(schemas.ReasonLengthMismatch, "response_logprobs", "response_logprobs has %d values for %d response tokens", len(s.ResponseLogprobs), n)
	}
	if s.HasTokenVersions && len(s.TokenVersions) != n {
		return schemas.Rejectf(schemas.ReasonLengthMismatch, "token_versions", "token_versions has %d values for %d response tokens", len(s.TokenVersions), n)
	}
	if s.HasTeacher && len(s.TeacherLogprobs) != n {
		return schemas.Rejectf(schemas.ReasonLengthMismatch, "teacher_logprobs", "teacher_logprobs has %d values for %d response tokens", len(s.TeacherLogprobs), n)
	}
	// Fields that a null reset must not leave half-set.
	if !d.seen[fTokenVersions] {
		s.TokenVersions, s.HasTokenVersions = nil, false
	}
	if !d.seen[fTeacherLogprobs] {
		s.TeacherLogprobs, s.HasTeacher = nil, false
	}
	if !d.seen[fReward] {
		s.Reward, s.HasReward = 0, false
	}
	return nil
}

func (d *Decoder) finishTraj() error {
	for _, f := range requiredTraj {
		if !d.seen[f] {
			return schemas.Rejectf(schemas.ReasonMissingField, fieldNames[f], "trajectory record has no %s", fieldNames[f])
		}
	}
	t := &d.traj
	for _, id := range [...]struct {
		f field
		v string
	}{{fTrajectoryID, t.TrajectoryID}, {fTaskID, t.TaskID}} {
		if id.v == "" {
			return schemas.Rejectf(schemas.ReasonInvalidValue, fieldNames[id.f], "%s is empty", fieldNames[id.f])
		}
	}
	if !d.seen[fSignals] {
		t.Signals, t.HasSignals = nil, false
	}
	return nil
}

// terminationReasons are the canonical (stored) termination reasons that
// rLLM also sends, in lower case (rllm.workflows.workflow.TerminationReason
// values): the canonical form is the upper-case name of rLLM's enum member.
var terminationReasons = [...]string{
	"MAX_PROMPT_LENGTH_EXCEEDED", "MAX_RESPONSE_LENGTH_EXCEEDED", "ENV_DONE",
	"MAX_TURNS_EXCEEDED", "TIMEOUT", "UNKNOWN", "ERROR",
}

// rllmEnumPrefix is what Python's str() puts before a TerminationReason
// member's name ("TerminationReason.ENV_DONE").
const rllmEnumPrefix = "TerminationReason."

// CanonicalTermination returns the stored form of a termination_reason:
// any spelling of one of rLLM's reasons, in any letter case and with or
// without the "TerminationReason." prefix of Python's str(enum), becomes
// its canonical upper-case name (env_done → ENV_DONE); any other value is
// kept as received. It does not allocate for the canonical reasons.
func CanonicalTermination(b []byte) string {
	name := b
	if len(name) > len(rllmEnumPrefix) && string(name[:len(rllmEnumPrefix)]) == rllmEnumPrefix {
		name = name[len(rllmEnumPrefix):]
	}
	for _, r := range terminationReasons {
		if equalFoldASCII(name, r) {
			return r
		}
	}
	return string(b)
}

// equalFoldASCII reports whether b equals the upper-case ASCII string
// upper, ignoring ASCII letter case.
func equalFoldASCII(b []byte, upper string) bool {
	if len(b) != len(upper) {
		return false
	}
	for i := range len(b) {
		c := b[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != upper[i] {
			return false
		}
	}
	return true
}
