package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors/gatewayout"
	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest/gateway"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/loop"
)

// gatewayOpts are the gateway's own flags; the in-process pipeline's come
// from ingest's definitions (pipelineFlags).
type gatewayOpts struct {
	listen, upstream, to, ready string
	weightVersion               int64
	agentTokenFile, adminFile   string
	upstreamKeyEnv              string
	maxRequest, maxBuffered     string
	maxRequestBodies            string
	maxTraceBytes               string
	walDir, walFileBytes        string
	kafkaPartitions             int
	shutdownTimeout             time.Duration
	wireDeltas                  bool
	wholePrompts                bool // deprecated: !wireDeltas
	forward                     []string
	conn                        connFlags
	// The trainer's side of the loop: published versions and pacing.
	follow        bool
	followStore   string
	group         string
	trainerPoll   time.Duration
	groupsPerStep int64
	maxStaleness  int64
	paceWait      time.Duration
}

// pipelineFlags are ingest's flags that shape the in-process pipeline of
// a shard-root --to: the gateway borrows ingest's own definitions, so the
// defaults and help stay in one place.
var pipelineFlags = slices.Sorted(maps.Keys(borrowed(&ingestOpts{})))

// borrowed maps each borrowed flag to where ingestOptsFrom reads it back.
func borrowed(o *ingestOpts) map[string]any {
	return map[string]any{
		"group-size": &o.groupSize, "min-group-size": &o.minGroupSize, "group-timeout": &o.groupTimeout,
		"max-open-groups": &o.maxOpenGroups, "max-partitions": &o.maxPartitions, "shard-size": &o.shardSize,
		"flush-interval": &o.flushInterval, "estimator": &o.estimator, "compat": &o.compat, "no-std": &o.noStd,
		"kl-coef": &o.klCoef, "kl-clip": &o.klClip, "kl-discount": &o.klDisc, "filter": &o.filter,
		"decoders": &o.decoders, "encoders": &o.encoders, "max-record-bytes": &o.maxRecord,
		"zstd-level": &o.zstdLevel, "compact": &o.compact, "log-format": &o.logFormat, "full-prompts": &o.fullPrompts,
	}
}

