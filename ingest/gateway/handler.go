package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/bearer"
)

// answeredWait bounds how long a trace list waits for the calls already
// answered to be recorded (a call is recorded right after its answer is
// written; the bound only matters if recording is stuck).
const answeredWait = 5 * time.Second

// Handler returns the handler of every route (package doc).
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serve) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case p == "/health":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case p == "/v1" || strings.HasPrefix(p, "/v1/"):
		if s.auth(w, r, true, s.cfg.AgentToken, s.cfg.AdminToken) {
			s.handleAgent(w, r, "", p)
		}
	case strings.HasPrefix(p, "/sessions/"):
		rest := p[len("/sessions/"):]
		if sid, tail, ok := splitSessionPath(rest); ok {
			// Agent routes take the agent's or the admin's token, as
			// rLLM's gateway does.
			if s.auth(w, r, true, s.cfg.AgentToken, s.cfg.AdminToken) {
				s.handleAgent(w, r, sid, tail)
			}
			return
		}
		if s.auth(w, r, false, s.cfg.AdminToken) {
			s.sessionRoute(w, r, rest)
		}
	case p == "/records" && s.cfg.AgentToken != "" && s.tokenOK(r, s.cfg.AgentToken):
		// Workers that build their own records post them with the agents'
		// token (or the admin's, below).
		s.adminRoute(w, r, p)
	default:
		if s.auth(w, r, false, s.cfg.AdminToken) {
			s.adminRoute(w, r, p)
		}
	}
}

// presentedToken is the token r carries: "Authorization: Bearer" (the
// OpenAI SDK's) or else "x-api-key" (the Anthropic SDK's), as rLLM reads
// them.
func presentedToken(r *http.Request) (string, bool) {
	if v, ok := bearer.Parse(r.Header.Get("Authorization")); ok {
		return v, true
	}
	if v := r.Header.Get("X-Api-Key"); v != "" {
		return v, true
	}
	return "", false
}

// tokenOK reports whether r carries one of tokens (empty ones never
// match), checked against every one of them (bearer.Key).
func (s *Server) tokenOK(r *http.Request, tokens ...string) bool {
	got, ok := presentedToken(r)
	match := false
	for _, token := range tokens {
		match = bearer.NewKey(token).Matches(got) || match
	}
	return ok && match
}

// splitSessionPath splits "{session_id}/v1/..." at the shortest /v1 tail
// (rLLM's /sessions/(.+?)(/v1(?:/.*)?)$), or "{session_id}/generate".
func splitSessionPath(rest string) (sid, tail string, ok bool) {
	for i := 1; i+3 <= len(rest); i++ {
		if rest[i] == '/' && rest[i:i+3] == "/v1" && (i+3 == len(rest) || rest[i+3] == '/') {
			return rest[:i], rest[i:], true
		}
	}
	if sid, ok := strings.CutSuffix(rest, "/generate"); ok && sid != "" {
		return sid, "/generate", true
	}
	return "", "", false
}

// auth checks the token against tokens[0], the one the route requires
// (empty: none), or any other of tokens (constant time over hashes, so the
// length leaks nothing either); it answers 401 itself.
func (s *Server) auth(w http.ResponseWriter, r *http.Request, openai bool, tokens ...string) bool {
	if tokens[0] == "" {
		return true
	}
	if s.tokenOK(r, tokens...) {
		return true
	}
	s.metrics.errors.inc("unauthorized")
	w.Header().Set("WWW-Authenticate", `Bearer realm="rllm-pipe gateway"`)
	if openai {
		writeOpenAIError(w, http.StatusUnauthorized, "authentication_error", "missing or wrong token (Authorization: Bearer, or x-api-key)")
	} else {
		writeError(w, http.StatusUnauthorized, "missing or wrong token (Authorization: Bearer, or x-api-key)")
	}
	return false
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := s.bodies.read(w, r, s.cfg.MaxRequestBytes)
	if err != nil {
		s.bodyError(w, err, false)
		return nil, false
	}
	return b, true
}

// readJSON decodes a JSON object body into v; an empty body is {} (rLLM's
// _safe_json), anything else unreadable a 400.
func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	b, ok := s.readBody(w, r)
	if !ok {
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return true
	}
	if err := json.Unmarshal(b, v); err != nil {
		s.metrics.errors.inc("bad_request")
		writeError(w, http.StatusBadRequest, "body: "+err.Error())
		return false
	}
	return true
}

