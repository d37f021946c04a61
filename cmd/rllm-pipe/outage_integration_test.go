package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// services runs scripts/services.sh with args (fault injection).
func services(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(e2eModuleRoot(t), "scripts", "services.sh"), args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("services.sh %v: %v\n%s", args, err, out)
	}
}

// settledCount is the number of positions the manifest under cfg settles.
func settledCount(t testing.TB, cfg s3.Config) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := s3.Open(ctx, cfg, "observer")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, r := range st.Settled() {
		n += r.Len()
	}
	return n
}

// TestIntegrationOutages stops MinIO for 30 s and restarts the Kafka broker
// while one ingest runs: it must retry with backoff, not exit, commit
// nothing partial, and in the end hold every step exactly once.
func TestIntegrationOutages(t *testing.T) {
	sc := newScenario(t, "outage", "--groups", "3000", "--seed", "9")
	lines, cfg := sc.lines, sc.cfg
	half := len(lines) / 2
	produce := func(part [][]byte, name string) {
		if err := sc.produce(part, name, 4); err != nil {
			t.Fatal(err)
		}
	}
	produce(lines[:half], "a.jsonl")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	c := sc.ingest("--shard-size", "256KiB", "--metrics-addr", metricsAddr)
	var stderr syncBuffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Minute); !cond(); time.Sleep(300 * time.Millisecond) {
			select {
			case err := <-exited:
				t.Fatalf("ingest exited (%v) while waiting for %s\n%s", err, what, stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s\n%s", what, stderr.String())
			}
		}
	}
	waitFor("a first commit", func() bool { return settledCount(t, cfg) > 0 })

	// MinIO away for 30 s while the second half arrives.
	services(t, "minio-stop")
	produce(lines[half:], "b.jsonl")
	time.Sleep(30 * time.Second)
	select {
	case err := <-exited:
		t.Fatalf("ingest exited during the MinIO outage (%v)\n%s", err, stderr.String())
	default:
	}
	services(t, "minio-start")
	waitFor("every record settled after MinIO returned", func() bool { return settledCount(t, cfg) == int64(len(lines)) })
	resp, err := http.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !regexp.MustCompile(`rllm_pipe_s3_retries_total [1-9]`).Match(body) || !regexp.MustCompile(`rllm_pipe_shards_committed_total [1-9]`).Match(body) {
		t.Errorf("metrics after the outage do not show retries and commits:\n%s", body)
	}

	// A broker restart with the stream quiet, then more records.
	services(t, "kafka-stop")
	time.Sleep(5 * time.Second)
	services(t, "kafka-start")
	extra := [][]byte{}
	for i := 0; i < 3; i++ {
		extra = append(extra, []byte(fmt.Sprintf(`{"type":"step","step_id":"after-restart-%d","task_id":"after","trajectory_id":"after-%d","step_index":0,"policy_version":9,"prompt_ids":[1],"response_ids":[2],"response_logprobs":[-0.5]}`, i, i)),
			[]byte(fmt.Sprintf(`{"type":"trajectory","trajectory_id":"after-%d","task_id":"after","reward":%d,"num_steps":1,"group_size":3}`, i, i%2)))
	}
	produce(extra, "c.jsonl")
	all := append(append([][]byte{}, lines...), extra...)
	waitFor("the records produced after the broker restart", func() bool { return settledCount(t, cfg) == int64(len(all)) })

	if err := terminate(t, c, exited, &stderr); err != nil {
		t.Fatalf("ingest: %v\n%s", err, stderr.String())
	}
	ref := sc.reference(all)
	shards, letters := verifyS3Output(t, cfg, ref, sc.work, true)
	t.Logf("%d steps exactly once in %d shards, %d dead letters; s3 retries logged:\n%s", len(ref.Rows), shards, letters, e2eClip(stderr.String(), 2000))
}

// TestIntegrationStopKafkaDuringS3Outage: an ingest from Kafka whose store
// became unreachable with records in hand stops promptly on SIGTERM (a
// first signal ends the store's retries: of its commits, and of the
// end-of-generation sweep of unlisted objects, which retried for
// --retry-for, 15 minutes by default); a second run with the store back
// completes the output, every step exactly once.
func TestIntegrationStopKafkaDuringS3Outage(t *testing.T) {
	sc := newScenario(t, "stop-outage", "--groups", "400", "--seed", "21")
	half := len(sc.lines) / 2
	if err := sc.produce(sc.lines[:half], "a.jsonl", 2); err != nil {
		t.Fatal(err)
	}
	proxy := newTCPProxy(t, strings.TrimPrefix(sc.cfg.Endpoint, "http://"))
	w := sc.start("--s3-endpoint", "http://"+proxy.addr())
	c, stderr := w.cmd, w.stderr
	sc.waitSettled(w, "a first commit", func(n int64) bool { return n > 0 })
	proxy.Close()
	if err := sc.produce(sc.lines[half:], "b.jsonl", 2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // read, and its commits failing
	start := time.Now()
	terminateWithin(t, c, w.done, stderr, 30*time.Second) // its exit code is checked below
	t.Logf("stopped %s after SIGTERM:\n%s", time.Since(start).Round(time.Millisecond), e2eTail(stderr.String(), 600))
	if code := c.ProcessState.ExitCode(); code != exitStopped || !strings.Contains(stderr.String(), "not committed") {
		t.Fatalf("exit %d, want %d (stopped before finishing), saying records were not committed\n%s", code, exitStopped, e2eTail(stderr.String(), 3000))
	}

	again := sc.start()
	sc.waitSettled(again, "every record settled by a second run", func(n int64) bool { return n == int64(len(sc.lines)) })
	if err := terminate(t, again.cmd, again.done, again.stderr); err != nil {
		t.Fatalf("second ingest: %v\n%s", err, again.stderr.String())
	}
	verifyS3Output(t, sc.cfg, sc.reference(sc.lines), sc.work, true)
}
