// Package gatewayout opens where the capture gateway's records go (a
// gateway.Output) from a --to URL: a Kafka topic, a local record log, or a
// shard root with ingest's pipeline running in-process over a write-ahead
// log (the embedded default).
//
// It is the only gateway package that imports connectors and the pipeline
// runtime (connectors/pipeline): the gateway core (ingest/gateway) takes
// its Output injected and must not. Command-line concerns (flags, usage
// messages, exit codes) stay in cmd/rllm-pipe; errors a user can fix by
// changing the target are wrapped with ErrUsage.
package gatewayout

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest/gateway"
)

// ErrUsage marks an error in the target or the options (a bad URL, a
// write-ahead log folder given where none is used), as opposed to a
// failure to reach it.
var ErrUsage = errors.New("usage")

// Output is a gateway.Output with what a command needs to stop it and
// report on it.
type Output interface {
	gateway.Output
	// String names the target for logs.
	String() string
	// Failed is closed when the output can no longer take records (the
	// in-process pipeline failed); Err says why. Nil for outputs that
	// cannot fail that way.
	Failed() <-chan struct{}
	Err() error
	// Summary is a line on what was written, for the log once stopped.
	Summary() string
	// MaxRecordBytes is the longest record line Write takes
	// (gateway.Config.MaxRecordBytes).
	MaxRecordBytes() int
}

// refused turns an output's refusal of one record into the gateway's
// (gateway.RefusedError), which the gateway answers with the record's stub
// instead of retrying the batch for ever.
func refused(err error) error {
	var le *recordlog.RecordError
	if errors.As(err, &le) {
		return &gateway.RefusedError{Index: le.Index, Reason: le.Reason, Err: err}
	}
	var ke *kafka.RecordError
	if errors.As(err, &ke) {
		return &gateway.RefusedError{Index: ke.Index, Reason: ke.Reason, Err: err}
	}
	return err
}

// Kind is what a --to URL names.
type Kind int

const (
	KindShardRoot Kind = iota // a path or s3://bucket/prefix: the pipeline runs in-process
	KindKafka                 // kafka://host:port/topic
	KindRecordLog             // PATH.jsonl
)

// KindOf classifies a --to URL.
func KindOf(to string) Kind {
	switch {
	case strings.HasPrefix(to, "kafka://"):
		return KindKafka
	case strings.HasSuffix(to, ".jsonl") && !strings.HasPrefix(to, "s3://"):
		return KindRecordLog
	}
	return KindShardRoot
}

// Options configure Open. Zero values take the documented defaults.
type Options struct {
	// Kafka completes a kafka:// target's configuration (TLS, SASL...);
	// nil takes it as parsed.
	Kafka func(kafka.Config) kafka.Config
	// KafkaPartitions is the partition count of a topic Open creates
	// (default 8).
	KafkaPartitions int
	// RetryFor bounds how long Open retries an unreachable Kafka while
	// creating the topic (default 1m); Stop, when closed (the first
	// signal), ends Open's retries at once.
	RetryFor time.Duration
	Stop     <-chan struct{}
	// MaxRecordBytes is the longest line a record log or the write-ahead
	// log takes (default 16 MiB).
	MaxRecordBytes int
	// Root completes a shard root's location (S3 endpoint, region).
	Root connectors.Options
	// WALDir is the write-ahead log folder of an s3:// shard root (default:
	// under the user cache folder, named after the target; see WALDir). A
	// local shard root keeps it under <root>/_gateway/ and refuses one.
	WALDir string
	// WALFileBytes rotates the write-ahead log's files (default 64 MiB).
	WALFileBytes int64
	// Pipeline configures the in-process pipeline of a shard root; RunID
	// names its writer in the store.
	Pipeline pipeline.Config
	RunID    string
}

func (o *Options) defaults() {
	if o.KafkaPartitions <= 0 {
		o.KafkaPartitions = 8
	}
	if o.RetryFor <= 0 {
		o.RetryFor = time.Minute
	}
	if o.MaxRecordBytes <= 0 {
		o.MaxRecordBytes = 16 << 20
	}
	if o.WALFileBytes <= 0 {
		o.WALFileBytes = 64 << 20
	}
	if o.Kafka == nil {
		o.Kafka = func(c kafka.Config) kafka.Config { return c }
	}
}

// Open opens the output to. ctx bounds the output's life: for a shard
// root, the in-process pipeline stops at once when it ends (a second
// signal); Close is the orderly stop. Open blocks while it creates a
// Kafka topic or opens the store (retried within RetryFor, or until Stop).
func Open(ctx context.Context, to string, o Options) (Output, error) {
	o.defaults()
	switch KindOf(to) {
	case KindKafka:
		return openKafka(ctx, to, o)
	case KindRecordLog:
		path, err := connectors.LocalPath(to)
		if err != nil {
			return nil, fmt.Errorf("%w: --to %v", ErrUsage, err)
		}
		l, err := recordlog.Open(path, recordlog.Options{MaxRecordBytes: o.MaxRecordBytes})
		if err != nil {
			return nil, err
		}
		return &logOutput{l: l, max: o.MaxRecordBytes}, nil
	default:
		return openFeed(ctx, to, o)
	}
}

func openKafka(ctx context.Context, to string, o Options) (Output, error) {
	cfg, err := kafka.ParseURL(to)
	if err != nil {
		return nil, fmt.Errorf("%w: --to: %v", ErrUsage, err)
	}
	cfg = o.Kafka(cfg)
	ectx, cancel := context.WithTimeout(ctx, o.RetryFor)
	defer cancel()
	if err := kafka.EnsureTopic(store.WithRetryStop(ectx, o.Stop), cfg, o.KafkaPartitions, 1); err != nil {
		return nil, err
	}
	out, err := kafka.NewOutput(cfg, kafka.OutputOptions{})
	if err != nil {
		return nil, err
	}
	return &kafkaOutput{out: out, name: cfg.String()}, nil
}

