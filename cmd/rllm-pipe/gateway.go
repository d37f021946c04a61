package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest/gateway"
	"github.com/rllm-pipe/rllm-pipe/transform/pipeline"
)

// gatewayOpts are the gateway's own flags; the in-process pipeline's come
// from ingest's definitions (pipelineFlags).
type gatewayOpts struct {
	listen, upstream, to, ready string
	weightVersion               int64
	agentTokenFile, adminFile   string
	upstreamKeyEnv              string
	maxRequest, maxBuffered     string
	maxTraceBytes               string
	walDir, walFileBytes        string
	kafkaPartitions             int
	shutdownTimeout             time.Duration
	wholePrompts                bool
	conn                        connFlags
}

// pipelineFlags are ingest's flags that shape the in-process pipeline of
// a shard-root --to: the gateway borrows ingest's own definitions, so the
// defaults and help stay in one place.
var pipelineFlags = []string{
	"group-size", "min-group-size", "group-timeout", "max-open-groups", "max-partitions",
	"shard-size", "flush-interval", "estimator", "compat", "no-std", "kl-coef", "kl-clip", "kl-discount",
	"filter", "decoders", "encoders", "max-record-bytes", "zstd-level", "compact", "log-format", "full-prompts",
}

func newGatewayCmd(soft context.Context) *cobra.Command {
	var o gatewayOpts
	ingestFlags := newIngestCmd(soft).Flags()
	cmd := &cobra.Command{
		Use:   "gateway --upstream URL[,URL...] --to URL",
		Short: "Capture gateway: an OpenAI-compatible proxy in front of inference workers that records every call as Step records",
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

Security: beyond loopback the gateway refuses to start without both tokens
(--agent-token-file / RLLM_GATEWAY_AGENT_TOKEN for the agent routes, which
take the admin token too, --admin-token-file / RLLM_GATEWAY_ADMIN_TOKEN for
management, /records and /metrics), sent as "Authorization: Bearer" or
"x-api-key". Workers started with an API key get it from
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
	f.StringVar(&o.listen, "listen", "127.0.0.1:9090", "address to serve on (host:port; port 0 picks one); beyond loopback only with both tokens")
	f.StringVar(&o.upstream, "upstream", "", "inference workers' base URLs, comma-separated (http://host:port)")
	f.StringVar(&o.to, "to", "", "where records go: kafka://host:port/topic, a record log PATH.jsonl, or a shard root (a path or s3://bucket/prefix)")
	f.StringVar(&o.ready, "ready-file", "", "write the bound address to this file once listening")
	f.BoolVar(&o.wholePrompts, "whole-prompts", false, "write every step's whole prompt_ids, never parent_step_id + prompt_delta_ids (for readers of the records other than rllm-pipe ingest)")
	f.Int64Var(&o.weightVersion, "weight-version", 0, "initial weight (policy) version stamped on calls (POST /admin/weight_version changes it)")
	f.StringVar(&o.agentTokenFile, "agent-token-file", "", "file holding the bearer token of the agent routes (default: $RLLM_GATEWAY_AGENT_TOKEN; none: loopback only)")
	f.StringVar(&o.adminFile, "admin-token-file", "", "file holding the bearer token of the management routes, /records and /metrics (default: $RLLM_GATEWAY_ADMIN_TOKEN; none: loopback only)")
	f.StringVar(&o.upstreamKeyEnv, "upstream-key-env", "", "name of an environment variable holding the workers' API key (vLLM's --api-key), sent upstream as \"Authorization: Bearer\"; the agents' tokens are never forwarded")
	f.StringVar(&o.maxRequest, "max-request-bytes", "32MiB", "largest request body taken")
	f.StringVar(&o.maxBuffered, "max-buffered-bytes", "256MiB", "records waiting for the output at most; beyond it agents get 503 with a JSON error")
	f.StringVar(&o.maxTraceBytes, "max-trace-bytes", "1GiB", "in-memory traces (GET /sessions/{id}/traces) and finished sessions at most; beyond it finished sessions go first, oldest first (the output keeps every record)")
	f.StringVar(&o.walDir, "wal-dir", "", "write-ahead log folder of an s3:// --to (default: under the user cache folder, named after the --to)")
	f.StringVar(&o.walFileBytes, "wal-file-bytes", "64MiB", "rotate the write-ahead log's files at about this size (settled files are removed)")
	f.IntVar(&o.kafkaPartitions, "kafka-partitions", 8, "partitions of a kafka:// --to topic when the gateway creates it")
	f.DurationVar(&o.shutdownTimeout, "shutdown-timeout", time.Minute, "on the first signal, give calls in flight and the output this long to finish")
	o.conn.register(f)
	for _, name := range pipelineFlags {
		f.AddFlag(ingestFlags.Lookup(name))
	}
	return cmd
}

// ingestOptsFrom reads back the pipeline flags borrowed from ingest.
func ingestOptsFrom(fs *pflag.FlagSet) (ingestOpts, error) {
	var o ingestOpts
	var errs []error
	str := func(name string, p *string) {
		v, err := fs.GetString(name)
		errs, *p = append(errs, err), v
	}
	num := func(name string, p *int) {
		v, err := fs.GetInt(name)
		errs, *p = append(errs, err), v
	}
	flt := func(name string, p *float64) {
		v, err := fs.GetFloat64(name)
		errs, *p = append(errs, err), v
	}
	dur := func(name string, p *time.Duration) {
		v, err := fs.GetDuration(name)
		errs, *p = append(errs, err), v
	}
	boo := func(name string, p *bool) {
		v, err := fs.GetBool(name)
		errs, *p = append(errs, err), v
	}
	num("group-size", &o.groupSize)
	num("min-group-size", &o.minGroupSize)
	dur("group-timeout", &o.groupTimeout)
	num("max-open-groups", &o.maxOpenGroups)
	num("max-partitions", &o.maxPartitions)
	str("shard-size", &o.shardSize)
	dur("flush-interval", &o.flushInterval)
	str("estimator", &o.estimator)
	str("compat", &o.compat)
	boo("no-std", &o.noStd)
	flt("kl-coef", &o.klCoef)
	flt("kl-clip", &o.klClip)
	flt("kl-discount", &o.klDisc)
	str("filter", &o.filter)
	num("decoders", &o.decoders)
	num("encoders", &o.encoders)
	str("max-record-bytes", &o.maxRecord)
	num("zstd-level", &o.zstdLevel)
	boo("compact", &o.compact)
	str("log-format", &o.logFormat)
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
	var h slog.Handler = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
	if ing.logFormat == "json" {
		h = slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	log := slog.New(h)
	cfg.Log = log

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return usageErrorf("--listen: %v", err)
	}
	addr := ln.Addr().String()
	if !loopbackAddr(addr) && (cfg.AgentToken == "" || cfg.AdminToken == "") {
		ln.Close()
		return usageErrorf("--listen %s is beyond loopback: the gateway refuses it without both tokens (--agent-token-file or RLLM_GATEWAY_AGENT_TOKEN, --admin-token-file or RLLM_GATEWAY_ADMIN_TOKEN), or listen on 127.0.0.1", o.listen)
	}
	out, err := openGatewayOutput(ctx, soft, o, ing, log)
	if err != nil {
		ln.Close()
		return err
	}
	srv, err := gateway.New(cfg, out)
	if err != nil {
		ln.Close()
		return errors.Join(err, out.Close())
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(h, slog.LevelWarn)}
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
	if o.weightVersion < 0 {
		return c, usageErrorf("--weight-version: %d, want >= 0", o.weightVersion)
	}
	c.WeightVersion = o.weightVersion
	c.WholePrompts = o.wholePrompts
	if groupSizeSet {
		c.GroupSize = ing.groupSize
	}
	if c.AgentToken, err = token("agent-token-file", o.agentTokenFile, "RLLM_GATEWAY_AGENT_TOKEN"); err != nil {
		return c, err
	}
	if c.AdminToken, err = token("admin-token-file", o.adminFile, "RLLM_GATEWAY_ADMIN_TOKEN"); err != nil {
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
// a reader never sees half of it.
func writeReady(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// gatewayOutput is a gateway.Output with what the command needs to stop
// it and report on it.
type gatewayOutput interface {
	gateway.Output
	String() string
	// Failed is closed when the output can no longer take records (the
	// in-process pipeline failed); Err says why.
	Failed() <-chan struct{}
	Err() error
	Summary() string
}

// openGatewayOutput opens --to.
func openGatewayOutput(ctx, soft context.Context, o gatewayOpts, ing ingestOpts, log *slog.Logger) (gatewayOutput, error) {
	switch {
	case strings.HasPrefix(o.to, "kafka://"):
		cfg, err := kafka.ParseURL(o.to)
		if err != nil {
			return nil, usageErrorf("--to: %v", err)
		}
		cfg = o.conn.kafka(cfg)
		ectx, cancel := context.WithTimeout(ctx, o.conn.retryFor)
		defer cancel()
		if err := kafka.EnsureTopic(store.WithRetryStop(ectx, soft.Done()), cfg, o.kafkaPartitions, 1); err != nil {
			return nil, err
		}
		out, err := kafka.NewOutput(cfg, kafka.OutputOptions{})
		if err != nil {
			return nil, err
		}
		return &kafkaOutput{out: out, name: cfg.String()}, nil
	case strings.HasSuffix(o.to, ".jsonl") && !strings.HasPrefix(o.to, "s3://"):
		path, err := localPath("to", o.to)
		if err != nil {
			return nil, err
		}
		maxRecord, err := bytesIn("max-record-bytes", ing.maxRecord, 1<<10, 1<<30)
		if err != nil {
			return nil, err
		}
		l, err := recordlog.Open(path, recordlog.Options{MaxRecordBytes: int(maxRecord)})
		if err != nil {
			return nil, err
		}
		return &logOutput{l: l}, nil
	default:
		return openFeed(ctx, soft, o, ing, log)
	}
}

// openFeed opens a shard root with its write-ahead log and starts the
// pipeline over it.
func openFeed(ctx, soft context.Context, o gatewayOpts, ing ingestOpts, log *slog.Logger) (gatewayOutput, error) {
	ing.to = o.to
	p, err := newPlan(ing)
	if err != nil {
		return nil, err
	}
	p.cfg.Log = log.With("run", p.runID)
	walBytes, err := bytesIn("wal-file-bytes", o.walFileBytes, recordlog.HeaderSize+(1<<10), 64<<30)
	if err != nil {
		return nil, err
	}
	root, err := connectors.ParseRoot(o.to, ing.conn.options())
	if err != nil {
		return nil, usageErrorf("--to: %v", err)
	}
	var walDir string
	switch {
	case root.S3 == nil && o.walDir != "":
		return nil, usageErrorf("--wal-dir: a local --to keeps its write-ahead log under <to>/_gateway/")
	case root.S3 == nil:
		walDir = filepath.Join(root.Path, "_gateway")
	case o.walDir != "":
		if walDir, err = localPath("wal-dir", o.walDir); err != nil {
			return nil, err
		}
	default:
		cache, err := os.UserCacheDir()
		if err != nil {
			return nil, usageErrorf("--wal-dir: no user cache folder (%v): name one", err)
		}
		sum := sha256.Sum256([]byte(o.to))
		walDir = filepath.Join(cache, "rllm-pipe", "gateway", hex.EncodeToString(sum[:8]))
	}
	st, err := connectors.OpenStore(store.WithRetryStop(ctx, soft.Done()), root, p.runID)
	if err != nil {
		return nil, err
	}
	l, err := recordlog.Open(filepath.Join(walDir, "wal.jsonl"), recordlog.Options{MaxFileBytes: walBytes, MaxRecordBytes: int(p.maxRecord)})
	if err != nil {
		st.Close()
		return nil, err
	}
	dl := st.DeadLetters()
	pl := pipeline.New(p.cfg, st, dl)
	// The pipeline lives until Close or a second signal (ctx), not the
	// first: Close stops it after the output is flushed.
	feed, err := pl.Feed(ctx, l, pipeline.FeedOptions{})
	if err != nil {
		l.Close()
		st.Close()
		return nil, err
	}
	return &feedOutput{feed: feed, st: st, dl: dl, pl: pl, name: st.Name(), wal: walDir}, nil
}

// lines are the records' lines (the log and the pipeline key nothing:
// the assembler groups).
func lines(recs []gateway.Record) [][]byte {
	out := make([][]byte, len(recs))
	for i, r := range recs {
		out[i] = r.Line
	}
	return out
}

type kafkaOutput struct {
	out  *kafka.Output
	name string
}

func (k *kafkaOutput) Write(ctx context.Context, recs []gateway.Record) error {
	msgs := make([]kafka.Keyed, len(recs))
	for i, r := range recs {
		msgs[i] = kafka.Keyed{Key: r.Key, Line: r.Line}
	}
	return k.out.Write(ctx, msgs)
}
func (k *kafkaOutput) Close() error            { return k.out.Close() }
func (k *kafkaOutput) String() string          { return k.name }
func (k *kafkaOutput) Failed() <-chan struct{} { return nil }
func (k *kafkaOutput) Err() error              { return nil }
func (k *kafkaOutput) Summary() string         { return "records produced to " + k.name }

type logOutput struct{ l *recordlog.Log }

func (o *logOutput) Write(ctx context.Context, recs []gateway.Record) error {
	return o.l.Write(ctx, lines(recs))
}
func (o *logOutput) Close() error            { return o.l.Close() }
func (o *logOutput) String() string          { return o.l.Path() }
func (o *logOutput) Failed() <-chan struct{} { return nil }
func (o *logOutput) Err() error              { return nil }
func (o *logOutput) Summary() string {
	return fmt.Sprintf("record log %s (%d group commits)", o.l.Path(), o.l.Commits())
}

type feedOutput struct {
	feed      *pipeline.Feed
	st        store.Store
	dl        store.DeadLetters
	pl        *pipeline.Pipeline
	name, wal string
}

func (o *feedOutput) Write(ctx context.Context, recs []gateway.Record) error {
	return o.feed.Write(ctx, lines(recs))
}

// Close flushes the write-ahead log, stops the pipeline (complete groups
// committed, open ones left in the log) and closes the store.
func (o *feedOutput) Close() error {
	err := o.feed.Close()
	return errors.Join(err, o.dl.Close(), o.st.Close())
}
func (o *feedOutput) String() string          { return o.name + " (write-ahead log " + o.wal + ")" }
func (o *feedOutput) Failed() <-chan struct{} { return o.feed.Done() }
func (o *feedOutput) Err() error              { return o.feed.Err() }
func (o *feedOutput) Summary() string {
	r := o.pl.Result()
	return fmt.Sprintf("%d groups, %d rows in %d shards (groups still open stay in the write-ahead log)", r.GroupsEmitted, r.Rows, r.Shards)
}
