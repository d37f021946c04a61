// Package live serves the charts of package report over HTTP, following
// the manifest as shards commit, with the pipeline's health and a
// trajectory browser. It is read only: it runs the sandboxed DuckDB views
// of connectors/duckdb and the consumer groups' progress, and answers GET
// and HEAD only.
package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/bearer"
)

// Progress reads a consumer group's progress (train.GroupProgress).
type Progress func(ctx context.Context, obj store.Objects) (GroupProgress, error)

// GroupProgress is what a consumer group's log says it consumed.
type GroupProgress struct {
	Acked   int64 `json:"groups_acked"`
	Skipped int64 `json:"groups_skipped"`
	// Stale counts the skipped groups that were stale, StaleByVersion
	// by their policy version.
	Stale          int64          `json:"groups_skipped_stale"`
	StaleByVersion []VersionCount `json:"skipped_stale_by_version"`
	// Members are every member name seen.
	Members []Member `json:"members"`
}

// VersionCount is a number of groups of one policy version.
type VersionCount = schemas.VersionCount

// Member is one member of a consumer group: the shards it holds now and
// its last acknowledgement.
type Member struct {
	Name          string    `json:"name"`
	Leased        int       `json:"shards_leased"`
	Batches       int64     `json:"batches_acked"`
	PolicyVersion int64     `json:"policy_version"` // at its last acknowledgement
	Staleness     int64     `json:"staleness"`      // the largest in that batch
	SkippedStale  int64     `json:"groups_skipped_stale"`
	LastAck       time.Time `json:"last_ack,omitzero"`
}

// Options configure a Server.
type Options struct {
	// Token, when set, is required as "Authorization: Bearer TOKEN" (or
	// as the password of HTTP basic authentication, for browsers).
	Token string
	// Poll is how often the manifest is re-read. Default 2s.
	Poll time.Duration
	// RebuildFactor spaces Run's rebuilds: when the manifest grew, Run
	// reopens the views, rebuilds the trajectory index and reruns every
	// report only once max(Poll, RebuildFactor × the last rebuild's
	// duration) has passed since the last rebuild ended, so the server
	// spends at most 1/(RebuildFactor+1) of its time rebuilding however
	// often shards commit (docs/performance.md#ui-at-a-million-steps times a rebuild at a million
	// steps). Default 4.
	RebuildFactor int
	// K are the k of pass@k.
	K []int
	// Progress reads consumer groups' progress; nil: no consumer groups.
	Progress Progress
	// ConsumerGroups reads the consumer groups' logs for the consumed
	// view (duckdb.Options.ConsumerGroups); nil: consumed stays empty.
	ConsumerGroups duckdb.ConsumerGroups
	// PageSize is the trajectories per page of the browser. Default 50.
	PageSize int
	// IngestMetrics is the URL of an ingest process's metrics endpoint
	// (rllm-pipe ingest --metrics-addr, path /metrics): when set, Run
	// scrapes it every Poll and the health panel charts the open-group
	// backlog and the commits per minute over time.
	IngestMetrics string
	// IngestMetricsToken, when set, is sent to it as a bearer token (an
	// ingest's --metrics-token-file).
	IngestMetricsToken string
}

// Server is the live view of one output root.
type Server struct {
	r    store.Reader
	o    Options
	open func(ctx context.Context) (*duckdb.DB, error)
	// ingest is nil without Options.IngestMetrics.
	ingest *ingestWatch

	// cache keeps the shards of an object store across refreshes, so
	// each downloads once; made on first use, removed by Close.
	cacheOnce sync.Once
	cache     string

	// refreshing serializes refreshes: one opening at a time uses and
	// prunes the download cache.
	refreshing sync.Mutex

	mu      sync.RWMutex
	db      *duckdb.DB
	data    *report.Data
	entries []schemas.ShardEntry
	gen     int
	err     error
	// The last rebuild: how long it took and when it ended; pending is
	// the manifest entries committed since, not yet shown.
	lastBuild time.Duration
	builtAt   time.Time
	pending   int
	// firstBuild is when the first build started (zero before), and
	// firstEntries the manifest entries it reads: the building page says
	// so until it ends.
	firstBuild   time.Time
	firstEntries int
}