// WALDir is the write-ahead log folder of the shard root to: <root>/_gateway
// for a local root (which refuses dir), else dir, else a folder under the
// user cache folder named after to, so that a restart with the same --to
// finds the log it left.
func WALDir(to string, root connectors.Root, dir string) (string, error) {
	switch {
	case root.S3 == nil && dir != "":
		return "", fmt.Errorf("%w: --wal-dir: a local --to keeps its write-ahead log under <to>/_gateway/", ErrUsage)
	case root.S3 == nil:
		return filepath.Join(root.Path, "_gateway"), nil
	case dir != "":
		p, err := connectors.LocalPath(dir)
		if err != nil {
			return "", fmt.Errorf("%w: --wal-dir %v", ErrUsage, err)
		}
		return p, nil
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("%w: --wal-dir: no user cache folder (%v): name one", ErrUsage, err)
	}
	sum := sha256.Sum256([]byte(to))
	return filepath.Join(cache, "rllm-pipe", "gateway", hex.EncodeToString(sum[:8])), nil
}

// openFeed opens a shard root with its write-ahead log and starts the
// pipeline over it.
func openFeed(ctx context.Context, to string, o Options) (Output, error) {
	root, err := connectors.ParseRoot(to, o.Root)
	if err != nil {
		return nil, fmt.Errorf("%w: --to: %v", ErrUsage, err)
	}
	walDir, err := WALDir(to, root, o.WALDir)
	if err != nil {
		return nil, err
	}
	st, err := connectors.OpenStore(store.WithRetryStop(ctx, o.Stop), root, o.RunID)
	if err != nil {
		return nil, err
	}
	l, err := recordlog.Open(filepath.Join(walDir, "wal.jsonl"), recordlog.Options{MaxFileBytes: o.WALFileBytes, MaxRecordBytes: o.MaxRecordBytes})
	if err != nil {
		st.Close()
		return nil, err
	}
	dl := st.DeadLetters()
	pl := pipeline.New(o.Pipeline, st, dl)
	// The pipeline lives until Close or ctx (a second signal), not the
	// first signal: Close stops it after the output is flushed.
	feed, err := pl.Feed(ctx, l, pipeline.FeedOptions{RetryStop: o.Stop})
	if err != nil {
		l.Close()
		st.Close()
		return nil, err
	}
	return &feedOutput{feed: feed, st: st, dl: dl, pl: pl, name: st.Name(), wal: walDir, max: o.MaxRecordBytes}, nil
}

// lines are the records' lines (the log and the pipeline key nothing:
// the assembler groups).
func lines(recs []gateway.Record) [][]byte {
	out := make([][]byte, len(recs))
	for i, r := range recs {
		out[i] = r.Line
	}
	return out
}

// kafkaOutput produces each record keyed by its group (acks=all).
type kafkaOutput struct {
	out  *kafka.Output
	name string
}

func (k *kafkaOutput) Write(ctx context.Context, recs []gateway.Record) error {
	msgs := make([]kafka.Keyed, len(recs))
	for i, r := range recs {
		msgs[i] = kafka.Keyed{Key: r.Key, Line: r.Line}
	}
	return refused(k.out.Write(ctx, msgs))
}
func (k *kafkaOutput) MaxRecordBytes() int     { return k.out.MaxRecordBytes() }
func (k *kafkaOutput) Close() error            { return k.out.Close() }
func (k *kafkaOutput) String() string          { return k.name }
func (k *kafkaOutput) Failed() <-chan struct{} { return nil }
func (k *kafkaOutput) Err() error              { return nil }
func (k *kafkaOutput) Summary() string         { return "records produced to " + k.name }

// logOutput appends to a record log, fsynced in groups.
type logOutput struct {
	l   *recordlog.Log
	max int
}

func (o *logOutput) Write(ctx context.Context, recs []gateway.Record) error {
	return refused(o.l.Write(ctx, lines(recs)))
}
func (o *logOutput) MaxRecordBytes() int     { return o.max }
func (o *logOutput) Close() error            { return o.l.Close() }
func (o *logOutput) String() string          { return o.l.Path() }
func (o *logOutput) Failed() <-chan struct{} { return nil }
func (o *logOutput) Err() error              { return nil }
func (o *logOutput) Summary() string {
	return fmt.Sprintf("record log %s (%d group commits)", o.l.Path(), o.l.Commits())
}

// feedOutput writes to the write-ahead log the in-process pipeline follows.
type feedOutput struct {
	feed      *pipeline.Feed
	st        store.Store
	dl        store.DeadLetters
	pl        *pipeline.Pipeline
	name, wal string
	max       int
}

func (o *feedOutput) Write(ctx context.Context, recs []gateway.Record) error {
	return refused(o.feed.Write(ctx, lines(recs)))
}
func (o *feedOutput) MaxRecordBytes() int { return o.max }

// Close flushes the write-ahead log, stops the pipeline (complete groups
// committed, open ones left in the log) and closes the store.
func (o *feedOutput) Close() error {
	err := o.feed.Close()
	return errors.Join(err, o.dl.Close(), o.st.Close())
}
func (o *feedOutput) String() string          { return o.name + " (write-ahead log " + o.wal + ")" }
func (o *feedOutput) Failed() <-chan struct{} { return o.feed.Done() }
func (o *feedOutput) Err() error              { return o.feed.Err() }
func (o *feedOutput) Summary() string {
	r := o.pl.Result()
	return fmt.Sprintf("%d groups, %d rows in %d shards (groups still open stay in the write-ahead log)", r.GroupsEmitted, r.Rows, r.Shards)
}