func methodNotAllowed(w http.ResponseWriter, allowed ...string) {
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	writeError(w, http.StatusMethodNotAllowed, "method not allowed")
}

func (s *Server) adminRoute(w http.ResponseWriter, r *http.Request, p string) {
	switch {
	case p == "/sessions":
		switch r.Method {
		case http.MethodPost:
			s.createSession(w, r)
		case http.MethodGet:
			s.listSessions(w, r)
		default:
			methodNotAllowed(w, "GET", "POST")
		}
	case p == "/records":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, "POST")
			return
		}
		s.postRecords(w, r)
	case p == "/metrics":
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, traceBytes := s.sessions.usage()
		s.metrics.write(w, s.sessions.open(), traceBytes, s.weight.Load(), s.pool.list())
		s.pacer.writeMetrics(w)
	case p == "/health/workers":
		ws := s.pool.list()
		healthy := 0
		for _, wk := range ws {
			if wk.Healthy {
				healthy++
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"workers": ws, "healthy": healthy, "total": len(ws)})
	case p == "/traces/query":
		s.queryTraces(w, r)
	case strings.HasPrefix(p, "/traces/"):
		tj := s.sessions.trace(p[len("/traces/"):])
		if tj == nil {
			writeError(w, http.StatusNotFound, "Trace "+p[len("/traces/"):]+" not found")
			return
		}
		writeJSON(w, http.StatusOK, tj)
	case p == "/admin/workers" || strings.HasPrefix(p, "/admin/workers/"):
		s.workers(w, r, strings.TrimPrefix(strings.TrimPrefix(p, "/admin/workers"), "/"))
	case p == "/admin/weight_version":
		s.weightVersion(w, r)
	case p == "/admin/flush":
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.FinishTimeout)
		defer cancel()
		if err := s.queue.drain(ctx); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "timeout", "error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "flushed"})
	case p == "/admin/reload":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	default:
		writeError(w, http.StatusNotFound, "no route "+p)
	}
}

func (s *Server) sessionRoute(w http.ResponseWriter, r *http.Request, rest string) {
	switch {
	case rest == "batch_delete" && r.Method == http.MethodPost:
		var body struct {
			SessionIDs []string `json:"session_ids"`
		}
		if !s.readJSON(w, r, &body) {
			return
		}
		total := 0
		for _, id := range body.SessionIDs {
			total += s.sessions.remove(id)
		}
		writeJSON(w, http.StatusOK, map[string]int{"deleted": total})
	case strings.HasSuffix(rest, "/traces") && r.Method == http.MethodGet:
		sess := s.sessions.get(strings.TrimSuffix(rest, "/traces"))
		if sess == nil {
			writeJSON(w, http.StatusOK, []byte("[]"))
			return
		}
		// Calls already answered are listed: wait (briefly) until they
		// are recorded.
		ctx, cancel := context.WithTimeout(r.Context(), answeredWait)
		_ = sess.answered.wait(ctx)
		cancel()
		since, limit := queryFloat(r, "since"), int(queryFloat(r, "limit"))
		writeJSON(w, http.StatusOK, sess.traceList(since, limit))
	case strings.HasSuffix(rest, "/finish") && r.Method == http.MethodPost:
		s.finish(w, r, strings.TrimSuffix(rest, "/finish"))
	case r.Method == http.MethodGet:
		sess := s.sessions.get(rest)
		if sess == nil {
			writeError(w, http.StatusNotFound, "Session "+rest+" not found")
			return
		}
		writeJSON(w, http.StatusOK, sess.info())
	case r.Method == http.MethodDelete:
		writeJSON(w, http.StatusOK, map[string]int{"deleted": s.sessions.remove(rest)})
	default:
		methodNotAllowed(w, "GET", "DELETE")
	}
}

