package rllmdata

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	// The SQLite driver: cgo, like DuckDB already is in this module.
	_ "github.com/mattn/go-sqlite3"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// traceRecord is the part of rLLM's TraceRecord (rllm_model_gateway
// models.py) that becomes a Step. Lists stay raw JSON.
type traceRecord struct {
	TraceID             string          `json:"trace_id"`
	SessionID           string          `json:"session_id"`
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	PromptTokenIDs      json.RawMessage `json:"prompt_token_ids"`
	PromptDeltaTokenIDs json.RawMessage `json:"prompt_delta_token_ids"`
	ParentTraceID       string          `json:"parent_trace_id"`
	ResponseMessage     json.RawMessage `json:"response_message"`
	CompletionTokenIDs  json.RawMessage `json:"completion_token_ids"`
	Logprobs            json.RawMessage `json:"logprobs"`
	FinishReason        string          `json:"finish_reason"`
	WeightVersion       *int64          `json:"weight_version"`
	LatencyMS           *float64        `json:"latency_ms"`
	TokenCounts         json.RawMessage `json:"token_counts"`
	Timestamp           float64         `json:"timestamp"`
	Metadata            json.RawMessage `json:"metadata"`
	RawRequest          *struct {
		Tools json.RawMessage `json:"tools"`
	} `json:"raw_request"`
}

// traceRow is one row of the join of traces and trace_sessions.
type traceRow struct {
	rowid     int64
	traceID   string
	session   string
	data      []byte
	createdAt float64
	rec       traceRecord
	ok        bool // data parsed
}

// ImportTraces reads the SQLite trace store of rLLM's model gateway
// (tables traces(trace_id, data, created_at) and trace_sessions(trace_id,
// session_id, created_at), rllm_model_gateway/store/sqlite_store.py) at
// path, opened read-only, and writes one Step per trace, grouped by
// session in created_at order (step_index), and one Trajectory per
// session whose outcome opts.Rewards knows (the store holds no rewards).
//
// rLLM names sessions {task_id}:{rollout_idx}: the task id is the session
// id up to its last ':' (the whole id when there is none); the session id
// is the trajectory id. Step ids are trace ids (a trace recorded in a
// second session gets trace_id@session_id). Delta-chain traces
// (cumulative token mode: prompt_delta_token_ids and parent_trace_id) get
// their full prompt back from their parent chain within the session.
func ImportTraces(ctx context.Context, path string, opts Options, out Output) (Summary, error) {
	var sum Summary
	dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?mode=ro&_query_only=true"
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return sum, fmt.Errorf("open trace store %s: %w", path, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if err := checkTraceSchema(ctx, db); err != nil {
		return sum, fmt.Errorf("trace store %s: %w", path, err)
	}
	rows, err := db.QueryContext(ctx, `
		SELECT t.rowid, t.trace_id, ts.session_id, t.data, COALESCE(ts.created_at, t.created_at)
		FROM traces t LEFT JOIN trace_sessions ts ON ts.trace_id = t.trace_id
		ORDER BY ts.session_id IS NULL, ts.session_id, COALESCE(ts.created_at, t.created_at), t.rowid`)
	if err != nil {
		return sum, fmt.Errorf("query trace store %s: %w", path, err)
	}
	defer rows.Close()

	imp := &traceImport{path: path, opts: opts, em: emitter{out: out, sum: &sum}, seen: map[string]bool{}, sessions: map[string]bool{}}
	var cur []traceRow
	orphans := map[string][]traceRow{}
	var orphanOrder []string
	for rows.Next() {
		if err := ctx.Err(); err != nil {
			return sum, err
		}
		var r traceRow
		var session sql.NullString
		var data sql.RawBytes
		if err := rows.Scan(&r.rowid, &r.traceID, &session, &data, &r.createdAt); err != nil {
			return sum, fmt.Errorf("read trace store %s: %w", path, err)
		}
		r.data = append([]byte(nil), data...)
		r.ok = json.Unmarshal(r.data, &r.rec) == nil
		if !session.Valid {
			// A trace without a trace_sessions row: its session is the one
			// in its data.
			s := r.rec.SessionID
			if _, ok := orphans[s]; !ok {
				orphanOrder = append(orphanOrder, s)
			}
			orphans[s] = append(orphans[s], r)
			continue
		}
		r.session = session.String
		if len(cur) > 0 && cur[0].session != r.session {
			if err := imp.session(cur); err != nil {
				return sum, err
			}
			cur = cur[:0]
		}
		cur = append(cur, r)
	}
	if err := rows.Err(); err != nil {
		return sum, fmt.Errorf("read trace store %s: %w", path, err)
	}
	if len(cur) > 0 {
		if err := imp.session(cur); err != nil {
			return sum, err
		}
	}
	for _, s := range orphanOrder {
		rs := orphans[s]
		if s == "" || imp.sessions[s] {
			for _, r := range rs {
				why := "its data names no session_id"
				if s != "" {
					why = fmt.Sprintf("its session %q has other traces in trace_sessions but not this one", s)
				}
				if err := imp.em.dead(schemas.ReasonInconsistent, imp.src(r), r.data, "trace %q has no trace_sessions row and %s", r.traceID, why); err != nil {
					return sum, err
				}
			}
			continue
		}
		for i := range rs {
			rs[i].session = s
		}
		if err := imp.session(rs); err != nil {
			return sum, err
		}
	}
	sum.UnusedRewards = opts.Rewards.unused()
	return sum, nil
}

// checkTraceSchema fails unless the store has rLLM's tables and columns.
func checkTraceSchema(ctx context.Context, db *sql.DB) error {
	want := map[string][]string{
		"traces":         {"trace_id", "data", "created_at"},
		"trace_sessions": {"trace_id", "session_id", "created_at"},
	}
	for table, cols := range want {
		rows, err := db.QueryContext(ctx, `SELECT name FROM pragma_table_info(?)`, table)
		if err != nil {
			return fmt.Errorf("not an rLLM gateway trace store: %w", err)
		}
		have := map[string]bool{}
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				rows.Close()
				return err
			}
			have[name] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, c := range cols {
			if !have[c] {
				return fmt.Errorf("not an rLLM gateway trace store: table %s has no column %s", table, c)
			}
		}
	}
	return nil
}

