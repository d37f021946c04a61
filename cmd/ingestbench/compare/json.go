package compare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/bytedance/sonic"
	"github.com/minio/simdjson-go"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/ingest/synth"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Records generates the benchmark's records: the shape of the ingest
// benchmark (cmd/ingestbench "steps": 8 rollouts per group, 1-4 steps,
// ~512-token prompts, ~256-token responses), with or without chat
// messages, as JSON lines ending in newlines.
func Records(groups int, messages bool) ([]byte, error) {
	var buf bytes.Buffer
	_, err := synth.Generate(context.Background(), &buf, synth.Config{
		Groups: groups, GroupSize: 8, MinSteps: 1, MaxSteps: 4,
		PromptLen: 512, ResponseLen: 256, Messages: messages, Seed: 1,
	})
	return buf.Bytes(), err
}

// lines calls fn for each line of data (without its newline).
func lines(data []byte, fn func([]byte) error) error {
	for len(data) > 0 {
		nl := bytes.IndexByte(data, '\n')
		if nl < 0 {
			nl = len(data)
		}
		if err := fn(data[:nl]); err != nil {
			return err
		}
		data = data[min(nl+1, len(data)):]
	}
	return nil
}

// DecodeOurs decodes every line with ingest.Decoder, calling fn with each
// record.
func DecodeOurs(data []byte, fn func(ingest.Record)) error {
	var d ingest.Decoder
	return lines(data, func(l []byte) error {
		r, err := d.Decode(l)
		if err != nil {
			return err
		}
		fn(r)
		return nil
	})
}

// wire is the record as sonic decodes it: both record types' fields, the
// optional ones as pointers so that absent and zero differ.
type wire struct {
	Type              string             `json:"type"`
	StepID            string             `json:"step_id"`
	TaskID            string             `json:"task_id"`
	GroupID           string             `json:"group_id"`
	Role              string             `json:"role"`
	TrajectoryID      string             `json:"trajectory_id"`
	StepIndex         int64              `json:"step_index"`
	PolicyVersion     int64              `json:"policy_version"`
	PromptIDs         []int32            `json:"prompt_ids"`
	ResponseIDs       []int32            `json:"response_ids"`
	ResponseLogprobs  []float32          `json:"response_logprobs"`
	Messages          json.RawMessage    `json:"messages"`
	Metadata          json.RawMessage    `json:"metadata"`
	Reward            *float64           `json:"reward"`
	Done              *bool              `json:"done"`
	FinishReason      string             `json:"finish_reason"`
	Model             string             `json:"model"`
	CreatedAt         string             `json:"created_at"`
	NumSteps          int64              `json:"num_steps"`
	TerminationReason string             `json:"termination_reason"`
	Signals           map[string]float64 `json:"signals"`
	IsCorrect         *bool              `json:"is_correct"`
	GroupSize         int64              `json:"group_size"`
}

