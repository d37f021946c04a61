package live

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	in := `# HELP rllm_pipe_open_groups Groups held in memory.
# TYPE rllm_pipe_open_groups gauge
rllm_pipe_open_groups 17
rllm_pipe_shards_committed_total 3
rllm_pipe_rows_committed_total 1.5e+06
rllm_pipe_dead_letters_total{reason="late"} 2
rllm_pipe_commit_latency_seconds_sum 0.25 1700000000000
garbage
`
	got, err := parseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{metricOpenGroups: 17, metricShards: 3, metricRows: 1.5e6, "rllm_pipe_commit_latency_seconds_sum": 0.25} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
	if _, ok := got["rllm_pipe_dead_letters_total"]; ok {
		t.Errorf("a labelled series read as unlabelled")
	}
	if _, err := parseMetrics(strings.NewReader("up 1\n")); err == nil {
		t.Errorf("metrics without %s accepted", metricOpenGroups)
	}
}

func TestCommitsPerMinute(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(sec float64, shards float64) IngestSample {
		return IngestSample{At: t0.Add(time.Duration(sec * float64(time.Second))), Shards: shards}
	}
	for _, tc := range []struct {
		name string
		past []IngestSample
		s    IngestSample
		want float64
	}{
		{"first sample", nil, at(0, 5), 0},
		{"half a minute of history", []IngestSample{at(0, 0), at(15, 1)}, at(30, 2), 4},
		{"the minute before only", []IngestSample{at(0, 0), at(30, 10), at(60, 20), at(90, 23)}, at(120, 26), 6},
		{"restart resets the base", []IngestSample{at(0, 50), at(30, 2)}, at(60, 5), 6},
	} {
		if got := commitsPerMinute(tc.past, tc.s); got != tc.want {
			t.Errorf("%s: %v commits/min, want %v", tc.name, got, tc.want)
		}
	}
}

// TestIngestWatch: the section scrapes the endpoint, charts one point per
// scrape with the scraped values, and keeps the history when a scrape
// fails. A user and password in the endpoint's URL are sent, never shown.
func TestIngestWatch(t *testing.T) {
	var open, fail atomic.Int64
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "MUSER" || p != "MSECRETXYZ" {
			http.Error(w, "who", http.StatusUnauthorized)
			return
		}
		if fail.Load() == 1 {
			http.Error(w, "down", http.StatusInternalServerError)
			return
		}
		w.Write([]byte("rllm_pipe_open_groups " + itoa(open.Load()) + "\nrllm_pipe_shards_committed_total " + itoa(open.Load()/2) + "\n"))
	}))
	defer hs.Close()
	w := newIngestWatch(strings.Replace(hs.URL, "http://", "http://MUSER:MSECRETXYZ@", 1)+"/metrics", "")
	t0 := time.Now()
	for i, n := range []int64{4, 9, 2} {
		open.Store(n)
		if err := w.scrape(context.Background(), t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	fail.Store(1)
	if err := w.scrape(context.Background(), t0.Add(3*time.Second)); err == nil {
		t.Fatal("a failed scrape returned no error")
	}
	st := w.state()
	if st.Last == nil || st.Last.OpenGroups != 2 || st.Scrape != 4 || !strings.Contains(st.Error, "500") {
		t.Errorf("state %+v", st)
	}
	page := string(w.html())
	ys := regexp.MustCompile(`(?s)<svg class="chart" id="ingest-backlog".*?</svg>`).FindString(page)
	var got []string
	for _, m := range regexp.MustCompile(`data-y="([^"]*)"`).FindAllStringSubmatch(ys, -1) {
		got = append(got, m[1])
	}
	if strings.Join(got, ",") != "4,9,2" {
		t.Errorf("backlog chart points %v, want 4,9,2", got)
	}
	if !strings.Contains(page, "last scrape failed") {
		t.Errorf("the failed scrape is not shown")
	}
	state, _ := json.Marshal(st)
	for _, s := range []string{page, string(state)} {
		if strings.Contains(s, "MSECRETXYZ") || strings.Contains(s, "MUSER") {
			t.Errorf("the endpoint's user or password is shown: %s", s)
		}
	}
	if !strings.Contains(page, hs.URL+"/metrics") {
		t.Errorf("the endpoint is not named")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
