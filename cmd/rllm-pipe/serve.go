package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline/metrics"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
	trainflight "github.com/rllm-pipe/rllm-pipe/train/flight"
	"github.com/rllm-pipe/rllm-pipe/train/loop"
)

// serveGroup joins members for the Flight server. Its members share one
// replay of the group's log and put their events in shared records
// (train.GroupLog), opened at the first join.
type serveGroup struct {
	o  *trainOpts
	st store.Reader

	mu  sync.Mutex
	log *train.GroupLog
}

func (g *serveGroup) Join(ctx context.Context, name string, t trainflight.Ticket) (*train.Consumer, error) {
	g.mu.Lock()
	if g.log == nil {
		obj, err := g.st.Objects(train.GroupDir(g.o.group))
		if err == nil {
			g.log, err = train.OpenGroupLog(ctx, obj)
		}
		if err != nil {
			g.mu.Unlock()
			return nil, err
		}
	}
	log := g.log
	g.mu.Unlock()
	return g.o.joinOn(ctx, g.st, name, memberAsk{policyVersion: t.PolicyVersion, batchGroups: t.BatchGroups, versionsPerStep: t.VersionsPerStep}, log)
}

// serveOpts are serve's own flags: security and limits of the endpoint.
type serveOpts struct {
	listen, ready                 string
	tokenFile, adminFile          string
	memberTokensFile              string
	metricsAddr, metricsTokenFile string
	metricsToken                  string
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
	f.StringVar(&o.memberTokensFile, "member-tokens-file", "", "file of 'CONSUMER TOKEN' lines: each consumer streams only with its own token, outside the stream limits and never evicted (other tokens cannot lock it out)")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (host:port), at /metrics: per consumer batches, groups acknowledged and skipped as stale, data stall, freshness; beyond loopback only with a token")
	f.StringVar(&o.metricsTokenFile, "metrics-token-file", "", "file holding the bearer token /metrics requires (default: $RLLM_PIPE_METRICS_TOKEN; none: loopback only)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve TLS with this PEM certificate (with --tls-key)")
	f.StringVar(&o.tlsKey, "tls-key", "", "PEM private key of --tls-cert")
	f.IntVar(&o.maxStreams, "max-streams", 64, "streams (members) served at once; beyond it a new stream evicts one that has acknowledged nothing for --send-timeout, else it is refused")
	f.IntVar(&o.maxStreamsPerConn, "max-streams-per-conn", 4, "streams one client connection may hold at once (a consumer name streams once at a time)")
	f.IntVar(&o.maxStreamsPerHost, "max-streams-per-host", 16, "streams the connections of one client host (IP address) may hold at once; when the server or a host is full, a new stream evicts one that has acknowledged nothing for --send-timeout")
	f.StringVar(&o.maxStreamBytes, "max-stream-bytes", "256MiB", "bytes of batches a stream may have unacknowledged before it waits")
	f.DurationVar(&o.sendTimeout, "send-timeout", 30*time.Second, "drop a stream whose client does not take a batch within this")
	f.DurationVar(&o.ackTimeout, "ack-timeout", 5*time.Minute, "drop a stream with batches in flight and no acknowledgement for this long (0: never)")
	f.DurationVar(&o.shutdownGrace, "shutdown-grace", 10*time.Second, "on the first signal, close connections still open after this (a second signal: at once)")
}

// minTokenLen is the shortest token serve and gateway accept beyond
// loopback.
const minTokenLen = 16

// tokenFlag is a token and where it came from, for errors.
type tokenFlag struct{ flag, env, tok string }

// shortToken refuses a token (one given: empty ones are the caller's
// rule) shorter than minTokenLen to listen on listen: beyond loopback a
// token is all that guards the routes, and a short one is guessed.
func shortToken(listen string, tokens ...tokenFlag) error {
	for _, t := range tokens {
		if t.tok != "" && len(t.tok) < minTokenLen {
			from := "--" + t.flag
			if t.env != "" {
				from += " (or $" + t.env + ")"
			}
			return usageErrorf("%s: a token of %d bytes to listen beyond loopback (%s); want at least %d", from, len(t.tok), listen, minTokenLen)
		}
	}
	return nil
}

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

