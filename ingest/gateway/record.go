package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/prefix"
)

// Reasons a step is written so that ingest dead-letters it
// (metadata.gateway_reject; the ingest reason in parentheses).
const (
	rejectNullLogprob    = "null_logprob"        // a null logprob entry, written as null in place (wrong_type, as the same record from import rllm or rllm_pipe.emit)
	rejectLogprobCount   = "logprob_count"       // not one logprob per response token (length_mismatch)
	rejectMissingIDs     = "missing_token_ids"   // no prompt or response ids (missing_field)
	rejectUnreadable     = "unreadable_response" // the body was not the JSON expected (missing_field)
	rejectTooLarge       = "too_large"           // larger than the output takes: written as its stub (missing_field)
	cutClientDisconnect  = "client_disconnect"
	cutUpstream          = "upstream_cut"
	cutUpstreamError     = "upstream_error" // the stream ended with an error event
	cutTooLarge          = "too_large"      // the stream passed Config.MaxResponseBytes and was stopped
	finishReasonCutShort = "abort"
)

// call is one recorded agent call, from dispatch to the last byte.
type call struct {
	sess     *session
	endpoint string // chat, completions, generate
	version  int64  // weight version at dispatch
	dispatch time.Time
	latency  time.Duration
	messages json.RawMessage // request messages (chat)
	tools    json.RawMessage
	model    string          // requested model
	sampling json.RawMessage // the sampling parameters sent (an object), nil when none
	cap      capture
	stream   bool
	cutOff   string // why the agent did not get the whole answer ("" when it did)
	partial  bool   // the response recorded is cut short (else whole, the agent just never read it)
	// answering: the call is counted in sess.answered from the moment its
	// answer's end is written to the agent until it is recorded.
	answering bool
}

// answer counts cl in its session's answered calls, once.
func (cl *call) answer() {
	if !cl.answering {
		cl.answering = true
		cl.sess.answered.add(1)
	}
}

// stepRecord is a Step of the wire format. Pointer slices: nil is absent
// (ingest: missing_field), empty is present.
type stepRecord struct {
	Type             string          `json:"type"`
	StepID           string          `json:"step_id"`
	TaskID           string          `json:"task_id"`
	GroupID          string          `json:"group_id,omitempty"`
	Role             string          `json:"role,omitempty"`
	TrajectoryID     string          `json:"trajectory_id"`
	StepIndex        int64           `json:"step_index"`
	PolicyVersion    int64           `json:"policy_version"`
	PromptIDs        *[]int64        `json:"prompt_ids,omitempty"`
	ParentStepID     string          `json:"parent_step_id,omitempty"`
	PromptDeltaIDs   *[]int64        `json:"prompt_delta_ids,omitempty"`
	ResponseIDs      *[]int64        `json:"response_ids,omitempty"`
	ResponseLogprobs json.RawMessage `json:"response_logprobs,omitempty"`
	// TokenVersions, run-length encoded ([version, count] runs), when the
	// response's tokens span policy versions.
	TokenVersions [][2]int64      `json:"token_versions,omitempty"`
	Messages      json.RawMessage `json:"messages,omitempty"`
	FinishReason  string          `json:"finish_reason,omitempty"`
	Model         string          `json:"model,omitempty"`
	CreatedAt     string          `json:"created_at"`
	Metadata      json.RawMessage `json:"metadata"`
}

// stepMeta is the step's metadata: what the wire format has no field for.
type stepMeta struct {
	SessionID     string          `json:"session_id"`
	Endpoint      string          `json:"endpoint"`
	LatencyMS     float64         `json:"latency_ms"`
	Stream        bool            `json:"stream,omitempty"`
	Tools         json.RawMessage `json:"tools,omitempty"`
	Choices       int             `json:"n,omitempty"`
	CutOff        string          `json:"cut_off,omitempty"`
	Reject        string          `json:"gateway_reject,omitempty"`
	NullLogprobAt []int           `json:"null_logprob_positions,omitempty"`
	PromptTokens  int64           `json:"prompt_tokens,omitempty"`
	ComplTokens   int64           `json:"completion_tokens,omitempty"`
	// VersionChanges are where the generation crossed a weight update:
	// the response token at which each new version begins (an interrupted
	// and continued generation).
	VersionChanges []versionChange `json:"version_changes,omitempty"`
	// Sampling are the sampling parameters the call was sent with and the
	// engine's logprobs mode when it stamped one (logprobs_mode): what the
	// behaviour logprobs mean.
	Sampling json.RawMessage `json:"sampling,omitempty"`
	// PromptFork, for a step whose prompt does not extend the previous
	// step's prompt and answer (a chat template that re-rendered history):
	// where they diverge.
	PromptFork *promptFork `json:"prompt_fork,omitempty"`
}

