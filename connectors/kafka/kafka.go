// Package kafka is the Kafka edge of the pipeline (segmentio/kafka-go is
// imported here only): a consumer-group source whose per-partition start
// offsets come from the manifest (the source of truth), not from Kafka's
// committed offsets, and a producer that keys records by their group so
// that a group never straddles partitions or workers. Each record the
// source hands on refers to itself (partition, offset), and is read
// again (reread.go) only if it ends as a dead letter.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	kgo "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Config locates a topic. TLS and SASL come from flags or the environment
// (RLLM_PIPE_KAFKA_TLS=1, RLLM_PIPE_KAFKA_SASL_MECHANISM=PLAIN|SCRAM-SHA-256|SCRAM-SHA-512,
// RLLM_PIPE_KAFKA_SASL_USERNAME, RLLM_PIPE_KAFKA_SASL_PASSWORD); secrets are never
// logged.
type Config struct {
	Brokers []string
	Topic   string
	Group   string
	TLS     bool
	SASL    string
	User    string
	Pass    string
}

// String describes the location without secrets.
func (c Config) String() string {
	return fmt.Sprintf("kafka://%s/%s?group=%s", strings.Join(c.Brokers, ","), c.Topic, c.Group)
}

// ParseURL reads kafka://host:port[,host:port]/topic[?group=NAME].
func ParseURL(raw string) (Config, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "kafka" || u.Host == "" {
		return Config{}, fmt.Errorf("kafka: %q is not kafka://host:port/topic", raw)
	}
	topic := strings.Trim(u.Path, "/")
	if topic == "" || strings.Contains(topic, "/") {
		return Config{}, fmt.Errorf("kafka: %q names no single topic", raw)
	}
	c := Config{
		Brokers: strings.Split(u.Host, ","),
		Topic:   topic,
		Group:   u.Query().Get("group"),
		TLS:     os.Getenv("RLLM_PIPE_KAFKA_TLS") == "1" || u.Query().Get("tls") == "1",
		SASL:    os.Getenv("RLLM_PIPE_KAFKA_SASL_MECHANISM"),
		User:    os.Getenv("RLLM_PIPE_KAFKA_SASL_USERNAME"),
		Pass:    os.Getenv("RLLM_PIPE_KAFKA_SASL_PASSWORD"),
	}
	return c, nil
}

