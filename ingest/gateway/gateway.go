package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Record is one wire-format record (a Step or Trajectory JSON line, no
// newline) and the key that keeps a group together (its task_id / group id):
// outputs partition by it.
type Record struct {
	Key  string
	Line []byte
}

// Output is where captured records go. Write returns once every record is
// durable (fsynced, acknowledged by Kafka with acks=all, or in the shard
// root's write-ahead log); an error means none of them may be counted as
// durable (the caller reports it to the agent). Write is called from many
// goroutines; implementations batch concurrent calls (group commit). Close
// flushes and releases.
type Output interface {
	Write(ctx context.Context, recs []Record) error
	Close() error
}

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	Upstreams       []string // worker base URLs (http://host:port, optionally with an API path such as /v1), as given by --upstream
	GroupSize       int      // default group size written on trajectory records when the session does not say (0: none written)
	AgentToken      string   // bearer token for /sessions/{id}/v1/... and /v1/... (empty: none; only allowed on loopback, checked by cmd)
	AdminToken      string   // bearer token for management routes, /records and /metrics, also taken on agent routes (empty: none)
	UpstreamKey     string   // sent to the workers as "Authorization: Bearer" (vLLM's --api-key); empty: none. The agents' tokens are never forwarded
	MaxRequestBytes int64    // request body bound (default 32 MiB)
	// MaxRequestBodiesBytes bounds the request bodies held at once, of
	// every request together (default 256 MiB, at least MaxRequestBytes):
	// a request whose body does not fit in what the others leave is
	// answered 503 with Retry-After. A body is held until its handler
	// returns (for an agent call, until its response ends).
	MaxRequestBodiesBytes int64
	// MaxRecordBytes is the longest record line the Output takes (default
	// 16 MiB; cmd sets the output's own bound). A step recorded larger is
	// written as its stub (metadata.gateway_reject = too_large: ingest
	// dead-letters it); a POST /records line or a finish larger is refused
	// (413). An Output that refuses a record all the same (RefusedError)
	// gets its stub.
	MaxRecordBytes   int
	MaxBufferedBytes int64 // bound on records waiting for the output (default 256 MiB); beyond it agents get 503 with a JSON error
	WeightVersion    int64 // initial weight (policy) version
	Log              *slog.Logger

	// MaxResponseBytes bounds an upstream body the gateway reads to record
	// (default 256 MiB): a larger non-streaming one is a 502; a stream is
	// stopped there (the generation cancelled) and recorded cut short
	// (metadata.cut_off = too_large).
	MaxResponseBytes int64
	// AbandonedCallTimeout is how long a recorded call's upstream request
	// runs on after its agent disconnected (default 10m): the call is
	// not cancelled with the agent, so that what the backend generates
	// is recorded (metadata.cut_off = client_disconnect), as rLLM's
	// gateway records a call whose client left. A stream the agent
	// leaves midway is stopped at once instead.
	AbandonedCallTimeout time.Duration
	// HealthInterval is the period of the workers' health checks (GET
	// {url}/health; default 5s, negative: off).
	HealthInterval time.Duration
	// MaxTracesPerSession, MaxTraces and MaxTraceBytes bound the traces
	// kept in memory for the traces API (defaults 4096, 200,000 and 1 GiB;
	// a trace holds its prompt and response ids as JSON, so bytes are the
	// bound that matters for long prompts). The byte bound also counts
	// what finished sessions keep. Beyond a bound finished sessions go
	// first, oldest first: their traces, then the session (a call to its
	// id is then refused as after DELETE); then open sessions' oldest
	// traces. The durable copy is the Output.
	MaxTracesPerSession int
	MaxTraces           int
	MaxTraceBytes       int64
	// MaxRetiredSessions bounds the ids of finished sessions remembered
	// after they leave the table (DELETE, eviction), so that a late call to
	// one is refused (409) rather than starting a trajectory nobody will
	// finish, and a repeat of its finish is answered as the first one was
	// (default 100,000; about 200 bytes each).
	MaxRetiredSessions int
	// FinishTimeout bounds how long finish and POST /records wait for their
	// records to be durable before answering 503 (default 60s).
	FinishTimeout time.Duration
	// Writers is the number of concurrent Output.Write calls (default 4);
	// BatchRecords the most records per call (default 1024).
	Writers      int
	BatchRecords int
	// WholePrompts turns off prompt deltas on the wire: by default a
	// step whose prompt begins with the session's previous step's prompt
	// and response is written with parent_step_id and prompt_delta_ids
	// (the new tokens only), cutting the O(turns²) prompt tokens of
	// multi-turn agents from the output; ingest stores the same either
	// way.
	WholePrompts bool
	// Forward lists the routes besides the recorded endpoints that agents'
	// calls are forwarded to upstream (nil: DefaultForward): "[METHOD
	// ]/v1/path", a trailing "/*" for every path below, or "*" for all.
	// Any other call is answered 404 without reaching a worker.
	Forward []string
	// Trainer, if set, is followed every TrainerPoll (default 250ms): the
	// newest version the trainer published becomes the weight version
	// (never lowered; /admin/weight_version still sets any), and Pacing
	// reads the consumer group's progress from it.
	Trainer     Trainer
	TrainerPoll time.Duration
	// Pacing holds new groups back while the trainer is behind (needs
	// Trainer); see Pacing.
	Pacing Pacing
	// Transport overrides the upstream transport (tests); the default is
	// tuned for many keep-alive connections to few hosts.
	Transport http.RoundTripper
}