// DecodeSonic decodes every line with sonic into wire and fills the same
// Record ingest.Decoder returns for the benchmark's records (the fields
// and validation the generator exercises; signals in name order, since a
// map has none).
func DecodeSonic(data []byte, fn func(ingest.Record)) error {
	api := sonic.ConfigDefault
	return lines(data, func(l []byte) error {
		var w wire
		if err := api.Unmarshal(l, &w); err != nil {
			return err
		}
		switch w.Type {
		case "step":
			s := &schemas.Step{
				StepID: w.StepID, TaskID: w.TaskID, GroupID: w.GroupID, Role: w.Role,
				TrajectoryID: w.TrajectoryID, StepIndex: w.StepIndex, PolicyVersion: w.PolicyVersion,
				PromptIDs: w.PromptIDs, ResponseIDs: w.ResponseIDs, ResponseLogprobs: w.ResponseLogprobs,
				Messages: raw(w.Messages), Metadata: raw(w.Metadata),
				FinishReason: w.FinishReason, Model: w.Model,
			}
			if w.Reward != nil {
				s.Reward, s.HasReward = *w.Reward, true
			}
			if w.Done != nil {
				s.Done, s.HasDone = *w.Done, true
			}
			if err := setCreated(s, w.CreatedAt); err != nil {
				return err
			}
			if err := checkStep(s); err != nil {
				return err
			}
			fn(ingest.Record{Type: schemas.TypeStep, Step: s})
		case "trajectory":
			t := &schemas.Trajectory{
				TrajectoryID: w.TrajectoryID, TaskID: w.TaskID, GroupID: w.GroupID, Role: w.Role,
				NumSteps: w.NumSteps, TerminationReason: ingest.CanonicalTermination([]byte(w.TerminationReason)),
				GroupSize: w.GroupSize, Metadata: raw(w.Metadata),
			}
			if w.Reward != nil {
				t.Reward = *w.Reward
			}
			if w.IsCorrect != nil {
				t.IsCorrect, t.HasIsCorrect = *w.IsCorrect, true
			}
			if w.Signals != nil {
				t.HasSignals, t.Signals = true, make([]schemas.Signal, 0, len(w.Signals))
				for k, v := range w.Signals {
					t.Signals = append(t.Signals, schemas.Signal{Name: k, Value: v})
				}
				slices.SortFunc(t.Signals, func(a, b schemas.Signal) int { return strings.Compare(a.Name, b.Name) })
			}
			fn(ingest.Record{Type: schemas.TypeTrajectory, Trajectory: t})
		default:
			return fmt.Errorf("unknown record type %q", w.Type)
		}
		return nil
	})
}

// raw keeps a raw JSON value, nil for an absent or null one.
func raw(m json.RawMessage) []byte {
	if len(m) == 0 || string(m) == "null" {
		return nil
	}
	return m
}

func setCreated(s *schemas.Step, v string) error {
	if v == "" {
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return err
	}
	s.CreatedAt, s.HasCreatedAt = t.UnixMicro(), true
	return nil
}

// checkStep is the part of ingest's validation a step of the generator
// goes through.
func checkStep(s *schemas.Step) error {
	if s.StepID == "" || s.TaskID == "" || s.TrajectoryID == "" {
		return errors.New("step without an id")
	}
	if len(s.ResponseLogprobs) != len(s.ResponseIDs) {
		return errors.New("response_logprobs and response_ids differ in length")
	}
	return nil
}

// SimdDecoder decodes with simdjson-go: a whole chunk of lines is parsed
// at once (its strength: ParseND), then each record's fields are read
// from the tape into the same Record ingest.Decoder returns. Messages and
// metadata are re-serialised from the tape (simdjson-go has no raw
// value), so they come out compact.
type SimdDecoder struct {
	pj              *simdjson.ParsedJson
	root, val, elem simdjson.Iter
	obj             simdjson.Object
	arr             simdjson.Array
}

// Decode decodes the lines of chunk.
func (d *SimdDecoder) Decode(chunk []byte, fn func(ingest.Record)) error {
	pj, err := simdjson.ParseND(chunk, d.pj)
	if err != nil {
		return err
	}
	d.pj = pj
	it := pj.Iter()
	for {
		t := it.Advance()
		if t == simdjson.TypeNone {
			return nil
		}
		if t != simdjson.TypeRoot {
			return fmt.Errorf("unexpected %v at top level", t)
		}
		if _, _, err := it.Root(&d.root); err != nil {
			return err
		}
		r, err := d.record()
		if err != nil {
			return err
		}
		fn(r)
	}
}

