package store

import (
	"context"
	"sync"
	"time"
)

// Queue is group commit: callers that each have an item for a log share
// one record instead of racing for one each. The first caller makes the
// record of the items queued when it starts (as many as take allows); the
// others wait for their outcome, and the next one queued makes the next
// record. The manifest of an S3 root and a consumer group's log append
// through one.
type Queue[T any] struct {
	// Linger, when positive, is how long a record's maker waits for more
	// items before taking them.
	Linger time.Duration

	mu      sync.Mutex
	waiting []*Waiter[T]
	busy    bool
}

// Waiter is one caller's item waiting for its record.
type Waiter[T any] struct {
	Item T
	done chan error
	lead chan struct{}
}

// Finish delivers the item's outcome; the record's maker calls it once
// for every waiter of the record.
func (w *Waiter[T]) Finish(err error) { w.done <- err }

// Do queues item and returns its outcome. When the lead comes to this
// caller, take says how many of the first waiters go in the record (at
// least one is taken), and record makes it: it must Finish every waiter
// it is given, and may return a function to run once the lead has passed
// to the next waiter (a snapshot, which the next record need not wait
// for). A record of others' items too is made under ctx without its
// cancellation: an item that may have landed is never reported as not
// because another caller's context ended.
func (q *Queue[T]) Do(ctx context.Context, item T, take func(waiting []*Waiter[T]) int, record func(ctx context.Context, batch []*Waiter[T]) (after func())) error {
	w := &Waiter[T]{Item: item, done: make(chan error, 1), lead: make(chan struct{}, 1)}
	q.mu.Lock()
	q.waiting = append(q.waiting, w)
	if !q.busy {
		q.busy = true
		w.lead <- struct{}{}
	}
	q.mu.Unlock()
	for {
		select {
		case err := <-w.done:
			return err
		case <-w.lead:
			q.makeRecord(ctx, take, record)
		}
	}
}

func (q *Queue[T]) makeRecord(ctx context.Context, take func([]*Waiter[T]) int, record func(context.Context, []*Waiter[T]) func()) {
	if q.Linger > 0 {
		t := time.NewTimer(q.Linger)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	q.mu.Lock()
	n := len(q.waiting)
	if take != nil {
		n = min(max(take(q.waiting), 1), len(q.waiting))
	}
	batch := append([]*Waiter[T](nil), q.waiting[:n]...)
	q.waiting = q.waiting[n:]
	q.mu.Unlock()

	rctx := ctx
	if len(batch) > 1 {
		rctx = context.WithoutCancel(ctx)
	}
	after := record(rctx, batch)

	q.mu.Lock()
	if len(q.waiting) > 0 {
		q.waiting[0].lead <- struct{}{}
	} else {
		q.busy = false
	}
	q.mu.Unlock()
	if after != nil {
		after()
	}
}
