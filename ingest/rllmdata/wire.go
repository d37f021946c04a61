package rllmdata

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Output receives what an import produces, in order: wire-format lines
// (without the newline) and dead letters. Record's key is the record's
// group key (its task id), for outputs that partition. An error from
// either method stops the import and is returned by it.
type Output interface {
	Record(key string, line []byte) error
	DeadLetter(d schemas.DeadLetter) error
}

// Options control an import.
type Options struct {
	// PolicyVersion is the policy (weight) version of steps whose data has
	// none; without HasPolicyVersion such a step is a missing_field dead
	// letter.
	PolicyVersion    int64
	HasPolicyVersion bool
	// Rewards gives the outcome of a session (SQLite traces, which hold
	// none) or of an episode or trajectory whose reward is null, by id.
	Rewards Rewards
	// GroupSize, when > 0, is written as group_size on every trajectory
	// record.
	GroupSize int64
}

// Summary counts what an import did.
type Summary struct {
	Sources      int64 // sessions (SQLite) or episode files read
	Steps        int64 // step records written
	Trajectories int64 // trajectory records written
	// DeadLetters counts the records (and unreadable rows or files) not
	// written, by reason.
	DeadLetters map[schemas.Reason]int64
	// Unscored counts sessions or trajectories left without a reward: their
	// trajectory record is a dead letter, their steps are written.
	Unscored int64
	// UnusedRewards counts entries of Options.Rewards that matched nothing.
	UnusedRewards int64
}

// Dead returns the number of dead letters.
func (s *Summary) Dead() int64 {
	var n int64
	for _, v := range s.DeadLetters {
		n += v
	}
	return n
}

// wireStep is a Step record as written. Token and logprob lists are the
// raw JSON of the source, so nulls and out-of-range values reach the
// decoder's check as they are, never silently mended.
type wireStep struct {
	Type             string          `json:"type"`
	StepID           string          `json:"step_id"`
	TaskID           string          `json:"task_id"`
	Role             string          `json:"role,omitempty"`
	TrajectoryID     string          `json:"trajectory_id"`
	StepIndex        int64           `json:"step_index"`
	PolicyVersion    *int64          `json:"policy_version,omitempty"`
	PromptIDs        json.RawMessage `json:"prompt_ids,omitempty"`
	ResponseIDs      json.RawMessage `json:"response_ids,omitempty"`
	ResponseLogprobs json.RawMessage `json:"response_logprobs,omitempty"`
	Messages         json.RawMessage `json:"messages,omitempty"`
	Reward           *float64        `json:"reward,omitempty"`
	Done             *bool           `json:"done,omitempty"`
	FinishReason     string          `json:"finish_reason,omitempty"`
	Model            string          `json:"model,omitempty"`
	CreatedAt        string          `json:"created_at,omitempty"`
	Metadata         json.RawMessage `json:"metadata,omitempty"`
}

// wireTrajectory is a Trajectory record as written.
type wireTrajectory struct {
	Type              string             `json:"type"`
	TrajectoryID      string             `json:"trajectory_id"`
	TaskID            string             `json:"task_id"`
	Role              string             `json:"role,omitempty"`
	Reward            *float64           `json:"reward,omitempty"`
	NumSteps          int64              `json:"num_steps"`
	TerminationReason string             `json:"termination_reason,omitempty"`
	Signals           map[string]float64 `json:"signals,omitempty"`
	IsCorrect         *bool              `json:"is_correct,omitempty"`
	GroupSize         int64              `json:"group_size,omitempty"`
	Metadata          json.RawMessage    `json:"metadata,omitempty"`
}

// emitter checks each record with the pipeline's decoder and hands it to
// the output, or dead-letters it with the decoder's reason.
type emitter struct {
	out Output
	dec ingest.Decoder
	sum *Summary
}

func (e *emitter) dead(reason schemas.Reason, src schemas.Source, record []byte, format string, args ...any) error {
	if e.sum.DeadLetters == nil {
		e.sum.DeadLetters = map[schemas.Reason]int64{}
	}
	e.sum.DeadLetters[reason]++
	return e.out.DeadLetter(schemas.DeadLetter{Reason: reason, Error: fmt.Sprintf(format, args...), Source: src, Record: record})
}

// emit marshals rec, checks it and writes it. ok reports whether it was
// written; err is an output error.
func (e *emitter) emit(src schemas.Source, key string, rec any) (ok bool, err error) {
	line, merr := json.Marshal(rec)
	if merr != nil {
		// Only non-finite floats get here (the rest is strings, raw JSON
		// already parsed, and integers).
		return false, e.dead(schemas.ReasonNonFinite, src, nil, "%s: %v", describe(rec), merr)
	}
	if _, derr := e.dec.Decode(line); derr != nil {
		var re *schemas.RejectError
		reason := schemas.ReasonInvalidValue
		if errors.As(derr, &re) {
			reason = re.Reason
		}
		return false, e.dead(reason, src, line, "%s: %v", describe(rec), derr)
	}
	if err := e.out.Record(key, line); err != nil {
		return false, fmt.Errorf("write record: %w", err)
	}
	switch rec.(type) {
	case *wireStep:
		e.sum.Steps++
	case *wireTrajectory:
		e.sum.Trajectories++
	}
	return true, nil
}

func describe(rec any) string {
	switch r := rec.(type) {
	case *wireStep:
		return fmt.Sprintf("step %q (trajectory %q, index %d)", r.StepID, r.TrajectoryID, r.StepIndex)
	case *wireTrajectory:
		return fmt.Sprintf("trajectory %q", r.TrajectoryID)
	}
	return "record"
}

// finite returns v when it is a finite number, else nil.
func finite(v *float64) *float64 {
	if v == nil || math.IsNaN(*v) || math.IsInf(*v, 0) {
		return nil
	}
	return v
}

// unixTime formats seconds since the epoch as RFC 3339 (UTC,
// microseconds); "" for zero or a value out of range.
func unixTime(sec float64) string {
	if sec <= 0 || math.IsNaN(sec) || sec > 1e11 {
		return ""
	}
	whole, frac := math.Modf(sec)
	t := time.Unix(int64(whole), int64(math.Round(frac*1e6))*1e3).UTC()
	return t.Format("2006-01-02T15:04:05.000000Z07:00")
}

// isNull reports whether raw JSON is absent or null.
func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// rawList returns raw when it is a JSON array, else nil (absent).
func rawList(raw json.RawMessage) json.RawMessage {
	for _, c := range raw {
		switch c {
		case ' ', '\t', '\n', '\r':
			continue
		case '[':
			return raw
		}
		return nil
	}
	return nil
}

// emptyList reports whether raw is absent, null or an empty JSON array.
func emptyList(raw json.RawMessage) bool {
	var v []json.RawMessage
	if isNull(raw) {
		return true
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return false
	}
	return len(v) == 0
}

// idString returns a JSON string or integer as an id ("" for anything
// else).
func idString(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		if _, err := strconv.ParseInt(string(n), 10, 64); err == nil {
			return string(n)
		}
	}
	return ""
}

// metadataJSON encodes m, nil when it is empty.
func metadataJSON(m map[string]any) json.RawMessage {
	if len(m) == 0 {
		return nil
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil
	}
	return b
}
