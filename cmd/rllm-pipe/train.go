package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
	trainflight "github.com/rllm-pipe/rllm-pipe/train/flight"
	"github.com/rllm-pipe/rllm-pipe/train/merge"
)

// trainOpts are the flags serve and consume share: where the shards are,
// the consumer group, and what the trainer accepts.
type trainOpts struct {
	from            string
	group, name     string
	policyVersion   int64
	maxStaleness    int64
	maxVersionLead  int64
	maxTokens       int64
	includeFiltered bool
	batchEstimator  string
	compat          string
	layout          string
	leaseTimeout    time.Duration
	maxInflight     int
	follow          bool
	poll            time.Duration
	cpuProfile      string
	conn            connFlags
}

func (o *trainOpts) register(f *pflag.FlagSet, follow bool) {
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	f.StringVar(&o.group, "consumer-group", "default", "consumer group: members share the shards, each group is delivered and acknowledged once per group")
	f.Int64Var(&o.policyVersion, "policy-version", 0, "the trainer's current policy version (updatable through the API)")
	f.Int64Var(&o.maxStaleness, "max-staleness", -1, "skip groups more than this many versions behind --policy-version (-1: no bound)")
	f.Int64Var(&o.maxVersionLead, "max-version-lead", train.DefaultMaxVersionLead, "staleness is judged against the member's policy version capped at the newest committed group version plus this lead, so that a member far ahead (or lying) cannot pass the group's data over as stale (-1: no cap)")
	f.Int64Var(&o.maxTokens, "max-tokens", 0, "token budget of a batch, prompt and response tokens (0: one group per batch)")
	f.BoolVar(&o.includeFiltered, "include-filtered", false, "deliver rows a filter marked (filter_reason)")
	f.StringVar(&o.batchEstimator, "batch-estimator", "", "recompute advantage over each batch: reinforce_plus_plus_baseline, prpo, batch_std")
	f.StringVar(&o.compat, "compat", "rllm", "numerical conventions of --batch-estimator: rllm, verl, trl")
	f.StringVar(&o.layout, "layout", "steps", "rows of a batch: steps (one per step, the shard schema) or trajectories (the steps of a trajectory that extend each other merged into one row, as rLLM's verl backend trains on; --max-tokens counts merged rows)")
	f.DurationVar(&o.leaseTimeout, "lease-timeout", 30*time.Second, "a crashed member's shards go to another member after this")
	f.IntVar(&o.maxInflight, "max-inflight", 4, "batches per member delivered and not yet acknowledged, at most")
	f.BoolVar(&o.follow, "follow", follow, "keep following the manifest for new shards (else stop when every committed shard is done)")
	f.DurationVar(&o.poll, "poll", time.Second, "re-read the manifest this often when idle")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	o.conn.register(f)
}

// config is the consumer configuration for member name.
func (o *trainOpts) config(name string) (train.ConsumerConfig, error) {
	if err := train.CheckPolicyVersion(o.policyVersion); err != nil {
		return train.ConsumerConfig{}, usageErrorf("--policy-version: %v", err)
	}
	if o.maxStaleness < -1 || o.maxStaleness > train.MaxPolicyVersion {
		return train.ConsumerConfig{}, usageErrorf("--max-staleness: %d out of range [-1, 2^53]", o.maxStaleness)
	}
	// Out-of-range values were replaced by the defaults before, silently.
	if err := firstErr(
		int64In("max-tokens", o.maxTokens, 0, 1<<40), intIn("max-inflight", o.maxInflight, 1, 1<<16),
		durationIn("lease-timeout", o.leaseTimeout, time.Second, 24*time.Hour), durationIn("poll", o.poll, time.Millisecond, time.Hour),
	); err != nil {
		return train.ConsumerConfig{}, err
	}
	if o.maxVersionLead == 0 || o.maxVersionLead < -1 || o.maxVersionLead > train.MaxPolicyVersion {
		return train.ConsumerConfig{}, usageErrorf("--max-version-lead: %d, want -1 (no cap) or 1 to 2^53", o.maxVersionLead)
	}
	cfg := train.ConsumerConfig{
		MaxVersionLead: o.maxVersionLead,
		Config: train.Config{
			PolicyVersion: o.policyVersion, MaxStaleness: o.maxStaleness, MaxTokens: o.maxTokens,
			IncludeFiltered: o.includeFiltered,
		},
		Name: name, LeaseTimeout: o.leaseTimeout, MaxInflight: o.maxInflight, Follow: o.follow, Poll: o.poll,
	}
	layout, err := train.ParseLayout(o.layout)
	if err != nil {
		return cfg, usageErrorf("--layout: %v", err)
	}
	cfg.Layout = layout
	if o.batchEstimator != "" {
		compat, err := advantage.CompatByName(o.compat)
		if err != nil {
			return cfg, usageErrorf("--compat: %v", err)
		}
		if cfg.Batch, err = advantage.NewBatch(o.batchEstimator, advantage.Options{Compat: compat}); err != nil {
			return cfg, usageErrorf("--batch-estimator: %v", err)
		}
	}
	return cfg, nil
}

