package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report/live"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// uiOpts are the flags of `rllm-pipe ui`.
type uiOpts struct {
	from, listen, tokenFile string
	ready                   string
	ingestMetrics           string
	poll                    time.Duration
	k                       []int
	conn                    connFlags
}

func newUICmd(soft context.Context) *cobra.Command {
	var o uiOpts
	cmd := &cobra.Command{
		Use:   "ui --from URL [--listen ADDR]",
		Short: "Serve live charts, pipeline health and a trajectory browser over HTTP",
		Long: `ui serves, over HTTP, the charts of "rllm-pipe report" following the
manifest of --from (a path, file:///path or s3://bucket/prefix) as shards
commit; the pipeline's health (shards, rows, commits per minute, consumer
groups with their members, acknowledged groups and lag; with
--ingest-metrics, the URL of an ingest process's --metrics-addr endpoint,
its open-group backlog and commits per minute over time); and a
trajectory browser (filters by task, policy version, role, filter
reason, reward, staleness and shard; pages; a trajectory's steps with
their messages and tool calls, response tokens coloured by logprob,
teacher logprob or token advantage, switched on the page, each with its
legend). Chart buckets link to the trajectories behind them.

The manifest is re-read every --poll; when it grew, the views are
reopened, the trajectory index rebuilt and every chart recomputed, no
sooner than max(--poll, 4 x the last rebuild's duration) after the last
rebuild ended, so the server spends at most a fifth of its time
rebuilding however often shards commit (a rebuild took about 10 s at a
million steps and 100 s at ten million on two loaded cores). Pages are
served from the previous build meanwhile; the health panel says how many
manifest entries are waiting and when the next rebuild comes.

It listens at once: until the first build ends, the front page answers 503
with a page that says what is being built and reloads itself (the other
pages answer 503, not ready).

Read only: GET and HEAD only, over the sandboxed views of "sql". It listens
on loopback by default; anywhere else it needs a bearer token (from
--token-file or $RLLM_PIPE_UI_TOKEN, never a flag value), sent as
"Authorization: Bearer TOKEN" or, from a browser, as the password of the
basic-authentication prompt.`,
		Example: `  rllm-pipe ui --from data                  # then open http://127.0.0.1:8817/
  rllm-pipe ui --from s3://bucket/run --ready-file ui.addr --poll 10s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runUI(soft, o, cmd)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	f.StringVar(&o.listen, "listen", "127.0.0.1:8817", "address to serve on (host:port; port 0 picks one; localhost counts as loopback when it resolves to loopback only); beyond loopback only with a token")
	f.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token (default: $RLLM_PIPE_UI_TOKEN; none: loopback only)")
	f.StringVar(&o.ingestMetrics, "ingest-metrics", "", "metrics endpoint of an ingest process (http://host:port/metrics, from its --metrics-addr): chart its open-group backlog and commits per minute, scraped every --poll (with $RLLM_PIPE_METRICS_TOKEN as the bearer token, when set)")
	f.DurationVar(&o.poll, "poll", 2*time.Second, "how often to re-read the manifest (charts are rebuilt when it grew, at most every max(poll, 4x the last rebuild's duration))")
	f.IntSliceVar(&o.k, "k", []int{1, 2, 4, 8}, "the k of pass@k")
	f.StringVar(&o.ready, "ready-file", "", "write the bound address to this file once listening (before the first build ends: pages say \"building\" until then)")
	o.conn.register(f)
	return cmd
}

// groupProgress is a consumer group's progress for the health panel.
func groupProgress(ctx context.Context, obj store.Objects) (live.GroupProgress, error) {
	p, err := train.GroupProgress(ctx, obj)
	out := live.GroupProgress{Acked: p.GroupsAcked, Skipped: p.GroupsSkip, Stale: p.GroupsStale, Members: make([]live.Member, len(p.Members))}
	for i, m := range p.Members {
		out.Members[i] = live.Member{Name: m.Name, Leased: m.Leased, Batches: m.Batches, PolicyVersion: m.PolicyVersion, Staleness: m.Staleness,
			SkippedStale: m.SkippedStale, LastAck: m.LastAck}
	}
	out.StaleByVersion = p.StaleByVersion
	return out, err
}

// uiListenAddr is the address ui listens on and whether it is on
// loopback: a loopback IP as given; "localhost" (any case) when every
// address it resolves to is a loopback one, bound to the first of them, so
// that what is checked is what is bound; anything else as given, not
// loopback.
func uiListenAddr(ctx context.Context, addr string) (string, bool) {
	if loopbackAddr(addr) {
		return addr, true
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || !strings.EqualFold(host, "localhost") {
		return addr, false
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupIPAddr(rctx, host)
	if err != nil || len(ips) == 0 {
		return addr, false
	}
	for _, ip := range ips {
		if !ip.IP.IsLoopback() {
			return addr, false
		}
	}
	return net.JoinHostPort(ips[0].IP.String(), port), true
}

func runUI(ctx context.Context, o uiOpts, cmd *cobra.Command) error {
	if o.from == "" {
		return usageErrorf("--from is required")
	}
	if err := durationIn("poll", o.poll, 10*time.Millisecond, time.Hour); err != nil {
		return err
	}
	tok, err := token("token-file", o.tokenFile, "RLLM_PIPE_UI_TOKEN")
	if err != nil {
		return err
	}
	listen, loopback := uiListenAddr(ctx, o.listen)
	if tok == "" && !loopback {
		return usageErrorf("--listen %s is beyond loopback: ui refuses it without a token (--token-file or RLLM_PIPE_UI_TOKEN), or listen on 127.0.0.1 or localhost", o.listen)
	}
	if !loopback {
		if err := shortToken(o.listen, tokenFlag{"token-file", "RLLM_PIPE_UI_TOKEN", tok}); err != nil {
			return err
		}
	}
	if o.ingestMetrics != "" {
		u, err := url.Parse(o.ingestMetrics)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageErrorf("--ingest-metrics %q: want an http:// or https:// URL, as http://127.0.0.1:9464/metrics", o.ingestMetrics)
		}
	}
	r, err := openShardStore(ctx, o.from, o.conn)
	if err != nil {
		return err
	}
	defer r.Close()
	srv := live.New(r, live.Options{Token: tok, Poll: o.poll, K: o.k, Progress: groupProgress, ConsumerGroups: train.ConsumerLogs{}, IngestMetrics: o.ingestMetrics,
		IngestMetricsToken: strings.TrimSpace(os.Getenv("RLLM_PIPE_METRICS_TOKEN"))})
	// It answers at once: a "building" page until the first build ends
	// (minutes at ten million steps), which Run starts.
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("ui: %w", err)
	}
	if err := writeReady(o.ready, ln.Addr().String()); err != nil {
		ln.Close()
		return err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: idleTimeout, MaxHeaderBytes: 16 << 10}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	go func() {
		<-runCtx.Done()
		sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
		defer c()
		hs.Shutdown(sctx)
	}()
	if !globals.Quiet {
		fmt.Fprintf(cmd.ErrOrStderr(), "rllm-pipe ui: serving %s on http://%s/ (building the first views)\n", r.Name(), ln.Addr())
	}
	slog.Debug("ui", "auth", tok != "")
	err = hs.Serve(ln)
	cancel()
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