func (c Config) dialer() (*kgo.Dialer, error) {
	d := &kgo.Dialer{Timeout: 10 * time.Second, DualStack: true}
	if c.TLS {
		d.TLS = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	switch strings.ToUpper(c.SASL) {
	case "":
	case "PLAIN":
		d.SASLMechanism = plain.Mechanism{Username: c.User, Password: c.Pass}
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		algo := scram.SHA256
		if strings.HasSuffix(strings.ToUpper(c.SASL), "512") {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, c.User, c.Pass)
		if err != nil {
			return nil, fmt.Errorf("kafka: sasl: %w", err)
		}
		d.SASLMechanism = m
	default:
		return nil, fmt.Errorf("kafka: unknown SASL mechanism %q", c.SASL)
	}
	return d, nil
}

// Stream is the exactly-once stream name of a partition.
func Stream(topic string, partition int) string {
	return topic + "/" + strconv.Itoa(partition)
}

// Consumer runs consumer-group generations.
type Consumer struct {
	cfg    Config
	dialer *kgo.Dialer
	// fetcher dials the partitions' fetch connections: dialer's settings,
	// with a large read buffer under kafka-go's own (see bufferedConn).
	fetcher *kgo.Dialer
	group   *kgo.ConsumerGroup
}

// NewConsumer joins cfg.Group (required) on cfg.Topic.
func NewConsumer(cfg Config) (*Consumer, error) {
	if cfg.Group == "" {
		return nil, errors.New("kafka: --from kafka://.../topic needs ?group=NAME")
	}
	d, err := cfg.dialer()
	if err != nil {
		return nil, err
	}
	g, err := kgo.NewConsumerGroup(kgo.ConsumerGroupConfig{
		ID:                cfg.Group,
		Brokers:           cfg.Brokers,
		Dialer:            d,
		Topics:            []string{cfg.Topic},
		StartOffset:       kgo.FirstOffset,
		SessionTimeout:    6 * time.Second,
		RebalanceTimeout:  10 * time.Second,
		HeartbeatInterval: time.Second,
		JoinGroupBackoff:  time.Second,
		Timeout:           10 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("kafka: join group %s: %w", cfg.Group, err)
	}
	return &Consumer{cfg: cfg, dialer: d, fetcher: WithReadBuffer(d), group: g}, nil
}

// Close leaves the group.
func (c *Consumer) Close() error { return c.group.Close() }

// Generation is one assignment of partitions to this member. It ends on a
// rebalance; everything not committed by then is left to the next owner.
type Generation struct {
	c          *Consumer
	gen        *kgo.Generation
	Partitions []int
}

// TransientWait bounds how long Next keeps waiting through errors the
// broker calls temporary (a coordinator not yet elected, the offsets topic
// still being created on a fresh broker, a group loading) before it
// returns the last one.
const TransientWait = time.Minute

// Next blocks until this member is given its next assignment. The group
// retries a failed join itself (after JoinGroupBackoff) and reports each
// failure; temporary ones are waited through for up to TransientWait.
func (c *Consumer) Next(ctx context.Context) (*Generation, error) {
	var since time.Time
	var g *kgo.Generation
	for {
		var err error
		g, err = c.group.Next(ctx)
		if err == nil {
			break
		}
		var kerr kgo.Error
		if ctx.Err() != nil || !errors.As(err, &kerr) || !kerr.Temporary() {
			return nil, fmt.Errorf("kafka: next generation: %w", err)
		}
		if since.IsZero() {
			since = time.Now()
		} else if time.Since(since) >= TransientWait {
			return nil, fmt.Errorf("kafka: next generation: still failing after %s: %w", TransientWait, err)
		}
	}
	out := &Generation{c: c, gen: g}
	for _, a := range g.Assignments[c.cfg.Topic] {
		out.Partitions = append(out.Partitions, a.ID)
	}
	return out, nil
}

// ID is the consumer-group generation; later generations have larger IDs.
func (g *Generation) ID() int64 { return int64(g.gen.ID) }

// Streams names the generation's partitions as exactly-once streams.
func (g *Generation) Streams() []string {
	var s []string
	for _, p := range g.Partitions {
		s = append(s, Stream(g.c.cfg.Topic, p))
	}
	return s
}

// FirstOffsets returns the oldest offset still in each partition.
func (g *Generation) FirstOffsets(ctx context.Context) (map[int]int64, error) {
	out := map[int]int64{}
	for _, p := range g.Partitions {
		var conn *kgo.Conn
		var err error
		for _, b := range g.c.cfg.Brokers { // any broker can point at the leader
			if conn, err = g.c.dialer.DialLeader(ctx, "tcp", b, g.c.cfg.Topic, p); err == nil {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("kafka: leader of %s: %w", Stream(g.c.cfg.Topic, p), err)
		}
		// A broker that stops answering fails the lookup, not hangs it.
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		first, err := conn.ReadFirstOffset()
		conn.Close()
		if err != nil {
			return nil, fmt.Errorf("kafka: first offset of %s: %w", Stream(g.c.cfg.Topic, p), err)
		}
		out[p] = first
	}
	return out, nil
}

// ResumeOffset is the first position at or after first that settled does
// not contain: where a new owner starts reading a partition.
func ResumeOffset(settled schemas.Ranges, first int64) int64 {
	x := first
	for _, iv := range settled {
		if iv[1] < x {
			continue
		}
		if iv[0] > x {
			break
		}
		x = iv[1] + 1
	}
	return x
}

// Resume returns where each partition starts: its first offset not in
// settled (the positions the manifest settled) and still in the log.
// firsts are the partitions' oldest offsets (FirstOffsets).
func (g *Generation) Resume(settled schemas.Settled, firsts map[int]int64) map[int]int64 {
	start := make(map[int]int64, len(g.Partitions))
	for _, p := range g.Partitions {
		start[p] = ResumeOffset(settled[Stream(g.c.cfg.Topic, p)], firsts[p])
	}
	return start
}

// CommitOffsets records resume offsets in Kafka, as a hint for tools; the
// manifest stays the source of truth.
func (g *Generation) CommitOffsets(offsets map[int]int64) error {
	if len(offsets) == 0 {
		return nil
	}
	return g.gen.CommitOffsets(map[string]map[int]int64{g.c.cfg.Topic: offsets})
}

// Source reads the generation's partitions from the given offsets, all
// into one stream of chunks (records of a partition stay in order). It
// ends with kafka-go's ErrGenerationEnded on a rebalance.
//
// Each partition is read on its own connection to its leader, a fetch of
// up to FetchBytes at a time (Conn.ReadBatch), and every fetch is handed
// to the decoder in chunks of at most ChunkBytes: no per-message hop
// between goroutines. A partition holds at most two chunks that Read has
// not taken, so a slow pipeline pauses fetching; chunks are small so that
// those queued stay a small part of the heap.
// Connection failures are retried from the next offset with backoff (up
// to 5 s) until the generation ends.
func (g *Generation) Source(start map[int]int64) ingest.Source {
	s := &source{chunks: make(chan ingest.Chunk, 2*max(len(g.Partitions), 1)), errs: make(chan error, len(g.Partitions)+1),
		topic: g.c.cfg.Topic, lags: make([]atomic.Int64, len(g.Partitions))}
	// Arenas kept idle between chunks: a few more than the partitions
	// filling one at a time. A kept arena is live heap, which raises the
	// collector's goal and so the peak RSS (docs/performance.md#choices-behind-the-defaults, "Kafka values in
	// recycled arenas"): the pool stays small.
	s.arenas.free = make(chan []byte, len(g.Partitions)+4)
	// The end of the generation reaches Read even with no partition
	// assigned (more workers than partitions).
	g.gen.Start(func(ctx context.Context) {
		<-ctx.Done()
		s.errs <- kgo.ErrGenerationEnded
	})
	for i, p := range g.Partitions {
		g.gen.Start(func(ctx context.Context) {
			s.errs <- g.readPartition(ctx, s, p, start[p], &s.lags[i])
		})
	}
	return s
}

// FetchBytes is the most a partition's fetch asks the broker for;
// ChunkBytes the most a chunk handed to the decoder holds.
const (
	FetchBytes = 16 << 20
	ChunkBytes = 1 << 20
)

// fetchWait is how long the broker may hold a fetch of a partition with
// nothing new.
const fetchWait = 250 * time.Millisecond

// readPartition reads partition p from offset until ctx ends, redialling
// its leader after a failure. It returns ErrGenerationEnded once ctx is
// done, and otherwise never.
func (g *Generation) readPartition(ctx context.Context, s *source, p int, offset int64, lag *atomic.Int64) error {
	backoff := 100 * time.Millisecond
	again := &partitionRecords{c: g.c, p: p}
	for {
		conn, err := g.c.dialLeader(ctx, g.c.fetcher, p)
		if err == nil {
			var progressed bool
			offset, progressed, err = s.fetch(ctx, conn, p, again, offset, lag)
			conn.Close()
			if progressed {
				backoff = 100 * time.Millisecond
			}
		}
		if ctx.Err() != nil {
			return kgo.ErrGenerationEnded
		}
		s.retries.Add(1)
		slog.Warn("kafka: reading partition, retrying", "stream", Stream(s.topic, p), "offset", offset, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
			return kgo.ErrGenerationEnded
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// dialLeader connects to the leader of partition p through any broker,
// with d (the consumer's dialer or its fetcher).
func (c *Consumer) dialLeader(ctx context.Context, d *kgo.Dialer, p int) (*kgo.Conn, error) {
	var err error
	for _, b := range c.cfg.Brokers {
		var conn *kgo.Conn
		if conn, err = d.DialLeader(ctx, "tcp", b, c.cfg.Topic, p); err == nil {
			return conn, nil
		}
	}
	return nil, fmt.Errorf("kafka: leader of %s: %w", Stream(c.cfg.Topic, p), err)
}

// fetch reads batches from conn at offset and sends them as chunks until
// an error or the end of ctx; it returns the next offset to read. Each
// record refers to itself through again.
func (s *source) fetch(ctx context.Context, conn *kgo.Conn, p int, again ingest.Rereader, offset int64, lag *atomic.Int64) (next int64, progressed bool, err error) {
	// A call blocked on the broker ends with ctx. Every deadline set below
	// is followed by a check of ctx: an end that came before (while
	// records were taken from the read buffer, with no read to interrupt)
	// had its deadline overridden, and on an idle partition the loop would
	// fetch nothing for ever; an end that comes after moves the deadline
	// the next call uses.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // the seek asks the broker for the partition's bounds
	if err := ctx.Err(); err != nil {
		return offset, false, err
	}
	if _, err := conn.Seek(offset, kgo.SeekAbsolute); err != nil {
		return offset, false, fmt.Errorf("kafka: seek %s to %d: %w", Stream(s.topic, p), offset, err)
	}
	stream := Stream(s.topic, p)
	whole := false // the next value is read into a slice of its own
	for {
		if err := conn.SetDeadline(time.Now().Add(fetchWait + 30*time.Second)); err != nil {
			return offset, progressed, err
		}
		if err := ctx.Err(); err != nil {
			return offset, progressed, err
		}
		batch := conn.ReadBatchWith(kgo.ReadBatchConfig{MinBytes: 1, MaxBytes: FetchBytes, MaxWait: fetchWait})
		var c ingest.Chunk
		arena, size := s.arenas.get(), 0
		for {
			var value []byte
			var at int64
			inArena := !whole
			if whole {
				// The value that did not fit an arena, read into a slice of
				// its own (ReadMessage skips to the connection's offset,
				// which the failed Read left at that value).
				m, err := batch.ReadMessage()
				if err != nil {
					break
				}
				value, at, whole = m.Value, m.Offset, false
				s.arenas.fit(len(value))
			} else {
				n, err := batch.Read(arena[len(arena):cap(arena)])
				if errors.Is(err, io.ErrShortBuffer) {
					whole = true // the rest of this fetch is discarded and fetched again
					s.refetches.Add(1)
					break
				}
				if err != nil {
					break // io.EOF at the end of the batch; other errors come from Close
				}
				at = batch.Offset() - 1
				value = arena[len(arena) : len(arena)+n : len(arena)+n]
			}
			if at < offset {
				continue // a compressed batch may start before the offset asked for
			}
			if inArena {
				arena = arena[:len(arena)+len(value)]
			}
			c.Records = append(c.Records, ingest.Raw{Data: value,
				Source: schemas.Source{Stream: stream, Topic: s.topic, Partition: int32(p), Offset: at},
				Ref:    ingest.RawRef{From: again, Off: at, Len: len(value)}})
			offset = at + 1
			if size += len(value); size >= ChunkBytes || len(arena) >= ChunkBytes {
				c.Release = s.release(arena)
				if !s.send(ctx, c) {
					batch.Close()
					return offset, true, ctx.Err()
				}
				c, size, progressed = ingest.Chunk{}, 0, true
				arena = s.arenas.get()
			}
		}
		hw := batch.HighWaterMark()
		cerr := batch.Close()
		if whole && errors.Is(cerr, io.ErrShortBuffer) {
			cerr = nil // kafka-go kept the connection, at the value's offset
		}
		if len(c.Records) > 0 {
			c.Release = s.release(arena)
			if !s.send(ctx, c) {
				return offset, true, ctx.Err()
			}
			progressed = true
		} else {
			s.arenas.put(arena)
		}
		lag.Store(max(hw-offset, 0))
		if errors.Is(cerr, kgo.RequestTimedOut) {
			continue // nothing new within fetchWait: fetch again
		}
		if cerr != nil {
			return offset, progressed, fmt.Errorf("kafka: read %s: %w", stream, cerr)
		}
	}
}

// send hands c to Read; false when ctx ended first.
func (s *source) send(ctx context.Context, c ingest.Chunk) bool {
	if ctx.Err() != nil {
		return false
	}
	select {
	case s.chunks <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

type source struct {
	topic  string
	chunks chan ingest.Chunk
	errs   chan error
	lags   []atomic.Int64 // per partition, as of its last fetch
	// retries counts the partitions' reconnections after a failed fetch.
	retries atomic.Int64
	arenas  arenaPool
	// refetches counts the fetches cut short by a value larger than the
	// room left in an arena (fetched again, that value read whole).
	refetches atomic.Int64
}

// release returns a chunk's Release: arena back to the pool.
func (s *source) release(arena []byte) func() {
	return func() { s.arenas.put(arena) }
}

// Lag is how many records the generation's partitions hold beyond what
// has been read, as of each partition's last fetch.
func (s *source) Lag() int64 {
	var n int64
	for i := range s.lags {
		n += s.lags[i].Load()
	}
	return n
}

// ErrGenerationEnded is returned by a generation's source on a rebalance.
var ErrGenerationEnded = kgo.ErrGenerationEnded

// Read blocks for the next chunk of any partition: the records of one
// fetch (or a part of one of at most ChunkBytes).
func (s *source) Read(ctx context.Context) (ingest.Chunk, error) {
	select {
	case c := <-s.chunks:
		return c, nil
	case err := <-s.errs:
		return ingest.Chunk{}, err
	case <-ctx.Done():
		return ingest.Chunk{}, ctx.Err()
	}
}

func (s *source) Close() error { return nil }
