package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// TestIntegrationRebalance runs three ingest workers in one consumer group,
// kills one (SIGKILL) mid-stream; the others take its partitions over
// (fencing it in the manifest) and in the end every step is committed
// exactly once.
func TestIntegrationRebalance(t *testing.T) {
	brokers, endpoint := integrationEnv(t)
	bin := e2eBinary(t)
	work := t.TempDir()
	var rb [4]byte
	rand.Read(rb[:])
	id := hex.EncodeToString(rb[:])
	topic, group, prefix := "rebalance-"+id, "g-"+id, "rebalance-"+id

	gen := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--out", gen, "--groups", "4000", "--group-size", "4", "--prompt-len", "24",
		"--response-len", "12", "--messages=false", "--duplicates", "0.01", "--seed", "13", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	data, err := os.ReadFile(gen)
	if err != nil {
		t.Fatal(err)
	}
	lines := e2eSplitLines(data)
	ref, err := refIngest(lines, gen, 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := s3.ParseURL("s3://rllm-pipe-test/" + prefix)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint = endpoint

	// Create the topic (6 partitions) before the workers join.
	produce := func(part [][]byte, name string) error {
		p := filepath.Join(work, name)
		if err := os.WriteFile(p, e2eJoinLines(part), 0o644); err != nil {
			return err
		}
		cmd := exec.Command(bin, "produce", "--to", "kafka://"+brokers+"/"+topic, "--partitions", "6", "--quiet", p)
		cmd.Env = serviceEnv()
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("produce: %v\n%s", err, out)
		}
		return nil
	}
	if err := produce(lines[:len(lines)/10], "p0.jsonl"); err != nil {
		t.Fatal(err)
	}

	type worker struct {
		cmd    *exec.Cmd
		stderr *bytes.Buffer
		done   chan error
	}
	start := func() *worker {
		c := exec.Command(bin, "ingest", "--from", "kafka://"+brokers+"/"+topic+"?group="+group, "--to", "s3://rllm-pipe-test/"+prefix,
			"--group-size", "4", "--flush-interval", "300ms", "--shard-size", "256KiB")
		c.Env = serviceEnv()
		w := &worker{cmd: c, stderr: &bytes.Buffer{}, done: make(chan error, 1)}
		c.Stderr = w.stderr
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { w.done <- c.Wait() }()
		return w
	}
	workers := []*worker{start(), start(), start()}
	defer func() {
		for _, w := range workers {
			w.cmd.Process.Kill()
		}
	}()
	produced := make(chan error, 1)
	go func() {
		for k := 1; k < 10; k++ {
			if err := produce(lines[k*len(lines)/10:(k+1)*len(lines)/10], fmt.Sprintf("p%d.jsonl", k)); err != nil {
				produced <- err
				return
			}
			time.Sleep(time.Second)
		}
		produced <- nil
	}()
	for deadline := time.Now().Add(2 * time.Minute); settledCount(t, cfg) < int64(len(lines))/5; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no progress\n%s", workers[0].stderr.String())
		}
	}
	workers[1].cmd.Process.Kill() // mid-stream
	<-workers[1].done
	t.Logf("killed worker 2 at %d settled positions of %d", settledCount(t, cfg), len(lines))
	if err := <-produced; err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(3 * time.Minute); settledCount(t, cfg) < int64(len(lines)); time.Sleep(300 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d settled\nworker 1:\n%s\nworker 3:\n%s", settledCount(t, cfg), len(lines), workers[0].stderr.String(), workers[2].stderr.String())
		}
	}
	for _, i := range []int{0, 2} {
		workers[i].cmd.Process.Signal(syscall.SIGTERM)
		if err := <-workers[i].done; err != nil {
			t.Fatalf("worker %d: %v\n%s", i+1, err, workers[i].stderr.String())
		}
	}
	shards, letters := verifyS3Output(t, cfg, ref, work, true)
	t.Logf("%d steps exactly once in %d shards, %d dead letters\nworker 1:\n%s", len(ref.Rows), shards, letters, e2eClip(workers[0].stderr.String(), 1500))
}
