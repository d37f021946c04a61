package gateway

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TraceRecord is one recorded call in rLLM's TraceRecord JSON shape
// (rllm_model_gateway/models.py), what GET /sessions/{id}/traces returns.
type TraceRecord struct {
	TraceID            string           `json:"trace_id"`
	SessionID          string           `json:"session_id"`
	Model              string           `json:"model"`
	Messages           json.RawMessage  `json:"messages"`
	PromptTokenIDs     []int64          `json:"prompt_token_ids"`
	ResponseMessage    json.RawMessage  `json:"response_message"`
	CompletionTokenIDs []int64          `json:"completion_token_ids"`
	Logprobs           []float64        `json:"logprobs"`
	FinishReason       *string          `json:"finish_reason"`
	WeightVersion      int64            `json:"weight_version"`
	LatencyMS          float64          `json:"latency_ms"`
	TokenCounts        map[string]int64 `json:"token_counts"`
	Timestamp          float64          `json:"timestamp"`
	Metadata           json.RawMessage  `json:"metadata"`
}

// SessionInfo is rLLM's session description.
type SessionInfo struct {
	SessionID  string          `json:"session_id"`
	TraceCount int             `json:"trace_count"`
	CreatedAt  float64         `json:"created_at"`
	Metadata   json.RawMessage `json:"metadata"`
}

// trace is one recorded call as the traces API returns it.
type trace struct {
	id   string
	ts   float64
	json []byte
	sess *session // set and read under sessions.mu
	gone bool     // evicted or deleted (sessions.fifo skips it); under sessions.mu
}

// session is one agent run. Its identity (task, group, trajectory, role)
// is fixed at creation: from POST /sessions, else from the id
// ({task_id}:{rollout_idx}).
type session struct {
	id        string
	created   time.Time
	metadata  json.RawMessage // object
	sampling  []field         // sampling_params, in the order given
	taskID    string
	groupID   string
	trajID    string
	role      string
	groupSize int

	durable  *tracker // this session's records not yet durable (its own allocation: a retired id keeps it)
	inflight tracker  // recorded calls running
	// answered counts calls whose answer reached (or is reaching) the
	// agent but that are not recorded yet: a trace list waits for them,
	// so an agent that lists its traces after a call sees that call.
	answered tracker

	mu       sync.Mutex
	steps    int64  // recorded calls: the next step_index
	rejected int64  // of them, written to be dead-lettered (gateway_reject)
	last     *prev  // the step before the next one, when it can be a parent
	finished []byte // the trajectory line once finished
	// finishedAt is when the finish arrived (the trajectory's
	// metadata.finished_at): a repeat of the finish builds the same line.
	finishedAt time.Time
	// finishSum identifies the finish body (finishSum), kept for a repeat
	// of the finish once the session has left the table.
	finishSum [sha256.Size]byte
	traces    []*trace

	// Under sessions.mu: counted among the finished sessions (finishedN,
	// its bytes in sessions.bytes).
	counted bool
	// implicit: created by a call (ensure), not by POST /sessions; a call
	// that fails before anything is recorded may remove it (dropUnused)
	// unless a finish holds it (pinned, under sessions.mu).
	implicit bool
	pinned   bool

	// paced: admitted by the pacer and counted in its group's sessions
	// (under pacer.mu).
	paced bool
}

// prev is a recorded step a later step's prompt may extend: sent as a
// delta of it.
type prev struct {
	id             string
	index          int64
	prompt, answer []int64
}

// identity fields a POST /sessions body (or its metadata) may name.
type identity struct {
	TaskID       string `json:"task_id"`
	GroupID      string `json:"group_id"`
	TrajectoryID string `json:"trajectory_id"`
	Role         string `json:"role"`
	GroupSize    int    `json:"group_size"`
}

// newSession describes a session; incarnation is what makes its default
// trajectory id unique (sessions.incarnation).
func newSession(id, incarnation string, now time.Time, metadata json.RawMessage, sampling []field, ident identity, defaultGroupSize int) *session {
	if len(metadata) == 0 || string(metadata) == "null" {
		metadata = json.RawMessage("{}")
	}
	s := &session{id: id, created: now, metadata: metadata, sampling: sampling, durable: &tracker{},
		taskID: ident.TaskID, groupID: ident.GroupID, trajID: ident.TrajectoryID, role: ident.Role, groupSize: ident.GroupSize}
	if s.taskID == "" {
		s.taskID = id
		if i := strings.LastIndexByte(id, ':'); i > 0 {
			s.taskID = id[:i]
		}
	}
	if s.trajID == "" {
		s.trajID = id + "@" + incarnation
	}
	if s.groupSize <= 0 {
		s.groupSize = defaultGroupSize
	}
	return s
}

