package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// hop-by-hop and gateway-only request headers (the gateway's own tokens
// among them), never forwarded upstream.
var dropRequestHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade", "Authorization", "X-Api-Key", "Content-Length", "Accept-Encoding"}

var dropResponseHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length"}

// endpointOf names the recorded endpoints; "" for the others.
func endpointOf(tail string) string {
	switch strings.TrimRight(tail, "/") {
	case "/v1/chat/completions":
		return "chat"
	case "/v1/completions":
		return "completions"
	case "/generate":
		return "generate"
	}
	return ""
}

// rewrite is the request as forwarded, and what the agent asked for.
type rewrite struct {
	body          []byte
	askedLogprobs bool
	askedTokenIDs bool
	stream        bool
	messages      json.RawMessage
	tools         json.RawMessage
	model         string
	inputIDs      []int64 // SGLang /generate: the prompt ids sent
	// sampling are the sampling parameters the call was sent with (the
	// agent's, or the session's defaults), as recorded (samplingKeys).
	sampling []field
}

// samplingKeys are the sampling parameters recorded with each step: what
// the behaviour logprobs depend on (an importance ratio is only right
// against the distribution that sampled).
var samplingKeys = []string{"temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "max_new_tokens", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty"}

// recordSampling keeps fs's sampling keys (those of fs itself, or of its
// nested sampling_params object: SGLang's /generate).
func (rw *rewrite) recordSampling(fs []field) {
	if sp, ok := getField(fs, "sampling_params"); ok && !isNull(sp) {
		if inner, err := splitObject(sp); err == nil {
			fs = inner
		}
	}
	for _, k := range samplingKeys {
		if v, ok := getField(fs, k); ok && !isNull(v) {
			rw.sampling = append(rw.sampling, field{key: k, val: v})
		}
	}
}

func truthy(v json.RawMessage) bool {
	s := string(bytes.TrimSpace(v))
	return s != "" && s != "null" && s != "false"
}

// rewriteRequest forces what recording needs (logprobs, token ids) and
// fills the session's sampling params the agent did not set.
func rewriteRequest(body []byte, endpoint string, sampling []field) (*rewrite, error) {
	fs, err := splitObject(body)
	if err != nil {
		return nil, err
	}
	rw := &rewrite{}
	for _, sp := range sampling {
		if _, ok := getField(fs, sp.key); !ok {
			fs = append(fs, sp)
		}
	}
	rw.recordSampling(fs)
	if v, ok := getField(fs, "stream"); ok {
		rw.stream = string(bytes.TrimSpace(v)) == "true"
	}
	if v, ok := getField(fs, "model"); ok {
		_ = json.Unmarshal(v, &rw.model)
	}
	rw.messages, _ = getField(fs, "messages")
	if t, ok := getField(fs, "tools"); ok && !isNull(t) {
		rw.tools = t
	}
	switch endpoint {
	case "generate":
		v, _ := getField(fs, "return_logprob")
		rw.askedLogprobs, rw.askedTokenIDs = truthy(v), true
		fs = setField(fs, "return_logprob", json.RawMessage("true"))
		if v, ok := getField(fs, "input_ids"); ok {
			_ = json.Unmarshal(v, &rw.inputIDs)
		}
	default:
		lp, ok := getField(fs, "logprobs")
		rw.askedLogprobs = ok && truthy(lp)
		if endpoint == "completions" && ok && string(bytes.TrimSpace(lp)) == "0" {
			rw.askedLogprobs = true // completions: logprobs=0 asks for the sampled token's
		}
		if !rw.askedLogprobs {
			if endpoint == "chat" {
				fs = setField(fs, "logprobs", json.RawMessage("true"))
			} else {
				fs = setField(fs, "logprobs", json.RawMessage("0"))
			}
		}
		ti, _ := getField(fs, "return_token_ids")
		rw.askedTokenIDs = truthy(ti)
		if !rw.askedTokenIDs {
			fs = setField(fs, "return_token_ids", json.RawMessage("true"))
		}
	}
	if len(rw.messages) > 0 && (isNull(rw.messages) || bytes.TrimSpace(rw.messages)[0] != '[') {
		rw.messages = nil
	}
	rw.body = joinObject(fs)
	return rw, nil
}