func newGatewayCmd(soft context.Context) *cobra.Command {
	var o gatewayOpts
	ingestFlags := newIngestCmd(soft).Flags()
	cmd := &cobra.Command{
		Use:   "gateway --upstream URL[,URL...] --to URL",
		Short: "OpenAI-compatible proxy that records every agent call as a Step",
		Long: `gateway speaks rLLM's model-gateway API: agents use
http://ADDR/sessions/{session_id}/v1 as their OpenAI base URL, and every call
is forwarded to an --upstream worker (vLLM, SGLang) and recorded as a Step
record stamped with the weight version in force at dispatch. POST
/sessions/{id}/finish with the reward emits the Trajectory record and answers
once every record of the session is durable. POST /records takes
wire-format lines with the same durability.

--to is where records go:
  kafka://host:port/topic   produced keyed by group (acks=all), for ingest --from kafka://
  PATH.jsonl                a local record log (fsynced in groups), for ingest --from PATH.jsonl
  PATH or s3://bucket/pfx   a shard root: the pipeline runs in-process (the embedded default);
                            records first go to a write-ahead log (<root>/_gateway/, or
                            --wal-dir for s3://), then to shards as ingest commits them

--group-size, when given, is also written on the trajectory records of
sessions that name no group size; the other pipeline flags (estimator,
shard size, flush interval...) are ingest's and apply to a shard-root --to.

The loop: the gateway follows the trainer through its store (--to when it
is a shard root, else --trainer-store): calls are stamped with the newest
policy version the trainer published (rllm_pipe's publish_version), within
--trainer-poll. With --groups-per-step and --max-staleness it paces
rollouts: a new group's first call waits while the groups committed and
not consumed plus those in flight here fill (max-staleness + 1) x
groups-per-step, then gets 429 with Retry-After (--pace-wait); sessions
of admitted groups are never held.

Security: beyond loopback the gateway refuses to start without both tokens
(--agent-token-file / RLLM_PIPE_GATEWAY_AGENT_TOKEN for the agent routes and
POST /records, which take the admin token too, --admin-token-file /
RLLM_PIPE_GATEWAY_ADMIN_TOKEN for management and /metrics), sent as
"Authorization: Bearer" or "x-api-key". Workers started with an API key get it from
--upstream-key-env NAME (an environment variable, never a flag value). The first signal stops taking calls, finishes those in flight,
flushes the output and stops the pipeline (groups still open stay in the
write-ahead log and resume on the next start); a second aborts.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ing, err := ingestOptsFrom(ingestFlags)
			if err != nil {
				return err
			}
			ing.conn = o.conn
			return runGateway(cmd.Context(), soft, o, ing, cmd.Flags().Changed("group-size"))
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:8816", "address to serve on (host:port; port 0 picks one); beyond loopback only with both tokens")
	f.StringVar(&o.upstream, "upstream", "", "inference workers' base URLs, comma-separated (http://host:port)")
	f.StringVar(&o.to, "to", "", "where records go: kafka://host:port/topic, a record log PATH.jsonl, or a shard root (a path or s3://bucket/prefix)")
	f.StringVar(&o.ready, "ready-file", "", "write the bound address to this file once listening")
	f.BoolVar(&o.wireDeltas, "wire-deltas", true, "write a step that extends the one before as parent_step_id + prompt_delta_ids (false: every step's whole prompt_ids, for readers of the records other than rllm-pipe ingest)")
	f.BoolVar(&o.wholePrompts, "whole-prompts", false, "deprecated: use --wire-deltas=false")
	_ = f.MarkDeprecated("whole-prompts", "use --wire-deltas=false")
	f.StringArrayVar(&o.forward, "forward", nil, "a route besides the recorded endpoints forwarded to the workers, \"[METHOD ]/v1/path\" (a trailing /* for every path below; \"*\" for all); repeatable; default: GET /v1/models, GET /v1/models/*, POST /v1/embeddings. Any other call is answered 404: a worker's admin routes (vLLM's /v1/load_lora_adapter) are not the agents'")
	f.Int64Var(&o.weightVersion, "policy-version", 0, "initial policy (weight) version stamped on calls (POST /admin/weight_version, or the trainer's publish_version, changes it)")
	cli.Rename(f, "weight-version", "policy-version")
	f.StringVar(&o.agentTokenFile, "agent-token-file", "", "file holding the bearer token of the agent routes (default: $RLLM_PIPE_GATEWAY_AGENT_TOKEN; none: loopback only)")
	f.StringVar(&o.adminFile, "admin-token-file", "", "file holding the bearer token of the management routes, /records and /metrics (default: $RLLM_PIPE_GATEWAY_ADMIN_TOKEN; none: loopback only)")
	f.StringVar(&o.upstreamKeyEnv, "upstream-key-env", "", "name of an environment variable holding the workers' API key (vLLM's --api-key), sent upstream as \"Authorization: Bearer\"; the agents' tokens are never forwarded")
	f.StringVar(&o.maxRequest, "max-request-bytes", "32MiB", "largest request body taken")
	f.StringVar(&o.maxRequestBodies, "max-request-bodies-bytes", "256MiB", "request bodies held at once, of all requests together (at least --max-request-bytes); beyond it a request gets 503 and Retry-After")
	f.StringVar(&o.maxBuffered, "max-buffered-bytes", "256MiB", "records waiting for the output at most; beyond it agents get 503 with a JSON error")
	f.StringVar(&o.maxTraceBytes, "max-trace-bytes", "1GiB", "in-memory traces (GET /sessions/{id}/traces) and finished sessions at most; beyond it finished sessions go first, oldest first (the output keeps every record)")
	f.StringVar(&o.walDir, "wal-dir", "", "write-ahead log folder of an s3:// --to (default: under the user cache folder, named after the --to)")
	f.StringVar(&o.walFileBytes, "wal-file-bytes", "64MiB", "rotate the write-ahead log's files at about this size (settled files are removed)")
	f.IntVar(&o.kafkaPartitions, "kafka-partitions", 8, "partitions of a kafka:// --to topic when the gateway creates it")
	f.DurationVar(&o.shutdownTimeout, "shutdown-grace", time.Minute, "on the first signal, give calls in flight and the output this long to finish")
	cli.Rename(f, "shutdown-timeout", "shutdown-grace")
	f.BoolVar(&o.follow, "follow-trainer", true, "follow the trainer through its store: stamp calls with the newest policy version it published (never lowered) and read its progress for pacing")
	f.StringVar(&o.followStore, "trainer-store", "", "the shard root the trainer consumes and publishes its versions in (default: --to when it is a shard root; needed with a kafka:// or record-log --to)")
	f.StringVar(&o.group, "consumer-group", "default", "the trainer's consumer group (as serve's --consumer-group)")
	f.DurationVar(&o.trainerPoll, "trainer-poll", 250*time.Millisecond, "read the trainer's published version and progress this often")
	f.Int64Var(&o.groupsPerStep, "groups-per-step", 0, "pacing: the trainer's groups per optimizer step; with --max-staleness, a new group's first call waits while the pipe holds (max-staleness + 1) x this many groups (0: no pacing)")
	f.Int64Var(&o.maxStaleness, "max-staleness", -1, "pacing: how many versions behind the trainer a group may be trained (as serve's --max-staleness; needed with --groups-per-step)")
	f.DurationVar(&o.paceWait, "pace-wait", 30*time.Second, "pacing: how long a new group's first call waits for room before 429 and Retry-After")
	o.conn.register(f)
	o.conn.registerKafka(f)
	for _, name := range pipelineFlags {
		f.AddFlag(ingestFlags.Lookup(name))
	}
	// The flags are this command's own copies: the gateway says what the
	// bound means for it.
	f.Lookup("max-record-bytes").Usage = "longest record line written to a record log or a shard root's write-ahead log (a kafka:// topic's bound is its message size): a larger POST /records line or finish is refused (413), a larger recorded step is written as its stub, which ingest dead-letters"
	return cmd
}

// ingestOptsFrom reads back the pipeline flags borrowed from ingest.
func ingestOptsFrom(fs *pflag.FlagSet) (ingestOpts, error) {
	var o ingestOpts
	var errs []error
	for name, p := range borrowed(&o) {
		var err error
		switch p := p.(type) {
		case *string:
			*p, err = fs.GetString(name)
		case *int:
			*p, err = fs.GetInt(name)
		case *float64:
			*p, err = fs.GetFloat64(name)
		case *time.Duration:
			*p, err = fs.GetDuration(name)
		case *bool:
			*p, err = fs.GetBool(name)
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return o, fmt.Errorf("gateway: ingest's flags changed: %w", err)
	}
	return o, nil
}

func runGateway(ctx, soft context.Context, o gatewayOpts, ing ingestOpts, groupSizeSet bool) error {
	cfg, err := o.config(ing, groupSizeSet)
	if err != nil {
		return err
	}
	if o.to == "" {
		return usageErrorf("--to is required")
	}
	log, err := cli.Logger(os.Stderr, ing.logFormat, globals.Quiet)
	if err != nil {
		return err
	}
	cfg.Log = log

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return usageErrorf("--listen: %v", err)
	}
	addr := ln.Addr().String()
	if !loopbackAddr(addr) && (cfg.AgentToken == "" || cfg.AdminToken == "") {
		ln.Close()
		return usageErrorf("--listen %s is beyond loopback: the gateway refuses it without both tokens (--agent-token-file or RLLM_PIPE_GATEWAY_AGENT_TOKEN, --admin-token-file or RLLM_PIPE_GATEWAY_ADMIN_TOKEN), or listen on 127.0.0.1", o.listen)
	}
	if !loopbackAddr(addr) {
		if err := shortToken(o.listen, tokenFlag{"agent-token-file", "RLLM_PIPE_GATEWAY_AGENT_TOKEN", cfg.AgentToken}, tokenFlag{"admin-token-file", "RLLM_PIPE_GATEWAY_ADMIN_TOKEN", cfg.AdminToken}); err != nil {
			ln.Close()
			return err
		}
		// An agent token equal to the admin's gives every agent the
		// management routes.
		if cfg.AgentToken == cfg.AdminToken {
			ln.Close()
			return usageErrorf("--listen %s is beyond loopback: the agent token equals the admin token (agents would manage sessions, weight versions and workers); give them different tokens", o.listen)
		}
	}
	out, err := openGatewayOutput(ctx, soft, o, ing, log)
	if err != nil {
		ln.Close()
		return err
	}
	cfg.MaxRecordBytes = out.MaxRecordBytes()
	followed, err := o.trainer(ctx, cfg.Pacing.GroupsPerStep > 0)
	if err != nil {
		ln.Close()
		return errors.Join(err, out.Close())
	}
	if followed != nil {
		cfg.Trainer = followed
		defer followed.r.Close()
		log.Info("gateway: following the trainer", "store", followed.r.Name(), "consumer_group", o.group, "pacing", cfg.Pacing.GroupsPerStep > 0)
	}
	srv, err := gateway.New(cfg, out)
	if err != nil {
		ln.Close()
		return errors.Join(err, out.Close())
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: idleTimeout, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info("gateway: listening", "addr", addr, "upstreams", len(cfg.Upstreams), "to", out.String(),
		"auth", cfg.AgentToken != "" || cfg.AdminToken != "")
	if o.ready != "" {
		if err := writeReady(o.ready, addr); err != nil {
			log.Warn("gateway: ready file", "err", err)
		}
	}

	var runErr error
	select {
	case <-soft.Done():
	case err := <-served:
		runErr = fmt.Errorf("gateway: serve: %w", err)
	case <-out.Failed():
		runErr = fmt.Errorf("gateway: output: %w", out.Err())
	}
	log.Info("gateway: stopping: finishing calls in flight, flushing the output")
	// The command's ctx ends at a second signal: everything stops at once.
	stopCtx, cancel := context.WithTimeout(ctx, o.shutdownTimeout)
	defer cancel()
	// Close the listener and idle connections first: in-flight handlers
	// run on; the server's Close waits for them and flushes the output
	// (the in-process pipeline stops at once at a second signal: its
	// context is ctx).
	shut := make(chan struct{})
	go func() { defer close(shut); _ = hs.Shutdown(stopCtx) }()
	closeErr := srv.Close(stopCtx)
	_ = hs.Close()
	<-shut
	if err := errors.Join(runErr, closeErr); err != nil {
		return err
	}
	log.Info("gateway: stopped cleanly", "summary", out.Summary())
	return nil
}

// config validates the flags into the core's configuration.
func (o *gatewayOpts) config(ing ingestOpts, groupSizeSet bool) (gateway.Config, error) {
	var c gateway.Config
	for u := range strings.SplitSeq(o.upstream, ",") {
		if u = strings.TrimSpace(u); u != "" {
			c.Upstreams = append(c.Upstreams, u)
		}
	}
	if len(c.Upstreams) == 0 {
		return c, usageErrorf("--upstream is required (the inference workers' base URLs)")
	}
	var err error
	if c.MaxRequestBytes, err = bytesIn("max-request-bytes", o.maxRequest, 1<<10, 1<<30); err != nil {
		return c, err
	}
	if c.MaxRequestBodiesBytes, err = bytesIn("max-request-bodies-bytes", o.maxRequestBodies, 1<<20, 64<<30); err != nil {
		return c, err
	}
	if c.MaxBufferedBytes, err = bytesIn("max-buffered-bytes", o.maxBuffered, 1<<20, 64<<30); err != nil {
		return c, err
	}
	if c.MaxTraceBytes, err = bytesIn("max-trace-bytes", o.maxTraceBytes, 1<<20, 1<<40); err != nil {
		return c, err
	}
	if err := firstErr(durationIn("shutdown-timeout", o.shutdownTimeout, time.Millisecond, 24*time.Hour),
		intIn("kafka-partitions", o.kafkaPartitions, 1, 1<<14)); err != nil {
		return c, err
	}
	if err := int64In("policy-version", o.weightVersion, 0, schemas.MaxPolicyVersion); err != nil {
		return c, err
	}
	c.WeightVersion = o.weightVersion
	c.WholePrompts = o.wholePrompts || !o.wireDeltas
	if err := firstErr(durationIn("trainer-poll", o.trainerPoll, time.Millisecond, time.Hour), durationIn("pace-wait", o.paceWait, 0, time.Hour),
		int64In("groups-per-step", o.groupsPerStep, 0, 1<<30)); err != nil {
		return c, err
	}
	if err := train.CheckName("--consumer-group", o.group); err != nil {
		return c, usageErrorf("%v", err)
	}
	if o.groupsPerStep > 0 {
		if o.maxStaleness < 0 || o.maxStaleness > 1<<20 {
			return c, usageErrorf("--groups-per-step needs --max-staleness in [0, 1048576] (got %d): the bound pacing keeps", o.maxStaleness)
		}
		if !o.follow {
			return c, usageErrorf("--groups-per-step paces by the trainer's progress: it needs --follow-trainer")
		}
		c.Pacing = gateway.Pacing{MaxOffPolicy: o.maxStaleness, GroupsPerStep: o.groupsPerStep, Wait: o.paceWait}
	}
	c.TrainerPoll = o.trainerPoll
	c.Forward = o.forward
	if err := gateway.ValidateForward(c.Forward); err != nil {
		return c, usageErrorf("--forward: %v", err)
	}
	if groupSizeSet {
		c.GroupSize = ing.groupSize
	}
	if c.AgentToken, err = token("agent-token-file", o.agentTokenFile, "RLLM_PIPE_GATEWAY_AGENT_TOKEN"); err != nil {
		return c, err
	}
	if c.AdminToken, err = token("admin-token-file", o.adminFile, "RLLM_PIPE_GATEWAY_ADMIN_TOKEN"); err != nil {
		return c, err
	}
	if o.upstreamKeyEnv != "" {
		// From the environment only: a flag's value shows in ps.
		if c.UpstreamKey = strings.TrimSpace(os.Getenv(o.upstreamKeyEnv)); c.UpstreamKey == "" {
			return c, usageErrorf("--upstream-key-env: $%s is empty or unset", o.upstreamKeyEnv)
		}
	}
	return c, nil
}

// writeReady writes the bound address whole (temp file, rename), so that
// a reader never sees half of it; nothing without a path.
func writeReady(path, addr string) error {
	if path == "" {
		return nil
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// storeTrainer is the trainer's side of the loop read from its store.
type storeTrainer struct {
	r store.Reader
	f *loop.Follower
}

func (t storeTrainer) State(ctx context.Context) (gateway.TrainerState, error) {
	s, err := t.f.State(ctx)
	st := gateway.TrainerState{Version: -1, Trained: s.Trained, Committed: s.Committed, Consumed: s.Consumed, CommittedKeys: s.CommittedKeys}
	if s.HasServed {
		st.Version = s.Served.PolicyVersion
	}
	return st, err
}

// trainer opens the store the gateway follows (nil when it follows none);
// pacing needs one.
func (o *gatewayOpts) trainer(ctx context.Context, pacing bool) (*storeTrainer, error) {
	from := o.followStore
	if from == "" && gatewayout.KindOf(o.to) == gatewayout.KindShardRoot {
		from = o.to
	}
	if !o.follow || from == "" {
		if pacing {
			return nil, usageErrorf("--groups-per-step paces by the trainer's progress in its store: give --trainer-store (the shard root the trainer consumes)")
		}
		return nil, nil
	}
	r, err := openShardStore(ctx, from, o.conn)
	if err != nil {
		return nil, err
	}
	f, err := loop.NewFollower(r, o.group)
	if err != nil {
		r.Close()
		return nil, err
	}
	return &storeTrainer{r: r, f: f}, nil
}

// openGatewayOutput opens --to; a shard root gets ingest's pipeline,
// configured by ingest's flags.
func openGatewayOutput(ctx, soft context.Context, o gatewayOpts, ing ingestOpts, log *slog.Logger) (gatewayout.Output, error) {
	opts := gatewayout.Options{Kafka: o.conn.kafka, KafkaPartitions: o.kafkaPartitions, RetryFor: o.conn.RetryFor,
		Stop: soft.Done(), Root: ing.conn.options(), WALDir: o.walDir}
	maxRecord, err := bytesIn("max-record-bytes", ing.maxRecord, 1<<10, 1<<30)
	if err != nil {
		return nil, err
	}
	opts.MaxRecordBytes = int(maxRecord)
	if gatewayout.KindOf(o.to) == gatewayout.KindShardRoot {
		ing.to = o.to
		p, err := newPlan(ing)
		if err != nil {
			return nil, err
		}
		p.cfg.Log = log.With("run", p.runID)
		opts.Pipeline, opts.RunID = p.cfg, p.runID
		if opts.WALFileBytes, err = bytesIn("wal-file-bytes", o.walFileBytes, recordlog.HeaderSize+(1<<10), 64<<30); err != nil {
			return nil, err
		}
	}
	out, err := gatewayout.Open(ctx, o.to, opts)
	if errors.Is(err, gatewayout.ErrUsage) {
		return nil, usageErrorf("%v", strings.TrimPrefix(err.Error(), gatewayout.ErrUsage.Error()+": "))
	}
	return out, err
}
