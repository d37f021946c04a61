package kafka

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"

	kgo "github.com/segmentio/kafka-go"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// DeadLetters sends dead letters to a Kafka topic (--dlq kafka://.../topic)
// as JSON lines, keyed by their source position ("<stream>@<position>").
// Letters are buffered and produced, waiting for all in-sync replicas, at
// each checkpoint, before the manifest entry that settles their records:
// a letter is never lost. A crash between the two makes the next owner
// dead-letter the record again: the topic is at-least-once, and the key
// tells a repeat from a new letter.
type DeadLetters struct {
	schemas.Ledger
	w    *kgo.Writer
	name string
	mu   sync.Mutex
	buf  []kgo.Message
}

// Name is the topic's URL.
func (d *DeadLetters) Name() string { return d.name }

// NewDeadLetters writes to cfg.Topic (created if missing).
func NewDeadLetters(ctx context.Context, cfg Config) (*DeadLetters, error) {
	if err := EnsureTopic(ctx, cfg, 1, 1); err != nil {
		return nil, err
	}
	p, err := NewProducer(cfg)
	if err != nil {
		return nil, err
	}
	p.w.Balancer = &kgo.LeastBytes{}
	return &DeadLetters{w: p.w, name: cfg.String()}, nil
}

// Write buffers letters and notes the positions of letters and dropped
// records as pending.
func (d *DeadLetters) Write(ctx context.Context, letters []schemas.DeadLetter, dropped []schemas.Source) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range letters {
		v, err := json.Marshal(l.Line())
		if err != nil {
			return fmt.Errorf("kafka: encode dead letter: %w", err)
		}
		key := l.Source.Stream + "@" + strconv.FormatInt(l.Source.Position(), 10)
		d.buf = append(d.buf, kgo.Message{Key: []byte(key), Value: v})
	}
	d.Note(letters, dropped)
	return nil
}

// Checkpoint produces the buffered letters and hands over the positions
// they, and the dropped records, settle.
func (d *DeadLetters) Checkpoint(ctx context.Context) (schemas.Settled, *schemas.DeadLetterState, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.buf) > 0 {
		if err := d.w.WriteMessages(ctx, d.buf...); err != nil {
			return nil, nil, fmt.Errorf("kafka: produce dead letters: %w", err)
		}
		d.buf = d.buf[:0]
	}
	return d.Take(), nil, nil
}

// Reset drops letters not yet checkpointed (a generation that ended: their
// records are the next owner's).
func (d *DeadLetters) Reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.buf = d.buf[:0]
	d.Drop()
}

// Close flushes nothing (Checkpoint does) and closes the writer.
func (d *DeadLetters) Close() error { return d.w.Close() }
