package main

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

func TestMetricsExposition(t *testing.T) {
	m := &metrics{
		lag:        func() int64 { return 42 },
		deadLetter: func() map[schemas.Reason]int64 { return map[schemas.Reason]int64{"late": 2, "malformed_json": 5} },
	}
	m.Progress(transform.Counters{Records: 10, StepsEmitted: 4}, 3)
	m.Ended() // a generation ended
	m.Progress(transform.Counters{Records: 5}, 1)
	m.Committed(100, 250*time.Millisecond)
	m.Committed(50, 750*time.Millisecond)
	var b strings.Builder
	m.write(&b)
	out := b.String()
	for _, want := range []string{
		"rllm_pipe_records_read_total 15\n",
		"rllm_pipe_steps_emitted_total 4\n",
		"rllm_pipe_open_groups 1\n",
		"rllm_pipe_shards_committed_total 2\n",
		"rllm_pipe_rows_committed_total 150\n",
		"rllm_pipe_commit_latency_seconds_sum 1\n",
		"rllm_pipe_commit_latency_seconds_count 2\n",
		"rllm_pipe_commit_latency_seconds_max 0.75\n",
		"rllm_pipe_consumer_lag 42\n",
		`rllm_pipe_dead_letters_total{reason="late"} 2` + "\n",
		`rllm_pipe_dead_letters_total{reason="malformed_json"} 5` + "\n",
		"# TYPE rllm_pipe_s3_retries_total counter\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

// TestMetricsToken: --metrics-addr beyond loopback needs a token of at
// least 16 bytes, and then /metrics answers only requests that carry it.
func TestMetricsToken(t *testing.T) {
	t.Setenv("RLLM_PIPE_METRICS_TOKEN", "")
	dir := t.TempDir()
	short, long := filepath.Join(dir, "short"), filepath.Join(dir, "long")
	if err := os.WriteFile(short, []byte("abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const tok = "0123456789abcdef-metrics"
	if err := os.WriteFile(long, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		addr, file, err string
	}{
		{"127.0.0.1:0", "", ""},
		{"localhost:0", "", ""},
		{"[::1]:0", "", ""},
		{"0.0.0.0:9464", "", "beyond loopback"},
		{":9464", "", "beyond loopback"},
		{"192.0.2.1:9464", short, "want at least 16"},
		{"0.0.0.0:9464", long, ""},
	} {
		got, err := metricsToken(c.addr, c.file)
		if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
			t.Errorf("%s with %q: %v, want %q", c.addr, c.file, err, c.err)
		}
		if c.file == long && got != tok {
			t.Errorf("%s: token %q, want %q", c.addr, got, tok)
		}
	}
	h := metricsHandler(tok, &metrics{})
	for _, c := range []struct {
		auth string
		want int
	}{
		{"", http.StatusUnauthorized},
		{"Bearer " + tok, http.StatusOK},
		{"bearer " + tok, http.StatusOK},
		{"Bearer " + tok[:16], http.StatusUnauthorized},
		{"Bearer " + tok + "x", http.StatusUnauthorized},
		{"Basic " + tok, http.StatusUnauthorized},
		{tok, http.StatusUnauthorized},
	} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("Authorization %q: %d, want %d", c.auth, w.Code, c.want)
		}
		if w.Code == http.StatusOK && !strings.Contains(w.Body.String(), "rllm_pipe_") {
			t.Errorf("no metrics: %s", w.Body.String())
		}
	}
}
