package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// Items queued while a record is made share the next one; every caller
// gets its own outcome; take bounds a record; the snapshot hook runs
// after the hand-off.
func TestQueueSharesRecords(t *testing.T) {
	var q store.Queue[int]
	var mu sync.Mutex
	var records [][]int
	after := 0
	record := func(_ context.Context, batch []*store.Waiter[int]) func() {
		time.Sleep(2 * time.Millisecond) // a PUT's time, for the others to queue
		mu.Lock()
		var items []int
		for _, w := range batch {
			items = append(items, w.Item)
		}
		records = append(records, items)
		mu.Unlock()
		for _, w := range batch {
			if w.Item%7 == 0 {
				w.Finish(fmt.Errorf("item %d refused", w.Item))
			} else {
				w.Finish(nil)
			}
		}
		return func() { mu.Lock(); after++; mu.Unlock() }
	}
	take := func(w []*store.Waiter[int]) int { return min(len(w), 5) }
	var wg sync.WaitGroup
	errs := make([]error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = q.Do(context.Background(), i, take, record)
		}()
	}
	wg.Wait()
	seen := map[int]int{}
	for _, r := range records {
		if len(r) > 5 {
			t.Errorf("a record of %d items, take allows 5", len(r))
		}
		for _, it := range r {
			seen[it]++
		}
	}
	for i := range 64 {
		if seen[i] != 1 {
			t.Errorf("item %d in %d records", i, seen[i])
		}
		if (errs[i] != nil) != (i%7 == 0) {
			t.Errorf("item %d: outcome %v", i, errs[i])
		}
	}
	if len(records) == 64 {
		t.Error("no record shared: every item had its own")
	}
	if after != len(records) {
		t.Errorf("the hook ran %d times for %d records", after, len(records))
	}
}

// A record of several callers' items is made without the leader's
// cancellation: its context may end, the others' outcomes still come.
func TestQueueRecordOutlivesTheLeadersContext(t *testing.T) {
	var q store.Queue[string]
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	release := make(chan struct{})
	var sawCancel error
	first := true
	record := func(rctx context.Context, batch []*store.Waiter[string]) func() {
		if first {
			first = false
			close(started)
			<-release // the others queue meanwhile
			for _, w := range batch {
				w.Finish(nil)
			}
			return nil
		}
		<-time.After(10 * time.Millisecond)
		sawCancel = rctx.Err()
		for _, w := range batch {
			w.Finish(rctx.Err())
		}
		return nil
	}
	done := make(chan error, 3)
	go func() { done <- q.Do(context.Background(), "a", nil, record) }()
	<-started
	go func() { done <- q.Do(ctx, "b", nil, record) }() // leads the next record
	time.Sleep(5 * time.Millisecond)
	go func() { done <- q.Do(context.Background(), "c", nil, record) }()
	time.Sleep(5 * time.Millisecond)
	close(release)
	cancel()
	for range 3 {
		if err := <-done; err != nil {
			t.Errorf("outcome %v", err)
		}
	}
	if errors.Is(sawCancel, context.Canceled) {
		t.Error("the shared record saw its leader's cancellation")
	}
}
