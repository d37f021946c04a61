package flight

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/flight"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/merge"
)

// Group opens members of the served consumer group.
type Group interface {
	Join(ctx context.Context, name string, t Ticket) (*train.Consumer, error)
}

// Versions records the policy version a trainer says its inference
// workers now serve (serve: the store's, package train/loop), for the
// capture gateway to follow.
type Versions interface {
	Publish(ctx context.Context, version int64, by string) error
}

// Ticket is a DoGet request.
type Ticket struct {
	Consumer      string `json:"consumer,omitempty"`
	PolicyVersion *int64 `json:"policy_version,omitempty"`
	// BatchGroups asks for steps of exactly this many groups (serve's
	// --batch-groups for this member; a multiple of its --group-multiple).
	BatchGroups int `json:"batch_groups,omitempty"`
	// VersionsPerStep is how far the trainer's version advances with each
	// step it acknowledges (serve's --versions-per-batch for this member;
	// 0: it does not move): staleness is judged where the step trains.
	VersionsPerStep *int64 `json:"versions_per_step,omitempty"`
	// Key is the stream's secret, chosen by the client (at least
	// MinKeyLen characters); actions on the stream must carry it.
	Key string `json:"key,omitempty"`
}

// MaxTicketSteps bounds a ticket's batch_groups and versions_per_step.
const MaxTicketSteps = 1 << 20

// ErrTicket is a Group's refusal of what a ticket asks for (a client's
// mistake, not the server's state).
var ErrTicket = errors.New("the ticket asks for what this server cannot give")

// MinKeyLen is the shortest stream key a ticket may carry.
const MinKeyLen = 16

// BatchMeta is the app_metadata of every streamed batch.
type BatchMeta struct {
	BatchID  uint64 `json:"batch_id"`
	Consumer string `json:"consumer"`
	// Member is this stream's run of the consumer (name/incarnation);
	// an ack that names it is refused by any later stream of the name.
	Member    string   `json:"member"`
	Groups    []string `json:"groups"`
	Tokens    int64    `json:"tokens"`
	Rows      int64    `json:"rows"`
	Oversized bool     `json:"oversized"`
	// Layout is "trajectories" when the rows are merged trajectory rows
	// (serve --layout trajectories); Merge then tallies the merge.
	Layout string       `json:"layout,omitempty"`
	Merge  *merge.Stats `json:"merge,omitempty"`
	// Key is the stream's secret when the server made it (the ticket had
	// none); only in the first batch.
	Key string `json:"key,omitempty"`
	// AgesMs is, per group in Groups' order, how long ago its last
	// trajectory finished at the capture gateway, in milliseconds, when
	// the batch was formed (-1: unknown); absent when no group has one.
	AgesMs []int64 `json:"ages_ms,omitempty"`
	// Step places the batch in its trainer step: a step of --batch-groups
	// groups over --max-tokens comes as several batches (part 0 of
	// parts first), to accumulate into one optimizer step.
	Step train.StepPart `json:"step"`
}

type ackRequest struct {
	Consumer string   `json:"consumer"`
	Key      string   `json:"key"`
	Member   string   `json:"member,omitempty"` // the stream the batches came from
	BatchIDs []uint64 `json:"batch_ids"`
	// PolicyVersion, if set, is applied before the acknowledgement: the
	// batch formed next (after the acknowledgement frees a slot) is judged
	// against it.
	PolicyVersion *int64 `json:"policy_version,omitempty"`
}

type policyRequest struct {
	Consumer      string `json:"consumer"`
	Key           string `json:"key"`
	PolicyVersion *int64 `json:"policy_version"`
}

type statsRequest struct {
	Consumer string `json:"consumer"`
	Key      string `json:"key"`
}

