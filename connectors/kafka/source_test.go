package kafka

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestIntegrationSourceIdlePartitions: a partition with nothing new is
// fetched again, not treated as a failure: the broker answers an empty
// fetch with RequestTimedOut after the fetch wait, and a source that
// reconnected (with backoff up to seconds) on each would stall records
// that arrive later. Records produced before and after an idle spell
// arrive in order with no reconnection.
func TestIntegrationSourceIdlePartitions(t *testing.T) {
	brokers := os.Getenv("RLLM_KAFKA_BROKERS")
	if brokers == "" {
		t.Skip("RLLM_KAFKA_BROKERS not set: run `make test` (it starts Kafka)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id := time.Now().UnixNano()
	cfg := Config{Brokers: strings.Split(brokers, ","), Topic: fmt.Sprintf("idle-%d", id), Group: fmt.Sprintf("idle-%d", id)}
	if err := EnsureTopic(ctx, cfg, 2, 1); err != nil {
		t.Fatal(err)
	}
	out, err := NewOutput(cfg, OutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	c, err := NewConsumer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gen, err := c.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	src := gen.Source(map[int]int64{0: 0, 1: 0})
	read := func(want string) {
		t.Helper()
		if err := out.Write(ctx, []Keyed{{Key: "k", Line: []byte(want)}}); err != nil {
			t.Fatal(err)
		}
		chunk, err := src.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(chunk.Records) != 1 || string(chunk.Records[0].Data) != want {
			t.Fatalf("read %d records, want just %q", len(chunk.Records), want)
		}
	}
	read(`{"n":1}`)
	time.Sleep(6 * fetchWait) // both partitions idle: empty fetches
	read(`{"n":2}`)
	if n := src.(*source).retries.Load(); n != 0 {
		t.Errorf("%d reconnections while partitions were idle, want 0", n)
	}
}
