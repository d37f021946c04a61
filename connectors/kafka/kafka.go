// Package kafka is the Kafka edge of the pipeline (segmentio/kafka-go is
// imported here only): a consumer-group source whose per-partition start
// offsets come from the manifest (the source of truth), not from Kafka's
// committed offsets, and a producer that keys records by their group so
// that a group never straddles partitions or workers.
package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	kgo "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Config locates a topic. TLS and SASL come from flags or the environment
// (RLLM_KAFKA_TLS=1, RLLM_KAFKA_SASL_MECHANISM=PLAIN|SCRAM-SHA-256|SCRAM-SHA-512,
// RLLM_KAFKA_SASL_USERNAME, RLLM_KAFKA_SASL_PASSWORD); secrets are never
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
		TLS:     os.Getenv("RLLM_KAFKA_TLS") == "1" || u.Query().Get("tls") == "1",
		SASL:    os.Getenv("RLLM_KAFKA_SASL_MECHANISM"),
		User:    os.Getenv("RLLM_KAFKA_SASL_USERNAME"),
		Pass:    os.Getenv("RLLM_KAFKA_SASL_PASSWORD"),
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
	group  *kgo.ConsumerGroup
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
	return &Consumer{cfg: cfg, dialer: d, group: g}, nil
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

// Next blocks until this member is given its next assignment.
func (c *Consumer) Next(ctx context.Context) (*Generation, error) {
	g, err := c.group.Next(ctx)
	if err != nil {
		return nil, fmt.Errorf("kafka: next generation: %w", err)
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
func (g *Generation) Source(start map[int]int64) ingest.Source {
	s := &source{msgs: make(chan kgo.Message, 1024), errs: make(chan error, len(g.Partitions)+1), topic: g.c.cfg.Topic}
	s.readers = make([]*kgo.Reader, 0, len(g.Partitions))
	// The end of the generation reaches Read even with no partition
	// assigned (more workers than partitions).
	g.gen.Start(func(ctx context.Context) {
		<-ctx.Done()
		s.errs <- kgo.ErrGenerationEnded
	})
	for _, p := range g.Partitions {
		g.gen.Start(func(ctx context.Context) {
			r := kgo.NewReader(kgo.ReaderConfig{
				Brokers:   g.c.cfg.Brokers,
				Dialer:    g.c.dialer,
				Topic:     g.c.cfg.Topic,
				Partition: p,
				MinBytes:  1,
				MaxBytes:  16 << 20,
				MaxWait:   250 * time.Millisecond,
			})
			defer r.Close()
			s.mu.Lock()
			s.readers = append(s.readers, r)
			s.mu.Unlock()
			if err := r.SetOffset(start[p]); err != nil {
				s.errs <- err
				return
			}
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					if ctx.Err() != nil {
						s.errs <- kgo.ErrGenerationEnded
					} else {
						s.errs <- fmt.Errorf("kafka: read %s: %w", Stream(g.c.cfg.Topic, p), err)
					}
					return
				}
				select {
				case s.msgs <- m:
				case <-ctx.Done():
					s.errs <- kgo.ErrGenerationEnded
					return
				}
			}
		})
	}
	return s
}

type source struct {
	topic   string
	msgs    chan kgo.Message
	errs    chan error
	mu      sync.Mutex
	readers []*kgo.Reader
}

// Lag is how many records the generation's partitions hold beyond what
// has been read, as last reported by the readers.
func (s *source) Lag() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, r := range s.readers {
		n += max(r.Lag(), 0)
	}
	return n
}

// ErrGenerationEnded is returned by a generation's source on a rebalance.
var ErrGenerationEnded = kgo.ErrGenerationEnded

// Read blocks for the first message, then takes whatever else is ready
// (up to 1024 records or 4 MiB).
func (s *source) Read(ctx context.Context) (ingest.Chunk, error) {
	var c ingest.Chunk
	take := func(m kgo.Message) {
		c.Records = append(c.Records, ingest.Raw{
			Data: m.Value,
			Source: schemas.Source{
				Stream: Stream(m.Topic, m.Partition), Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset,
			},
		})
	}
	select {
	case m := <-s.msgs:
		take(m)
	case err := <-s.errs:
		return c, err
	case <-ctx.Done():
		return c, ctx.Err()
	}
	size := 0
	for len(c.Records) < 1024 && size < 4<<20 {
		select {
		case m := <-s.msgs:
			take(m)
			size += len(m.Value)
		default:
			return c, nil
		}
	}
	return c, nil
}

func (s *source) Close() error { return nil }