// openShards opens --from for reading.
func (o *trainOpts) openShards(ctx context.Context) (store.Reader, error) {
	if err := train.CheckName("--consumer-group", o.group); err != nil {
		return nil, usageErrorf("%v", err)
	}
	return openShardStore(ctx, o.from, o.conn)
}

// openShardStore opens the committed shards at from (an output root or
// s3://bucket/prefix) for reading; nothing is written there but consumer
// groups' logs.
func openShardStore(ctx context.Context, from string, conn connFlags) (store.Reader, error) {
	root, err := connectors.ParseRoot(from, conn.options())
	if err != nil {
		return nil, usageErrorf("--from: %v", err)
	}
	return connectors.OpenReader(ctx, root, "reader-"+newRunID())
}

// join makes a member of the group.
func (o *trainOpts) join(ctx context.Context, st store.Reader, name string, policyVersion *int64) (*train.Consumer, error) {
	cfg, err := o.config(name)
	if err != nil {
		return nil, err
	}
	if policyVersion != nil {
		cfg.PolicyVersion = *policyVersion
	}
	obj, err := st.Objects(train.GroupDir(o.group))
	if err != nil {
		return nil, err
	}
	return train.NewConsumer(ctx, st, obj, cfg)
}

func defaultMemberName() string {
	host, _ := os.Hostname()
	name := fmt.Sprintf("%s-%d", host, os.Getpid())
	if train.CheckName("", name) != nil {
		name = fmt.Sprintf("member-%d", os.Getpid())
	}
	return name
}

// serveGroup joins members for the Flight server.
type serveGroup struct {
	o  *trainOpts
	st store.Reader
}

func (g serveGroup) Join(ctx context.Context, name string, pv *int64) (*train.Consumer, error) {
	return g.o.join(ctx, g.st, name, pv)
}

// serveOpts are serve's own flags: security and limits of the endpoint.
type serveOpts struct {
	listen, ready                 string
	tokenFile, adminFile          string
	tlsCert, tlsKey               string
	maxStreams, maxStreamsPerConn int
	maxStreamsPerHost             int
	maxStreamBytes                string
	sendTimeout                   time.Duration
	ackTimeout                    time.Duration
	shutdownGrace                 time.Duration
}

func (o *serveOpts) register(f *pflag.FlagSet) {
	f.StringVar(&o.listen, "listen", "127.0.0.1:8815", "address to serve Arrow Flight on (host:port; port 0 picks one); beyond loopback only with a token")
	f.StringVar(&o.ready, "ready-file", "", "write the bound address to this file once listening")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token every client must send (default: $RLLM_PIPE_TOKEN; none: loopback only)")
	f.StringVar(&o.adminFile, "admin-token-file", "", "file holding the admin token, also the only one that reads other members' stats (default: $RLLM_PIPE_ADMIN_TOKEN)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve TLS with this PEM certificate (with --tls-key)")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.IntVar(&o.maxStreams, "max-streams", 64, "streams (members) served at once; more are refused")
	f.IntVar(&o.maxStreamsPerConn, "max-streams-per-conn", 4, "streams one client connection may hold at once (a consumer name streams once at a time)")
	f.IntVar(&o.maxStreamsPerHost, "max-streams-per-host", 16, "streams the connections of one client host (IP address) may hold at once; when the server or a host is full, a new stream evicts one that has acknowledged nothing for --send-timeout")
	f.StringVar(&o.maxStreamBytes, "max-stream-bytes", "256MiB", "bytes of batches a stream may have unacknowledged before it waits")
	f.DurationVar(&o.sendTimeout, "send-timeout", 30*time.Second, "drop a stream whose client does not take a batch within this")
	f.DurationVar(&o.ackTimeout, "ack-timeout", 5*time.Minute, "drop a stream with batches in flight and no acknowledgement for this long (0: never)")
	f.DurationVar(&o.shutdownGrace, "shutdown-grace", 10*time.Second, "on the first signal, close connections still open after this (a second signal: at once)")
}

