package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
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
	st, err := s3.Open(context.Background(), cfg, "observer")
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
	brokers, endpoint := integrationEnv(t)
	bin := e2eBinary(t)
	work := t.TempDir()
	var rb [4]byte
	rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	topic, group, prefix := "outage-"+id, "g-"+id, "outage-"+id

	gen := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--out", gen, "--groups", "3000", "--group-size", "4", "--prompt-len", "24",
		"--response-len", "12", "--messages=false", "--seed", "9", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	data, err := os.ReadFile(gen)
	if err != nil {
		t.Fatal(err)
	}
	lines := e2eSplitLines(data)
	half := len(lines) / 2
	produce := func(part [][]byte, name string) {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, e2eJoinLines(part), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "produce", "--to", "kafka://"+brokers+"/"+topic, "--partitions", "4", "--quiet", p)
		cmd.Env = serviceEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("produce: %v\n%s", err, out)
		}
	}
	produce(lines[:half], "a.jsonl")

	cfg, err := s3.ParseURL("s3://rllm-pipe-test/" + prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = endpoint
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := ln.Addr().String()
	ln.Close()
	c := exec.Command(bin, "ingest", "--from", "kafka://"+brokers+"/"+topic+"?group="+group, "--to", "s3://rllm-pipe-test/"+prefix,
		"--group-size", "4", "--flush-interval", "300ms", "--shard-size", "256KiB", "--metrics-addr", metricsAddr)
	c.Env = serviceEnv()
	var stderr bytes.Buffer
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

	c.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Fatalf("ingest: %v\n%s", err, stderr.String())
	}
	ref, err := refIngest(all, gen, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	shards, letters := verifyS3Output(t, cfg, ref, work, true)
	t.Logf("%d steps exactly once in %d shards, %d dead letters; s3 retries logged:\n%s", len(ref.Rows), shards, letters, e2eClip(stderr.String(), 2000))
}