// key is the output partition key: the group when named, else the task.
func (s *session) key() string {
	if s.groupID != "" {
		return s.groupID
	}
	return s.taskID
}

func (s *session) info() SessionInfo {
	s.mu.Lock()
	n := len(s.traces)
	s.mu.Unlock()
	return SessionInfo{SessionID: s.id, TraceCount: n, CreatedAt: unixSeconds(s.created), Metadata: s.metadata}
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }

// sessions is the session table and the bounded in-memory trace store.
//
// Memory is bounded by count (total traces, traces per session) and by
// bytes (maxBytes: the traces' JSON, which holds prompt and response ids,
// plus what a finished session keeps). Beyond a bound, finished sessions
// go first, oldest finished first: their traces, then the session itself
// (its id retired); then the oldest traces of open sessions. Open
// sessions themselves are not evicted (they are bounded by the agents
// running). The durable copy of every trace is the Output.
//
// Every incarnation of a session id has a trajectory id of its own,
// "{session_id}@{run}.{n}": run is drawn at random when the gateway starts
// and n counts the sessions it created, so that a session id used again
// (after DELETE, after finish and POST /sessions, after a restart) never
// writes a step or trajectory id an earlier incarnation wrote, which
// ingest would take for a retry or a late duplicate. A finished session
// that leaves the table (DELETE, eviction) leaves its id retired: a call to
// it is refused until POST /sessions starts it again. Retired ids are
// forgotten oldest first beyond maxRetired, and at a restart; a call to a
// forgotten one starts a new incarnation (its ids still fresh).
type sessions struct {
	perSession, total int
	maxBytes          int64
	run               string
	seq               atomic.Int64
	maxRetired        int

	mu        sync.Mutex
	m         map[string]*session
	traces    map[string]*session // trace id → session
	count     int                 // traces held
	bytes     int64               // traces' JSON and finished sessions' footprint
	fifo      []*trace            // traces held, oldest first, and gone ones not yet skipped
	finishedQ []*session          // finished sessions, oldest first, and stale ones not yet skipped
	finishedN int                 // finished sessions in m
	retired   map[string]*retired // finished sessions' ids no longer in m
	retiredQ  []retiredID         // retired, oldest first
	retiredN  int64
	// left, if set, is called (under mu) with every session taken out of
	// the table.
	left func(*session)
}

func newSessions(perSession, total int, maxBytes int64, maxRetired int) *sessions {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return &sessions{perSession: perSession, total: total, maxBytes: maxBytes, maxRetired: maxRetired,
		run: strings.ToLower(base32.StdEncoding.EncodeToString(b[:])),
		m:   map[string]*session{}, traces: map[string]*session{}, retired: map[string]*retired{}}
}

type retiredID struct {
	id string
	n  int64
}

// retired is what a finished session that left the table leaves: enough
// to answer a repeat of its finish (a client that lost the answer) as the
// first one was answered.
type retired struct {
	n       int64 // when retired (retiredN)
	trajID  string
	steps   int64
	sum     [sha256.Size]byte // the finish body's
	durable *tracker          // nil once its records were durable
}

// retiredFinish returns what the retired session id left, if it is
// remembered.
func (t *sessions) retiredFinish(id string) (retired, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.retired[id]
	if !ok {
		return retired{}, false
	}
	return *r, true
}

// incarnation returns the next "{run}.{n}" trajectory id suffix.
func (t *sessions) incarnation() string {
	return t.run + "." + strconv.FormatInt(t.seq.Add(1), 10)
}

func (t *sessions) get(id string) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

// pin returns the session of id (nil: none), which dropUnused will no
// longer remove: a finish holds it.
func (t *sessions) pin(id string) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.m[id]
	if s != nil {
		s.pinned = true
	}
	return s
}

// ensure returns the session of id, creating a default one (a call to a
// session URL that POST /sessions never named, as rLLM allows), with the
// caller's call counted in its inflight (the caller calls inflight.done);
// nil when id is retired.
func (t *sessions) ensure(id string, mk func() *session) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.m[id]
	if !ok {
		if _, ok := t.retired[id]; ok {
			return nil
		}
		s = mk()
		t.m[id] = s
	}
	// Counted in flight under t.mu, so that dropUnused, under it too,
	// never drops a session another call has just been given.
	s.inflight.add(1)
	return s
}

// dropUnused removes s if a call created it (ensure) and it is still
// unused: no step recorded, not finished, no other call in flight (the
// caller's own is counted in s.inflight; of calls that overlap, the last
// to fail removes it). A call that fails before
// it records anything (a request the upstream refuses) then leaves no
// session behind, as if it had never been made.
func (t *sessions) dropUnused(s *session) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !s.implicit || s.pinned || t.m[s.id] != s || s.inflight.count() > 1 {
		return
	}
	s.mu.Lock()
	unused := s.steps == 0 && s.finished == nil && len(s.traces) == 0
	s.mu.Unlock()
	if unused {
		delete(t.m, s.id)
		if t.left != nil {
			t.left(s)
		}
	}
}