func (d *SimdDecoder) record() (ingest.Record, error) {
	obj, err := d.root.Object(&d.obj)
	if err != nil {
		return ingest.Record{}, err
	}
	var s schemas.Step
	var t schemas.Trajectory
	var typ string
	for {
		name, vt, err := obj.NextElementBytes(&d.val)
		if err != nil {
			return ingest.Record{}, err
		}
		if vt == simdjson.TypeNone {
			break
		}
		if err := d.field(string(name), vt, &s, &t, &typ); err != nil {
			return ingest.Record{}, fmt.Errorf("%s: %w", name, err)
		}
	}
	switch typ {
	case "step":
		if err := checkStep(&s); err != nil {
			return ingest.Record{}, err
		}
		return ingest.Record{Type: schemas.TypeStep, Step: &s}, nil
	case "trajectory":
		t.TrajectoryID, t.TaskID, t.GroupID, t.Role = s.TrajectoryID, s.TaskID, s.GroupID, s.Role
		t.Metadata = s.Metadata
		return ingest.Record{Type: schemas.TypeTrajectory, Trajectory: &t}, nil
	}
	return ingest.Record{}, fmt.Errorf("unknown record type %q", typ)
}

func (d *SimdDecoder) field(name string, vt simdjson.Type, s *schemas.Step, t *schemas.Trajectory, typ *string) error {
	v := &d.val
	var err error
	switch name {
	case "type":
		*typ, err = v.String()
	case "step_id":
		s.StepID, err = v.String()
	case "task_id":
		s.TaskID, err = v.String()
	case "group_id":
		s.GroupID, err = v.String()
	case "role":
		s.Role, err = v.String()
	case "trajectory_id":
		s.TrajectoryID, err = v.String()
	case "step_index":
		s.StepIndex, err = v.Int()
	case "policy_version":
		s.PolicyVersion, err = v.Int()
	case "prompt_ids":
		s.PromptIDs, err = d.ints()
	case "response_ids":
		s.ResponseIDs, err = d.ints()
	case "response_logprobs":
		s.ResponseLogprobs, err = d.floats()
	case "messages":
		s.Messages, err = v.MarshalJSONBuffer(nil)
	case "metadata":
		if vt != simdjson.TypeNull {
			s.Metadata, err = v.MarshalJSONBuffer(nil)
		}
	case "reward":
		s.Reward, err = v.Float()
		s.HasReward, t.Reward = true, s.Reward
	case "done":
		s.Done, err = v.Bool()
		s.HasDone = true
	case "finish_reason":
		s.FinishReason, err = v.String()
	case "model":
		s.Model, err = v.String()
	case "created_at":
		var c string
		if c, err = v.String(); err == nil {
			err = setCreated(s, c)
		}
	case "num_steps":
		t.NumSteps, err = v.Int()
	case "termination_reason":
		var b []byte
		b, err = v.StringBytes()
		t.TerminationReason = ingest.CanonicalTermination(b)
	case "is_correct":
		t.IsCorrect, err = v.Bool()
		t.HasIsCorrect = true
	case "group_size":
		t.GroupSize, err = v.Int()
	case "signals":
		err = d.signals(t)
	}
	return err
}

func (d *SimdDecoder) ints() ([]int32, error) {
	a, err := d.val.Array(&d.arr)
	if err != nil {
		return nil, err
	}
	it := a.Iter()
	out := []int32{}
	for it.Advance() != simdjson.TypeNone {
		v, err := it.Int()
		if err != nil {
			return nil, err
		}
		out = append(out, int32(v))
	}
	return out, nil
}

func (d *SimdDecoder) floats() ([]float32, error) {
	a, err := d.val.Array(&d.arr)
	if err != nil {
		return nil, err
	}
	it := a.Iter()
	out := []float32{}
	for it.Advance() != simdjson.TypeNone {
		v, err := it.Float()
		if err != nil {
			return nil, err
		}
		out = append(out, float32(v))
	}
	return out, nil
}

func (d *SimdDecoder) signals(t *schemas.Trajectory) error {
	var o simdjson.Object
	obj, err := d.val.Object(&o)
	if err != nil {
		return err
	}
	t.HasSignals, t.Signals = true, []schemas.Signal{}
	for {
		name, vt, err := obj.NextElementBytes(&d.elem)
		if err != nil {
			return err
		}
		if vt == simdjson.TypeNone {
			return nil
		}
		v, err := d.elem.Float()
		if err != nil {
			return err
		}
		t.Signals = append(t.Signals, schemas.Signal{Name: string(name), Value: v})
	}
}