// Options secure and bound a Server. Zero fields take the defaults.
type Options struct {
	// Token, if set, is the bearer token every call must carry; AdminToken,
	// if set, is accepted as well and is the only one that reads other
	// members' stats. With neither, Serve listens on loopback only.
	Token, AdminToken string
	// TLS, if set, is the server's TLS configuration (certificate and key).
	TLS *tls.Config
	// MaxStreams is how many DoGet streams run at once (default 64).
	MaxStreams int
	// MaxStreamsPerConn is how many of them one client connection may
	// hold (default 4), so that one client cannot take every slot.
	MaxStreamsPerConn int
	// MaxStreamsPerHost is how many of them the connections of one client
	// host (peer IP address) may hold together (default 16): a client
	// opening many connections still gets no more. When the server or a
	// host is full, a new stream evicts the oldest stream that has been
	// open for SendTimeout without acknowledging a batch (of the host
	// with the most streams, or of the full host), instead of being
	// refused: streams that never read cannot lock a trainer out.
	MaxStreamsPerHost int
	// MaxStreamBytes is how many bytes of batches a stream may have sent
	// and not acknowledged before it waits (default 256 MiB; a batch alone
	// over it still goes).
	MaxStreamBytes int64
	// SendTimeout drops a stream whose client does not take a batch within
	// it (default 30s).
	SendTimeout time.Duration
	// AckTimeout drops a stream with batches in flight and no
	// acknowledgement for this long (default 5m; negative: never).
	AckTimeout time.Duration
	// MemberTokens gives consumers their own bearer tokens (consumer
	// name -> token). A call with one streams only under its name, and
	// only a call with it streams under that name. Such streams are
	// reserved: outside MaxStreams and the per-connection and per-host
	// limits, and never evicted for a newcomer, so holders of the shared
	// Token cannot lock that trainer out, whatever they open.
	MemberTokens map[string]string
	// Versions, if set, takes publish_policy_version (else the action
	// is refused: Unimplemented).
	Versions Versions
	// ShutdownGrace bounds a graceful stop: connections still open after it
	// are closed (default 10s).
	ShutdownGrace time.Duration
	// RejoinWait is how long a stream under a name that is still streaming
	// waits for that stream to end before it is refused (default 5s;
	// negative: refused at once). A trainer that reconnects right after
	// dropping its stream is let in once the server has seen the drop,
	// which can arrive after the new stream on another connection.
	RejoinWait time.Duration
}

func (o Options) withDefaults() Options {
	if o.MaxStreams <= 0 {
		o.MaxStreams = 64
	}
	if o.MaxStreamsPerConn <= 0 {
		o.MaxStreamsPerConn = 4
	}
	if o.MaxStreamsPerHost <= 0 {
		o.MaxStreamsPerHost = 16
	}
	if o.MaxStreamBytes <= 0 {
		o.MaxStreamBytes = 256 << 20
	}
	if o.SendTimeout <= 0 {
		o.SendTimeout = 30 * time.Second
	}
	if o.AckTimeout == 0 {
		o.AckTimeout = 5 * time.Minute
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 10 * time.Second
	}
	if o.RejoinWait == 0 {
		o.RejoinWait = 5 * time.Second
	}
	return o
}

// Server is the Flight service.
type Server struct {
	flight.BaseFlightServer
	group Group
	opts  Options
	auth  *auth

	// closing ends every stream at shutdown (a graceful stop would wait
	// for streams that follow the manifest forever); aborting also cuts
	// the release of their work short. Abort closes aborted.
	closing, aborting context.Context
	close, abort      context.CancelFunc
	abortOnce         sync.Once
	aborted           chan struct{}

	mu      sync.Mutex
	members map[string]*member // nil: name reserved, joining
	named   int                // of them, streams under MemberTokens names
	freed   chan struct{}      // closed (and replaced) when a name is freed
	conns   map[string]int     // streams per client connection (peer address)
	hosts   map[string]int     // streams per client host (peer IP)
	left    map[string]leftMember
}

// member is one stream: a member of the group.
type member struct {
	name  string
	named bool   // name has its own token: outside the limits, never evicted
	conn  string // the client connection's peer address
	host  string // its IP address
	// joined is when the stream began; acks counts the batches it
	// acknowledged; evict ends it (a newcomer needs its slot).
	joined time.Time
	acks   atomic.Int64
	evict  func()
	id     string            // the consumer's member id, name/incarnation
	key    [sha256.Size]byte // digest of the stream's secret
	c      *train.Consumer

	mu       sync.Mutex
	sent     map[uint64]int64 // bytes of batches sent, not acknowledged
	bytes    int64            // their sum
	progress time.Time        // last acknowledgement, or first batch in flight since
	// idleSince is when the member last had no batch in flight (zero
	// while it has one); idle sums those spans: the trainer waiting for
	// data, as the server sees it.
	idleSince time.Time
	idle      time.Duration
	acked     chan struct{} // signalled on every acknowledgement

	// acking is read-held by acknowledgements in flight, so that the
	// tallies kept when the stream ends count them: the last ack can end
	// the stream (everything acknowledged) before its own tally lands.
	acking sync.RWMutex
}

// leftMember is a stream that ended: its final tallies, for its client.
type leftMember struct {
	key   [sha256.Size]byte
	stats train.Stats
}