func (c *Config) defaults() {
	if c.MaxRequestBytes <= 0 {
		c.MaxRequestBytes = 32 << 20
	}
	if c.MaxRequestBodiesBytes <= 0 {
		c.MaxRequestBodiesBytes = 256 << 20
	}
	c.MaxRequestBodiesBytes = max(c.MaxRequestBodiesBytes, c.MaxRequestBytes+1)
	if c.Forward == nil {
		c.Forward = DefaultForward
	}
	if c.MaxRecordBytes <= 0 {
		c.MaxRecordBytes = 16 << 20
	}
	if c.MaxBufferedBytes <= 0 {
		c.MaxBufferedBytes = 256 << 20
	}
	if c.MaxResponseBytes <= 0 {
		c.MaxResponseBytes = 256 << 20
	}
	if c.AbandonedCallTimeout <= 0 {
		c.AbandonedCallTimeout = 10 * time.Minute
	}
	if c.TrainerPoll <= 0 {
		c.TrainerPoll = 250 * time.Millisecond
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = 5 * time.Second
	}
	if c.MaxTracesPerSession <= 0 {
		c.MaxTracesPerSession = 4096
	}
	if c.MaxRetiredSessions <= 0 {
		c.MaxRetiredSessions = 100_000
	}
	if c.MaxTraceBytes <= 0 {
		c.MaxTraceBytes = 1 << 30
	}
	if c.MaxTraces <= 0 {
		c.MaxTraces = 200_000
	}
	if c.FinishTimeout <= 0 {
		c.FinishTimeout = 60 * time.Second
	}
	if c.Writers <= 0 {
		c.Writers = 4
	}
	if c.BatchRecords <= 0 {
		c.BatchRecords = 1024
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Server is the capture gateway. It is safe for concurrent use.
type Server struct {
	cfg      Config
	log      *slog.Logger
	out      Output
	queue    *queue
	pool     *pool
	sessions *sessions
	metrics  *metrics
	client   *http.Client
	forward  []route // Config.Forward
	weight   atomic.Int64
	pacer    *pacer
	// stopFollow ends the trainer's follower; followDone is closed when
	// it returned.
	stopFollow context.CancelFunc
	followDone chan struct{}
	bodies     bodies // Config.MaxRequestBodiesBytes

	closing  atomic.Bool
	inflight tracker // handlers running (agent calls, finish, /records)
	closeMu  sync.Mutex
	closed   bool
	closeErr error

	// beforeRecord, when set (tests), runs as a call's recording begins.
	beforeRecord func()
}

// New returns a Server over out with cfg's upstream workers; it starts the
// output writers and the health checks, which Close stops.
func New(cfg Config, out Output) (*Server, error) {
	if out == nil {
		return nil, errors.New("gateway: nil output")
	}
	if cfg.GroupSize < 0 || cfg.WeightVersion < 0 {
		return nil, fmt.Errorf("gateway: group size %d and weight version %d must be >= 0", cfg.GroupSize, cfg.WeightVersion)
	}
	cfg.defaults()
	forward, err := parseRoutes(cfg.Forward)
	if err != nil {
		return nil, err
	}
	tr := cfg.Transport
	if tr == nil {
		tr = newTransport()
	}
	s := &Server{
		cfg:      cfg,
		log:      cfg.Log,
		out:      out,
		metrics:  newMetrics(),
		client:   &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		sessions: newSessions(cfg.MaxTracesPerSession, cfg.MaxTraces, cfg.MaxTraceBytes, cfg.MaxRetiredSessions),
		forward:  forward,
	}
	if cfg.Pacing.on() && cfg.Trainer == nil {
		return nil, errors.New("gateway: pacing needs the trainer's state (Config.Trainer)")
	}
	if cfg.Pacing.GroupsPerStep < 0 || cfg.Pacing.MaxOffPolicy < 0 {
		return nil, fmt.Errorf("gateway: pacing groups per step %d and max off-policy %d must be >= 0", cfg.Pacing.GroupsPerStep, cfg.Pacing.MaxOffPolicy)
	}
	s.pacer = newPacer(cfg.Pacing)
	s.sessions.left = s.pacer.left
	s.weight.Store(cfg.WeightVersion)
	s.bodies.limit = cfg.MaxRequestBodiesBytes
	s.queue = newQueue(out, cfg.MaxBufferedBytes, cfg.Writers, cfg.BatchRecords, s.metrics, cfg.Log)
	s.pool = newPool(s.client, cfg.HealthInterval, cfg.UpstreamKey, cfg.Log)
	for i, u := range cfg.Upstreams {
		if _, err := s.pool.add(fmt.Sprint(i), u, "", "", 1); err != nil {
			s.queue.stop()
			s.pool.stop()
			return nil, fmt.Errorf("gateway: upstream %d: %w", i, err)
		}
	}
	s.followDone = make(chan struct{})
	if cfg.Trainer != nil {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopFollow = cancel
		go func() {
			defer close(s.followDone)
			s.follow(ctx, cfg.Trainer, cfg.TrainerPoll)
		}()
	} else {
		close(s.followDone)
	}
	return s, nil
}

// newTransport is tuned for latency: keep-alive connections to few hosts,
// many idle connections per host, no compression negotiated on our side
// (bodies are parsed), HTTP/1.1 (what vLLM and SGLang serve).
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          8192,
		MaxIdleConnsPerHost:   4096,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // generations can take minutes before the first byte
		ExpectContinueTimeout: 0,
		DisableCompression:    true,
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        64 << 10,
	}
}