// memberTokens reads --member-tokens-file: lines of "CONSUMER TOKEN"
// (blank lines and # comments skipped). Names and tokens are each used
// once, and no token is also the shared or the admin one (a call's token
// must say who it is). Tokens never appear in an error.
func memberTokens(file, shared, admin string) (map[string]string, error) {
	if file == "" {
		return nil, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, usageErrorf("--member-tokens-file: %v", err)
	}
	named, owner := map[string]string{}, map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, usageErrorf("--member-tokens-file: %s line %d: want CONSUMER TOKEN", file, i+1)
		}
		name, tok := fields[0], fields[1]
		if err := train.CheckName("consumer", name); err != nil {
			return nil, usageErrorf("--member-tokens-file: %s line %d: %v", file, i+1, err)
		}
		if _, dup := named[name]; dup {
			return nil, usageErrorf("--member-tokens-file: %s line %d: consumer %q listed twice", file, i+1, name)
		}
		if other, dup := owner[tok]; dup || tok == shared || tok == admin {
			other = strconv.Quote(other)
			if !dup {
				other = "the shared or admin token"
			}
			return nil, usageErrorf("--member-tokens-file: %s line %d: the token of %q is also that of %s; give each its own", file, i+1, name, other)
		}
		named[name], owner[tok] = tok, name
	}
	if len(named) == 0 {
		return nil, usageErrorf("--member-tokens-file: %s names no consumer", file)
	}
	return named, nil
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
	if opts.MemberTokens, err = memberTokens(o.memberTokensFile, opts.Token, opts.AdminToken); err != nil {
		return opts, err
	}
	if o.metricsAddr != "" {
		if o.metricsToken, err = metricsToken(o.metricsAddr, o.metricsTokenFile); err != nil {
			return opts, err
		}
	}
	// Beyond loopback a token is all that guards the data: a short one
	// is guessed.
	if host, _, _ := net.SplitHostPort(o.listen); host != "localhost" && !loopbackAddr(o.listen) {
		tokens := []tokenFlag{{"token-file", "RLLM_PIPE_TOKEN", opts.Token}, {"admin-token-file", "RLLM_PIPE_ADMIN_TOKEN", opts.AdminToken}}
		for _, tok := range opts.MemberTokens {
			tokens = append(tokens, tokenFlag{"member-tokens-file", "", tok})
		}
		if err := shortToken(o.listen, tokens...); err != nil {
			return opts, err
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
		Short: "Serve token-budget batches to trainers over Arrow Flight (a consumer group)",
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
only. --member-tokens-file gives trainers their own tokens: their streams
are outside the stream limits, so other token holders cannot lock them out. --tls-cert/--tls-key serve TLS. Streams are bounded (--max-streams,
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
			if o.peek() {
				return usageErrorf("--consumer-group: serve needs a consumer group (trainers acknowledge into it)")
			}
			// An unreachable store is not waited for past a first signal.
			st, err := o.openShards(store.WithRetryStop(cmd.Context(), soft.Done()))
			if err != nil {
				return err
			}
			if opts.Versions, err = loop.NewPublisher(st, o.group); err != nil {
				return err
			}
			srv := trainflight.NewServer(&serveGroup{o: &o, st: st}, opts)
			if so.metricsAddr != "" {
				stopMetrics, err := metrics.Serve(cmd.Context(), so.metricsAddr, so.metricsToken, metrics.SourceFunc(srv.WriteMetrics))
				if err != nil {
					return usageErrorf("--metrics-addr: %v", err)
				}
				defer stopMetrics()
			}
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
	o.register(f, true, "default")
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
