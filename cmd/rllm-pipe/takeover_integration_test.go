package main

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestIntegrationIdleWorkerTakesOver runs two workers on a one-partition
// topic: one owns the partition, the other idles with no partition. When
// the owner is killed, the idle worker's empty generation must end and it
// must take the partition over.
func TestIntegrationIdleWorkerTakesOver(t *testing.T) {
	t.Parallel() // see main_test.go
	sc := newScenario(t, "takeover", "--groups", "600", "--seed", "21")
	lines, cfg := sc.lines, sc.cfg
	ref := sc.reference(lines)
	produce := func(part [][]byte, name string) {
		if err := sc.produce(part, name, 1); err != nil {
			t.Fatal(err)
		}
	}
	half := len(lines) / 2
	produce(lines[:half], "a.jsonl")
	type worker struct {
		cmd    *exec.Cmd
		stderr *syncBuffer
	}
	start := func() *worker {
		c := sc.ingest()
		w := &worker{cmd: c, stderr: &syncBuffer{}}
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
	if err := terminate(t, idle.cmd, waitChan(idle.cmd), idle.stderr); err != nil {
		t.Fatalf("worker: %v\n%s", err, idle.stderr.String())
	}
	verifyS3Output(t, cfg, ref, sc.work, true)
}
