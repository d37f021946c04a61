package kafka

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest"
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

// TestIntegrationFetchEndsWithItsContext: a partition's fetch loop returns
// once its context ends, whenever that happens. The end interrupts a
// fetch blocked on the broker by moving the connection's deadline; an end
// that came while a fetch's records were taken from the read buffer (no
// read to interrupt) or just before the loop set the next fetch's
// deadline was overridden by that deadline: on an idle partition the loop
// then fetched nothing every fetchWait for ever, so the generation never
// ended and a stopping ingest never exited. Each round ends the context
// as soon as the partition's records are handed over, which races the
// end against the loop setting the next fetch's deadline.
func TestIntegrationFetchEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := newTopic(ctx, t, "fetch-ends", 1)
	defer DeleteTopics(context.Background(), cfg, cfg.Topic)
	out, err := NewOutput(cfg, OutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var recs []Keyed
	for i := range 500 {
		recs = append(recs, Keyed{Key: "k", Line: fmt.Appendf(nil, `{"n":%d,"pad":"%0100d"}`, i, i)})
	}
	if err := out.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}
	d, err := cfg.dialer()
	if err != nil {
		t.Fatal(err)
	}
	fetcher := WithReadBuffer(d)
	s := &source{topic: cfg.Topic, chunks: make(chan ingest.Chunk)}
	for round := range 300 {
		conn, err := fetcher.DialLeader(ctx, "tcp", cfg.Brokers[0], cfg.Topic, 0)
		if err != nil {
			t.Fatal(err)
		}
		ended, end := context.WithCancel(ctx)
		done := make(chan struct{})
		var lag atomic.Int64
		go func() {
			defer close(done)
			s.fetch(ended, conn, 0, 0, &lag)
		}()
		select {
		case c := <-s.chunks:
			end()
			if len(c.Records) != len(recs) {
				t.Fatalf("round %d: a chunk of %d records, want %d", round, len(c.Records), len(recs))
			}
		case <-time.After(time.Minute):
			t.Fatalf("round %d: no records in a minute", round)
		}
		select {
		case <-done:
		case <-time.After(20 * fetchWait):
			conn.Close()
			<-done
			t.Fatalf("round %d: the fetch loop still ran %s after its context ended", round, 20*fetchWait)
		}
		conn.Close()
	}
}
