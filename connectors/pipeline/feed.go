package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// FeedOptions tune a Feed; zero values take the defaults.
type FeedOptions struct {
	// CatchUp bounds how long Close waits for the pipeline to take in the
	// log to its end before it stops (default 30s); what it did not take
	// is read on the next start.
	CatchUp time.Duration
	// PruneEvery is how often sealed log segments whose every record is
	// settled are removed (default 10s).
	PruneEvery time.Duration
	// RetryStop, when closed (the process's first signal), ends the
	// store's retries of commits and of the final sweep during an
	// outage; nil: they run for the store's own limit.
	RetryStop <-chan struct{}
}

// Feed runs the pipeline in-process over a write-ahead record log that
// grows while it runs: the capture gateway's shard-root output. Write
// appends to the log (durable once it returns); the pipeline follows the
// log's durable end (recordlog.Tail) and commits shards, with every
// segment's records settled in the manifest like a file's lines.
//
// On a restart over the same log and store nothing is lost or doubled:
// the tail reads again from the oldest segment left, and the positions a
// commit settled are skipped. Close stops as a soft stop of a file
// ingest: groups still open stay in the log, unsettled, and are assembled
// on the next start, never written as partial groups. Sealed segments are
// removed once every record in them is settled.
type Feed struct {
	p    *Pipeline
	log  *recordlog.Log
	tail *recordlog.Tail
	o    FeedOptions

	soft, hard context.CancelFunc
	done       chan struct{}
	err        error // set before done closes

	handed atomic.Int64 // records the tail handed out
	taken  atomic.Int64 // records the assembler took
	inner  Observer

	claimed map[string]bool // streams claimed; reading goroutine only

	pruneStop chan struct{}
	pruneDone chan struct{}
	pending   []recordlog.Passed // pruner only (then Close)

	once     sync.Once
	closeErr error
}

// Feed starts the pipeline over log, which it owns from now on (Close
// closes it). ctx ends the pipeline at once (a second signal); a failure
// of the pipeline ends it too (Done, Err), the log staying durable.
func (p *Pipeline) Feed(ctx context.Context, log *recordlog.Log, o FeedOptions) (*Feed, error) {
	if o.CatchUp <= 0 {
		o.CatchUp = 30 * time.Second
	}
	if o.PruneEvery <= 0 {
		o.PruneEvery = 10 * time.Second
	}
	f := &Feed{p: p, log: log, o: o, inner: p.cfg.Observer, done: make(chan struct{}), claimed: map[string]bool{},
		pruneStop: make(chan struct{}), pruneDone: make(chan struct{})}
	var streams []string
	for _, s := range log.Segments() {
		streams = append(streams, s.Stream)
		f.claimed[s.Stream] = true
	}
	if err := p.store.Claim(ctx, streams, 0); err != nil {
		return nil, fmt.Errorf("feed: claim the log's streams: %w", err)
	}
	f.tail = log.Tail(f.claim)
	p.cfg.Observer = feedObserver{f}
	hard, cancelHard := context.WithCancel(ctx)
	soft, cancelSoft := context.WithCancel(hard)
	f.hard, f.soft = cancelHard, cancelSoft
	go f.run(hard, soft)
	go f.pruner()
	return f, nil
}

// claim claims a segment's stream before its first record is read.
func (f *Feed) claim(ctx context.Context, s recordlog.Segment) error {
	if f.claimed[s.Stream] {
		return nil
	}
	if err := f.p.store.Claim(ctx, []string{s.Stream}, 0); err != nil {
		return fmt.Errorf("feed: claim %s: %w", s.Path, err)
	}
	f.claimed[s.Stream] = true
	return nil
}