type traceImport struct {
	path     string
	opts     Options
	em       emitter
	seen     map[string]bool // trace ids given a step already
	sessions map[string]bool // sessions imported
}

func (t *traceImport) src(r traceRow) schemas.Source {
	return schemas.Source{File: t.path, Line: r.rowid}
}

// taskOf splits an rLLM session id {task_id}:{rollout_idx}.
func taskOf(session string) string {
	if i := strings.LastIndexByte(session, ':'); i > 0 {
		return session[:i]
	}
	return session
}

// session writes the steps of one session (rows in step order) and its
// trajectory record.
func (t *traceImport) session(rows []traceRow) error {
	t.em.sum.Sources++
	session := rows[0].session
	t.sessions[session] = true
	task := taskOf(session)
	byID := make(map[string]*traceRow, len(rows))
	for i := range rows {
		if rows[i].ok {
			byID[rows[i].traceID] = &rows[i]
		}
	}
	chain := chainResolver{byID: byID, full: map[string][]int64{}}
	for i, r := range rows {
		src := t.src(r)
		if !r.ok {
			// The step keeps its place: the trajectory below counts it, so
			// the pipeline never sees a shortened run as whole.
			if err := t.em.dead(schemas.ReasonMalformedJSON, src, r.data, "trace %q (session %q, step %d): data is not a TraceRecord JSON object", r.traceID, session, i); err != nil {
				return err
			}
			continue
		}
		stepID := r.traceID
		if t.seen[stepID] {
			stepID = r.traceID + "@" + session
		}
		t.seen[r.traceID] = true
		s := &wireStep{
			Type: "step", StepID: stepID, TaskID: task, TrajectoryID: session, StepIndex: int64(i),
			ResponseIDs:      rawList(r.rec.CompletionTokenIDs),
			ResponseLogprobs: rawList(r.rec.Logprobs),
			Model:            r.rec.Model, FinishReason: r.rec.FinishReason,
			CreatedAt: unixTime(r.rec.Timestamp),
		}
		if s.CreatedAt == "" {
			s.CreatedAt = unixTime(r.createdAt)
		}
		s.PolicyVersion = r.rec.WeightVersion
		if s.PolicyVersion == nil && t.opts.HasPolicyVersion {
			v := t.opts.PolicyVersion
			s.PolicyVersion = &v
		}
		// The store keeps an empty logprob list when the sampler sent none;
		// no logprobs for a non-empty response is a missing field, not
		// zero tokens.
		s.ResponseLogprobs = logprobsFor(s.ResponseIDs, s.ResponseLogprobs)
		prompt, err := chain.prompt(r.traceID)
		if err != nil {
			if derr := t.em.dead(schemas.ReasonMissingField, src, r.data, "trace %q (session %q, step %d): prompt_token_ids: %v", r.traceID, session, i, err); derr != nil {
				return derr
			}
			continue
		}
		s.PromptIDs = prompt
		s.Messages = chatMessages(r.rec.Messages, r.rec.ResponseMessage)
		meta := map[string]any{"source": "rllm-gateway", "trace_id": r.traceID, "session_id": session}
		if r.rec.LatencyMS != nil {
			meta["latency_ms"] = *finiteOr(r.rec.LatencyMS)
		}
		if !isNull(r.rec.TokenCounts) {
			meta["token_counts"] = r.rec.TokenCounts
		}
		if r.rec.RawRequest != nil && !isNull(r.rec.RawRequest.Tools) {
			meta["tools"] = r.rec.RawRequest.Tools
		}
		if !isNull(r.rec.Metadata) && string(r.rec.Metadata) != "{}" {
			meta["trace_metadata"] = r.rec.Metadata
		}
		s.Metadata = metadataJSON(meta)
		if _, err := t.em.emit(src, task, s); err != nil {
			return err
		}
	}
	tr := &wireTrajectory{Type: "trajectory", TrajectoryID: session, TaskID: task, NumSteps: int64(len(rows)), GroupSize: t.opts.GroupSize}
	src := schemas.Source{File: t.path}
	o, ok := t.opts.Rewards.lookup(session)
	if !ok {
		t.em.sum.Unscored++
		line, _ := json.Marshal(tr)
		return t.em.dead(schemas.ReasonMissingField, src, line, "session %q: no reward (the trace store holds none; give them with --rewards)", session)
	}
	setOutcome(tr, o)
	tr.Metadata = mergeMeta(map[string]any{"source": "rllm-gateway", "session_id": session}, o.Metadata)
	_, err := t.em.emit(src, task, tr)
	return err
}