// stripKeys are what the agent did not ask for: the token ids and
// logprobs the gateway asked for in its place.
func (rw *rewrite) stripKeys() (root, choice []string) {
	if !rw.askedTokenIDs {
		root = append(root, "prompt_token_ids")
		choice = append(choice, "token_ids", "prompt_token_ids")
	}
	if !rw.askedLogprobs {
		choice = append(choice, "logprobs")
	}
	return root, choice
}

// withEngineKeys adds the keys of body that an engine stamps for the
// gateway (its weight version, its per-token output_versions, which the
// gateway records), when body holds one; root and choice are not modified.
func withEngineKeys(root, choice []string, body []byte) ([]string, []string) {
	if bytes.Contains(body, []byte(`"weight_version"`)) {
		root = append(slices.Clip(root), "weight_version")
	}
	if bytes.Contains(body, []byte(`"logprobs_mode"`)) {
		root = append(slices.Clip(root), "logprobs_mode")
	}
	if bytes.Contains(body, []byte(`"output_versions"`)) {
		root = append(slices.Clip(root), "output_versions")
		choice = append(slices.Clip(choice), "output_versions")
	}
	return root, choice
}

// upstreamDo sends the request to the session's worker; a worker that
// cannot be reached is marked unhealthy and the next one is tried (the
// request never reached it, so nothing is generated twice).
func (s *Server) upstreamDo(ctx context.Context, r *http.Request, sid, tail string, body []byte) (*http.Response, *worker, error) {
	var tried []*worker
	for {
		w := s.pool.pick(sid, tried)
		if w == nil {
			if len(tried) == 0 {
				return nil, nil, errNoWorker
			}
			return nil, nil, fmt.Errorf("%w reachable (tried %d)", errNoWorker, len(tried))
		}
		tried = append(tried, w)
		req, err := http.NewRequestWithContext(ctx, r.Method, w.target(tail, r.URL.RawQuery), bytes.NewReader(body))
		if err != nil {
			return nil, nil, err
		}
		for k, vs := range r.Header {
			req.Header[k] = vs
		}
		dropHeaders(req.Header, dropRequestHeaders)
		if s.cfg.UpstreamKey != "" {
			req.Header.Set("Authorization", "Bearer "+s.cfg.UpstreamKey)
		}
		if len(body) > 0 && req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		w.active.Add(1)
		resp, err := s.client.Do(req)
		if err != nil {
			w.active.Add(-1)
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "dial" {
				w.healthy.Store(false)
				s.log.Warn("gateway: worker unreachable; marked unhealthy", "worker_id", w.id, "url", w.url)
				continue
			}
			return nil, nil, err
		}
		return resp, w, nil
	}
}