// minTokenLen is the shortest token serve accepts beyond loopback.
const minTokenLen = 16

// token is the token in file, or else in the environment variable env;
// "" when neither is set. Tokens never come from a flag value (visible in
// ps) and are never printed.
func token(flag, file, env string) (string, error) {
	if file == "" {
		return strings.TrimSpace(os.Getenv(env)), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", usageErrorf("--%s: %v", flag, err)
	}
	tok := strings.TrimSpace(string(data))
	if tok == "" {
		return "", usageErrorf("--%s: %s is empty", flag, file)
	}
	return tok, nil
}

// options are the Flight server's options from the flags.
func (o *serveOpts) options() (trainflight.Options, error) {
	var opts trainflight.Options
	var err error
	if opts.Token, err = token("token-file", o.tokenFile, "RLLM_PIPE_TOKEN"); err != nil {
		return opts, err
	}
	if opts.AdminToken, err = token("admin-token-file", o.adminFile, "RLLM_PIPE_ADMIN_TOKEN"); err != nil {
		return opts, err
	}
	// Beyond loopback a token is all that guards the data: a short one
	// is guessed.
	if host, _, _ := net.SplitHostPort(o.listen); host != "localhost" && !loopbackAddr(o.listen) {
		for _, t := range []struct{ flag, env, tok string }{{"token-file", "RLLM_PIPE_TOKEN", opts.Token}, {"admin-token-file", "RLLM_PIPE_ADMIN_TOKEN", opts.AdminToken}} {
			if t.tok != "" && len(t.tok) < minTokenLen {
				return opts, usageErrorf("--%s (or $%s): a token of %d bytes to listen beyond loopback (%s); want at least %d", t.flag, t.env, len(t.tok), o.listen, minTokenLen)
			}
		}
	}
	switch {
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return opts, usageErrorf("--tls-cert and --tls-key go together")
	case o.tlsCert != "":
		cert, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return opts, usageErrorf("--tls-cert/--tls-key: %v", err)
		}
		opts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if o.maxStreams < 1 || o.maxStreams > 1<<16 {
		return opts, usageErrorf("--max-streams: %d out of range [1, 65536]", o.maxStreams)
	}
	if o.maxStreamsPerConn < 1 || o.maxStreamsPerConn > o.maxStreams {
		return opts, usageErrorf("--max-streams-per-conn: %d out of range [1, --max-streams]", o.maxStreamsPerConn)
	}
	if err := intIn("max-streams-per-host", o.maxStreamsPerHost, 1, 1<<16); err != nil {
		return opts, err
	}
	opts.MaxStreams, opts.MaxStreamsPerConn, opts.MaxStreamsPerHost = o.maxStreams, o.maxStreamsPerConn, o.maxStreamsPerHost
	if opts.MaxStreamBytes, err = parseBytes(o.maxStreamBytes); err != nil {
		return opts, usageErrorf("--max-stream-bytes: %v", err)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
		zero bool
	}{{"send-timeout", o.sendTimeout, false}, {"ack-timeout", o.ackTimeout, true}, {"shutdown-grace", o.shutdownGrace, false}} {
		if d.v < 0 || (d.v == 0 && !d.zero) {
			return opts, usageErrorf("--%s: %v, want a positive duration", d.name, d.v)
		}
	}
	opts.SendTimeout, opts.AckTimeout, opts.ShutdownGrace = o.sendTimeout, o.ackTimeout, o.shutdownGrace
	if opts.AckTimeout == 0 {
		opts.AckTimeout = -1 // never
	}
	return opts, nil
}