// NewServer serves members of group under opts.
func NewServer(group Group, opts Options) *Server {
	closing, cancelClosing := context.WithCancel(context.Background())
	aborting, cancelAborting := context.WithCancel(context.Background())
	return &Server{
		group: group, opts: opts.withDefaults(), auth: newAuth(opts.Token, opts.AdminToken, opts.MemberTokens),
		members: map[string]*member{}, freed: make(chan struct{}), conns: map[string]int{}, hosts: map[string]int{}, left: map[string]leftMember{},
		closing: closing, close: cancelClosing, aborting: aborting, abort: cancelAborting,
		aborted: make(chan struct{}),
	}
}

// Abort ends every stream and connection at once (Serve returns without
// waiting out the grace); unacknowledged work is left to the lease
// timeout if it cannot be released in time. Safe to call more than once.
func (s *Server) Abort() {
	s.abortOnce.Do(func() {
		s.close()
		s.abort()
		close(s.aborted)
	})
}

func keyDigest(key string) [sha256.Size]byte { return sha256.Sum256([]byte(key)) }

// stream returns the live stream of consumer name whose key is key.
// Absent and wrong keys are refused alike, so the reply tells nothing of
// other clients' streams.
func (s *Server) stream(name, key string) (*member, error) {
	d := keyDigest(key)
	s.mu.Lock()
	m := s.members[name]
	s.mu.Unlock()
	if m == nil || key == "" || subtle.ConstantTimeCompare(d[:], m.key[:]) != 1 {
		return nil, status.Errorf(codes.PermissionDenied, "no stream of consumer %q with this key is open on this server (actions name the consumer and carry the key of its stream)", name)
	}
	return m, nil
}

func checkVersion(what string, v *int64) error {
	if v == nil {
		return nil
	}
	if err := train.CheckPolicyVersion(*v); err != nil {
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	}
	return nil
}