// WeightVersion is the weight version stamped on calls dispatched now.
func (s *Server) WeightVersion() int64 { return s.weight.Load() }

// enter counts a request in flight unless the gateway is closing (the
// caller then calls s.inflight.done). Counted first and checked after:
// Close sets closing before it waits for the count, so a request either
// sees closing or is waited for, never slips in between.
func (s *Server) enter() bool {
	s.inflight.add(1)
	if s.closing.Load() {
		s.inflight.done(1)
		return false
	}
	return true
}

// Close stops taking calls (new ones get 503), waits for the calls in
// flight, waits until every queued record is durable, then closes the
// Output. When ctx ends first it stops the writers and returns an error
// naming what was not written. Safe to call twice.
func (s *Server) Close(ctx context.Context) error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return s.closeErr
	}
	s.closed = true
	s.closing.Store(true)
	s.pacer.stop()
	s.pool.stop()
	if s.stopFollow != nil {
		s.stopFollow()
	}
	<-s.followDone
	var errs []error
	if err := s.inflight.wait(ctx); err != nil {
		errs = append(errs, fmt.Errorf("gateway close: calls still in flight: %w", err))
	}
	if err := s.queue.drain(ctx); err != nil {
		errs = append(errs, err)
	}
	s.queue.stop()
	if err := s.out.Close(); err != nil {
		errs = append(errs, fmt.Errorf("gateway close: output: %w", err))
	}
	if t, ok := s.client.Transport.(*http.Transport); ok {
		t.CloseIdleConnections()
	}
	s.closeErr = errors.Join(errs...)
	return s.closeErr
}