func newServeCmd(soft context.Context) *cobra.Command {
	var (
		o  trainOpts
		so serveOpts
	)
	cmd := &cobra.Command{
		Use:   "serve --from URL",
		Short: "Stream token-budget batches of a consumer group to trainers over Arrow Flight, taking acknowledgements",
		Long: `serve is the trainer-facing endpoint: every DoGet stream is a member of
--consumer-group, receiving whole groups in batches of at most --max-tokens,
skipping groups staler than --max-staleness; trainers acknowledge batches
and report their policy version through Flight actions (ack,
set_policy_version, stats), each for their own stream only. Several serve
processes, or several streams of one, share the shards without overlap;
the group's position lives in the store, so a restart resumes after the
last acknowledgement. The Python client is train/python (package rllm_pipe).

Security: with a token (--token-file or $RLLM_PIPE_TOKEN) every call must
carry "authorization: Bearer TOKEN"; without one serve listens on loopback
only. --tls-cert/--tls-key serve TLS. Streams are bounded (--max-streams,
--max-stream-bytes) and a client that stops reading or acknowledging is
dropped (--send-timeout, --ack-timeout), its batches going back to the
group. The first signal ends every stream and closes connections still
open after --shutdown-grace; a second closes them at once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if _, err := o.config("x"); err != nil {
				return err
			}
			opts, err := so.options()
			if err != nil {
				return err
			}
			if err := checkOutputFiles(cmd.Context(), []string{o.from}, "ready-file", so.ready, "cpuprofile", o.cpuProfile); err != nil {
				return err
			}
			stopProfile, err := startCPUProfile(o.cpuProfile)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, stopProfile()) }()
			// An unreachable store is not waited for past a first signal.
			st, err := o.openShards(store.WithRetryStop(cmd.Context(), soft.Done()))
			if err != nil {
				return err
			}
			srv := trainflight.NewServer(serveGroup{o: &o, st: st}, opts)
			// The command's context ends at the second signal: abort.
			stop := context.AfterFunc(cmd.Context(), srv.Abort)
			defer stop()
			err = trainflight.Serve(soft, so.listen, srv, func(addr string) {
				slog.Info("serve: listening", "addr", addr, "from", o.from, "consumer_group", o.group,
					"auth", opts.Token != "" || opts.AdminToken != "", "tls", opts.TLS != nil)
				if opts.TLS == nil && (opts.Token != "" || opts.AdminToken != "") && !loopbackAddr(addr) {
					slog.Warn("serve: tokens cross the network in clear text without --tls-cert")
				}
				if so.ready != "" {
					_ = os.WriteFile(so.ready, []byte(addr+"\n"), 0o644)
				}
			})
			if errors.Is(err, trainflight.ErrNeedToken) {
				return usageErrorf("--listen %s is beyond loopback: serve refuses it without a token (--token-file or RLLM_PIPE_TOKEN), or listen on 127.0.0.1", so.listen)
			}
			return err
		},
	}
	f := cmd.Flags()
	o.register(f, true)
	so.register(f)
	return cmd
}

// loopbackAddr reports whether host:port is on a loopback address.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// consumeLine is one batch in consume's JSON-lines output.
type consumeLine struct {
	BatchID   uint64   `json:"batch_id"`
	Groups    []string `json:"groups"`
	Rows      int64    `json:"rows"`
	Tokens    int64    `json:"tokens"`
	Oversized bool     `json:"oversized"`
	// With --layout trajectories: the merge's tallies.
	Layout string       `json:"layout,omitempty"`
	Merge  *merge.Stats `json:"merge,omitempty"`
}

func newConsumeCmd(soft context.Context) *cobra.Command {
	var (
		o          trainOpts
		format     string
		out        string
		maxBatches int
		noAck      bool
		statsJSON  string
	)
	cmd := &cobra.Command{
		Use:   "consume --from URL",
		Short: "Print a consumer group's batches (JSON lines or an Arrow IPC stream) and acknowledge them",
		Long: `consume is one member of --consumer-group for shell use: it prints each
batch (--format jsonl: one summary line per batch; --format arrow: the
batches as an Arrow IPC stream) and acknowledges it once written. Without
--follow it stops when every committed shard is done.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if format != "jsonl" && format != "arrow" {
				return usageErrorf("--format: jsonl or arrow")
			}
			if err := intIn("max-batches", maxBatches, 0, math.MaxInt32); err != nil {
				return err
			}
			if _, err := o.config("x"); err != nil {
				return err
			}
			if noAck {
				// Peeking: nothing is acknowledged, so every batch stays in
				// flight; the member must be allowed them all.
				if maxBatches <= 0 {
					return usageErrorf("--no-ack needs --max-batches")
				}
				o.maxInflight = max(o.maxInflight, maxBatches)
			}
			// Before anything is opened: --out is truncated when created.
			if err := checkOutputFiles(cmd.Context(), []string{o.from}, "out", out, "stats-json", statsJSON, "cpuprofile", o.cpuProfile); err != nil {
				return err
			}
			if o.name == "" {
				o.name = defaultMemberName()
			}
			if err := train.CheckName("--name", o.name); err != nil {
				return usageErrorf("%v", err)
			}
			stopProfile, err := startCPUProfile(o.cpuProfile)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, stopProfile()) }()
			// An unreachable store is not waited for past a first signal.
			st, err := o.openShards(store.WithRetryStop(cmd.Context(), soft.Done()))
			if err != nil {
				return err
			}
			c, err := o.join(store.WithRetryStop(cmd.Context(), soft.Done()), st, o.name, nil)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out != "" && out != "-" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			runErr := consumeLoop(soft, c, w, format, maxBatches, !noAck)
			// Leaving releases the member's shards: retried while the store
			// is out, but not past a signal.
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			closeErr := c.Close(store.WithRetryStop(cctx, soft.Done()))
			stats := c.Stats()
			fmt.Fprintf(cmd.ErrOrStderr(), "consume: %d batches, %d groups acknowledged, %d lost, %d stale and %d empty skipped, %d filtered rows, %d oversized, %d shards taken over\n",
				stats.Batches, stats.GroupsAcked, stats.GroupsLost, stats.SkippedStale, stats.SkippedEmpty, stats.SkippedFiltered, stats.Oversized, stats.Takeovers)
			if statsJSON != "" {
				data, _ := json.MarshalIndent(stats, "", "  ")
				if err := os.WriteFile(statsJSON, append(data, '\n'), 0o644); err != nil {
					return err
				}
			}
			if errors.Is(runErr, context.Canceled) && soft.Err() != nil {
				runErr = nil // stopped by a signal: a clean stop
			}
			return errors.Join(runErr, closeErr)
		},
	}
	f := cmd.Flags()
	o.register(f, false)
	f.StringVar(&o.name, "name", "", "this member's stable name in the group (default host-pid); a restart under the same name resumes its shards at once")
	f.StringVar(&format, "format", "jsonl", "output: jsonl (a line per batch) or arrow (Arrow IPC stream)")
	f.StringVar(&out, "out", "-", "write to this file instead of stdout")
	f.IntVar(&maxBatches, "max-batches", 0, "stop after this many batches (0: no limit)")
	f.BoolVar(&noAck, "no-ack", false, "do not acknowledge (peek; with --max-batches)")
	f.StringVar(&statsJSON, "stats-json", "", "write the member's tallies as JSON to this file at the end")
	return cmd
}

