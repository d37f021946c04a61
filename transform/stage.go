package transform

import (
	"context"
	"fmt"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// DeadLetters receives what the stage will not write: dead letters, and
// the positions of records dropped as producer retries. Both are settled
// once the receiver has made them durable (see sink.Settler).
type DeadLetters interface {
	Write(ctx context.Context, letters []schemas.DeadLetter, dropped []schemas.Source) error
}

// StageConfig configures Stage.
type StageConfig struct {
	Assembler Config
	// BatchRows is the number of rows gathered before a batch is built.
	// Default 2048 (about 7 MB of Arrow buffers with 512+256-token steps).
	BatchRows int
	// BatchBytes cuts a batch sooner, once its records as received reach
	// this many bytes, so that long rows (8k-token responses are 160 KB
	// of JSON each) do not make batches of hundreds of megabytes, several
	// of which are in flight between here and the encoders. Default
	// DefaultBatchBytes; at most maxBatchBytes.
	BatchBytes int
	// Tick is how often timeouts are checked and pending groups flushed.
	// Default 1 s.
	Tick time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Stopped, if set, tells a closed input from a stop: when it reports
	// true as in closes, open groups are dropped (they were not committed
	// and will be assembled again on the next run) instead of being closed
	// as at the end of the input.
	Stopped func() bool
	// Observe, if set, receives the counters and the number of open groups
	// after every input batch and tick (for metrics); it runs on the
	// stage's goroutine and must not block.
	Observe func(c Counters, openGroups int)
}

// DefaultBatchBytes is StageConfig.BatchBytes's default. Rows of the
// default benchmark shape (about 9 KB as received) fill it at about 1,800,
// near BatchRows; rows of 8k-token responses at about 100. The few batches
// in flight between the stage and the encoders then stay far below the
// ingest's memory limit whatever the rows' length.
const DefaultBatchBytes = 16 << 20

// maxBatchBytes caps the raw bytes gathered into one batch, so that Arrow's
// 32-bit string and list offsets never overflow on huge records.
const maxBatchBytes = 256 << 20

// Stage assembles the decoded batches from in, sends Arrow batches of
// emitted groups to out, and dead letters to dl. When in is closed (the
// end of a finite input) it closes every open group, flushes, and closes
// out. It returns the assembler's counters.
//
// Sends to out block (backpressure): a slow sink pauses assembly, which
// pauses decoding and reading.
func Stage(ctx context.Context, in <-chan ingest.Batch, out chan<- Batch, dl DeadLetters, bt *Batcher, cfg StageConfig) (c Counters, err error) {
	defer func() {
		if err == nil {
			close(out)
		}
	}()
	if cfg.BatchRows <= 0 {
		cfg.BatchRows = 2048
	}
	if cfg.BatchBytes <= 0 {
		cfg.BatchBytes = DefaultBatchBytes
	}
	cfg.BatchBytes = min(cfg.BatchBytes, maxBatchBytes)
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := NewAssembler(cfg.Assembler)
	var pending []*Group
	rows, bytes := 0, 0

	collect := func() error {
		if cfg.Observe != nil {
			cfg.Observe(a.Counters, a.OpenGroups())
		}
		o := a.Take()
		if err := o.ReadRecords(ctx); err != nil {
			return err
		}
		if err := dl.Write(ctx, o.Dead, o.Dropped); err != nil {
			return fmt.Errorf("write dead letters: %w", err)
		}
		for _, g := range o.Groups {
			pending = append(pending, g)
			rows += g.Rows()
			bytes += g.rawBytes()
		}
		return nil
	}
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		batches, err := bt.Build(pending)
		if err != nil {
			return err
		}
		pending, rows, bytes = pending[:0], 0, 0
		for i, b := range batches {
			select {
			case out <- b:
			case <-ctx.Done():
				for _, r := range batches[i:] {
					r.Record.Release()
				}
				return ctx.Err()
			}
		}
		return nil
	}

	t := time.NewTicker(cfg.Tick)
	defer t.Stop()
	for {
		select {
		case b, ok := <-in:
			if !ok {
				if cfg.Stopped == nil || !cfg.Stopped() {
					a.Flush()
				}
				if err := collect(); err != nil {
					return a.Counters, err
				}
				return a.Counters, flush()
			}
			a.Counters.Blank += b.Blank
			now := cfg.Now()
			for i := range b.Items {
				a.Add(&b.Items[i], now)
			}
			if err := collect(); err != nil {
				return a.Counters, err
			}
			if rows >= cfg.BatchRows || bytes >= cfg.BatchBytes {
				if err := flush(); err != nil {
					return a.Counters, err
				}
			}
		case <-t.C:
			a.Expire(cfg.Now())
			if err := collect(); err != nil {
				return a.Counters, err
			}
			if err := flush(); err != nil {
				return a.Counters, err
			}
		case <-ctx.Done():
			return a.Counters, ctx.Err()
		}
	}
}