// retireLocked remembers a finished session's id once it leaves the table.
func (t *sessions) retireLocked(s *session) {
	if !s.counted {
		return
	}
	if _, ok := t.retired[s.id]; ok {
		return
	}
	t.retiredN++
	r := &retired{n: t.retiredN, trajID: s.trajID, durable: s.durable}
	s.mu.Lock()
	r.steps, r.sum = s.steps, s.finishSum
	s.mu.Unlock()
	if r.durable.count() == 0 {
		r.durable = nil
	}
	t.retired[s.id] = r
	t.retiredQ = append(t.retiredQ, retiredID{s.id, t.retiredN})
	for len(t.retiredQ) > t.maxRetired {
		if r := t.retiredQ[0]; t.retired[r.id] != nil && t.retired[r.id].n == r.n { // not taken back and retired again since
			delete(t.retired, r.id)
		}
		t.retiredQ[0] = retiredID{}
		t.retiredQ = t.retiredQ[1:]
	}
}

func (t *sessions) list() []*session {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*session, 0, len(t.m))
	for _, s := range t.m {
		out = append(out, s)
	}
	return out
}

func (t *sessions) open() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m) - t.finishedN
}

// usage returns the traces held and the bytes counted against maxBytes.
func (t *sessions) usage() (traces int, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.count, t.bytes
}

// remove deletes a session and its traces; it returns the traces deleted.
// A finished session's id is retired.
func (t *sessions) remove(id string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	s, ok := t.m[id]
	if !ok {
		return 0
	}
	t.retireLocked(s)
	return t.dropLocked(s)
}

// footprint is what a finished session keeps, counted against maxBytes.
func (s *session) footprint() int64 {
	return 512 + int64(len(s.id)+len(s.metadata)+len(s.taskID)+len(s.groupID)+len(s.trajID)+len(s.role)+len(s.finished))
}

// dropLocked takes s out of the table with its traces; it returns the
// traces dropped. Its entries in fifo and finishedQ go stale.
func (t *sessions) dropLocked(s *session) int {
	if t.m[s.id] == s {
		delete(t.m, s.id)
	}
	if t.left != nil {
		t.left(s)
	}
	if s.counted {
		s.counted = false
		t.finishedN--
		t.bytes -= s.footprint()
	}
	s.mu.Lock()
	n := len(s.traces)
	for _, tr := range s.traces {
		t.forgetLocked(tr)
	}
	s.traces = nil
	s.last = nil
	s.mu.Unlock()
	t.compactLocked()
	return n
}

// forgetLocked drops a trace from the index and the counts.
func (t *sessions) forgetLocked(tr *trace) {
	delete(t.traces, tr.id)
	tr.gone = true
	t.count--
	t.bytes -= int64(len(tr.json))
	tr.json = nil // readers holding it keep their copy of the slice
}

// compactLocked drops stale entries from fifo and finishedQ once they
// outnumber the live ones (sessions deleted without eviction reaching
// them), so that neither grows without bound.
func (t *sessions) compactLocked() {
	if len(t.fifo) > 2*t.count+1024 {
		live := make([]*trace, 0, t.count)
		for _, tr := range t.fifo {
			if !tr.gone {
				live = append(live, tr)
			}
		}
		t.fifo = live
	}
	if len(t.finishedQ) > 2*t.finishedN+1024 {
		live := make([]*session, 0, t.finishedN)
		for _, f := range t.finishedQ {
			if f.counted {
				live = append(live, f)
			}
		}
		t.finishedQ = live
	}
}

// markFinished queues s for eviction ahead of open sessions and lets go
// of what only calls to come needed (the previous step's token ids). It
// returns how many traces were evicted to stay within the bounds.
func (t *sessions) markFinished(s *session) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	s.mu.Lock()
	s.last = nil
	s.mu.Unlock()
	if t.m[s.id] != s || s.counted {
		return 0
	}
	s.counted = true
	t.finishedN++
	t.bytes += s.footprint()
	t.finishedQ = append(t.finishedQ, s)
	return t.shrinkLocked(nil)
}

