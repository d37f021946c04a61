package schemas

import "fmt"

// Reason is a stable, machine-readable code for why a record was not
// written. It is the label of dead-letter metrics and the "reason" field of
// a dead-letter line; codes are never renamed.
type Reason string

// Reasons produced while decoding a single record.
const (
	ReasonMalformedJSON  Reason = "malformed_json"   // not valid JSON
	ReasonNotAnObject    Reason = "not_an_object"    // valid JSON, but not an object
	ReasonMissingField   Reason = "missing_field"    // required field absent or null
	ReasonWrongType      Reason = "wrong_type"       // field of the wrong JSON type
	ReasonUnknownType    Reason = "unknown_type"     // "type" is neither step nor trajectory
	ReasonInvalidValue   Reason = "invalid_value"    // right type, out of domain (empty id, negative index, bad timestamp)
	ReasonInvalidTokenID Reason = "invalid_token_id" // token id outside [0, 2^31-1]
	ReasonNonFinite      Reason = "non_finite"       // NaN, ±Inf, or overflow in a float field
	ReasonLengthMismatch Reason = "length_mismatch"  // per-token list length differs from response_ids
	ReasonTooLarge       Reason = "too_large"        // record larger than the configured limit
)

// Reasons produced while assembling groups, where a record is judged
// against the records that came before it.
const (
	ReasonDuplicateConflict    Reason = "duplicate_conflict"    // same id (or step position), different content
	ReasonInconsistent         Reason = "inconsistent"          // disagrees with earlier records of its trajectory or group
	ReasonStepOutOfRange       Reason = "step_out_of_range"     // step_index >= num_steps
	ReasonIncompleteTrajectory Reason = "incomplete_trajectory" // trajectory unfinished when its group was emitted
	ReasonIncompleteGroup      Reason = "incomplete_group"      // group below --min-group-size at timeout or end of input
	ReasonLate                 Reason = "late"                  // record for a group already emitted
	ReasonInvalidParent        Reason = "invalid_parent"        // parent_step_id names no earlier step of its trajectory
	ReasonRejectedStep         Reason = "rejected_step"         // its trajectory says a step of it was rejected at capture (rejected_steps)
)

// Source is where a record came from: file and 1-based line for files,
// topic, partition and offset for Kafka.
type Source struct {
	// Stream identifies the ordered input the position belongs to, for
	// exactly-once bookkeeping: a file's absolute path and a fingerprint
	// of its head, or topic/partition. Empty for inputs that cannot be
	// replayed (stdin): those are never skipped on a restart.
	Stream    string `json:"-"`
	File      string `json:"file,omitempty"`
	Line      int64  `json:"line,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition int32  `json:"partition,omitempty"`
	Offset    int64  `json:"offset,omitempty"`
}

// Position is the record's place in its stream: the Kafka offset, or the
// file line.
func (s Source) Position() int64 {
	if s.Topic != "" {
		return s.Offset
	}
	return s.Line
}

func (s Source) String() string {
	if s.Topic != "" {
		return fmt.Sprintf("%s/%d@%d", s.Topic, s.Partition, s.Offset)
	}
	return fmt.Sprintf("%s:%d", s.File, s.Line)
}

// RejectError is the typed error of a record that cannot be written. Reason
// is the stable code; Field names the offending field when there is one.
type RejectError struct {
	Reason Reason
	Field  string
	Err    error
}

func (e *RejectError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: field %q: %v", e.Reason, e.Field, e.Err)
	}
	return fmt.Sprintf("%s: %v", e.Reason, e.Err)
}

func (e *RejectError) Unwrap() error { return e.Err }

// Rejectf builds a *RejectError with a formatted message.
func Rejectf(reason Reason, field, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Field: field, Err: fmt.Errorf(format, args...)}
}
