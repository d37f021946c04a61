package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	kgo "github.com/segmentio/kafka-go"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// Producer sends wire-format records to a topic, keyed by their group so
// that every record of a group lands in one partition (and so with one
// ingest worker). It is the Go API for rollout workers; `rllm-pipe produce`
// uses it too. Safe for concurrent use; every Send waits for all in-sync
// replicas.
//
// kafka-go's producer is not idempotent: a retried send may duplicate a
// record. Ingest drops such duplicates (same id, same content).
type Producer struct {
	w *kgo.Writer
}

// NewProducer writes to cfg.Topic, creating it if the broker allows.
func NewProducer(cfg Config) (*Producer, error) {
	d, err := cfg.dialer()
	if err != nil {
		return nil, err
	}
	tr := &kgo.Transport{TLS: d.TLS, SASL: d.SASLMechanism}
	return &Producer{w: &kgo.Writer{
		Addr:                   kgo.TCP(cfg.Brokers...),
		Topic:                  cfg.Topic,
		Balancer:               &kgo.Hash{},
		RequiredAcks:           kgo.RequireAll,
		BatchSize:              1000,
		BatchBytes:             1 << 20, // the broker's default message.max.bytes
		BatchTimeout:           20 * time.Millisecond,
		AllowAutoTopicCreation: true,
		Transport:              tr,
	}}, nil
}

// Key returns the partitioning key of a wire record: its group_id when
// set, else its task_id — not task_id:role, so that a record that omits
// the role (and inherits its trajectory's group) lands with the rest of
// its group; nil (any partition) for a record that does not decode.
func Key(d *ingest.Decoder, record []byte) []byte {
	rec, err := d.Decode(record)
	if err != nil {
		return nil
	}
	if s := rec.Step; s != nil {
		if s.GroupID != "" {
			return []byte(s.GroupID)
		}
		return []byte(s.TaskID)
	}
	if t := rec.Trajectory; t.GroupID != "" {
		return []byte(t.GroupID)
	}
	return []byte(rec.Trajectory.TaskID)
}

// Send writes records (one wire record each) and waits for the broker.
func (p *Producer) Send(ctx context.Context, records ...[]byte) error {
	var d ingest.Decoder
	msgs := make([]kgo.Message, len(records))
	for i, r := range records {
		msgs[i] = kgo.Message{Key: Key(&d, r), Value: r}
	}
	if err := p.w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("kafka: produce: %w", err)
	}
	return nil
}

// Close flushes and closes the producer.
func (p *Producer) Close() error { return p.w.Close() }

// EnsureTopic creates cfg.Topic with the given partitions if it does not
// exist (replication factor 1 unless replicas > 1).
func EnsureTopic(ctx context.Context, cfg Config, partitions, replicas int) error {
	conn, cc, done, err := dialController(ctx, cfg)
	if err != nil {
		return err
	}
	defer done()
	err = cc.CreateTopics(kgo.TopicConfig{Topic: cfg.Topic, NumPartitions: partitions, ReplicationFactor: max(replicas, 1)})
	if err != nil && !errors.Is(err, kgo.TopicAlreadyExists) {
		return fmt.Errorf("kafka: create topic %s: %w", cfg.Topic, err)
	}
	// Wait until every partition has a leader.
	deadline := time.Now().Add(leaderWait)
	for {
		parts, err := conn.ReadPartitions(cfg.Topic)
		ok := err == nil && len(parts) > 0
		for _, p := range parts {
			ok = ok && p.Leader.Host != ""
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kafka: topic %s has no leaders yet: %v", cfg.Topic, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafka: topic %s: waiting for leaders: %w", cfg.Topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// DeleteTopics deletes topics (for tests and benchmarks that clean up
// after themselves; a topic that does not exist is not an error).
func DeleteTopics(ctx context.Context, cfg Config, topics ...string) error {
	_, cc, done, err := dialController(ctx, cfg)
	if err != nil {
		return err
	}
	defer done()
	if err := cc.DeleteTopics(topics...); err != nil && !errors.Is(err, kgo.UnknownTopicOrPartition) {
		return fmt.Errorf("kafka: delete topics %v: %w", topics, err)
	}
	return nil
}

// leaderWait bounds EnsureTopic's wait for a new topic's leaders; adminWait
// bounds every call on an admin connection (kafka-go's Conn calls have no
// deadline of their own: a broker that accepts but never answers would
// hold them for ever).
const (
	leaderWait = 30 * time.Second
	adminWait  = leaderWait + 15*time.Second
)

// dialController connects to the first broker and to the cluster's
// controller (which creates and deletes topics). Calls on both fail once
// ctx ends or adminWait has passed; done closes them.
func dialController(ctx context.Context, cfg Config) (conn, ctrl *kgo.Conn, done func(), err error) {
	d, err := cfg.dialer()
	if err != nil {
		return nil, nil, nil, err
	}
	deadline := time.Now().Add(adminWait)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	var conns []*kgo.Conn
	var stops []func() bool
	done = func() {
		for i, c := range conns {
			stops[i]()
			c.Close()
		}
	}
	// bound sets c's deadline, then has the end of ctx move it to now (in
	// that order: an end that came already is not overridden).
	bound := func(c *kgo.Conn) {
		_ = c.SetDeadline(deadline)
		conns = append(conns, c)
		stops = append(stops, context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) }))
	}
	conn, err = d.DialContext(ctx, "tcp", cfg.Brokers[0])
	if err != nil {
		return nil, nil, nil, fmt.Errorf("kafka: dial %s: %w", cfg.Brokers[0], err)
	}
	bound(conn)
	c, err := conn.Controller()
	if err != nil {
		done()
		return nil, nil, nil, fmt.Errorf("kafka: controller: %w", err)
	}
	ctrl, err = d.DialContext(ctx, "tcp", net.JoinHostPort(c.Host, strconv.Itoa(c.Port)))
	if err != nil {
		done()
		return nil, nil, nil, fmt.Errorf("kafka: dial controller: %w", err)
	}
	bound(ctrl)
	return conn, ctrl, done, nil
}
