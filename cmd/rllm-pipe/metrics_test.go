package main

import (
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