// New returns a server over r; Run follows the manifest.
func New(r store.Reader, o Options) *Server {
	if o.Poll <= 0 {
		o.Poll = 2 * time.Second
	}
	if o.PageSize <= 0 {
		o.PageSize = 50
	}
	if o.RebuildFactor <= 0 {
		o.RebuildFactor = 4
	}
	s := &Server{r: r, o: o}
	s.open = func(ctx context.Context) (*duckdb.DB, error) {
		return duckdb.Open(ctx, r, duckdb.Options{DownloadDir: s.cacheDir(), ConsumerGroups: s.o.ConsumerGroups})
	}
	if o.IngestMetrics != "" {
		s.ingest = newIngestWatch(o.IngestMetrics, o.IngestMetricsToken)
	}
	return s
}

// Run re-reads the manifest every Poll and reopens the views when it
// grew (no sooner than Options.RebuildFactor allows), and scrapes the ingest metrics (on a goroutine of its own, so a
// slow reopening does not leave gaps in their history), until ctx ends;
// it closes the views on return.
func (s *Server) Run(ctx context.Context) error {
	if s.ingest != nil {
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.scrapeLoop(ctx)
		}()
		defer func() { <-done }()
	}
	defer s.Close()
	t := time.NewTicker(s.o.Poll)
	defer t.Stop()
	for {
		if err := s.refresh(ctx, true); err != nil && ctx.Err() == nil {
			slog.Warn("ui: refresh", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Server) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(s.o.Poll)
	defer t.Stop()
	for {
		if err := s.ingest.scrape(ctx, time.Now()); err != nil && ctx.Err() == nil {
			slog.Debug("ui: ingest metrics", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// cacheDir is the download folder of an object store's shards ("" for a
// local root, read in place, or when no folder can be made: each opening
// then downloads into its own).
func (s *Server) cacheDir() string {
	if _, local := s.r.(interface{ Root() string }); local {
		return ""
	}
	s.cacheOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rllm-pipe-ui-*")
		if err != nil {
			slog.Warn("ui: no download cache, every refresh downloads every shard", "err", err)
			return
		}
		s.mu.Lock()
		s.cache = dir
		s.mu.Unlock()
	})
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cache
}

// Close closes the views (Run does on return) and removes the download
// cache; the handlers then answer "not ready". Safe to call more than
// once.
func (s *Server) Close() error {
	// After a refresh under way, which would install views nothing
	// closes over a removed cache.
	s.refreshing.Lock()
	defer s.refreshing.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.db != nil {
		err = s.db.Close()
		s.db = nil
	}
	if s.cache != "" {
		err = errors.Join(err, os.RemoveAll(s.cache))
		s.cache = ""
	}
	return err
}

// Refresh reopens the views if the manifest has new entries, builds the
// trajectory browser's index and runs the reports, at once (Run spaces
// its rebuilds); the views in use until then keep serving.
func (s *Server) Refresh(ctx context.Context) error { return s.refresh(ctx, false) }

// rebuildDue reports whether Run may rebuild now: max(Poll,
// RebuildFactor × the last rebuild's duration) after the last one ended.
func (s *Server) rebuildDue(now time.Time) bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	wait := max(s.o.Poll, time.Duration(s.o.RebuildFactor)*s.lastBuild)
	return s.builtAt.IsZero() || now.Sub(s.builtAt) >= wait
}

func (s *Server) refresh(ctx context.Context, spaced bool) error {
	s.refreshing.Lock()
	defer s.refreshing.Unlock()
	entries, err := s.r.Entries(ctx)
	if err != nil {
		return fmt.Errorf("ui: manifest: %w", err)
	}
	s.mu.Lock()
	same := s.db != nil && len(entries) == len(s.entries)
	s.pending = max(0, len(entries)-len(s.entries))
	s.mu.Unlock()
	if same || spaced && !s.rebuildDue(time.Now()) {
		return nil
	}
	start := time.Now()
	s.mu.Lock()
	if s.data == nil {
		s.firstBuild, s.firstEntries = start, len(entries)
	}
	s.mu.Unlock()
	db, err := s.open(ctx)
	if err != nil {
		s.mu.Lock()
		s.err = err
		s.mu.Unlock()
		return err
	}
	for _, q := range indexSQL {
		if _, err := db.SQL().ExecContext(ctx, q); err != nil {
			db.Close()
			return fmt.Errorf("ui: trajectory index: %w", err)
		}
	}
	d, err := report.Collect(ctx, db, duckdb.ReportOptions{K: s.o.K})
	if err != nil {
		db.Close()
		return err
	}
	d.Source, d.Shards = s.r.Name(), db.Shards()
	s.mu.Lock()
	old := s.db
	s.db, s.data, s.entries, s.err = db, d, entries, nil
	s.gen++
	s.builtAt = time.Now()
	s.lastBuild, s.pending = s.builtAt.Sub(start), 0
	s.mu.Unlock()
	if old != nil {
		// Handlers hold the read lock while they query: none uses old now.
		old.Close()
		// What only old read (shards merged by a compaction since,
		// an older snapshot) leaves the download cache.
		if n, err := db.PruneDownloads(); err != nil {
			slog.Warn("ui: pruning the download cache", "err", err)
		} else if n > 0 {
			slog.Debug("ui: download cache pruned", "files", n)
		}
	}
	return nil
}

// Handler is the HTTP interface.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", s.index)
	mux.HandleFunc("/charts", s.charts)
	mux.HandleFunc("/api/state", s.state)
	mux.HandleFunc("/ingest", s.ingestSection)
	mux.HandleFunc("/trajectories", s.trajectories)
	mux.HandleFunc("/trajectory", s.trajectory)
	mux.HandleFunc("/favicon.ico", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent) // no icon: not a 404 in every page's console
	})
	mux.HandleFunc("/app.js", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Write([]byte(appJS))
	})
	return s.guard(mux)
}

