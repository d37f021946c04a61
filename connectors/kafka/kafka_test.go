package kafka

import (
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func TestParseURL(t *testing.T) {
	c, err := ParseURL("kafka://a:9092,b:9093/steps?group=ingest")
	if err != nil || len(c.Brokers) != 2 || c.Brokers[1] != "b:9093" || c.Topic != "steps" || c.Group != "ingest" {
		t.Fatalf("%+v %v", c, err)
	}
	for _, bad := range []string{"kafka://a:9092", "kafka://a:9092/x/y", "http://a/b", "kafka:///t"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("ParseURL(%q) accepted", bad)
		}
	}
	t.Setenv("RLLM_PIPE_KAFKA_SASL_PASSWORD", "hunter2")
	c, _ = ParseURL("kafka://a:1/t")
	if s := c.String(); s != "kafka://a:1/t?group=" {
		t.Fatalf("String() = %q (must never show secrets)", s)
	}
}

func TestResumeOffset(t *testing.T) {
	cases := []struct {
		settled schemas.Ranges
		first   int64
		want    int64
	}{
		{nil, 0, 0},
		{nil, 40, 40},
		{schemas.Ranges{{0, 9}}, 0, 10},
		{schemas.Ranges{{0, 9}, {12, 20}}, 0, 10},  // 10 and 11 belong to an open group
		{schemas.Ranges{{5, 9}}, 0, 0},             // offsets 0..4 are not settled
		{schemas.Ranges{{0, 9}, {10, 20}}, 0, 21},  // adjacent (as Add never leaves them)
		{schemas.Ranges{{0, 9}, {12, 20}}, 11, 11}, // retention removed 0..10
		{schemas.Ranges{{0, 9}, {12, 20}}, 15, 21},
	}
	for _, tc := range cases {
		if got := ResumeOffset(tc.settled, tc.first); got != tc.want {
			t.Errorf("ResumeOffset(%v, %d) = %d, want %d", tc.settled, tc.first, got, tc.want)
		}
	}
}

func TestKeyIsTheGroup(t *testing.T) {
	var d ingest.Decoder
	step := `{"type":"step","step_id":"s","task_id":"t","role":"judge","trajectory_id":"r","step_index":0,"policy_version":0,"prompt_ids":[],"response_ids":[],"response_logprobs":[]}`
	traj := `{"type":"trajectory","trajectory_id":"r","task_id":"t","role":"judge","reward":1,"num_steps":1}`
	// Keyed by task (roles of a task share a partition), so that a record
	// omitting the role still meets its group.
	if k := string(Key(&d, []byte(step))); k != "t" {
		t.Fatalf("step key %q", k)
	}
	if k := string(Key(&d, []byte(strings.Replace(traj, `"role":"judge",`, "", 1)))); k != "t" {
		t.Fatalf("trajectory key %q", k)
	}
	if k := string(Key(&d, []byte(strings.Replace(traj, `"role":"judge"`, `"group_id":"g7"`, 1)))); k != "g7" {
		t.Fatalf("explicit group key %q", k)
	}
	if k := Key(&d, []byte("{broken")); k != nil {
		t.Fatalf("bad record key %q", k)
	}
}