func (f *Feed) run(hard, soft context.Context) {
	defer close(f.done)
	err := f.p.stages(hard, soft, countingSource{f.tail, &f.handed}, f.o.RetryStop)
	err = errors.Join(err, f.tail.Close())
	if err == nil {
		// The sweep only removes objects no manifest lists (invisible to
		// readers): a failure is logged, the data is whole.
		if serr := f.p.store.Sweep(store.WithRetryStop(hard, f.o.RetryStop)); serr != nil {
			f.p.cfg.Log.Warn("feed: sweeping unlisted objects", "err", serr)
		}
	}
	f.err = err
}

// Write appends lines to the log and returns once they are fsynced.
func (f *Feed) Write(ctx context.Context, lines [][]byte) error {
	return f.log.Write(ctx, lines)
}

// Done is closed when the pipeline ended: after Close, or on a failure
// (Err).
func (f *Feed) Done() <-chan struct{} { return f.done }

// Err is the pipeline's error once Done is closed.
func (f *Feed) Err() error {
	select {
	case <-f.done:
		return f.err
	default:
		return nil
	}
}

// Close closes the log (the Writes queued are committed first), lets the
// pipeline take in the log to its end (at most CatchUp), stops it softly
// (complete groups committed, open ones left in the log) and removes the
// segments settled. Safe to call twice.
func (f *Feed) Close() error {
	f.once.Do(func() {
		errLog := f.log.Close()
		end, _ := f.log.Durable()
		deadline := time.NewTimer(f.o.CatchUp)
		tick := time.NewTicker(5 * time.Millisecond)
	wait:
		for f.tail.Position() != end || f.taken.Load() < f.handed.Load() {
			select {
			case <-f.done:
				break wait
			case <-deadline.C:
				f.p.cfg.Log.Warn("feed: stopping before the pipeline took in the whole log; the rest is read on the next start")
				break wait
			case <-tick.C:
			}
		}
		deadline.Stop()
		tick.Stop()
		f.soft()
		<-f.done
		close(f.pruneStop)
		<-f.pruneDone
		f.hard()
		f.closeErr = errors.Join(errLog, f.err, f.prune())
	})
	return f.closeErr
}

// Abort stops the pipeline at once (what it did not commit is read again
// on the next start); Close still closes the log.
func (f *Feed) Abort() { f.hard() }

func (f *Feed) pruner() {
	defer close(f.pruneDone)
	t := time.NewTicker(f.o.PruneEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := f.prune(); err != nil {
				f.p.cfg.Log.Warn("feed: removing settled log segments", "err", err)
			}
		case <-f.pruneStop:
			return
		}
	}
}

// prune removes the segments the tail passed whose records are all
// settled.
func (f *Feed) prune() error {
	f.pending = append(f.pending, f.tail.Passed()...)
	if len(f.pending) == 0 {
		return nil
	}
	settled := f.p.store.Settled()
	var errs []error
	keep := f.pending[:0]
	for _, s := range f.pending {
		if !s.Settled(settled) {
			keep = append(keep, s)
			continue
		}
		if err := f.log.Remove(s.N); err != nil {
			errs = append(errs, err)
		}
	}
	f.pending = keep
	return errors.Join(errs...)
}

// countingSource counts the records a source hands out.
type countingSource struct {
	ingest.Source
	n *atomic.Int64
}

func (s countingSource) Read(ctx context.Context) (ingest.Chunk, error) {
	c, err := s.Source.Read(ctx)
	s.n.Add(int64(len(c.Records)))
	return c, err
}

// feedObserver notes the records the assembler took, then tells the
// pipeline's own observer.
type feedObserver struct{ f *Feed }

func (o feedObserver) Progress(c transform.Counters, open int) {
	o.f.taken.Store(c.Records)
	o.f.inner.Progress(c, open)
}
func (o feedObserver) Committed(rows int64, took time.Duration) { o.f.inner.Committed(rows, took) }
func (o feedObserver) Ended()                                   { o.f.inner.Ended() }
func (o feedObserver) Lag(fn func() int64)                      { o.f.inner.Lag(fn) }