// promptFork is where a prompt leaves its predecessor's prompt + answer:
// At, the first token that differs (their common prefix's length), of
// PrevTokens.
type promptFork struct {
	At         int `json:"at"`
	PrevTokens int `json:"prev_tokens"`
}

// versionChange is a response token position where a new policy version
// begins.
type versionChange struct {
	At      int   `json:"at"`
	Version int64 `json:"version"`
}

// tokenVersions fills the unknown runs of in with version and returns the
// runs and where the version changes; nil, nil when every token is at
// version (nothing the step's own version does not say).
func tokenVersions(in [][2]int64, version int64) ([][2]int64, []versionChange) {
	var runs [][2]int64
	var changes []versionChange
	mixed, at := false, 0
	for _, r := range in {
		v := r[0]
		if v < 0 {
			v = version
		}
		mixed = mixed || v != version
		if n := len(runs); n > 0 && runs[n-1][0] == v {
			runs[n-1][1] += r[1]
		} else {
			if at > 0 {
				changes = append(changes, versionChange{At: at, Version: v})
			}
			runs = append(runs, [2]int64{v, r[1]})
		}
		at += int(r[1])
	}
	if !mixed {
		return nil, nil
	}
	return runs, changes
}

// reject classifies a capture: "" when the step is trainable.
func (c *capture) reject() string {
	switch {
	case c.unreadable && (c.promptIDs == nil || c.responseIDs == nil):
		return rejectUnreadable
	case c.promptIDs == nil || c.responseIDs == nil:
		return rejectMissingIDs
	case len(c.nullAt) > 0:
		return rejectNullLogprob
	case len(c.logprobs) != len(c.responseIDs):
		return rejectLogprobCount
	}
	return ""
}

// logprobsJSON is the response_logprobs array as the upstream gave it:
// a null entry stays null in its place (ingest dead-letters the step as
// wrong_type, as it does the same record imported or emitted from
// Python), never dropped so that the rest shift.
func (c *capture) logprobsJSON() json.RawMessage {
	if len(c.nullAt) == 0 {
		if c.logprobs == nil {
			return json.RawMessage("[]")
		}
		return marshal(c.logprobs)
	}
	out := make([]*float64, 0, c.lpEntries)
	k, n := 0, 0
	for i := range c.lpEntries {
		if n < len(c.nullAt) && c.nullAt[n] == i {
			out = append(out, nil)
			n++
			continue
		}
		if k < len(c.logprobs) {
			out = append(out, &c.logprobs[k])
			k++
		}
	}
	return marshal(out)
}

func stepID(trajID string, index int64) string {
	return trajID + "#" + strconv.FormatInt(index, 10)
}

