package gateway

import (
	"encoding/json"
	"fmt"
)

// RefusedError is an Output's refusal of one record of a Write, which no
// retry can write (larger than the output takes, not one line). The
// writers then write the record's stub in its place (refusedStub) and go
// on: one bad record never holds up the others.
type RefusedError struct {
	Index  int    // the record's place in the Write's records
	Reason string // machine-readable: too_large, line_break, ...
	Err    error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("gateway: the output refused record %d (%s): %v", e.Index, e.Reason, e.Err)
}

func (e *RefusedError) Unwrap() error { return e.Err }

// stubKeys are the fields a stub keeps: what names the record and places
// it (its step, trajectory and group), none of its content.
var stubKeys = []string{"type", "step_id", "task_id", "group_id", "role", "trajectory_id", "step_index", "policy_version", "finish_reason", "model"}

// refusedStub is what is written for a record the output cannot take: its
// identity fields (string and number values only) and metadata.gateway_reject
// = reason with the record's size, without its tokens, messages or reward.
// Ingest dead-letters it (missing_field) under its own step or trajectory
// id, so the record is accounted for where its data goes, instead of
// vanishing or stopping the output.
func refusedStub(line []byte, reason string) []byte {
	stub := map[string]any{}
	if fs, err := splitObject(line); err == nil {
		for _, k := range stubKeys {
			v, ok := getField(fs, k)
			if !ok || len(v) == 0 || len(v) > 1024 || (v[0] != '"' && (v[0] < '0' || v[0] > '9') && v[0] != '-') {
				continue
			}
			stub[k] = json.RawMessage(v)
		}
	}
	if _, ok := stub["type"]; !ok {
		stub["type"] = "step"
	}
	stub["metadata"] = map[string]any{"gateway_reject": reason, "gateway_record_bytes": len(line)}
	b, _ := json.Marshal(stub)
	return b
}
