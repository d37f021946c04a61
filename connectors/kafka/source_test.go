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
	brokers := os.Getenv("RLLM_PIPE_KAFKA_BROKERS")
	if brokers == "" {
		t.Skip("RLLM_PIPE_KAFKA_BROKERS not set: run `make test` (it starts Kafka)")
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
	// 3.4 MiB of small values, then one of 2 MiB (a chunk ends within
	// it; larger than an arena's first headroom), small ones, one of 6 MiB
	// (larger than a chunk and than the headroom grown for 2 MiB), one of
	// 5 MiB (within the headroom grown for 6 MiB), small ones.
	var sizes []int
	for range 35 {
		sizes = append(sizes, 100<<10)
	}
	sizes = append(sizes, 2<<20)
	for range 20 {
		sizes = append(sizes, 1<<10)
	}
	sizes = append(sizes, 6<<20, 5<<20)
	for range 10 {
		sizes = append(sizes, 1<<10)
	}
	value := func(i int) []byte {
		v := bytes.Repeat([]byte{byte('a' + i%26)}, sizes[i])
		copy(v, fmt.Sprintf("%06d", i))
		return v
	}
	cfg := largeValuesTopic(ctx, t, "large-values", kgo.Compression(0), len(sizes), value)

	d, err := cfg.dialer()
	if err != nil {
		t.Fatal(err)
	}
	again := &partitionRecords{c: &Consumer{cfg: cfg, dialer: d}}
	s := &source{topic: cfg.Topic, chunks: make(chan ingest.Chunk, 4)}
	s.arenas.free = make(chan []byte, 2)
	var refs []ingest.RawRef
	fetchAll(ctx, t, cfg, s, again, 0, int64(len(sizes)), func(r ingest.Raw) {
		next := len(refs)
		if r.Source.Offset != int64(next) || !bytes.Equal(r.Data, value(next)) {
			t.Fatalf("record at offset %d (%d bytes, %.8q), want value %d (%d bytes)", r.Source.Offset, len(r.Data), r.Data, next, sizes[next])
		}
		if r.Ref != (ingest.RawRef{From: again, Off: int64(next), Len: sizes[next]}) {
			t.Fatalf("record at offset %d refers to %+v", next, r.Ref)
		}
		refs = append(refs, r.Ref)
	})
	// The 2 MiB and 6 MiB values did not fit; the 5 MiB one did.
	if n := s.refetches.Load(); n != 2 {
		t.Errorf("%d fetches cut short by a value larger than the room left, want 2", n)
	}

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

// TestIntegrationFetchCompressed: a batch its producer compressed (zstd,
// as rollout workers often send) comes whole from the broker even to a
// fetch that starts within it: the records before the offset asked for
// are skipped, those from it on arrive once each, in order and intact,
// values larger than an arena's room among both.
func TestIntegrationFetchCompressed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 400
	size := func(i int) int {
		switch i {
		case 50:
			return 1800 << 10
		case 300:
			return 3 << 20
		}
		return 2<<10 + i*997%(18<<10)
	}
	value := func(i int) []byte {
		return bytes.Repeat(fmt.Appendf(nil, "%06d-", i), size(i)/7+1)[:size(i)]
	}
	cfg := largeValuesTopic(ctx, t, "compressed", kgo.Zstd, n, value)
	d, err := cfg.dialer()
	if err != nil {
		t.Fatal(err)
	}
	again := &partitionRecords{c: &Consumer{cfg: cfg, dialer: d}}
	for _, from := range []int64{0, 120, 300, 301} {
		s := &source{topic: cfg.Topic, chunks: make(chan ingest.Chunk, 4)}
		s.arenas.free = make(chan []byte, 2)
		next := from
		fetchAll(ctx, t, cfg, s, again, from, n, func(r ingest.Raw) {
			if r.Source.Offset != next || !bytes.Equal(r.Data, value(int(next))) {
				t.Fatalf("from offset %d: record at offset %d (%d bytes, %.8q), want value %d (%d bytes)", from, r.Source.Offset, len(r.Data), r.Data, next, size(int(next)))
			}
			next++
		})
	}
}

// largeValuesTopic creates a topic of one partition that takes values of
// up to 16 MiB and writes n values to it, in one batch compressed with
// codec (0: none), and returns its config; the topic is deleted when t
// ends.
func largeValuesTopic(ctx context.Context, t *testing.T, name string, codec kgo.Compression, n int, value func(int) []byte) Config {
	t.Helper()
	brokers := os.Getenv("RLLM_PIPE_KAFKA_BROKERS")
	if brokers == "" {
		t.Skip("RLLM_PIPE_KAFKA_BROKERS not set: run `make test` (it starts Kafka)")
	}
	cfg := Config{Brokers: strings.Split(brokers, ","), Topic: fmt.Sprintf("%s-%d", name, time.Now().UnixNano())}
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
	t.Cleanup(func() { DeleteTopics(context.Background(), cfg, cfg.Topic) })
	transport := &kgo.Transport{}
	defer transport.CloseIdleConnections()
	w := &kgo.Writer{Addr: kgo.TCP(cfg.Brokers...), Topic: cfg.Topic, Transport: transport,
		BatchBytes: 16 << 20, BatchSize: n, RequiredAcks: kgo.RequireAll, Compression: codec}
	defer w.Close()
	msgs := make([]kgo.Message, n)
	for i := range msgs {
		msgs[i].Value = value(i)
	}
	// A new topic's metadata may reach the broker a writer asks a moment
	// after its leaders are known.
	for err := w.WriteMessages(ctx, msgs...); err != nil; err = w.WriteMessages(ctx, msgs...) {
		if !errors.Is(err, kgo.UnknownTopicOrPartition) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cfg
}

// fetchAll runs s.fetch on partition 0 of cfg's topic from offset from
// until records up to offset until (excluded) came, handing each to check,
// and releasing each chunk once checked, as the decoder does (the next
// chunks reuse its arena).
func fetchAll(ctx context.Context, t *testing.T, cfg Config, s *source, again ingest.Rereader, from, until int64, check func(ingest.Raw)) {
	t.Helper()
	d, err := cfg.dialer()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := WithReadBuffer(d).DialLeader(ctx, "tcp", cfg.Brokers[0], cfg.Topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fetchCtx, end := context.WithCancel(ctx)
	fetched := make(chan error, 1)
	go func() {
		var lag atomic.Int64
		_, _, err := s.fetch(fetchCtx, conn, 0, again, from, &lag)
		fetched <- err
	}()
	defer func() { end(); <-fetched }()
	for next := from; next < until; {
		select {
		case c := <-s.chunks:
			for _, r := range c.Records {
				check(r)
				next = r.Source.Offset + 1
			}
			if c.Release != nil {
				c.Release()
			}
		case err := <-fetched:
			t.Fatalf("the fetch ended before offset %d: %v", next, err)
		case <-ctx.Done():
			t.Fatalf("the fetch did not reach offset %d", next)
		}
	}
}