func queryFloat(r *http.Request, key string) float64 {
	v, err := strconv.ParseFloat(r.URL.Query().Get(key), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	return v
}

// validSessionID refuses ids that would make URLs ambiguous or logs
// confusing: empty, over 512 bytes, control characters, a /v1 segment, or
// the suffixes of the session routes.
func validSessionID(id string) error {
	switch {
	case id == "" || len(id) > 512:
		return fmt.Errorf("session_id must be 1 to 512 bytes")
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return fmt.Errorf("session_id has a control character")
	case strings.Contains(id+"/", "/v1/") || strings.HasPrefix(id, "v1/") || id == "v1":
		return fmt.Errorf("session_id must not contain a /v1 segment")
	case strings.HasSuffix(id, "/traces") || strings.HasSuffix(id, "/finish") || strings.HasSuffix(id, "/generate") || id == "batch_delete":
		return fmt.Errorf("session_id must not end in /traces, /finish or /generate")
	}
	return nil
}

type createBody struct {
	SessionID      string          `json:"session_id"`
	Metadata       json.RawMessage `json:"metadata"`
	SamplingParams json.RawMessage `json:"sampling_params"`
	identity
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var body createBody
	if !s.readJSON(w, r, &body) {
		return
	}
	if body.SessionID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		body.SessionID = hex.EncodeToString(b[:])
	}
	if err := validSessionID(body.SessionID); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ident := body.identity
	if !isNull(body.Metadata) {
		if fs, err := splitObject(body.Metadata); err != nil {
			writeError(w, http.StatusBadRequest, "metadata must be an object")
			return
		} else if len(fs) > 0 {
			var m identity
			_ = json.Unmarshal(body.Metadata, &m) // wrong types: ignored, as free-form metadata
			ident = ident.or(m)
		}
	}
	if ident.GroupSize < 0 {
		writeError(w, http.StatusBadRequest, "group_size must be >= 1")
		return
	}
	var sampling []field
	if !isNull(body.SamplingParams) {
		fs, err := splitObject(body.SamplingParams)
		if err != nil {
			writeError(w, http.StatusBadRequest, "sampling_params must be an object")
			return
		}
		sampling = fs
	}
	fresh := newSession(body.SessionID, s.sessions.incarnation(), time.Now(), body.Metadata, sampling, ident, s.cfg.GroupSize)
	if kept := s.sessions.create(fresh); kept != fresh && !kept.sameSetup(fresh, ident.TrajectoryID != "") {
		// Its recorded steps carry its identity: a session cannot change
		// it midway. The same request again is a retry (200).
		writeError(w, http.StatusConflict, "session "+body.SessionID+" is open with recorded calls under other metadata or sampling params; finish or DELETE it before starting it again")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"session_id": body.SessionID, "url": "/sessions/" + body.SessionID + "/v1"})
}

func (a identity) or(b identity) identity {
	if a.TaskID == "" {
		a.TaskID = b.TaskID
	}
	if a.GroupID == "" {
		a.GroupID = b.GroupID
	}
	if a.TrajectoryID == "" {
		a.TrajectoryID = b.TrajectoryID
	}
	if a.Role == "" {
		a.Role = b.Role
	}
	if a.GroupSize == 0 {
		a.GroupSize = b.GroupSize
	}
	return a
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	since, limit := queryFloat(r, "since"), int(queryFloat(r, "limit"))
	all := s.sessions.list()
	slices.SortFunc(all, func(a, b *session) int { return a.created.Compare(b.created) })
	out := make([]SessionInfo, 0, len(all))
	for _, sess := range all {
		info := sess.info()
		if since > 0 && info.CreatedAt < since {
			continue
		}
		if limit > 0 && len(out) == limit {
			break
		}
		out = append(out, info)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) queryTraces(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		methodNotAllowed(w, "POST")
		return
	}
	var body struct {
		SessionIDs []string `json:"session_ids"`
		Since      float64  `json:"since"`
		Limit      int      `json:"limit"`
	}
	if !s.readJSON(w, r, &body) {
		return
	}
	sessions := make([]*session, 0, len(body.SessionIDs))
	for _, id := range body.SessionIDs {
		if sess := s.sessions.get(id); sess != nil {
			sessions = append(sessions, sess)
		}
	}
	// As a session's list: the calls already answered are recorded
	// first, all sessions waiting within one bound.
	ctx, cancel := context.WithTimeout(r.Context(), answeredWait)
	for _, sess := range sessions {
		_ = sess.answered.wait(ctx)
	}
	cancel()
	out := []byte{'['}
	for _, sess := range sessions {
		arr := sess.traceList(body.Since, body.Limit)
		if len(arr) > 2 {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(out, arr[1:len(arr)-1]...)
		}
	}
	writeJSON(w, http.StatusOK, append(out, ']'))
}