// consumeLoop writes batches to w and acknowledges each once written and
// flushed.
func consumeLoop(ctx context.Context, c *train.Consumer, w io.Writer, format string, maxBatches int, ack bool) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	var iw *ipc.Writer
	defer func() {
		if iw != nil {
			iw.Close()
		}
		bw.Flush()
	}()
	enc := json.NewEncoder(bw)
	for n := 0; maxBatches == 0 || n < maxBatches; n++ {
		d, err := c.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		line := consumeLine{BatchID: d.ID, Groups: d.Groups, Rows: d.Record.NumRows(), Tokens: d.Tokens, Oversized: d.Oversized, Merge: d.Merge}
		if d.Merge != nil {
			line.Layout = "trajectories"
		}
		if format == "arrow" {
			if iw == nil {
				iw = ipc.NewWriter(bw, ipc.WithSchema(d.Record.Schema()))
			}
			err = iw.Write(d.Record)
		} else {
			err = enc.Encode(line)
		}
		d.Record.Release()
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			return err
		}
		if !ack {
			continue
		}
		// Written and flushed before it is acknowledged: a crash between the
		// two delivers the batch again, never loses it.
		if _, err := c.Ack(ctx, d.ID); err != nil {
			if !errors.Is(err, train.ErrLeaseLost) {
				return err
			}
			slog.Warn("consume: acknowledgement refused; the batch goes to another member", "batch_id", d.ID, "err", err)
		}
	}
	return nil
}