// handleAgent serves an agent call: tail is "/v1/..." or "/generate"; sid
// is "" outside a session.
func (s *Server) handleAgent(w http.ResponseWriter, r *http.Request, sid, tail string) {
	start := time.Now()
	if !s.forwards(r.Method, tail) {
		s.metrics.errors.inc("not_forwarded")
		writeOpenAIError(w, http.StatusNotFound, "not_found",
			fmt.Sprintf("the gateway does not forward %s %s to the inference workers (its --forward routes: %s)", r.Method, tail, strings.Join(s.cfg.Forward, ", ")))
		return
	}
	if !s.enter() {
		writeOpenAIError(w, http.StatusServiceUnavailable, "gateway_closing", "the gateway is shutting down")
		return
	}
	defer s.inflight.done(1)
	endpoint := endpointOf(tail)
	recorded := sid != "" && endpoint != "" && r.Method == http.MethodPost
	switch {
	case recorded:
		s.metrics.calls.inc("recorded")
	case sid != "":
		s.metrics.calls.inc("passthrough")
	default:
		s.metrics.calls.inc("plain")
	}
	var body []byte
	if r.Body != nil {
		var err error
		body, err = s.bodies.read(w, r, s.cfg.MaxRequestBytes)
		if err != nil {
			s.bodyError(w, err, true)
			return
		}
	}
	if !recorded {
		s.passThrough(w, r, sid, tail, body, start)
		return
	}
	if err := validSessionID(sid); err != nil {
		s.metrics.errors.inc("bad_request")
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	if s.queue.full(0) {
		s.metrics.errors.inc("buffer_full")
		writeOpenAIError(w, http.StatusServiceUnavailable, "buffer_full",
			"the capture gateway's record buffer is full (the output is behind or down); retry later")
		return
	}
	sess := s.sessions.ensure(sid, func() *session {
		sess := newSession(sid, s.sessions.incarnation(), time.Now(), nil, nil, identity{}, s.cfg.GroupSize)
		sess.implicit = true
		return sess
	})
	if sess == nil {
		s.metrics.errors.inc("session_finished")
		writeOpenAIError(w, http.StatusConflict, "session_finished", "session "+sid+" is finished and was deleted; POST /sessions to start it again")
		return
	}
	defer sess.inflight.done(1) // counted by ensure
	// A call that records nothing (a body that is not JSON, a call the
	// upstream refused or failed) leaves no session behind that it made.
	recordedCall := false
	defer func() {
		if !recordedCall {
			s.sessions.dropUnused(sess)
		}
	}()
	sess.mu.Lock()
	finished := sess.finished != nil
	sess.mu.Unlock()
	if finished {
		s.metrics.errors.inc("session_finished")
		writeOpenAIError(w, http.StatusConflict, "session_finished", "session "+sid+" is finished; POST /sessions to start it again")
		return
	}
	if !s.pacer.admit(r.Context(), sess) {
		if s.closing.Load() {
			writeOpenAIError(w, http.StatusServiceUnavailable, "gateway_closing", "the gateway is shutting down")
			return
		}
		s.metrics.errors.inc("paced")
		w.Header().Set("Retry-After", fmt.Sprint(max(1, int(s.cfg.TrainerPoll.Seconds()+0.999))))
		writeOpenAIError(w, http.StatusTooManyRequests, "paced",
			"the trainer is behind (pacing: the groups in the pipe fill (max off-policy + 1) x groups per step); retry later")
		return
	}
	rw, err := rewriteRequest(body, endpoint, sess.sampling)
	if err != nil {
		s.metrics.errors.inc("bad_request")
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "the request body is not a JSON object")
		return
	}
	cl := &call{sess: sess, endpoint: endpoint, version: s.weight.Load(), dispatch: time.Now(), messages: rw.messages,
		tools: rw.tools, model: rw.model, stream: rw.stream}
	if len(rw.sampling) > 0 {
		cl.sampling = joinObject(rw.sampling)
	}
	cl.cap.weightVersion = -1
	cl.cap.gw = s.weight.Load // the version in force as each chunk arrives
	cl.cap.promptIDs = rw.inputIDs
	defer func() { // after s.record
		if cl.answering {
			sess.answered.done(1)
		}
	}()
	// The upstream request outlives the agent's: a call the agent gives up
	// on is still answered and recorded (the backend serves it either way).
	up := detach(r.Context(), s.cfg.AbandonedCallTimeout)
	defer up.release()
	resp, wk, err := s.upstreamDo(up.ctx, r, sid, tail, rw.body)
	if err != nil {
		s.upstreamError(w, r, err)
		return
	}
	defer wk.active.Add(-1)
	defer resp.Body.Close()
	upStart := cl.dispatch
	if resp.StatusCode != http.StatusOK {
		s.metrics.errors.inc("upstream_status")
		s.copyResponse(w, resp)
		return
	}
	var upstream time.Duration
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		cl.stream = true
		upstream = s.relayStream(w, r, resp, rw, cl, up)
	} else {
		raw, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxResponseBytes+1))
		upstream = time.Since(upStart)
		if err != nil || int64(len(raw)) > s.cfg.MaxResponseBytes {
			s.metrics.errors.inc("upstream_read")
			writeOpenAIError(w, http.StatusBadGateway, "upstream_error", "reading the upstream response failed or it was too large")
			return
		}
		parseResponse(raw, &cl.cap)
		if r.Context().Err() != nil {
			// The agent left while the backend answered: the whole answer
			// is recorded, marked as one the agent never received.
			cl.cutOff = cutClientDisconnect
		} else {
			out := raw
			root, choice := rw.stripKeys()
			if root, choice = withEngineKeys(root, choice, raw); len(root)+len(choice) > 0 && endpoint != "generate" && !cl.cap.unreadable {
				if b, _, err := stripFields(raw, root, choice); err == nil {
					out = b
				}
			}
			copyHeaders(w.Header(), resp.Header)
			w.Header().Set("Content-Length", fmt.Sprint(len(out)))
			w.WriteHeader(resp.StatusCode)
			cl.answer()
			_, werr := w.Write(out)
			if http.NewResponseController(w).Flush() != nil || werr != nil {
				cl.cutOff = cutClientDisconnect
			}
		}
	}
	cl.latency = time.Since(cl.dispatch)
	recordedCall = true
	s.record(cl)
	s.metrics.added.observe(time.Since(start) - upstream)
}