func (s *Server) workers(w http.ResponseWriter, r *http.Request, id string) {
	switch {
	case id == "" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, s.pool.list())
	case id == "" && r.Method == http.MethodPost:
		var body struct {
			URL       string  `json:"url"`
			WorkerID  string  `json:"worker_id"`
			APIPath   *string `json:"api_path"`
			ModelName *string `json:"model_name"`
			Weight    *int    `json:"weight"`
		}
		if !s.readJSON(w, r, &body) {
			return
		}
		if body.URL == "" {
			writeError(w, http.StatusBadRequest, "url is required")
			return
		}
		if body.WorkerID == "" {
			var b [8]byte
			_, _ = rand.Read(b[:])
			body.WorkerID = hex.EncodeToString(b[:])
		}
		api, model, weight := "", "", 1
		if body.APIPath != nil {
			api = *body.APIPath
		}
		if body.ModelName != nil {
			model = *body.ModelName
		}
		if body.Weight != nil {
			weight = *body.Weight
		}
		wk, err := s.pool.add(body.WorkerID, body.URL, api, model, weight)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"worker_id": wk.id, "url": wk.url, "api_path": wk.apiPath})
	case id != "" && r.Method == http.MethodDelete:
		if !s.pool.remove(id) {
			writeError(w, http.StatusNotFound, "Worker "+id+" not found")
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"removed": id})
	default:
		methodNotAllowed(w, "GET", "POST", "DELETE")
	}
}

func (s *Server) weightVersion(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]int64{"weight_version": s.weight.Load()})
	case http.MethodPost:
		var body struct {
			WeightVersion *json.Number `json:"weight_version"`
		}
		if !s.readJSON(w, r, &body) {
			return
		}
		if body.WeightVersion == nil {
			writeError(w, http.StatusBadRequest, "weight_version is required")
			return
		}
		v, err := body.WeightVersion.Int64()
		if err != nil || v < 0 || v > schemas.MaxPolicyVersion {
			writeError(w, http.StatusBadRequest, "weight_version must be an integer in [0, 2^53]")
			return
		}
		s.weight.Store(v)
		s.log.Info("gateway: weight version set", "weight_version", v)
		writeJSON(w, http.StatusOK, map[string]int64{"weight_version": v})
	default:
		methodNotAllowed(w, "GET", "POST")
	}
}

// finish emits the session's trajectory record once its calls in flight
// are done and answers when every record of the session is durable. A
// repeat with the same body waits again and answers the same; a different
// one is a 409.
func (s *Server) finish(w http.ResponseWriter, r *http.Request, sid string) {
	if !s.enter() {
		writeError(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	defer s.inflight.done(1)
	sess := s.sessions.pin(sid) // a failing call no longer removes it
	gone, retired := s.sessions.retiredFinish(sid)
	if sess == nil && !retired {
		writeError(w, http.StatusNotFound, "Session "+sid+" not found")
		return
	}
	var body finishBody
	if !s.readJSON(w, r, &body) {
		return
	}
	if body.Reward == nil || math.IsNaN(*body.Reward) || math.IsInf(*body.Reward, 0) {
		writeError(w, http.StatusBadRequest, "reward is required and must be finite")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.FinishTimeout)
	defer cancel()
	if sess == nil {
		// Finished, then evicted or deleted: a repeat of the same finish
		// is answered as the first was.
		if gone.sum != finishSum(&body) {
			writeError(w, http.StatusConflict, "session "+sid+" was finished with a different body")
			return
		}
		if gone.durable != nil {
			if err := gone.durable.wait(ctx); err != nil {
				s.metrics.errors.inc("finish_not_durable")
				writeError(w, http.StatusServiceUnavailable, "the session's records are not durable yet (the output is behind or down); repeat the same finish to wait again")
				return
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"session_id": sid, "trajectory_id": gone.trajID, "num_steps": gone.steps, "durable": true})
		return
	}

	sess.mu.Lock()
	prev := sess.finished
	if prev == nil {
		sess.finished = []byte{} // refuse new calls from now on
		sess.finishSum = finishSum(&body)
		sess.finishedAt = time.Now()
	}
	sess.mu.Unlock()
	if prev != nil && len(prev) == 0 {
		writeError(w, http.StatusConflict, "session "+sid+" is being finished")
		return
	}
	if prev == nil {
		if err := sess.inflight.wait(ctx); err != nil {
			sess.mu.Lock()
			sess.finished = nil
			sess.mu.Unlock()
			writeError(w, http.StatusServiceUnavailable, "calls of the session still in flight: "+err.Error())
			return
		}
	}
	sess.mu.Lock()
	line := buildTrajectory(sess, &body, sess.steps)
	if prev == nil && len(line) > s.cfg.MaxRecordBytes {
		sess.finished = nil // not finished: a smaller body may finish it
		sess.mu.Unlock()
		s.metrics.errors.inc("bad_record")
		writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"error": fmt.Sprintf("the trajectory record would be %d bytes, more than the output takes (%d): send less metadata", len(line), s.cfg.MaxRecordBytes), "reason": "too_large"})
		return
	}
	if prev == nil {
		sess.finished = line
	}
	sess.mu.Unlock()
	if prev != nil && !bytes.Equal(prev, line) {
		writeError(w, http.StatusConflict, "session "+sid+" was finished with a different body")
		return
	}
	if prev == nil {
		s.queue.enqueue(sess.durable, Record{Key: sess.key(), Line: line})
		s.pacer.finished(sess)
		if n := s.sessions.markFinished(sess); n > 0 {
			s.metrics.tracesEvicted.Add(int64(n))
		}
	}
	if err := sess.durable.wait(ctx); err != nil {
		s.metrics.errors.inc("finish_not_durable")
		writeError(w, http.StatusServiceUnavailable, "the session's records are not durable yet (the output is behind or down); repeat the same finish to wait again")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"session_id": sid, "trajectory_id": sess.trajID, "num_steps": sess.stepsNow(), "durable": true})
}

