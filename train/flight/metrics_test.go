package flight

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/train"
)

// TestMetricsStaleByVersion: stale skips show per consumer and per policy
// version, the newest staleVersionsShown versions only; declined groups
// per consumer.
func TestMetricsStaleByVersion(t *testing.T) {
	by := map[int64]int64{}
	for v := range int64(20) {
		by[v] = v + 1
	}
	st := train.Stats{DeclinedStale: 7, StaleByVersion: by}
	st.SkippedStale = 210
	s := &Server{left: map[string]leftMember{"trainer": {stats: st}}}
	var buf bytes.Buffer
	s.WriteMetrics(&buf)
	out := buf.String()
	for _, want := range []string{
		`rllm_serve_groups_skipped_stale_total{consumer="trainer"} 210`,
		`rllm_serve_groups_declined_stale_total{consumer="trainer"} 7`,
		`rllm_serve_groups_skipped_stale_by_version{consumer="trainer",version="19"} 20`,
		`rllm_serve_groups_skipped_stale_by_version{consumer="trainer",version="4"} 5`,
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("metrics lack %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, `version="3"`) {
		t.Errorf("metrics show more than the newest %d versions:\n%s", staleVersionsShown, out)
	}
}
