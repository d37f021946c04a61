package main

import (
	"fmt"
	"testing"
	"time"
)

// TestIntegrationRebalance runs three ingest workers in one consumer group,
// kills one (SIGKILL) mid-stream; the others take its partitions over
// (fencing it in the manifest) and in the end every step is committed
// exactly once.
func TestIntegrationRebalance(t *testing.T) {
	t.Parallel() // see main_test.go
	sc := newScenario(t, "rebalance", "--groups", "2000", "--duplicates", "0.01", "--seed", "13")
	lines, cfg := sc.lines, sc.cfg
	ref := sc.reference(lines)
	produce := func(part [][]byte, name string) error { return sc.produce(part, name, 6) }
	// Create the topic (6 partitions) before the workers join.
	if err := produce(lines[:len(lines)/10], "p0.jsonl"); err != nil {
		t.Fatal(err)
	}

	workers := []*worker{sc.start("--shard-size", "256KiB"), sc.start("--shard-size", "256KiB"), sc.start("--shard-size", "256KiB")}
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
		if err := terminate(t, workers[i].cmd, workers[i].done, workers[i].stderr); err != nil {
			t.Fatalf("worker %d: %v\n%s", i+1, err, workers[i].stderr.String())
		}
	}
	shards, letters := verifyS3Output(t, cfg, ref, sc.work, true)
	t.Logf("%d steps exactly once in %d shards, %d dead letters\nworker 1:\n%s", len(ref.Rows), shards, letters, e2eClip(workers[0].stderr.String(), 1500))
}
