package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// tracker counts outstanding work and lets callers wait for none. The zero
// value is ready.
type tracker struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n == 0
}

func (t *tracker) add(k int) {
	if k <= 0 {
		return // nothing outstanding: an idle channel made now would never close
	}
	t.mu.Lock()
	if t.n == 0 {
		t.idle = make(chan struct{})
	}
	t.n += k
	t.mu.Unlock()
}

func (t *tracker) done(k int) {
	t.mu.Lock()
	t.n -= k
	if t.n == 0 {
		close(t.idle)
		t.idle = nil
	}
	t.mu.Unlock()
}

func (t *tracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// wait returns when nothing is outstanding or ctx ends.
func (t *tracker) wait(ctx context.Context) error {
	t.mu.Lock()
	ch := t.idle
	t.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// item is one queued record and the tracker told when it is durable.
type item struct {
	rec     Record
	owner   *tracker
	stubbed bool // rec is the stub of a record the output refused
}

// queue holds records until the Output has them. Enqueue never blocks or
// refuses: callers check full() before taking work on (an agent call, a
// POST /records) so that the bound is exceeded by at most the records of
// the calls already in flight. Writers take batches in order; a failed
// batch goes back to the front and is retried with backoff until it is
// written or the queue is stopped.
type queue struct {
	out     Output
	max     int64
	batch   int
	metrics *metrics
	log     *slog.Logger

	mu      sync.Mutex
	pending []item
	bytes   int64 // queued and in flight
	wake    chan struct{}
	all     tracker // every record not yet durable

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newQueue(out Output, max int64, writers, batch int, m *metrics, log *slog.Logger) *queue {
	ctx, cancel := context.WithCancel(context.Background())
	q := &queue{out: out, max: max, batch: batch, metrics: m, log: log, wake: make(chan struct{}, 1), ctx: ctx, cancel: cancel}
	m.bufferLimit.Store(max)
	for range writers {
		q.wg.Add(1)
		go q.writer()
	}
	return q
}

// full reports whether the records waiting for the output fill the bound.
func (q *queue) full(extra int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes+extra > q.max
}

// enqueue queues recs; owner (may be nil) is told as each becomes durable.
func (q *queue) enqueue(owner *tracker, recs ...Record) {
	if len(recs) == 0 {
		return
	}
	if owner != nil {
		owner.add(len(recs))
	}
	q.all.add(len(recs))
	q.mu.Lock()
	for _, r := range recs {
		q.pending = append(q.pending, item{rec: r, owner: owner})
		q.bytes += int64(len(r.Line))
	}
	q.metrics.bufferBytes.Store(q.bytes)
	q.metrics.bufferRecords.Store(int64(len(q.pending)))
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue) take() []item {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(len(q.pending), q.batch)
	if n == 0 {
		return nil
	}
	b := make([]item, n)
	copy(b, q.pending)
	q.pending = q.pending[n:]
	if len(q.pending) == 0 {
		q.pending = nil
	}
	q.metrics.bufferRecords.Store(int64(len(q.pending)))
	if len(q.pending) > 0 {
		select { // another writer may take the rest
		case q.wake <- struct{}{}:
		default:
		}
	}
	return b
}

func (q *queue) putBack(b []item) {
	q.mu.Lock()
	q.pending = append(b, q.pending...)
	q.metrics.bufferRecords.Store(int64(len(q.pending)))
	q.mu.Unlock()
}

func (q *queue) writer() {
	defer q.wg.Done()
	backoff := 50 * time.Millisecond
	for {
		b := q.take()
		if b == nil {
			select {
			case <-q.wake:
				continue
			case <-q.ctx.Done():
				return
			}
		}
		recs := make([]Record, len(b))
		var size int64
		for i, it := range b {
			recs[i] = it.rec
			size += int64(len(it.rec.Line))
		}
		if err := q.out.Write(q.ctx, recs); err != nil {
			var re *RefusedError
			if errors.As(err, &re) && re.Index >= 0 && re.Index < len(b) {
				// No retry writes it: its stub goes in its place, at once.
				b = q.refused(b, re)
				if len(b) > 0 {
					q.putBack(b)
				}
				continue
			}
			q.putBack(b)
			q.metrics.errors.inc("output_write")
			q.log.Warn("gateway: output write failed; retrying", "records", len(recs), "backoff", backoff, "err", err)
			select {
			case <-time.After(backoff):
			case <-q.ctx.Done():
				return
			}
			backoff = min(backoff*2, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		q.mu.Lock()
		q.bytes -= size
		q.metrics.bufferBytes.Store(q.bytes)
		q.mu.Unlock()
		q.metrics.recordsDurable.Add(int64(len(recs)))
		for _, it := range b {
			if it.owner != nil {
				it.owner.done(1)
			}
		}
		q.all.done(len(b))
	}
}

// refused replaces the record of b the output refused (re.Index) by its
// stub (refusedStub), or, should the output refuse the stub too, drops it
// (counted and logged): either way the batch goes on without it.
func (q *queue) refused(b []item, re *RefusedError) []item {
	it := &b[re.Index]
	q.metrics.errors.inc("output_refused")
	if !it.stubbed {
		stub := refusedStub(it.rec.Line, re.Reason)
		q.log.Warn("gateway: the output refused a record; its stub is written instead (ingest dead-letters it)",
			"reason", re.Reason, "bytes", len(it.rec.Line), "err", re.Err)
		q.mu.Lock()
		q.bytes += int64(len(stub) - len(it.rec.Line))
		q.metrics.bufferBytes.Store(q.bytes)
		q.mu.Unlock()
		it.rec.Line, it.stubbed = stub, true
		return b
	}
	q.log.Error("gateway: the output refused a refused record's stub too; dropped", "reason", re.Reason, "stub", string(it.rec.Line), "err", re.Err)
	q.mu.Lock()
	q.bytes -= int64(len(it.rec.Line))
	q.metrics.bufferBytes.Store(q.bytes)
	q.mu.Unlock()
	if it.owner != nil {
		it.owner.done(1)
	}
	q.all.done(1)
	return append(b[:re.Index], b[re.Index+1:]...)
}

// drain waits until every queued record is durable.
func (q *queue) drain(ctx context.Context) error {
	if err := q.all.wait(ctx); err != nil {
		q.mu.Lock()
		n, b := len(q.pending), q.bytes
		q.mu.Unlock()
		return fmt.Errorf("gateway: %d records (%d bytes) not durable: %w", max(n, q.all.count()), b, err)
	}
	return nil
}

// stop ends the writers (a Write in progress sees its context cancelled).
func (q *queue) stop() {
	q.cancel()
	q.wg.Wait()
}