// relayStream passes an SSE stream through event by event, flushing each,
// and folds the data payloads into the capture. It returns the time spent
// waiting on the upstream. An agent that leaves mid-stream stops the
// generation (up is cancelled: vLLM aborts a request whose connection
// closes) and the step holds what arrived; one that left before the
// upstream answered never sees a byte, and the whole stream is read and
// recorded (bounded by up's timeout).
func (s *Server) relayStream(w http.ResponseWriter, r *http.Request, resp *http.Response, rw *rewrite, cl *call, up *detached) time.Duration {
	rc := http.NewResponseController(w)
	goneBefore := r.Context().Err() != nil
	if !goneBefore {
		stop := context.AfterFunc(r.Context(), func() { up.cancel(errAgentGone) })
		defer stop()
		copyHeaders(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		_ = rc.Flush()
	}
	strip := cl.endpoint != "generate"
	root, choice := rw.stripKeys()
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	var waited time.Duration
	clientGone, sawDone := goneBefore, false
	var line []byte
	var size int64 // bytes of the stream read, bounded as a whole body is
	for {
		t0 := time.Now()
		chunk, err := br.ReadSlice('\n')
		waited += time.Since(t0)
		if size += int64(len(chunk)); size > s.cfg.MaxResponseBytes {
			// Stop the generation and record what arrived, cut short.
			s.metrics.errors.inc("upstream_too_large")
			up.cancel(errStreamTooLarge)
			cl.cutOff, cl.partial = cutTooLarge, true
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, chunk...)
			continue
		}
		if len(line) > 0 {
			chunk = append(line, chunk...)
			line = line[:0]
		}
		if len(chunk) > 0 {
			out := chunk
			if data, ok := bytes.CutPrefix(chunk, []byte("data:")); ok {
				data = bytes.TrimSpace(data)
				if string(data) == "[DONE]" {
					sawDone = true
					cl.answer() // the agent's stream ends with this event
				} else if len(data) > 0 && cl.cap.addChunk(data) && strip {
					if root, choice := withEngineKeys(root, choice, data); len(root)+len(choice) > 0 {
						if b, changed, err := stripFields(data, root, choice); err == nil && changed {
							out = append(append([]byte("data: "), b...), '\n')
						}
					}
				}
			}
			if !clientGone {
				if _, werr := w.Write(out); werr != nil {
					clientGone = true
				} else if len(bytes.TrimSpace(chunk)) == 0 { // end of an event
					if rc.Flush() != nil {
						clientGone = true
					}
				}
			}
		}
		if err != nil {
			switch {
			case goneBefore:
				cl.cutOff = cutClientDisconnect
				cl.partial = !errors.Is(err, io.EOF) || !sawDone
			case sawDone && !clientGone:
				// The whole transcript reached the agent: complete, even
				// when the agent hung up before the upstream's EOF (its
				// request context is then already cancelled, and the read
				// fails with that rather than EOF).
			case clientGone || r.Context().Err() != nil:
				cl.cutOff, cl.partial = cutClientDisconnect, true
			case !errors.Is(err, io.EOF) || !sawDone:
				cl.cutOff, cl.partial = cutUpstream, true
			}
			break
		}
		if clientGone && !goneBefore {
			// The agent is gone: stop the generation (vLLM aborts a request
			// whose connection closes) and record what arrived.
			cl.cutOff, cl.partial = cutClientDisconnect, true
			break
		}
	}
	if cl.cap.upstreamErr && cl.cutOff == "" {
		// The upstream ended the stream with an error event (and maybe
		// [DONE]): the generation failed, what arrived is cut short.
		cl.cutOff, cl.partial = cutUpstreamError, true
	}
	if !goneBefore {
		_ = rc.Flush()
	}
	return waited
}

