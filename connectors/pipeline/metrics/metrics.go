// Package metrics exposes a running pipeline's counters in the Prometheus
// text format: Pipeline is the pipeline.Observer a command hands its
// pipeline, Handler serves it at /metrics (with a bearer token when one is
// set), and Serve runs that server on an address.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/bearer"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// Pipeline holds what a pipeline reported. Stages report through its
// methods; Write reads under the lock.
type Pipeline struct {
	mu          sync.Mutex
	past        transform.Counters // of finished runs (earlier generations)
	cur         transform.Counters
	openGroups  int
	shards      int64
	rows        int64
	commitSum   float64
	commitN     int64
	commitMax   float64
	lag         func() int64
	deadLetters func() map[schemas.Reason]int64
}

// New returns an empty Pipeline; deadLetters, if not nil, gives the
// dead-letter counts by reason.
func New(deadLetters func() map[schemas.Reason]int64) *Pipeline {
	return &Pipeline{deadLetters: deadLetters}
}

// Progress implements pipeline.Observer.
func (m *Pipeline) Progress(c transform.Counters, open int) {
	m.mu.Lock()
	m.cur, m.openGroups = c, open
	m.mu.Unlock()
}

// Ended implements pipeline.Observer: it folds the current run's counters
// into the past.
func (m *Pipeline) Ended() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.past.Add(m.cur)
	m.cur, m.openGroups = transform.Counters{}, 0
}

// Committed implements pipeline.Observer.
func (m *Pipeline) Committed(rows int64, took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shards++
	m.rows += rows
	s := took.Seconds()
	m.commitSum += s
	m.commitN++
	m.commitMax = max(m.commitMax, s)
}

// Lag implements pipeline.Observer.
func (m *Pipeline) Lag(lag func() int64) {
	m.mu.Lock()
	m.lag = lag
	m.mu.Unlock()
}

// RecordsRead is how many records the pipeline's runs read so far.
func (m *Pipeline) RecordsRead() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.past.Records + m.cur.Records
}

// Write writes the metrics to w in the Prometheus text format.
func (m *Pipeline) Write(w io.Writer) {
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
	c("rllm_pipe_trajectories_failed_total", "Trajectories dead-lettered because a step was rejected at capture (their groups not waited for).", p.Failed+cur.Failed)
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
	if m.deadLetters != nil {
		counts := m.deadLetters()
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

// Source writes metrics in Prometheus' text format: a Pipeline, or any
// other server's (serve's, through SourceFunc).
type Source interface {
	Write(w io.Writer)
}

// SourceFunc is a function as a Source.
type SourceFunc func(w io.Writer)

// Write calls f.
func (f SourceFunc) Write(w io.Writer) { f(w) }

// Handler serves m; with a token, only to requests that carry it
// ("Authorization: Bearer TOKEN", the scheme in any case, as Prometheus
// sends a scrape's credentials).
func Handler(token string, m Source) http.Handler {
	key := bearer.NewKey(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if key.IsSet() {
			if got, _ := bearer.Parse(r.Header.Get("Authorization")); !key.Matches(got) {
				w.Header().Set("WWW-Authenticate", `Bearer realm="rllm-pipe metrics"`)
				http.Error(w, "unauthorised", http.StatusUnauthorized)
				return
			}
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		m.Write(w)
	})
}

// IdleTimeout closes a keep-alive connection to the server after this long
// without a request: without it an idle connection, authenticated or not,
// is held for ever. Scrapers reconnect on their next request.
const IdleTimeout = 2 * time.Minute

// Serve serves m at /metrics on addr (Handler) until stop is called. The
// caller decides whether addr may go without a token.
func Serve(ctx context.Context, addr, token string, m Source) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", Handler(token, m))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: IdleTimeout}
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