// buildStep renders the step line and its trace for call index; a prompt
// that begins with parent's prompt and answer is written as a delta
// (unless whole), one that does not is marked as a fork (returned too).
func buildStep(cl *call, index int64, parent *prev, whole bool) (line []byte, tr *trace, reject string, fork *promptFork) {
	s, c := cl.sess, &cl.cap
	if cl.partial && c.promptIDs != nil && c.responseIDs == nil {
		c.responseIDs = []int64{} // cut before the first token: an empty response, not a missing one
	}
	reject = c.reject()
	finish := c.finishReason
	if cl.partial {
		finish = finishReasonCutShort
	}
	model := c.model
	if model == "" {
		model = cl.model
	}
	meta := stepMeta{SessionID: s.id, Endpoint: cl.endpoint, LatencyMS: float64(cl.latency.Microseconds()) / 1e3, Stream: cl.stream,
		Tools: cl.tools, CutOff: cl.cutOff, Reject: reject, NullLogprobAt: c.nullAt, PromptTokens: c.promptTok, ComplTokens: c.complTok}
	if c.choices > 1 {
		meta.Choices = c.choices
	}
	meta.Sampling = cl.sampling
	if c.logprobsMode != "" {
		meta.Sampling = joinObject(append(splitOrEmpty(cl.sampling), field{key: "logprobs_mode", val: marshal(c.logprobsMode)}))
	}
	id := stepID(s.trajID, index)
	version := cl.version // in force at dispatch, unless the engine stamped its own
	if c.weightVersion >= 0 {
		version = c.weightVersion
	}
	var runs [][2]int64
	if c.versions != nil && c.counted == len(c.responseIDs) {
		if first := c.versions[0][0]; first >= 0 && c.stampedFirst {
			version = first // the step is at its first token's version, as the engine stamped it
		}
		runs, meta.VersionChanges = tokenVersions(c.versions, version)
	}
	extends := 0
	if parent != nil && reject == "" && c.promptIDs != nil {
		if extends = prefix.Extends(c.promptIDs, parent.prompt, parent.answer); extends == 0 && len(parent.prompt)+len(parent.answer) > 0 {
			meta.PromptFork = &promptFork{At: prefix.Diverges(c.promptIDs, parent.prompt, parent.answer), PrevTokens: len(parent.prompt) + len(parent.answer)}
		}
	}
	metaJSON := marshal(meta)
	rec := stepRecord{Type: "step", StepID: id, TaskID: s.taskID, GroupID: s.groupID, Role: s.role, TrajectoryID: s.trajID,
		StepIndex: index, PolicyVersion: version, FinishReason: finish, Model: model,
		CreatedAt: cl.dispatch.UTC().Format("2006-01-02T15:04:05.000000Z"), Metadata: metaJSON}
	if c.promptIDs != nil {
		rec.PromptIDs = &c.promptIDs
		// No parent: the session's first step, or one after a step that
		// will be dead-lettered; sent whole.
		if extends > 0 && !whole {
			delta := c.promptIDs[extends:]
			rec.PromptIDs, rec.ParentStepID, rec.PromptDeltaIDs = nil, parent.id, &delta
		}
	}
	if c.responseIDs != nil {
		rec.ResponseIDs = &c.responseIDs
		rec.TokenVersions = runs
	}
	if reject != rejectUnreadable && reject != rejectMissingIDs {
		rec.ResponseLogprobs = c.logprobsJSON()
	}
	respMsg := c.message
	if cl.endpoint == "chat" && cl.stream {
		respMsg = c.streamMessage()
	}
	if len(cl.messages) > 0 && len(respMsg) > 0 {
		rec.Messages = appendToArray(cl.messages, respMsg)
	}
	line = marshal(rec)

	var fr *string
	if finish != "" {
		fr = &finish
	}
	counts := map[string]int64{}
	if c.promptTok > 0 {
		counts["prompt"] = c.promptTok
	}
	if c.complTok > 0 {
		counts["completion"] = c.complTok
	}
	msgs := cl.messages
	if len(msgs) == 0 {
		msgs = json.RawMessage("[]")
	}
	if len(respMsg) == 0 {
		respMsg = json.RawMessage("{}")
	}
	t := TraceRecord{TraceID: traceID(id), SessionID: s.id, Model: model, Messages: msgs, PromptTokenIDs: nonNil(c.promptIDs),
		ResponseMessage: respMsg, CompletionTokenIDs: nonNil(c.responseIDs), Logprobs: c.logprobs, FinishReason: fr,
		WeightVersion: version, LatencyMS: meta.LatencyMS, TokenCounts: counts, Timestamp: unixSeconds(cl.dispatch), Metadata: metaJSON}
	tj := marshal(t)
	return line, &trace{id: t.TraceID, ts: t.Timestamp, json: tj}, reject, meta.PromptFork
}

