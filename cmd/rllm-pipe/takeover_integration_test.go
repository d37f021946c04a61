package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// TestIntegrationIdleWorkerTakesOver runs two workers on a one-partition
// topic: one owns the partition, the other idles with no partition. When
// the owner is killed, the idle worker's empty generation must end and it
// must take the partition over.
func TestIntegrationIdleWorkerTakesOver(t *testing.T) {
	brokers, endpoint := integrationEnv(t)
	bin := e2eBinary(t)
	work := t.TempDir()
	var rb [4]byte
	rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	topic, group, prefix := "takeover-"+id, "g-"+id, "takeover-"+id
	gen := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--out", gen, "--groups", "600", "--group-size", "4", "--prompt-len", "16",
		"--response-len", "8", "--messages=false", "--seed", "21", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	data, _ := os.ReadFile(gen)
	lines := e2eSplitLines(data)
	ref, err := refIngest(lines, gen, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	produce := func(part [][]byte, name string) {
		p := filepath.Join(work, name)
		os.WriteFile(p, e2eJoinLines(part), 0o644)
		cmd := exec.Command(bin, "produce", "--to", "kafka://"+brokers+"/"+topic, "--partitions", "1", "--quiet", p)
		cmd.Env = serviceEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("produce: %v\n%s", err, out)
		}
	}
	half := len(lines) / 2
	produce(lines[:half], "a.jsonl")
	cfg, _ := s3.ParseURL("s3://rllm-pipe-test/" + prefix)
	cfg.Endpoint = endpoint
	type worker struct {
		cmd    *exec.Cmd
		stderr *bytes.Buffer
	}
	start := func() *worker {
		c := exec.Command(bin, "ingest", "--from", "kafka://"+brokers+"/"+topic+"?group="+group, "--to", "s3://rllm-pipe-test/"+prefix,
			"--group-size", "4", "--flush-interval", "300ms")
		c.Env = serviceEnv()
		w := &worker{cmd: c, stderr: &bytes.Buffer{}}
		c.Stderr = w.stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		return w
	}
	a, b := start(), start()
	defer a.cmd.Process.Kill()
	defer b.cmd.Process.Kill()
	// Groups that straddle the half stay open until the rest arrives: wait
	// for most of the half.
	for deadline := time.Now().Add(2 * time.Minute); settledCount(t, cfg) < int64(half*9/10); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("first half not settled\n%s\n%s", a.stderr.String(), b.stderr.String())
		}
	}
	// Kill whichever holds the partition: its latest generation has it.
	holds := func(w *worker) bool {
		log := w.stderr.String()
		i := strings.LastIndex(log, `msg="kafka: generation"`)
		return i >= 0 && strings.Contains(log[i:], "partitions=[0]")
	}
	owner, idle := a, b
	if !holds(a) {
		owner, idle = b, a
	}
	owner.cmd.Process.Kill()
	owner.cmd.Wait()
	produce(lines[half:], "b.jsonl")
	for deadline := time.Now().Add(2 * time.Minute); settledCount(t, cfg) < int64(len(lines)); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the idle worker did not take over: %d of %d settled\n%s", settledCount(t, cfg), len(lines), idle.stderr.String())
		}
	}
	idle.cmd.Process.Signal(syscall.SIGTERM)
	if err := idle.cmd.Wait(); err != nil {
		t.Fatalf("worker: %v\n%s", err, idle.stderr.String())
	}
	verifyS3Output(t, cfg, ref, work, true)
}