var (
	errAgentGone      = errors.New("the agent disconnected mid-stream")
	errStreamTooLarge = errors.New("the stream passed the response bound (MaxResponseBytes)")
)

// detached is the context of a recorded call's upstream request: it is
// not cancelled with the agent's request, so that a call the agent gives
// up on is still answered and recorded, and it ends timeout after the
// agent left (or at once, by cancel, when a stream it was reading
// stops).
type detached struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	stop   func() bool
	timer  atomic.Pointer[time.Timer]
}

func detach(agent context.Context, timeout time.Duration) *detached {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(agent))
	d := &detached{ctx: ctx, cancel: cancel}
	d.stop = context.AfterFunc(agent, func() {
		d.timer.Store(time.AfterFunc(timeout, func() { cancel(errAbandoned) }))
	})
	return d
}

// release ends the upstream request's context once the call is done.
func (d *detached) release() {
	d.stop()
	if t := d.timer.Load(); t != nil {
		t.Stop()
	}
	d.cancel(nil)
}

var errAbandoned = errors.New("the agent disconnected and the upstream did not answer within the abandoned-call timeout")

// record turns a finished call into its step and trace.
func (s *Server) record(cl *call) {
	if s.beforeRecord != nil {
		s.beforeRecord()
	}
	sess := cl.sess
	sess.mu.Lock()
	index := sess.steps
	sess.steps++
	// The previous step, if it is a parent this one may extend (stored as
	// a delta unless --whole-prompts; a fork when it does not).
	var parent *prev
	if p := sess.last; p != nil && p.index == index-1 {
		parent = p
	}
	sess.last = nil
	sess.mu.Unlock()
	line, tr, reject, fork := buildStep(cl, index, parent, s.cfg.WholePrompts)
	if fork != nil {
		s.metrics.forks.Add(1)
	}
	if len(line) > s.cfg.MaxRecordBytes {
		// More than the output takes: its stub, which ingest dead-letters.
		s.log.Warn("gateway: a step is larger than the output takes; its stub is written instead", "session_id", sess.id, "bytes", len(line), "max", s.cfg.MaxRecordBytes)
		line, reject = refusedStub(line, rejectTooLarge), rejectTooLarge
	}
	if c := &cl.cap; reject == "" && cl.cutOff == "" && c.promptIDs != nil && c.responseIDs != nil {
		// This step is the next one's parent, unless a later call was
		// recorded meanwhile (it was then written whole). Set only now,
		// once its line is known to be written as it is.
		sess.mu.Lock()
		if sess.steps == index+1 {
			sess.last = &prev{id: stepID(sess.trajID, index), index: index, prompt: c.promptIDs, answer: c.responseIDs}
		}
		sess.mu.Unlock()
	}
	if reject != "" {
		// Its trajectory can never complete: its finish says so
		// (rejected_steps), and ingest closes the group without it.
		sess.mu.Lock()
		sess.rejected++
		sess.mu.Unlock()
	}
	s.queue.enqueue(sess.durable, Record{Key: sess.key(), Line: line})
	s.metrics.steps.Add(1)
	if reject != "" {
		s.metrics.rejected.inc(reject)
	}
	if cl.cutOff != "" {
		s.metrics.cutOff.inc(cl.cutOff)
	}
	if cl.cap.choices > 1 {
		s.metrics.unrecordedN.Add(int64(cl.cap.choices - 1))
	}
	s.metrics.promptTokens.Add(int64(len(cl.cap.promptIDs)))
	s.metrics.complTokens.Add(int64(len(cl.cap.responseIDs)))
	if n := s.sessions.addTrace(sess, tr); n > 0 {
		s.metrics.tracesEvicted.Add(int64(n))
	}
}

