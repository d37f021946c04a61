package kafka

import (
	"context"
	"errors"
	"fmt"
	"time"

	kgo "github.com/segmentio/kafka-go"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// Keyed is one wire record (a JSON line without its newline) and the key
// that keeps its group in one partition.
type Keyed struct {
	Key  string
	Line []byte
}

// OutputOptions tune an Output; zero values take the defaults.
type OutputOptions struct {
	// BatchTimeout is how long a partition's batch waits for more records
	// before it is sent (default 5ms): the latency a lone Write adds.
	BatchTimeout time.Duration
	// BatchBytes bounds one request to a partition (default 1 MiB, the
	// broker's default message.max.bytes).
	BatchBytes int64
	// MaxAttempts bounds the sends of one batch to a failing broker
	// (default 3); the Write's ctx bounds the whole.
	MaxAttempts int
}

// Output is the capture gateway's Kafka output: it produces records to
// cfg.Topic keyed by their group (a hash balancer, so a group stays in one
// partition and with one ingest worker), waiting for every in-sync
// replica (acks=all). Concurrent Writes share the producer's batches, so
// many small Writes make few requests. Safe for concurrent use.
//
// A Write returns once every record is acknowledged, or with an error
// when one is not (the broker is down past MaxAttempts, or ctx ended): the
// records may then still reach the topic (the producer is not idempotent),
// so a caller that retries may double one, which ingest drops as a
// duplicate (same id, same content).
type Output struct {
	w          *kgo.Writer
	one        *kgo.Writer // batches of one message: writeAlone's
	tr         *kgo.Transport
	topic      string
	batchBytes int64
}

// RecordError is a Write's refusal of one of its records, which no retry
// can produce: larger than a request to a partition (OutputOptions.
// BatchBytes) or than the topic takes (the broker's message.max.bytes).
// Index is its place in the Write's records. The Write's other records
// may have been produced.
type RecordError struct {
	Index  int
	Reason string // too_large
	Err    error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("kafka: record %d refused (%s): %v", e.Index, e.Reason, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// messageOverhead is what kafka-go counts for a message besides its key
// and value when it checks a message against BatchBytes (Message.totalSize:
// sizes, attributes, timestamp, and one byte for no headers).
const messageOverhead = 4 + 1 + 1 + 4 + 4 + 8 + 1

// MaxRecordBytes is the longest line a Write takes with a key of up to
// 4 KiB (a group or task id); a longer one is a RecordError.
func (o *Output) MaxRecordBytes() int { return max(1, int(o.batchBytes)-messageOverhead-4096) }

// NewOutput returns an Output to cfg.Topic, with TLS and SASL from cfg.
// It does not create the topic (EnsureTopic does).
func NewOutput(cfg Config, o OutputOptions) (*Output, error) {
	d, err := cfg.dialer()
	if err != nil {
		return nil, err
	}
	if o.BatchTimeout <= 0 {
		o.BatchTimeout = 5 * time.Millisecond
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = 1 << 20
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	tr := &kgo.Transport{TLS: d.TLS, SASL: d.SASLMechanism, DialTimeout: d.Timeout}
	writer := func(batch int) *kgo.Writer {
		return &kgo.Writer{
			Addr:                   kgo.TCP(cfg.Brokers...),
			Topic:                  cfg.Topic,
			Balancer:               &kgo.Hash{},
			RequiredAcks:           kgo.RequireAll,
			BatchSize:              batch,
			BatchBytes:             o.BatchBytes,
			BatchTimeout:           o.BatchTimeout,
			MaxAttempts:            o.MaxAttempts,
			AllowAutoTopicCreation: true,
			Transport:              tr,
		}
	}
	return &Output{topic: cfg.Topic, tr: tr, batchBytes: o.BatchBytes, w: writer(10000), one: writer(1)}, nil
}

// Write produces recs and returns once the broker acknowledged all of
// them (acks=all), or ctx ended. A record without a key is keyed by its
// group_id or task_id (Key).
func (o *Output) Write(ctx context.Context, recs []Keyed) error {
	if len(recs) == 0 {
		return nil
	}
	var d ingest.Decoder
	msgs := make([]kgo.Message, len(recs))
	for i, r := range recs {
		key := []byte(r.Key)
		if len(key) == 0 {
			key = Key(&d, r.Line)
		}
		msgs[i] = kgo.Message{Key: key, Value: r.Line}
		if size := int64(len(key) + len(r.Line) + messageOverhead); size > o.batchBytes {
			return &RecordError{Index: i, Reason: "too_large", Err: fmt.Errorf("%d bytes with its key, more than a request's %d (%w)", size, o.batchBytes, kgo.MessageSizeTooLarge)}
		}
	}
	if err := o.w.WriteMessages(ctx, msgs...); err != nil {
		if sizeRefused(err) {
			// The broker refuses a whole partition batch for one message
			// over the topic's max.message.bytes: which one is learnt
			// by sending them one at a time.
			return o.writeAlone(ctx, msgs)
		}
		if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
			err = fmt.Errorf("%w (%v)", ctxErr, err)
		}
		return fmt.Errorf("kafka: produce to %s: %w", o.topic, err)
	}
	return nil
}

// sizeRefused reports whether a WriteErrors holds a message refused as too
// large.
func sizeRefused(err error) bool {
	if errors.Is(err, kgo.MessageSizeTooLarge) || errors.Is(err, kgo.RecordListTooLarge) {
		return true
	}
	var we kgo.WriteErrors
	if !errors.As(err, &we) {
		return false
	}
	for _, e := range we {
		if e != nil && (errors.Is(e, kgo.MessageSizeTooLarge) || errors.Is(e, kgo.RecordListTooLarge)) {
			return true
		}
	}
	return false
}

// writeAlone sends msgs one at a time, after a batch failed on a message
// too large, through a writer whose batches hold one message (concurrent
// Writes share batches: through the main writer a message sent alone
// could still share a batch with another Write's oversized one and be
// refused with it). The first refused is the RecordError (those before it
// are produced, perhaps twice: ingest drops the copy). When every message
// passes alone, the one to blame was another Write's: this Write
// succeeded after all.
func (o *Output) writeAlone(ctx context.Context, msgs []kgo.Message) error {
	for i := range msgs {
		err := o.one.WriteMessages(ctx, msgs[i])
		if err == nil {
			continue
		}
		if sizeRefused(err) {
			return &RecordError{Index: i, Reason: "too_large", Err: fmt.Errorf("%s: refused as too large: %w", o.topic, err)}
		}
		return fmt.Errorf("kafka: produce to %s: %w", o.topic, err)
	}
	return nil
}

// Close flushes what is batched and closes the producer. Safe to call
// twice.
func (o *Output) Close() error {
	err := errors.Join(o.w.Close(), o.one.Close())
	o.tr.CloseIdleConnections() // the writer closes only a transport of its own
	if err != nil {
		return fmt.Errorf("kafka: close output to %s: %w", o.topic, err)
	}
	return nil
}