// join reserves name for a new stream of connection conn (refused at
// MaxStreams, MaxStreamsPerConn, MaxStreamsPerHost unless a stream can be
// evicted: see Options.MaxStreamsPerHost; a name with its own token is
// outside them) and joins the group. evict ends the new stream if it is
// evicted in turn.
func (s *Server) join(ctx context.Context, t Ticket, key [sha256.Size]byte, conn string, evict func()) (*member, error) {
	host := hostOf(conn)
	named := s.auth.reserved(t.Consumer)
	s.mu.Lock()
	if err := s.awaitFree(ctx, t.Consumer); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	for evictions := 0; ; evictions++ {
		if _, busy := s.members[t.Consumer]; busy {
			s.mu.Unlock()
			return nil, status.Errorf(codes.AlreadyExists, "consumer %q is already streaming", t.Consumer)
		}
		if named {
			break
		}
		if s.conns[conn] >= s.opts.MaxStreamsPerConn {
			s.mu.Unlock()
			return nil, status.Errorf(codes.ResourceExhausted, "this connection has %d streams, its limit (--max-streams-per-conn)", s.opts.MaxStreamsPerConn)
		}
		serverFull, hostFull := len(s.members)-s.named >= s.opts.MaxStreams, s.hosts[host] >= s.opts.MaxStreamsPerHost
		if !serverFull && !hostFull {
			break
		}
		var victim *member
		if evictions < 4 {
			victim = s.evictable(host, hostFull)
		}
		if victim == nil {
			s.mu.Unlock()
			if hostFull {
				return nil, status.Errorf(codes.ResourceExhausted, "this client host has %d streams, its limit (--max-streams-per-host)", s.opts.MaxStreamsPerHost)
			}
			return nil, status.Errorf(codes.ResourceExhausted, "this server has %d streams, its limit (--max-streams)", s.opts.MaxStreams)
		}
		slog.Warn("flight: evicting a stream that acknowledged nothing, for a new one (the server or its host is full)",
			"consumer", victim.name, "host", victim.host, "open_for", time.Since(victim.joined).Round(time.Second), "new_consumer", t.Consumer)
		victim.evict()
		if err := s.awaitLeft(ctx, victim); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	s.members[t.Consumer] = nil // reserve the name
	if named {
		s.named++
	} else {
		s.conns[conn]++
		s.hosts[host]++
	}
	s.mu.Unlock()
	c, err := s.group.Join(ctx, t.Consumer, t)
	if err != nil {
		s.mu.Lock()
		s.freeName(t.Consumer, conn)
		s.mu.Unlock()
		if errors.Is(err, ErrTicket) {
			return nil, status.Errorf(codes.InvalidArgument, "join: %v", err)
		}
		return nil, status.Errorf(codes.Unavailable, "join: %v", err)
	}
	now := time.Now()
	m := &member{name: t.Consumer, named: named, conn: conn, host: host, joined: now, idleSince: now, evict: evict, id: c.Stats().Member, key: key, c: c, sent: map[uint64]int64{}, acked: make(chan struct{}, 1)}
	s.mu.Lock()
	s.members[t.Consumer] = m
	s.mu.Unlock()
	return m, nil
}

// hostOf is the host of a peer address (the address itself when it has
// no port).
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// evictable is the stream to evict for a newcomer from host: one open for
// at least SendTimeout that acknowledged no batch, of host when onlyHost,
// else of the host with the most streams; the oldest of those. nil when
// there is none. s.mu held.
func (s *Server) evictable(host string, onlyHost bool) *member {
	now := time.Now()
	var v *member
	for _, m := range s.members {
		if m == nil || m.named || m.acks.Load() > 0 || now.Sub(m.joined) < s.opts.SendTimeout || (onlyHost && m.host != host) {
			continue
		}
		if v == nil || s.hosts[m.host] > s.hosts[v.host] || (s.hosts[m.host] == s.hosts[v.host] && m.joined.Before(v.joined)) {
			v = m
		}
	}
	return v
}

// awaitLeft waits (up to ShutdownGrace) for m's stream to end and free its
// slot; s.mu held (released while waiting).
func (s *Server) awaitLeft(ctx context.Context, m *member) error {
	timer := time.NewTimer(s.opts.ShutdownGrace)
	defer timer.Stop()
	for s.members[m.name] == m {
		freed := s.freed
		s.mu.Unlock()
		select {
		case <-freed:
			s.mu.Lock()
		case <-timer.C:
			s.mu.Lock()
			return status.Errorf(codes.ResourceExhausted, "the server is full (--max-streams, --max-streams-per-host) and the evicted stream has not ended yet")
		case <-ctx.Done():
			s.mu.Lock()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
	return nil
}

// awaitFree waits up to RejoinWait for name's stream to end; s.mu held
// (released while waiting).
func (s *Server) awaitFree(ctx context.Context, name string) error {
	if _, busy := s.members[name]; !busy || s.opts.RejoinWait < 0 {
		return nil
	}
	timer := time.NewTimer(s.opts.RejoinWait)
	defer timer.Stop()
	for {
		if _, busy := s.members[name]; !busy {
			return nil
		}
		freed := s.freed
		s.mu.Unlock()
		select {
		case <-freed:
			s.mu.Lock()
		case <-timer.C:
			s.mu.Lock()
			return nil // refused below if still busy
		case <-ctx.Done():
			s.mu.Lock()
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// freeName deletes name's stream of connection conn, counts it out of
// the limits and wakes streams waiting for it; s.mu held.
func (s *Server) freeName(name, conn string) {
	delete(s.members, name)
	close(s.freed)
	s.freed = make(chan struct{})
	if s.auth.reserved(name) {
		s.named--
		return
	}
	if s.conns[conn]--; s.conns[conn] <= 0 {
		delete(s.conns, conn)
	}
	host := hostOf(conn)
	if s.hosts[host]--; s.hosts[host] <= 0 {
		delete(s.hosts, host)
	}
}

// leave releases m's work to the group and keeps its tallies.
func (s *Server) leave(m *member) {
	s.mu.Lock()
	s.freeName(m.name, m.conn)
	// The key keeps answering stats while the shards are released (a
	// client asking right after its stream ended is not refused).
	s.remember(m, m.c.Stats())
	s.mu.Unlock()
	// Release the member's shards even though the stream's context is
	// gone: its unacknowledged batches go to the others at once. Abort
	// cuts this short (the lease timeout releases them then).
	// A shutdown ends the store's retries (an outage): the lease timeout
	// releases the shards then.
	cctx, cancel := context.WithTimeout(s.aborting, 30*time.Second)
	defer cancel()
	if err := m.c.Close(store.WithRetryStop(cctx, s.closing.Done())); err != nil {
		slog.Warn("flight: releasing a consumer's shards", "consumer", m.name, "err", err)
	}
	m.acking.Lock() // acknowledgements in flight have their tallies in
	st := m.c.Stats()
	m.acking.Unlock()
	s.mu.Lock()
	s.remember(m, st)
	s.mu.Unlock()
	slog.Info("flight: consumer left", "consumer", m.name, "batches", st.Batches, "groups_acked", st.GroupsAcked)
}

// remember keeps a member's key and tallies after its stream ended, for
// stats. Callers hold s.mu.
func (s *Server) remember(m *member, st train.Stats) {
	if _, ok := s.left[m.name]; !ok && len(s.left) >= 4096 { // bounded: forget one at random
		for k := range s.left {
			delete(s.left, k)
			break
		}
	}
	s.left[m.name] = leftMember{key: m.key, stats: st}
}

var (
	errAckTimeout  = errors.New("no acknowledgement within the ack timeout")
	errSendTimeout = errors.New("the client did not take a batch within the send timeout")
	errShutdown    = errors.New("the server is shutting down")
	errEvicted     = errors.New("evicted: the server or this client host is full and this stream acknowledged no batch")
)

// DoGet streams batches to one member; see the package comment.
func (s *Server) DoGet(tkt *flight.Ticket, stream flight.FlightService_DoGetServer) error {
	var t Ticket
	if len(tkt.GetTicket()) > 0 {
		if err := json.Unmarshal(tkt.GetTicket(), &t); err != nil {
			return status.Errorf(codes.InvalidArgument, "ticket: %v", err)
		}
	}
	who := callerOf(stream.Context())
	switch {
	case t.Consumer == "" && who.role == roleNamed:
		t.Consumer = who.name
	case t.Consumer == "":
		t.Consumer = "flight-" + randomHex(4)
	}
	if err := train.CheckName("consumer", t.Consumer); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	if (who.role == roleNamed) != s.auth.reserved(t.Consumer) || who.role == roleNamed && t.Consumer != who.name {
		return status.Errorf(codes.PermissionDenied, "consumer %q: a consumer with its own token (--member-tokens-file) streams with that token, and that token streams under its name only", t.Consumer)
	}
	if err := checkVersion("ticket", t.PolicyVersion); err != nil {
		return err
	}
	if t.BatchGroups < 0 || t.BatchGroups > MaxTicketSteps || t.VersionsPerStep != nil && (*t.VersionsPerStep < 0 || *t.VersionsPerStep > MaxTicketSteps) {
		return status.Errorf(codes.InvalidArgument, "ticket: batch_groups and versions_per_step go from 0 to %d", MaxTicketSteps)
	}
	madeKey := ""
	switch {
	case t.Key == "":
		madeKey = randomHex(16)
		t.Key = madeKey
	case len(t.Key) < MinKeyLen:
		return status.Errorf(codes.InvalidArgument, "ticket: key shorter than %d characters", MinKeyLen)
	}
	ctx, cancel := context.WithCancelCause(stream.Context())
	defer cancel(nil)
	stop := context.AfterFunc(s.closing, func() { cancel(errShutdown) })
	defer stop()
	conn := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		conn = p.Addr.String()
	}
	m, err := s.join(ctx, t, keyDigest(t.Key), conn, func() { cancel(errEvicted) })
	if err != nil {
		return err
	}
	slog.Info("flight: consumer joined", "consumer", m.name, "member", m.id)
	defer s.leave(m)
	if s.opts.AckTimeout > 0 {
		go s.watch(ctx, m, func() { cancel(errAckTimeout) })
	}

	cs := &countingStream{DataStreamWriter: stream}
	var w *flight.Writer
	abandoned := false // a send still runs: the writer is not ours
	defer func() {
		if w != nil && !abandoned {
			w.Close()
		}
	}()
	for {
		if err := m.waitBytes(ctx, s.opts.MaxStreamBytes); err != nil {
			return endStatus(ctx, err)
		}
		d, err := m.c.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return endStatus(ctx, err)
		}
		bm := BatchMeta{BatchID: d.ID, Consumer: m.name, Member: m.id, Groups: d.Groups, Tokens: d.Tokens, Rows: d.Record.NumRows(), Oversized: d.Oversized, Merge: d.Merge, Key: madeKey, Step: d.StepPart}
		if d.Merge != nil {
			bm.Layout = "trajectories"
		}
		bm.AgesMs = agesMs(d.Ages(time.Now()))
		meta, _ := json.Marshal(bm)
		madeKey = ""
		if w == nil {
			w = flight.NewRecordWriter(cs, ipc.WithSchema(d.Record.Schema()))
		}
		n, err := s.send(ctx, w, cs, d.Record, meta)
		if err != nil {
			abandoned = errors.Is(err, errSendTimeout) || ctx.Err() != nil
			if errors.Is(err, errSendTimeout) {
				slog.Warn("flight: dropping a stream whose client does not read", "consumer", m.name, "send_timeout", s.opts.SendTimeout)
				return status.Errorf(codes.DeadlineExceeded, "%v (%s): stream dropped, its batches go back to the group", err, s.opts.SendTimeout)
			}
			return endStatus(ctx, err)
		}
		m.sentBatch(d.ID, n)
	}
}

// agesMs are ages in milliseconds (-1 stays -1); nil when all are -1.
func agesMs(ages []time.Duration) []int64 {
	var out []int64
	known := false
	for _, a := range ages {
		ms := int64(-1)
		if a >= 0 {
			ms, known = a.Milliseconds(), true
		}
		out = append(out, ms)
	}
	if !known {
		return nil
	}
	return out
}

// endStatus is the status a stream ends with when ctx ended (the cause
// says why) or err happened.
func endStatus(ctx context.Context, err error) error {
	if ctx.Err() == nil {
		return status.Errorf(codes.Internal, "next batch: %v", err)
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errAckTimeout):
		return status.Errorf(codes.DeadlineExceeded, "%v: stream dropped, its batches go back to the group", cause)
	case errors.Is(cause, errShutdown):
		return status.Error(codes.Unavailable, cause.Error())
	case errors.Is(cause, errEvicted):
		return status.Error(codes.ResourceExhausted, cause.Error())
	}
	return status.FromContextError(ctx.Err()).Err()
}

// send writes one batch (rec is released) and returns the bytes it took;
// a send not done within SendTimeout returns errSendTimeout and is left
// running: it ends when the stream does (gRPC cancels the stream's
// context once DoGet returns, which unblocks it).
func (s *Server) send(ctx context.Context, w *flight.Writer, cs *countingStream, rec arrow.RecordBatch, meta []byte) (int64, error) {
	done := make(chan error, 1)
	before := cs.n.Load()
	go func() {
		err := w.WriteWithAppMetadata(rec, meta)
		rec.Release()
		done <- err
	}()
	timer := time.NewTimer(s.opts.SendTimeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return cs.n.Load() - before, err
	case <-timer.C:
		return 0, errSendTimeout
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// watch drops m (calls drop) once it has had batches in flight and no
// acknowledgement for AckTimeout. It returns when ctx ends.
func (s *Server) watch(ctx context.Context, m *member, drop func()) {
	tick := min(s.opts.AckTimeout/4, time.Second)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			m.mu.Lock()
			idle := len(m.sent) > 0 && now.Sub(m.progress) > s.opts.AckTimeout
			m.mu.Unlock()
			if idle {
				slog.Warn("flight: dropping a stream without acknowledgements", "consumer", m.name, "ack_timeout", s.opts.AckTimeout)
				drop()
				return
			}
		}
	}
}

// sentBatch records batch id, n bytes, as in flight.
func (m *member) sentBatch(id uint64, n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.sent) == 0 {
		m.progress = time.Now()
		if !m.idleSince.IsZero() {
			m.idle += m.progress.Sub(m.idleSince)
			m.idleSince = time.Time{}
		}
	}
	m.sent[id] = n
	m.bytes += n
}

// ackedBatches takes ids out of flight.
func (m *member) ackedBatches(ids []uint64) {
	m.mu.Lock()
	for _, id := range ids {
		if n, ok := m.sent[id]; ok {
			delete(m.sent, id)
			m.bytes -= n
			m.acks.Add(1)
		}
	}
	m.progress = time.Now()
	if len(m.sent) == 0 && m.idleSince.IsZero() {
		m.idleSince = m.progress
	}
	m.mu.Unlock()
	select {
	case m.acked <- struct{}{}:
	default:
	}
}

// waitBytes blocks while m has at least max bytes in flight.
func (m *member) waitBytes(ctx context.Context, max int64) error {
	for {
		m.mu.Lock()
		over := len(m.sent) > 0 && m.bytes >= max
		m.mu.Unlock()
		if !over {
			return nil
		}
		select {
		case <-m.acked:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// countingStream counts the bytes sent through it.
type countingStream struct {
	flight.DataStreamWriter
	n atomic.Int64
}

func (c *countingStream) Send(d *flight.FlightData) error {
	c.n.Add(int64(len(d.GetDataHeader()) + len(d.GetDataBody()) + len(d.GetAppMetadata())))
	return c.DataStreamWriter.Send(d)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DoAction handles ack, set_policy_version and stats.
func (s *Server) DoAction(a *flight.Action, stream flight.FlightService_DoActionServer) error {
	reply := func(v any) error {
		body, err := json.Marshal(v)
		if err != nil {
			return status.Errorf(codes.Internal, "encode reply: %v", err)
		}
		return stream.Send(&flight.Result{Body: body})
	}
	switch a.GetType() {
	case "ack":
		var r ackRequest
		if err := json.Unmarshal(a.GetBody(), &r); err != nil {
			return status.Errorf(codes.InvalidArgument, "ack: %v", err)
		}
		if err := checkVersion("ack", r.PolicyVersion); err != nil {
			return err
		}
		m, err := s.stream(r.Consumer, r.Key)
		if err != nil {
			return err
		}
		if r.Member != "" && r.Member != m.id {
			return status.Errorf(codes.FailedPrecondition, "batches of %s: that stream of %q has ended (its unacknowledged batches went back to the group)", r.Member, r.Consumer)
		}
		if r.PolicyVersion != nil {
			m.c.SetPolicyVersion(*r.PolicyVersion)
		}
		var total train.AckResult
		m.acking.RLock()
		defer m.acking.RUnlock()
		defer m.ackedBatches(r.BatchIDs)
		for _, id := range r.BatchIDs {
			res, err := m.c.Ack(stream.Context(), id)
			total.Groups += res.Groups
			total.Lost += res.Lost
			if err != nil && !errors.Is(err, train.ErrLeaseLost) {
				return status.Errorf(codes.FailedPrecondition, "ack %d: %v", id, err)
			}
		}
		return reply(total)
	case "set_policy_version":
		var r policyRequest
		if err := json.Unmarshal(a.GetBody(), &r); err != nil {
			return status.Errorf(codes.InvalidArgument, "set_policy_version: %v", err)
		}
		if r.PolicyVersion == nil {
			return status.Error(codes.InvalidArgument, "set_policy_version: policy_version missing")
		}
		if err := checkVersion("set_policy_version", r.PolicyVersion); err != nil {
			return err
		}
		m, err := s.stream(r.Consumer, r.Key)
		if err != nil {
			return err
		}
		m.c.SetPolicyVersion(*r.PolicyVersion)
		return reply(map[string]int64{"policy_version": *r.PolicyVersion})
	case "publish_policy_version":
		var r policyRequest
		if err := json.Unmarshal(a.GetBody(), &r); err != nil {
			return status.Errorf(codes.InvalidArgument, "publish_policy_version: %v", err)
		}
		if r.PolicyVersion == nil {
			return status.Error(codes.InvalidArgument, "publish_policy_version: policy_version missing")
		}
		if err := checkVersion("publish_policy_version", r.PolicyVersion); err != nil {
			return err
		}
		m, err := s.stream(r.Consumer, r.Key)
		if err != nil {
			return err
		}
		if s.opts.Versions == nil {
			return status.Error(codes.Unimplemented, "publish_policy_version: this server records no published versions")
		}
		// The publisher trains with that version: its staleness too.
		m.c.SetPolicyVersion(*r.PolicyVersion)
		if err := s.opts.Versions.Publish(stream.Context(), *r.PolicyVersion, m.name); err != nil {
			return status.Errorf(codes.Unavailable, "publish_policy_version: %v", err)
		}
		return reply(map[string]int64{"policy_version": *r.PolicyVersion})
	case "stats":
		var r statsRequest
		if len(a.GetBody()) > 0 {
			if err := json.Unmarshal(a.GetBody(), &r); err != nil {
				return status.Errorf(codes.InvalidArgument, "stats: %v", err)
			}
		}
		st, err := s.stats(callRole(stream.Context()), r)
		if err != nil {
			return err
		}
		return reply(st)
	default:
		return status.Errorf(codes.Unimplemented, "unknown action %q (have ack, publish_policy_version, set_policy_version, stats)", a.GetType())
	}
}

// stats answers the stats action: a member's own tallies with its key
// (also after its stream ended), any member's or all with the admin
// token.
func (s *Server) stats(r role, req statsRequest) (any, error) {
	if req.Key != "" {
		if m, err := s.stream(req.Consumer, req.Key); err == nil {
			return m.c.Stats(), nil
		}
		d := keyDigest(req.Key)
		s.mu.Lock()
		l, ok := s.left[req.Consumer]
		s.mu.Unlock()
		if ok && subtle.ConstantTimeCompare(d[:], l.key[:]) == 1 {
			return l.stats, nil
		}
		return nil, status.Errorf(codes.PermissionDenied, "no stream of consumer %q with this key on this server", req.Consumer)
	}
	if r != roleAdmin {
		return nil, status.Error(codes.PermissionDenied, "stats without the stream's key need the admin token")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if req.Consumer != "" {
		if m := s.members[req.Consumer]; m != nil {
			return m.c.Stats(), nil
		}
		if l, ok := s.left[req.Consumer]; ok {
			return l.stats, nil
		}
		return nil, status.Errorf(codes.NotFound, "no consumer %q on this server", req.Consumer)
	}
	all := map[string]train.Stats{}
	for name, m := range s.members {
		if m != nil {
			all[name] = m.c.Stats()
		}
	}
	return all, nil
}

// ListActions names the actions.
func (s *Server) ListActions(_ *flight.Empty, stream flight.FlightService_ListActionsServer) error {
	acts := []*flight.ActionType{
		{Type: "ack", Description: `{"consumer", "key", "batch_ids": [...]}: acknowledge delivered batches`},
		{Type: "set_policy_version", Description: `{"consumer", "key", "policy_version"}: the trainer's policy version, for staleness`},
		{Type: "publish_policy_version", Description: `{"consumer", "key", "policy_version"}: the inference workers now serve this version (the trainer's too); the capture gateway follows it`},
		{Type: "stats", Description: `{"consumer", "key"}: the member's tallies (without a key: admin token)`},
	}
	sort.Slice(acts, func(i, j int) bool { return acts[i].Type < acts[j].Type })
	for _, a := range acts {
		if err := stream.Send(a); err != nil {
			return err
		}
	}
	return nil
}

// Serve runs a Flight server for srv on addr until ctx ends; ready, if
// set, receives the bound address. Without a token it refuses an address
// beyond loopback (ErrNeedToken). When ctx ends every stream ends and
// Serve waits for the connections to close, at most ShutdownGrace; then
// (or at srv.Abort) it closes them. It returns once every stream's work
// is released (or Abort cut that short).
func Serve(ctx context.Context, addr string, srv *Server, ready func(string)) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("flight: listen on %s: %w", addr, err)
	}
	if !srv.auth.enabled() && !loopback(lis.Addr()) {
		_ = lis.Close()
		return fmt.Errorf("flight: %s: %w (give a token, or listen on 127.0.0.1)", addr, ErrNeedToken)
	}
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(srv.auth.unary),
		grpc.ChainStreamInterceptor(srv.auth.stream),
		// Streams beyond MaxStreams are refused; this bounds what one
		// connection can ask at once (actions included).
		grpc.MaxConcurrentStreams(uint32(max(4*srv.opts.MaxStreams, 256))),
		grpc.ConnectionTimeout(10 * time.Second),
		// Find clients that are gone without a word.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.MaxRecvMsgSize(4 << 20),
		// Stop and GracefulStop return once every handler has: its
		// member's work is released by then.
		grpc.WaitForHandlers(true),
	}
	if srv.opts.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(srv.opts.TLS)))
	}
	gs := grpc.NewServer(opts...)
	flight.RegisterFlightServiceServer(gs, srv)
	if ready != nil {
		ready(lis.Addr().String())
	}
	conns := &connTracker{Listener: lis, open: map[net.Conn]struct{}{}}
	// stop ends every connection at once: gRPC's Stop waits for the
	// handshakes under way, which a client that never sends a byte
	// holds for the connection timeout; closing their connections ends
	// them.
	stop := func() {
		conns.closeAll()
		gs.Stop()
	}
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(conns) }()
	select {
	case err := <-errc:
		srv.Abort()
		stop()
		return fmt.Errorf("flight: serve: %w", err)
	case <-ctx.Done():
	case <-srv.aborted:
	}
	srv.close()
	graceful := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(graceful)
	}()
	grace := time.NewTimer(srv.opts.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-graceful:
	case <-grace.C:
		slog.Warn("flight: shutdown grace over; closing the connections still open", "grace", srv.opts.ShutdownGrace)
		stop()
	case <-srv.aborted:
		stop()
	}
	<-graceful
	<-errc
	return nil
}

// connTracker is a listener that keeps the connections it accepted until
// they are closed, so that a stop can close them all, those still in
// their handshake included.
type connTracker struct {
	net.Listener
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
}

func (l *connTracker) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		c.Close()
		return nil, net.ErrClosed
	}
	tc := &trackedConn{Conn: c, l: l}
	l.open[tc] = struct{}{}
	return tc, nil
}

// closeAll closes every connection accepted and not yet closed, and every
// one accepted from now on.
func (l *connTracker) closeAll() {
	l.mu.Lock()
	l.closed = true
	open := l.open
	l.open = map[net.Conn]struct{}{}
	l.mu.Unlock()
	for c := range open {
		c.(*trackedConn).Conn.Close()
	}
}

type trackedConn struct {
	net.Conn
	l    *connTracker
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.open, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}
