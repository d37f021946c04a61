package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// scenario is a Kafka topic, a consumer group and an S3 prefix of a test's
// own, with generated input (groups of 4) and the binary to drive them.
type scenario struct {
	t                    *testing.T
	bin, work, brokers   string
	topic, group, prefix string
	cfg                  s3.Config
	in                   string
	lines                [][]byte
}

// newScenario generates input with `rllm-pipe gen` (small token lists, no
// messages) plus genArgs.
func newScenario(t *testing.T, name string, genArgs ...string) *scenario {
	t.Helper()
	brokers, endpoint := integrationEnv(t)
	var rb [4]byte
	rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	s := &scenario{t: t, bin: e2eBinary(t), work: t.TempDir(), brokers: brokers,
		topic: name + "-" + id, group: "g-" + id, prefix: name + "-" + id}
	s.in = filepath.Join(s.work, "in.jsonl")
	args := append([]string{"gen", "--to", s.in, "--group-size", "4", "--prompt-len", "24", "--response-len", "12",
		"--messages=false", "--quiet"}, genArgs...)
	if r := e2eRun(t, s.bin, s.work, args...); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	data, err := os.ReadFile(s.in)
	if err != nil {
		t.Fatal(err)
	}
	s.lines = e2eSplitLines(data)
	cfg, err := s3.ParseURL("s3://rllm-pipe-test/" + s.prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = endpoint
	s.cfg = cfg
	cleanupS3(t, cfg)
	cleanupTopics(t, brokers, s.topic, s.topic+".dlq")
	return s
}

// setLines replaces the input (for tests that add bad records).
func (s *scenario) setLines(lines [][]byte) {
	s.lines = lines
	if err := os.WriteFile(s.in, e2eJoinLines(lines), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// reference computes what the committed output must hold for lines.
func (s *scenario) reference(lines [][]byte) *refResult {
	s.t.Helper()
	ref, err := refIngest(lines, s.in, 4, 2)
	if err != nil {
		s.t.Fatalf("reference: %v", err)
	}
	return ref
}

// produce sends part to the topic (created with the given partitions).
func (s *scenario) produce(part [][]byte, name string, partitions int) error {
	p := filepath.Join(s.work, name)
	if err := os.WriteFile(p, e2eJoinLines(part), 0o644); err != nil {
		return err
	}
	// A produce still running after two minutes is hung: SIGQUIT dumps
	// its goroutines into the error.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, "produce", "--to", "kafka://"+s.brokers+"/"+s.topic, "--kafka-partitions", fmt.Sprint(partitions), "--quiet", p)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGQUIT) }
	cmd.WaitDelay = 30 * time.Second
	cmd.Env = serviceEnv()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("produce: %v\n%s", err, e2eTail(string(out), 200_000))
	}
	return nil
}

// ingest returns (not started) an ingest worker of the scenario's group
// into its prefix.
func (s *scenario) ingest(extra ...string) *exec.Cmd {
	args := append([]string{"ingest", "--from", "kafka://" + s.brokers + "/" + s.topic + "?group=" + s.group,
		"--to", "s3://rllm-pipe-test/" + s.prefix, "--group-size", "4", "--flush-interval", "300ms"}, extra...)
	c := exec.Command(s.bin, args...)
	c.Env = serviceEnv()
	return c
}

// worker is an ingest process of the scenario, started.
type worker struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   <-chan error // c.Wait's result
}

// start starts an ingest worker (s.ingest with extra flags); it is killed
// when the test ends.
func (s *scenario) start(extra ...string) *worker {
	s.t.Helper()
	c := s.ingest(extra...)
	w := &worker{cmd: c, stderr: &syncBuffer{}}
	c.Stderr = w.stderr
	if err := c.Start(); err != nil {
		s.t.Fatal(err)
	}
	w.done = waitChan(c)
	s.t.Cleanup(func() { c.Process.Kill() })
	return w
}

// waitSettled polls the output's settled positions until cond holds, at
// most two minutes, failing with w's log.
func (s *scenario) waitSettled(w *worker, what string, cond func(settled int64) bool) {
	s.t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(settledCount(s.t, s.cfg)); time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: not within 2 minutes (%d of %d settled)\n%s", what, settledCount(s.t, s.cfg), len(s.lines), w.stderr.String())
		}
	}
}

// syncBuffer is a bytes.Buffer safe to read while a child process writes
// to it (exec copies its output on another goroutine).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