// guard: GET and HEAD only, the token when set, strict headers.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-store")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "read only", http.StatusMethodNotAllowed)
			return
		}
		if s.o.Token != "" && !s.authorised(r) {
			h.Set("WWW-Authenticate", `Basic realm="rllm-pipe ui"`)
			http.Error(w, "unauthorised", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) authorised(r *http.Request) bool {
	got, ok := bearer.Parse(r.Header.Get("Authorization"))
	if !ok {
		_, got, _ = r.BasicAuth()
	}
	return bearer.NewKey(s.o.Token).Matches(got)
}

func (s *Server) snapshot() (*report.Data, []schemas.ShardEntry, int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.data, s.entries, s.gen, s.err
}

func link(v url.Values) string { return "/trajectories?" + v.Encode() }

func (s *Server) index(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	d, _, gen, err := s.snapshot()
	if d == nil {
		s.building(w, err)
		return
	}
	body := template.HTML(`<p class="meta"><a href="/trajectories">trajectories</a></p><h2>Health</h2><div id="health"></div>`)
	if s.ingest != nil {
		body += `<div id="ingest">` + s.ingest.html() + `</div>`
	}
	body += `<h2>Committed data</h2><div id="charts">` + report.ChartsHTML(d, link) + `</div>`
	render(w, "rllm-pipe ui", gen, body)
}

// building answers while the first build runs (or failed): 503 with
// Retry-After, and a page that reloads itself until the views are there.
func (s *Server) building(w http.ResponseWriter, err error) {
	s.mu.RLock()
	started, entries := s.firstBuild, s.firstEntries
	s.mu.RUnlock()
	msg := "Reading the manifest of " + s.r.Name() + "…"
	if !started.IsZero() {
		msg = fmt.Sprintf("Building the views of %s: %d manifest entries, started %s ago. This page reloads itself when they are ready.",
			s.r.Name(), entries, time.Since(started).Round(time.Second))
	}
	body := `<p id="building">` + template.HTMLEscapeString(msg) + `</p>`
	if err != nil {
		body += `<p class="meta" id="build-error">The last attempt failed (retried every poll): ` + template.HTMLEscapeString(err.Error()) + `</p>`
	}
	w.Header().Set("Retry-After", "2")
	w.Header().Set("Refresh", "2")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(http.StatusServiceUnavailable)
	shell.Execute(w, map[string]any{"Title": "rllm-pipe ui: building", "Gen": 0, "CSS": template.CSS(report.CSS + uiCSS), "Body": template.HTML(body)})
}

// ingestSection is the ingest metrics' part of the health panel.
func (s *Server) ingestSection(w http.ResponseWriter, r *http.Request) {
	if s.ingest == nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write([]byte(s.ingest.html()))
}

func (s *Server) charts(w http.ResponseWriter, _ *http.Request) {
	d, _, gen, _ := s.snapshot()
	if d == nil {
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("X-Generation", strconv.Itoa(gen))
	w.Write([]byte(report.ChartsHTML(d, link)))
}

// Consumer is a consumer group's progress.
type Consumer struct {
	Group string `json:"group"`
	GroupProgress
	Lag   int64  `json:"lag_groups"` // committed groups not yet acknowledged or skipped
	Error string `json:"error,omitempty"`
}

// State is /api/state.
type State struct {
	Generation       int        `json:"generation"`
	Shards           int        `json:"shards"`
	Rows             int64      `json:"rows"`
	Groups           int64      `json:"groups"`
	NewestVersion    int64      `json:"newest_policy_version"`
	CommitsPerMinute float64    `json:"commits_per_minute"` // over the last 10 minutes
	LastCommit       time.Time  `json:"last_commit"`
	Consumers        []Consumer `json:"consumers"`
	// Ingest, with Options.IngestMetrics: the last scrape.
	Ingest *IngestState `json:"ingest,omitempty"`
	// PendingEntries are the manifest entries committed since the charts
	// were drawn (the figures above count the drawn ones); the next
	// rebuild comes RebuildInSeconds from now at the earliest, the last
	// one took RebuildSeconds.
	PendingEntries   int     `json:"pending_entries"`
	RebuildSeconds   float64 `json:"rebuild_seconds"`
	RebuildInSeconds float64 `json:"rebuild_in_seconds"`
	RebuildFactor    int     `json:"rebuild_factor"`
}

func (s *Server) state(w http.ResponseWriter, r *http.Request) {
	_, entries, gen, _ := s.snapshot()
	st := State{Generation: gen, Consumers: []Consumer{}}
	now := time.Now()
	s.mu.RLock()
	st.PendingEntries, st.RebuildSeconds, st.RebuildFactor = s.pending, s.lastBuild.Seconds(), s.o.RebuildFactor
	if !s.builtAt.IsZero() {
		wait := max(s.o.Poll, time.Duration(s.o.RebuildFactor)*s.lastBuild)
		st.RebuildInSeconds = max(0, s.builtAt.Add(wait).Sub(now).Seconds())
	}
	s.mu.RUnlock()
	recent := 0
	for _, e := range entries {
		if e.Path == "" {
			continue
		}
		st.Shards++
		st.Rows += e.Rows
		st.Groups += int64(e.Groups)
		st.NewestVersion = max(st.NewestVersion, e.PolicyVersion)
		if e.CommittedAt.After(st.LastCommit) {
			st.LastCommit = e.CommittedAt
		}
		if now.Sub(e.CommittedAt) <= 10*time.Minute {
			recent++
		}
	}
	st.CommitsPerMinute = float64(recent) / 10
	if s.o.Progress != nil {
		st.Consumers = s.consumers(r.Context(), st.Groups)
	}
	if s.ingest != nil {
		st.Ingest = s.ingest.state()
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(st)
}

func (s *Server) consumers(ctx context.Context, committed int64) []Consumer {
	out := []Consumer{}
	root, err := s.r.Objects(store.ConsumersDir)
	if err != nil {
		return out
	}
	names, err := root.List(ctx, "")
	if err != nil {
		return out
	}
	seen := map[string]bool{}
	for _, n := range names {
		g, _, _ := strings.Cut(n, "/")
		if g == "" || seen[g] || !store.CheckName(g) {
			continue
		}
		seen[g] = true
		c := Consumer{Group: g}
		obj, err := s.r.Objects(store.ConsumersDir + "/" + g)
		if err == nil {
			c.GroupProgress, err = s.o.Progress(ctx, obj)
		}
		if err != nil {
			c.Error = err.Error()
		}
		if c.Members == nil {
			c.Members = []Member{}
		}
		if c.StaleByVersion == nil {
			c.StaleByVersion = []VersionCount{}
		}
		c.Lag = max(0, committed-c.Acked-c.Skipped)
		out = append(out, c)
	}
	return out
}
