package iceberg

import (
	"context"
	"sync"
	"time"
)

// Follower keeps the tables in step with a root that a running ingest
// commits to: a sync at once and then every interval (a failed one is
// reported and left for the next: the shards are committed whatever the
// catalog does), and one more at Finish.
type Follower struct {
	s      *Syncer
	report func(Result, error)
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
	mu     sync.Mutex
	total  Result
}

// Follow starts syncing s at once and then every interval until Halt or
// Finish. report, if not nil, hears every sync's result (or error, but
// not one that ctx's end caused).
func Follow(ctx context.Context, s *Syncer, every time.Duration, report func(Result, error)) *Follower {
	f := &Follower{s: s, report: report, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			_ = f.sync(ctx)
			select {
			case <-f.stop:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return f
}

func (f *Follower) sync(ctx context.Context) error {
	res, err := f.s.Sync(ctx)
	if f.report != nil && (err == nil || ctx.Err() == nil) {
		f.report(res, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		res.Position, res.Snapshot = 0, 0 // a failed sync does not say where the table is
	}
	f.total.Add(res)
	return err
}

// Halt stops the interval syncs (once; a no-op after).
func (f *Follower) Halt() {
	f.once.Do(func() { close(f.stop) })
	<-f.done
}

// Finish stops the interval syncs and syncs once more, so that the tables
// hold every commit made before it; a catalog that does not answer within
// timeout is left behind (the next sync catches up). It returns what
// every sync did in all.
func (f *Follower) Finish(ctx context.Context, timeout time.Duration) (Result, error) {
	f.Halt()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := f.sync(ctx)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total, err
}
