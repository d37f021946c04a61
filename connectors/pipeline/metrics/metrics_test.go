package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/bearer/bearertest"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

func TestExposition(t *testing.T) {
	m := New(func() map[schemas.Reason]int64 { return map[schemas.Reason]int64{"late": 2, "malformed_json": 5} })
	m.Lag(func() int64 { return 42 })
	m.Progress(transform.Counters{Records: 10, StepsEmitted: 4}, 3)
	m.Ended() // a generation ended
	m.Progress(transform.Counters{Records: 5}, 1)
	m.Committed(100, 250*time.Millisecond)
	m.Committed(50, 750*time.Millisecond)
	if got := m.RecordsRead(); got != 15 {
		t.Errorf("RecordsRead %d, want 15", got)
	}
	var b strings.Builder
	m.Write(&b)
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

// TestHandlerToken: with a token, /metrics answers only requests that
// carry it as a bearer token (the scheme in any case); without one, every
// request.
func TestHandlerToken(t *testing.T) {
	const tok = "0123456789abcdef-metrics"
	for _, c := range []struct {
		token, auth string
		want        int
	}{
		{tok, "", http.StatusUnauthorized},
		{tok, "Bearer " + tok, http.StatusOK},
		{tok, "bearer " + tok, http.StatusOK},
		{tok, "Bearer " + tok[:16], http.StatusUnauthorized},
		{tok, "Bearer " + tok + "x", http.StatusUnauthorized},
		{tok, "Basic " + tok, http.StatusUnauthorized},
		{tok, tok, http.StatusUnauthorized},
		{"", "", http.StatusOK},
		{"", "Bearer anything", http.StatusOK},
	} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		w := httptest.NewRecorder()
		Handler(c.token, New(nil)).ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("token %q, Authorization %q: %d, want %d", c.token, c.auth, w.Code, c.want)
		}
		if w.Code == http.StatusOK && !strings.Contains(w.Body.String(), "rllm_pipe_records_read_total 0\n") {
			t.Errorf("no metrics: %s", w.Body.String())
		}
		if w.Code == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") == "" {
			t.Errorf("a 401 without WWW-Authenticate")
		}
	}
}

// TestHandlerTokenSuite: the bearer header rule every server shares.
func TestHandlerTokenSuite(t *testing.T) {
	h := Handler(bearertest.Token, New(nil))
	bearertest.Run(t, func(t *testing.T, header string) bool {
		r := httptest.NewRequest("GET", "/metrics", nil)
		if header != "" {
			r.Header.Set("Authorization", header)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code == http.StatusOK
	})
}
