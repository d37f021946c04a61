package train

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// hookObjects runs hooks[n] before the n-th Create after arm.
type hookObjects struct {
	Objects
	mu    sync.Mutex
	n     int
	hooks map[int]func()
}

func (o *hookObjects) arm(h map[int]func()) {
	o.mu.Lock()
	o.n, o.hooks = 0, h
	o.mu.Unlock()
}

func (o *hookObjects) Create(ctx context.Context, name string, data []byte) error {
	o.mu.Lock()
	o.n++
	h := o.hooks[o.n]
	o.mu.Unlock()
	if h != nil {
		h()
	}
	return o.Objects.Create(ctx, name, data)
}

// Regression tests for two races between an acknowledgement (a Flight
// action's goroutine) and Next's goroutine over the pending skips, found in
// review: pending marks are now a set, and each appender clears exactly
// what it wrote.

// reviewConsumer returns a consumer holding a shard, with one batch in
// flight.
func reviewConsumer(t *testing.T) (*Consumer, *hookObjects, *Delivery) {
	t.Helper()
	root := t.TempDir()
	writeShardsTo(t, root, 0, 20)
	sh, obj := openGroup(t, root, "g")
	ho := &hookObjects{Objects: obj}
	c, err := NewConsumer(context.Background(), sh, ho, ConsumerConfig{
		Config: Config{MaxStaleness: -1, MaxTokens: 8, IncludeFiltered: true},
		Name:   "r", LeaseTimeout: time.Hour, Poll: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	d.Record.Release()
	return c, ho, d
}

// An Ack (Flight DoAction goroutine) snapshots the pending skips, the Next
// goroutine flushes the same skips and records a new one, then the Ack's
// clearMarks drops len(snapshot) entries again: the new skip is lost, so
// its group is never settled and its shard never done (no EOF).
func TestConcurrentAckKeepsPendingSkips(t *testing.T) {
	c, ho, d := reviewConsumer(t)
	ctx := context.Background()
	var sh string
	for _, ms := range c.inflight {
		sh = ms[0].Shard
	}
	a, b := skipKey{sh, 1000}, skipKey{sh, 1001}
	c.mu.Lock()
	c.skips = map[skipKey]skipNote{a: {}}
	c.mu.Unlock()

	bAdded := make(chan struct{})
	ackDone := make(chan error, 1)
	ho.arm(map[int]func(){
		1: func() { // flushMarks' event, appendMu held
			go func() { _, err := c.Ack(ctx, d.ID); ackDone <- err }()
			time.Sleep(200 * time.Millisecond) // Ack has snapshotted [a], waits for appendMu
		},
		2: func() { <-bAdded }, // the Ack's event
	})
	if err := c.flushMarks(ctx); err != nil { // Next goroutine
		t.Fatal(err)
	}
	c.mu.Lock()
	c.skips[b] = skipNote{stale: true, version: 3} // Next skips another (stale) group
	c.mu.Unlock()
	close(bAdded)
	if err := <-ackDone; err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	pending := fmt.Sprint(c.skips)
	c.mu.Unlock()
	if pending != fmt.Sprint(map[skipKey]skipNote{b: {stale: true, version: 3}}) {
		t.Errorf("pending skips after the race: %s, want only %v: a skip was dropped without reaching the log", pending, b)
	}
	_ = c.Close(ctx)
}

// Two appenders that snapshotted the same pending skips both clear them:
// the second c.skips[len(snapshot):] is out of range and panics (in the
// Flight server, a panic in a DoAction/DoGet handler kills the process).
func TestConcurrentAckAndFlushDoNotPanic(t *testing.T) {
	c, ho, d := reviewConsumer(t)
	ctx := context.Background()
	var sh string
	for _, ms := range c.inflight {
		sh = ms[0].Shard
	}
	c.mu.Lock()
	c.skips = map[skipKey]skipNote{{sh, 1000}: {}}
	c.mu.Unlock()

	panicked := make(chan any, 1)
	ho.arm(map[int]func(){
		1: func() { // the Ack's event, appendMu held
			go func() {
				defer func() { panicked <- recover() }()
				_ = c.flushMarks(ctx) // Next goroutine: snapshots the same skip
			}()
			time.Sleep(200 * time.Millisecond)
		},
	})
	if _, err := c.Ack(ctx, d.ID); err != nil {
		t.Fatal(err)
	}
	if p := <-panicked; p != nil {
		t.Errorf("flushMarks after a concurrent Ack panicked: %v", p)
		return // c.mu is left locked by the panic: no Close
	}
	_ = c.Close(ctx)
}
