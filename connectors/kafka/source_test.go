package kafka

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kgo "github.com/segmentio/kafka-go"

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
			s.fetch(ended, conn, 0, nil, 0, &lag)
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

// TestIntegrationFetchLargeValues: values of several MiB, on a topic that
// takes them, between small ones and across chunk boundaries, arrive once
// each, in order, intact, with their offsets.
func TestIntegrationFetchLargeValues(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	brokers := os.Getenv("RLLM_KAFKA_BROKERS")
	if brokers == "" {
		t.Skip("RLLM_KAFKA_BROKERS not set: run `make test` (it starts Kafka)")
	}
	cfg := Config{Brokers: strings.Split(brokers, ","), Topic: fmt.Sprintf("large-values-%d", time.Now().UnixNano())}
	// The broker takes values of up to 1 MiB by default: this topic, 16.
	_, cc, done, err := dialController(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = cc.CreateTopics(kgo.TopicConfig{Topic: cfg.Topic, NumPartitions: 1, ReplicationFactor: 1,
		ConfigEntries: []kgo.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(16 << 20)}}})
	done()
	if err != nil {
		t.Fatal(err)
	}
	if err := EnsureTopic(ctx, cfg, 1, 1); err != nil {
		t.Fatal(err)
	}
	defer DeleteTopics(context.Background(), cfg, cfg.Topic)

	// 3.4 MiB of small values, then one of 2 MiB (a chunk ends within
	// it), small ones, one of 6 MiB (larger than a chunk), small ones.
	var sizes []int
	for range 35 {
		sizes = append(sizes, 100<<10)
	}
	sizes = append(sizes, 2<<20)
	for range 20 {
		sizes = append(sizes, 1<<10)
	}
	sizes = append(sizes, 6<<20)
	for range 10 {
		sizes = append(sizes, 1<<10)
	}
	value := func(i int) []byte {
		v := bytes.Repeat([]byte{byte('a' + i%26)}, sizes[i])
		copy(v, fmt.Sprintf("%06d", i))
		return v
	}
	transport := &kgo.Transport{}
	defer transport.CloseIdleConnections()
	w := &kgo.Writer{Addr: kgo.TCP(cfg.Brokers...), Topic: cfg.Topic, Transport: transport,
		BatchBytes: 16 << 20, BatchSize: len(sizes), RequiredAcks: kgo.RequireAll}
	var msgs []kgo.Message
	for i := range sizes {
		msgs = append(msgs, kgo.Message{Value: value(i)})
	}
	// A new topic's metadata may reach the broker a writer asks a moment
	// after its leaders are known.
	for err := w.WriteMessages(ctx, msgs...); err != nil; err = w.WriteMessages(ctx, msgs...) {
		if !errors.Is(err, kgo.UnknownTopicOrPartition) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	w.Close()

	d, err := cfg.dialer()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := WithReadBuffer(d).DialLeader(ctx, "tcp", cfg.Brokers[0], cfg.Topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := &source{topic: cfg.Topic, chunks: make(chan ingest.Chunk, 4)}
	again := &partitionRecords{c: &Consumer{cfg: cfg, dialer: d}}
	fetchCtx, end := context.WithCancel(ctx)
	fetched := make(chan error, 1)
	go func() {
		var lag atomic.Int64
		_, _, err := s.fetch(fetchCtx, conn, 0, again, 0, &lag)
		fetched <- err
	}()
	next := 0
	var refs []ingest.RawRef
	for next < len(sizes) {
		select {
		case c := <-s.chunks:
			for _, r := range c.Records {
				if r.Source.Offset != int64(next) || !bytes.Equal(r.Data, value(next)) {
					t.Fatalf("record at offset %d (%d bytes, %.8q), want value %d (%d bytes)", r.Source.Offset, len(r.Data), r.Data, next, sizes[next])
				}
				if r.Ref != (ingest.RawRef{From: again, Off: int64(next), Len: sizes[next]}) {
					t.Fatalf("record at offset %d refers to %+v", next, r.Ref)
				}
				refs = append(refs, r.Ref)
				next++
			}
		case err := <-fetched:
			t.Fatalf("the fetch ended after %d of %d values: %v", next, len(sizes), err)
		case <-ctx.Done():
			t.Fatalf("%d of %d values read", next, len(sizes))
		}
	}
	end()
	<-fetched

	// Every record read again through its reference, in an order of its
	// own (one offset twice), and offsets past the end, which fail alone.
	var ask []ingest.RawRef
	for i := len(refs) - 1; i >= 0; i -= 2 {
		ask = append(ask, refs[i])
	}
	for i := 0; i < len(refs); i += 2 {
		ask = append(ask, refs[i])
	}
	ask = append(ask, refs[36], ingest.RawRef{From: again, Off: int64(len(sizes)) + 5, Len: 10}, ingest.RawRef{From: again, Off: 3, Len: 7})
	recs, errs, err := again.Reread(ctx, ask)
	if err != nil {
		t.Fatal(err)
	}
	for i, ref := range ask {
		switch {
		case ref.Off >= int64(len(sizes)):
			if errs[i] == nil || recs[i] != nil || !strings.Contains(errs[i].Error(), "no longer holds offset") {
				t.Errorf("offset %d past the end read again: %d bytes, error %v", ref.Off, len(recs[i]), errs[i])
			}
		case ref.Len != sizes[ref.Off]:
			if errs[i] == nil || recs[i] != nil {
				t.Errorf("offset %d read again as %d bytes, not %d: no error", ref.Off, sizes[ref.Off], ref.Len)
			}
		case errs[i] != nil || !bytes.Equal(recs[i], value(int(ref.Off))):
			t.Errorf("offset %d read again: %d bytes (%.8q), error %v; want value %d", ref.Off, len(recs[i]), recs[i], errs[i], ref.Off)
		}
	}
}