// passThrough forwards a call that is not recorded, streaming the body.
func (s *Server) passThrough(w http.ResponseWriter, r *http.Request, sid, tail string, body []byte, start time.Time) {
	t0 := time.Now()
	resp, wk, err := s.upstreamDo(r.Context(), r, sid, tail, body)
	if err != nil {
		s.upstreamError(w, r, err)
		return
	}
	defer wk.active.Add(-1)
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		s.metrics.errors.inc("upstream_status")
	}
	upstream := time.Since(t0)
	s.copyResponse(w, resp)
	s.metrics.added.observe(time.Since(start) - upstream)
}

// copyResponse relays status, headers and body, flushing as it goes.
func (s *Server) copyResponse(w http.ResponseWriter, resp *http.Response) {
	copyHeaders(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			_ = rc.Flush()
		}
		if err != nil {
			return
		}
	}
}

func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = vs
	}
	dropHeaders(dst, dropResponseHeaders)
}

// dropHeaders deletes from h the headers its Connection header names
// (hop-by-hop too, RFC 9110 section 7.6.1: a client may mark any header
// as meant for the gateway alone), then those of always.
func dropHeaders(h http.Header, always []string) {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range always {
		h.Del(name)
	}
}

func (s *Server) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		s.metrics.errors.inc("client_gone")
		return
	}
	s.metrics.errors.inc("upstream_unreachable")
	s.log.Warn("gateway: upstream call failed", "path", r.URL.Path, "err", err)
	writeOpenAIError(w, http.StatusBadGateway, "upstream_unreachable", "no upstream worker answered: "+err.Error())
}

// bodyError answers a request body that could not be read.
func (s *Server) bodyError(w http.ResponseWriter, err error, openai bool) {
	if errors.Is(err, errBodiesFull) {
		s.bodiesFull(w, openai)
		return
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		s.metrics.errors.inc("body_too_large")
		msg := fmt.Sprintf("request body over %d bytes", mbe.Limit)
		if openai {
			writeOpenAIError(w, http.StatusRequestEntityTooLarge, "request_too_large", msg)
		} else {
			writeError(w, http.StatusRequestEntityTooLarge, msg)
		}
		return
	}
	s.metrics.errors.inc("bad_request")
	if openai {
		writeOpenAIError(w, http.StatusBadRequest, "invalid_request_error", "reading the request body failed")
	} else {
		writeError(w, http.StatusBadRequest, "reading the request body failed")
	}
}

// writeOpenAIError answers in the OpenAI error shape agents' SDKs parse.
func writeOpenAIError(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": status}})
}

// writeError answers a management route in rLLM's shape: {"error": "..."}.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var b []byte
	switch x := v.(type) {
	case []byte:
		b = x
	case json.RawMessage:
		b = x
	default:
		b = marshal(v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