func nonNil(s []int64) []int64 {
	if s == nil {
		return []int64{}
	}
	return s
}

// appendToArray returns the JSON array arr with v appended.
func appendToArray(arr, v json.RawMessage) json.RawMessage {
	var items []json.RawMessage
	if err := json.Unmarshal(arr, &items); err != nil {
		return nil
	}
	items = append(items, v)
	out := marshal(items)
	return out
}

// finishBody is POST /sessions/{id}/finish.
type finishBody struct {
	Reward            *float64        `json:"reward"`
	IsCorrect         *bool           `json:"is_correct"`
	TerminationReason string          `json:"termination_reason"`
	Signals           json.RawMessage `json:"signals"`
	Metadata          json.RawMessage `json:"metadata"`
}

// finishSum identifies a finish body, so that a repeat of a finish is
// told from a different one once its session has left the table. The
// body is encoded again: its raw objects compacted, fields in order.
func finishSum(b *finishBody) [sha256.Size]byte {
	data, _ := json.Marshal(b) // it decoded from JSON: it encodes
	return sha256.Sum256(data)
}

type trajectoryRecord struct {
	Type              string          `json:"type"`
	TrajectoryID      string          `json:"trajectory_id"`
	TaskID            string          `json:"task_id"`
	GroupID           string          `json:"group_id,omitempty"`
	Role              string          `json:"role,omitempty"`
	Reward            float64         `json:"reward"`
	NumSteps          int64           `json:"num_steps"`
	TerminationReason string          `json:"termination_reason,omitempty"`
	Signals           json.RawMessage `json:"signals,omitempty"`
	IsCorrect         *bool           `json:"is_correct,omitempty"`
	GroupSize         int             `json:"group_size,omitempty"`
	RejectedSteps     int64           `json:"rejected_steps,omitempty"`
	Metadata          json.RawMessage `json:"metadata,omitempty"`
}

func buildTrajectory(s *session, f *finishBody, numSteps int64) []byte {
	rec := trajectoryRecord{Type: "trajectory", TrajectoryID: s.trajID, TaskID: s.taskID, GroupID: s.groupID, Role: s.role,
		Reward: *f.Reward, NumSteps: numSteps, TerminationReason: f.TerminationReason, IsCorrect: f.IsCorrect, GroupSize: s.groupSize,
		RejectedSteps: s.rejected}
	if !isNull(f.Signals) {
		rec.Signals = f.Signals
	}
	// The session id rides in the metadata (the trajectory id is the
	// session id and its incarnation), unless the finish body names one,
	// and so does when the finish arrived (freshness: finished here →
	// delivered to the trainer).
	sid := marshal(s.id)
	at := marshal(s.finishedAt.UTC().Format(time.RFC3339Nano))
	switch fs, err := splitObject(f.Metadata); {
	case isNull(f.Metadata):
		rec.Metadata = joinObject([]field{{key: "session_id", val: sid}, {key: schemas.FinishedAtKey, val: at}})
	case err != nil:
		rec.Metadata = f.Metadata
	default:
		if _, ok := getField(fs, "session_id"); !ok {
			fs = append(fs, field{key: "session_id", val: sid})
		}
		if _, ok := getField(fs, schemas.FinishedAtKey); !ok {
			fs = append(fs, field{key: schemas.FinishedAtKey, val: at})
		}
		rec.Metadata = joinObject(fs)
	}
	return marshal(rec)
}

// marshal is json.Marshal without HTML escaping (messages keep "<tool_call>"
// as received) and without the encoder's newline.
func marshal(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		panic("gateway: marshal: " + err.Error()) // only our own types, with valid raw JSON
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}

// traceID is the URL-safe id of the trace of a step: rLLM's clients put
// trace ids in URLs unescaped, and step ids hold the session id ('/', ':')
// and '#'. 32 hex digits of the step id's SHA-256: stable across a
// retried write, and the step id is in the trace's metadata.
func traceID(stepID string) string {
	h := sha256.Sum256([]byte(stepID))
	return hex.EncodeToString(h[:16])
}
