package live

import (
	"bufio"
	"context"
	"fmt"
	"html/template"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
)

// The ingest metrics the health panel reads (cmd/rllm-pipe's
// --metrics-addr, Prometheus text format).
const (
	metricOpenGroups = "rllm_pipe_open_groups"
	metricShards     = "rllm_pipe_shards_committed_total"
	metricRows       = "rllm_pipe_rows_committed_total"
	metricRecords    = "rllm_pipe_records_read_total"
)

// maxIngestSamples bounds the history kept of the ingest metrics: at the
// default poll of 2s, about an hour and a half.
const maxIngestSamples = 2700

// IngestSample is one scrape of the ingest metrics endpoint.
type IngestSample struct {
	At         time.Time `json:"at"`
	OpenGroups float64   `json:"open_groups"` // groups held in memory, waiting for trajectories
	Shards     float64   `json:"shards_committed"`
	Rows       float64   `json:"rows_committed"`
	Records    float64   `json:"records_read"`
	// CommitsPerMinute is the shards committed over the minute before At
	// (over the time since the first sample while there is less than a
	// minute of history, or since a restart of the ingest process, whose
	// counters start again from 0).
	CommitsPerMinute float64 `json:"commits_per_minute"`
}

// IngestState is the ingest part of /api/state.
type IngestState struct {
	URL    string        `json:"url"`
	Last   *IngestSample `json:"last,omitempty"`
	Error  string        `json:"error,omitempty"`
	Scrape int           `json:"scrapes"`
}

// ingestWatch scrapes the ingest metrics endpoint and keeps its history.
type ingestWatch struct {
	url    string
	shown  string // url without the user and password it may hold, for pages
	token  string // sent as a bearer token, when set
	client *http.Client

	mu      sync.Mutex
	samples []IngestSample
	err     string
	scrapes int
}

func newIngestWatch(raw, token string) *ingestWatch {
	shown := raw
	if u, err := url.Parse(raw); err == nil && u.User != nil {
		u.User = nil
		shown = u.String()
	}
	return &ingestWatch{url: raw, shown: shown, token: token, client: &http.Client{Timeout: 5 * time.Second}}
}

// scrape reads the endpoint once and appends a sample; a failed scrape
// keeps the history and records the error.
func (w *ingestWatch) scrape(ctx context.Context, now time.Time) error {
	vals, err := w.fetch(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.scrapes++
	if err != nil {
		w.err = err.Error()
		return err
	}
	w.err = ""
	s := IngestSample{At: now, OpenGroups: vals[metricOpenGroups], Shards: vals[metricShards], Rows: vals[metricRows], Records: vals[metricRecords]}
	s.CommitsPerMinute = commitsPerMinute(w.samples, s)
	w.samples = append(w.samples, s)
	if len(w.samples) > maxIngestSamples {
		w.samples = append(w.samples[:0], w.samples[len(w.samples)-maxIngestSamples:]...)
	}
	return nil
}

// commitsPerMinute is the rate of shards committed over the minute before
// s, from the samples before it.
func commitsPerMinute(past []IngestSample, s IngestSample) float64 {
	base := -1
	for i := len(past) - 1; i >= 0; i-- {
		p := past[i]
		if p.Shards > s.Shards || p.At.After(s.At) {
			break // the process restarted (or the clock stepped back): count from here
		}
		base = i
		if s.At.Sub(p.At) >= time.Minute {
			break
		}
	}
	if base < 0 {
		return 0
	}
	p := past[base]
	dt := s.At.Sub(p.At).Minutes()
	if dt <= 0 {
		return 0
	}
	return (s.Shards - p.Shards) / dt
}

func (w *ingestWatch) fetch(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url, nil)
	if err != nil {
		return nil, fmt.Errorf("ingest metrics: %w", err)
	}
	if w.token != "" {
		req.Header.Set("Authorization", "Bearer "+w.token)
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ingest metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("ingest metrics: %s", resp.Status)
	}
	return parseMetrics(io.LimitReader(resp.Body, 4<<20))
}

// parseMetrics reads the unlabelled samples of a Prometheus text
// exposition: name → value. Labelled series and comments are skipped.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if !ok || strings.ContainsRune(name, '{') {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil || math.IsNaN(v) {
			continue
		}
		out[name] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("ingest metrics: %w", err)
	}
	if _, ok := out[metricOpenGroups]; !ok {
		return nil, fmt.Errorf("ingest metrics: no %s: not the metrics of rllm-pipe ingest", metricOpenGroups)
	}
	return out, nil
}

func (w *ingestWatch) state() *IngestState {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := &IngestState{URL: w.shown, Error: w.err, Scrape: w.scrapes}
	if n := len(w.samples); n > 0 {
		last := w.samples[n-1]
		st.Last = &last
	}
	return st
}

// charts draws the open-group backlog and the commits per minute over
// time.
func (w *ingestWatch) charts() []*report.Chart {
	w.mu.Lock()
	defer w.mu.Unlock()
	open := report.Series{Name: "open groups"}
	commits := report.Series{Name: "commits per minute"}
	for _, s := range w.samples {
		x := float64(s.At.UnixNano()) / 1e9
		open.Points = append(open.Points, report.Point{X: x, Y: s.OpenGroups})
		commits.Points = append(commits.Points, report.Point{X: x, Y: s.CommitsPerMinute})
	}
	note := "no scrape of " + w.shown + " yet"
	if w.err != "" {
		note = w.err
	}
	return []*report.Chart{
		{ID: "ingest-backlog", Title: "Ingest: open-group backlog", XLabel: "time (UTC)", YLabel: "groups held open", Kind: report.KindLine, XTime: true,
			Series: []report.Series{open}, Note: note},
		{ID: "ingest-commits", Title: "Ingest: shards committed per minute", XLabel: "time (UTC)", YLabel: "commits per minute", Kind: report.KindLine, XTime: true,
			Series: []report.Series{commits}, Note: note},
	}
}

// html is the ingest section of the live view.
func (w *ingestWatch) html() template.HTML {
	var b strings.Builder
	st := w.state()
	fmt.Fprintf(&b, `<p class="meta" id="ingest-status" data-scrapes="%d">ingest metrics: %s`, st.Scrape, template.HTMLEscapeString(w.shown))
	if st.Last != nil {
		fmt.Fprintf(&b, ` · %s open groups · %s shards and %s rows committed by this process · %.1f commits/min`,
			fmtInt(st.Last.OpenGroups), fmtInt(st.Last.Shards), fmtInt(st.Last.Rows), st.Last.CommitsPerMinute)
	}
	if st.Error != "" {
		fmt.Fprintf(&b, ` · <span class="err">last scrape failed: %s</span>`, template.HTMLEscapeString(st.Error))
	}
	b.WriteString(`</p><div class="charts">`)
	for _, c := range w.charts() {
		fmt.Fprintf(&b, `<figure data-chart="%s"><figcaption>%s</figcaption>%s</figure>`, c.ID, template.HTMLEscapeString(c.Title), c.SVG())
	}
	b.WriteString(`</div>`)
	return template.HTML(b.String())
}

func fmtInt(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