// logprobsFor returns the logprob list to write for a response: an empty
// list for an empty response (nothing to score), absent (missing_field)
// when a non-empty response has an absent or empty list.
func logprobsFor(response, logprobs json.RawMessage) json.RawMessage {
	switch {
	case response != nil && emptyList(response) && emptyList(logprobs):
		return json.RawMessage("[]")
	case emptyList(logprobs):
		return nil
	}
	return logprobs
}

func finiteOr(v *float64) *float64 {
	if f := finite(v); f != nil {
		return f
	}
	z := 0.0
	return &z
}

// setOutcome copies an outcome into a trajectory record.
func setOutcome(tr *wireTrajectory, o Outcome) {
	r := o.Reward
	tr.Reward = &r
	if o.IsCorrect != nil {
		tr.IsCorrect = o.IsCorrect
	}
	if o.TerminationReason != "" {
		tr.TerminationReason = o.TerminationReason
	}
	if len(o.Signals) > 0 {
		tr.Signals = o.Signals
	}
}

// mergeMeta adds the keys of the JSON object extra (when it is one) to
// base, under "metadata".
func mergeMeta(base map[string]any, extra json.RawMessage) json.RawMessage {
	if !isNull(extra) && string(extra) != "{}" {
		base["metadata"] = extra
	}
	return metadataJSON(base)
}

// chatMessages returns the request messages followed by the response
// message, as one JSON array (nil when there are none).
func chatMessages(request, response json.RawMessage) json.RawMessage {
	var msgs []json.RawMessage
	if !isNull(request) {
		if err := json.Unmarshal(request, &msgs); err != nil {
			return request // not an array: the decoder says wrong_type
		}
	}
	var resp map[string]json.RawMessage
	if !isNull(response) && json.Unmarshal(response, &resp) == nil && len(resp) > 0 {
		msgs = append(msgs, response)
	}
	if len(msgs) == 0 {
		return nil
	}
	b, err := json.Marshal(msgs)
	if err != nil {
		return nil
	}
	return b
}

// chainResolver rebuilds the full prompt of delta-chain traces: a link's
// prompt is its parent's prompt and completion followed by its delta.
type chainResolver struct {
	byID map[string]*traceRow
	full map[string][]int64
}

// prompt returns the trace's full prompt ids as raw JSON.
func (c *chainResolver) prompt(id string) (json.RawMessage, error) {
	r := c.byID[id]
	if isNull(r.rec.PromptDeltaTokenIDs) {
		return rawList(r.rec.PromptTokenIDs), nil
	}
	ids, err := c.fullPrompt(id, 0)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ids)
}

func (c *chainResolver) fullPrompt(id string, depth int) ([]int64, error) {
	if ids, ok := c.full[id]; ok {
		return ids, nil
	}
	if depth > len(c.byID) {
		return nil, fmt.Errorf("delta chain through %q has a cycle", id)
	}
	r, ok := c.byID[id]
	if !ok {
		return nil, fmt.Errorf("delta-chain parent %q is not in the session", id)
	}
	var ids []int64
	if isNull(r.rec.PromptDeltaTokenIDs) {
		if err := json.Unmarshal(orEmpty(r.rec.PromptTokenIDs), &ids); err != nil {
			return nil, fmt.Errorf("trace %q: prompt_token_ids: %w", id, err)
		}
	} else {
		if r.rec.ParentTraceID == "" {
			return nil, fmt.Errorf("trace %q has prompt_delta_token_ids but no parent_trace_id", id)
		}
		base, err := c.fullPrompt(r.rec.ParentTraceID, depth+1)
		if err != nil {
			return nil, err
		}
		parent := c.byID[r.rec.ParentTraceID]
		var completion, delta []int64
		if err := json.Unmarshal(orEmpty(parent.rec.CompletionTokenIDs), &completion); err != nil {
			return nil, fmt.Errorf("trace %q: completion_token_ids: %w", r.rec.ParentTraceID, err)
		}
		if err := json.Unmarshal(r.rec.PromptDeltaTokenIDs, &delta); err != nil {
			return nil, fmt.Errorf("trace %q: prompt_delta_token_ids: %w", id, err)
		}
		ids = make([]int64, 0, len(base)+len(completion)+len(delta))
		ids = append(append(append(ids, base...), completion...), delta...)
	}
	c.full[id] = ids
	return ids, nil
}

func orEmpty(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return json.RawMessage("[]")
	}
	return raw
}