// addTrace stores a trace of s within the bounds and returns how many
// traces were evicted to make room.
func (t *sessions) addTrace(s *session, tr *trace) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m[s.id] != s { // deleted meanwhile
		return 0
	}
	tr.sess = s
	s.mu.Lock()
	s.traces = append(s.traces, tr)
	over := len(s.traces) > t.perSession
	s.mu.Unlock()
	t.traces[tr.id] = s
	t.count++
	t.bytes += int64(len(tr.json))
	t.fifo = append(t.fifo, tr)
	evicted := 0
	if over && t.evictOldestOf(s) {
		evicted++
	}
	return evicted + t.shrinkLocked(tr)
}

// evictOldestOf drops the oldest trace of s; false when s has none.
func (t *sessions) evictOldestOf(s *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.traces) == 0 {
		return false
	}
	tr := s.traces[0]
	s.traces[0] = nil
	s.traces = s.traces[1:]
	if len(s.traces) == 0 {
		s.traces = nil
	}
	t.forgetLocked(tr)
	return true
}

// shrinkLocked evicts until the bounds hold: finished sessions first,
// oldest first (traces, then the session), then the oldest traces of
// open sessions. keep, the trace just added, goes last: a single trace
// larger than the bound is kept until the next one comes. It returns the
// traces evicted.
func (t *sessions) shrinkLocked(keep *trace) int {
	n := 0
	for t.count > t.total || t.bytes > t.maxBytes {
		if len(t.finishedQ) > 0 {
			f := t.finishedQ[0]
			if !f.counted { // stale: deleted or taken over
				t.finishedQ[0] = nil
				t.finishedQ = t.finishedQ[1:]
				continue
			}
			if t.evictOldestOf(f) {
				n++
				continue
			}
			t.finishedQ[0] = nil
			t.finishedQ = t.finishedQ[1:]
			t.retireLocked(f)
			t.dropLocked(f)
			continue
		}
		for len(t.fifo) > 0 && t.fifo[0].gone {
			t.fifo[0] = nil
			t.fifo = t.fifo[1:]
		}
		if len(t.fifo) == 0 || t.fifo[0] == keep {
			break
		}
		if !t.evictOldestOf(t.fifo[0].sess) {
			break // cannot happen: a live trace is in its session's list
		}
		n++
	}
	t.compactLocked()
	return n
}

func (t *sessions) trace(id string) []byte {
	t.mu.Lock()
	s := t.traces[id]
	t.mu.Unlock()
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, tr := range s.traces {
		if tr.id == id {
			return tr.json
		}
	}
	return nil
}

// traceList returns a session's traces at or after since (unix seconds;
// <= 0: all), at most limit (<= 0: all), as one JSON array.
func (s *session) traceList(since float64, limit int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	buf := []byte{'['}
	n := 0
	for _, tr := range s.traces {
		if since > 0 && tr.ts < since {
			continue
		}
		if limit > 0 && n == limit {
			break
		}
		if n > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, tr.json...)
		n++
	}
	return append(buf, ']')
}

// create registers s (POST /sessions). It replaces a session of the same
// id that has no recorded call and is not finished (an agent's call may
// have created it first), or one that is finished (the id starts again, as
// a new incarnation); a retired id is taken back. It returns the session
// in force: not s when one is open with recorded calls or being finished.
func (t *sessions) create(s *session) *session {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.retired, s.id) // its entry in retiredQ goes when it comes first
	old := t.m[s.id]
	if old == nil {
		t.m[s.id] = s
		return s
	}
	old.mu.Lock()
	unused := old.steps == 0 && old.finished == nil && old.inflight.count() == 0
	done := len(old.finished) > 0 && old.inflight.count() == 0
	old.mu.Unlock()
	switch {
	case unused:
	case done:
		t.dropLocked(old)
	default:
		return old
	}
	t.m[s.id] = s
	return s
}

// sameSetup reports whether fresh, a POST /sessions for a session in
// force, asks for what s already has: the same identity (the trajectory
// id only when fresh names one), metadata and sampling params. Such a
// request is a retry.
func (s *session) sameSetup(fresh *session, namedTrajectory bool) bool {
	if s.taskID != fresh.taskID || s.groupID != fresh.groupID || s.role != fresh.role || s.groupSize != fresh.groupSize ||
		namedTrajectory && s.trajID != fresh.trajID || !sameJSON(s.metadata, fresh.metadata) || len(s.sampling) != len(fresh.sampling) {
		return false
	}
	given := make(map[string]json.RawMessage, len(s.sampling))
	for _, f := range s.sampling {
		given[f.key] = f.val
	}
	for _, f := range fresh.sampling {
		if v, ok := given[f.key]; !ok || !sameJSON(v, f.val) {
			return false
		}
	}
	return true
}

// sameJSON reports whether two JSON texts hold the same value (objects
// compared as sets of members, whatever their order and spacing).
func sameJSON(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return bytes.Equal(a, b)
	}
	return reflect.DeepEqual(va, vb)
}
