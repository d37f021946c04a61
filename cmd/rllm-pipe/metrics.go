package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// metrics holds what --metrics-addr serves, in the Prometheus text format.
// Stages report through callbacks; the handler reads under the lock.
type metrics struct {
	mu         sync.Mutex
	past       transform.Counters // of finished pipelines (earlier generations)
	cur        transform.Counters
	openGroups int
	shards     int64
	rows       int64
	commitSum  float64
	commitN    int64
	commitMax  float64
	lag        func() int64
	deadLetter func() map[schemas.Reason]int64
}

// idleTimeout closes a keep-alive connection of the commands' HTTP servers
// (gateway, ui, metrics) after this long without a request: without it an
// idle connection, authenticated or not, is held for ever. Clients
// reconnect on their next request.
const idleTimeout = 2 * time.Minute

// Progress implements pipeline.Observer.
func (m *metrics) Progress(c transform.Counters, open int) {
	m.mu.Lock()
	m.cur, m.openGroups = c, open
	m.mu.Unlock()
}

// Ended folds the current pipeline's counters into the past.
func (m *metrics) Ended() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.past.Add(m.cur)
	m.cur, m.openGroups = transform.Counters{}, 0
}

// Committed implements pipeline.Observer.
func (m *metrics) Committed(rows int64, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shards++
	m.rows += rows
	s := took.Seconds()
	m.commitSum += s
	m.commitN++
	m.commitMax = max(m.commitMax, s)
}

// recordsRead is how many records the pipelines read so far.
func (m *metrics) recordsRead() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.past.Records + m.cur.Records
}

// Lag implements pipeline.Observer.
func (m *metrics) Lag(lag func() int64) {
	m.mu.Lock()
	m.lag = lag
	m.mu.Unlock()
}

func (m *metrics) write(w io.Writer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c := func(name, help string, v int64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	g := func(name, help string, v float64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s gauge\n%s %g\n", name, help, name, name, v)
	}
	p, cur := m.past, m.cur
	c("rllm_pipe_records_read_total", "Records read from the input.", p.Records+cur.Records)
	c("rllm_pipe_duplicates_dropped_total", "Producer retries dropped.", p.Duplicates+cur.Duplicates)
	c("rllm_pipe_records_skipped_total", "Records settled by an earlier run, skipped.", p.SkippedCommitted+cur.SkippedCommitted)
	c("rllm_pipe_groups_emitted_total", "Groups emitted (partial included).", p.GroupsEmitted+cur.GroupsEmitted)
	c("rllm_pipe_partial_groups_total", "Groups emitted partial.", p.PartialGroups+cur.PartialGroups)
	c("rllm_pipe_steps_emitted_total", "Steps emitted.", p.StepsEmitted+cur.StepsEmitted)
	c("rllm_pipe_groups_timed_out_total", "Groups closed by --group-timeout.", p.TimedOut+cur.TimedOut)
	c("rllm_pipe_groups_evicted_total", "Groups closed at --max-open-groups.", p.Evicted+cur.Evicted)
	g("rllm_pipe_open_groups", "Groups held in memory.", float64(m.openGroups))
	c("rllm_pipe_shards_committed_total", "Shards committed.", m.shards)
	c("rllm_pipe_rows_committed_total", "Rows committed.", m.rows)
	fmt.Fprintf(w, "# HELP rllm_pipe_commit_latency_seconds Time to commit a shard (footer, upload, manifest).\n# TYPE rllm_pipe_commit_latency_seconds summary\n")
	fmt.Fprintf(w, "rllm_pipe_commit_latency_seconds_sum %g\nrllm_pipe_commit_latency_seconds_count %d\n", m.commitSum, m.commitN)
	g("rllm_pipe_commit_latency_seconds_max", "Slowest shard commit.", m.commitMax)
	c("rllm_pipe_s3_retries_total", "Object-store operations retried after a transient failure.", s3.Retries.Load())
	if m.lag != nil {
		g("rllm_pipe_consumer_lag", "Records behind the partition ends, over the partitions this worker reads.", float64(m.lag()))
	}
	if m.deadLetter != nil {
		counts := m.deadLetter()
		reasons := make([]string, 0, len(counts))
		for r := range counts {
			reasons = append(reasons, string(r))
		}
		sort.Strings(reasons)
		fmt.Fprintf(w, "# HELP rllm_pipe_dead_letters_total Records dead-lettered, by reason.\n# TYPE rllm_pipe_dead_letters_total counter\n")
		for _, r := range reasons {
			fmt.Fprintf(w, "rllm_pipe_dead_letters_total{reason=%q} %d\n", r, counts[schemas.Reason(r)])
		}
	}
}

// metricsHandler writes m; with a token, to requests that carry it
// ("Authorization: Bearer TOKEN", as Prometheus sends a scrape's
// credentials).
func metricsHandler(token string, m *metrics) http.Handler {
	want := sha256.Sum256([]byte(token))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			got := ""
			if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "Bearer ") {
				got = a[7:]
			}
			// Compared as digests: a length mismatch takes the same time.
			if g := sha256.Sum256([]byte(got)); subtle.ConstantTimeCompare(g[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="rllm-pipe metrics"`)
				http.Error(w, "unauthorised", http.StatusUnauthorized)
				return
			}
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		m.write(w)
	})
}

// metricsToken is the token /metrics on addr requires: from file, else
// $RLLM_PIPE_METRICS_TOKEN. Beyond loopback one is required, of at least
// minTokenLen bytes, as for every other server.
func metricsToken(addr, file string) (string, error) {
	tok, err := token("metrics-token-file", file, "RLLM_PIPE_METRICS_TOKEN")
	if err != nil {
		return "", err
	}
	if host, _, _ := net.SplitHostPort(addr); host == "localhost" || loopbackAddr(addr) {
		return tok, nil
	}
	if tok == "" {
		return "", usageErrorf("--metrics-addr %s is beyond loopback: it needs a token (--metrics-token-file or RLLM_PIPE_METRICS_TOKEN), or listen on 127.0.0.1", addr)
	}
	return tok, shortToken(addr, tokenFlag{"metrics-token-file", "RLLM_PIPE_METRICS_TOKEN", tok})
}

// serveMetrics serves /metrics on addr until ctx ends (metricsHandler).
func serveMetrics(ctx context.Context, addr, token string, m *metrics) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metricsHandler(token, m))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: idleTimeout}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("metrics server", "err", err)
		}
	}()
	slog.Info("serving metrics", "addr", ln.Addr().String())
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}, nil
}