func (s *session) stepsNow() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps
}

// postRecords takes wire-format JSON lines and answers once all are
// durable. Every line must be a JSON object (ingest validates the rest and
// dead-letters what is wrong); one that is not refuses the whole body, so
// nothing is half taken.
func (s *Server) postRecords(w http.ResponseWriter, r *http.Request) {
	if !s.enter() {
		writeError(w, http.StatusServiceUnavailable, "the gateway is shutting down")
		return
	}
	defer s.inflight.done(1)
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var recs []Record
	var size int64
	for n, line := range bytes.Split(body, []byte{'\n'}) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var k struct {
			TaskID  any `json:"task_id"`
			GroupID any `json:"group_id"`
		}
		if line[0] != '{' || json.Unmarshal(line, &k) != nil {
			s.metrics.errors.inc("bad_record")
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": fmt.Sprintf("line %d is not a JSON object; nothing was taken", n+1), "reason": "malformed_json", "line": n + 1})
			return
		}
		if bytes.IndexByte(line, '\r') >= 0 {
			// A CR is JSON whitespace, but no line of a record log: the
			// same record without it.
			var c bytes.Buffer
			_ = json.Compact(&c, line) // valid: just unmarshalled
			line = c.Bytes()
		}
		if len(line) > s.cfg.MaxRecordBytes {
			s.metrics.errors.inc("bad_record")
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]any{"error": fmt.Sprintf("line %d is %d bytes, more than the output takes (%d); nothing was taken", n+1, len(line), s.cfg.MaxRecordBytes), "reason": "too_large", "line": n + 1})
			return
		}
		key, _ := k.GroupID.(string)
		if key == "" {
			key, _ = k.TaskID.(string)
		}
		recs = append(recs, Record{Key: key, Line: line})
		size += int64(len(line))
	}
	if len(recs) == 0 {
		writeJSON(w, http.StatusOK, map[string]int{"accepted": 0})
		return
	}
	if s.queue.full(size) {
		s.metrics.errors.inc("buffer_full")
		writeError(w, http.StatusServiceUnavailable, "the capture gateway's record buffer is full (the output is behind or down); retry later")
		return
	}
	t := &tracker{}
	s.queue.enqueue(t, recs...)
	s.metrics.recordsPosted.Add(int64(len(recs)))
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.FinishTimeout)
	defer cancel()
	if err := t.wait(ctx); err != nil {
		s.metrics.errors.inc("records_not_durable")
		writeError(w, http.StatusServiceUnavailable, "the records are queued but not durable yet; a retry is deduplicated downstream by step_id")
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"accepted": len(recs)})
}
