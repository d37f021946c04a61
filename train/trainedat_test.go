package train_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/traintest"
)

// TestStalenessHoldsWhereTrained: a trainer that prefetches 4 batches
// (a reader goroutine ahead of the training loop, as a Flight client's
// buffer is) and advances one version per batch never trains on a row
// more than MaxStaleness behind the version that trains it; every group
// is acknowledged or skipped, once — with no version-lead cap, and with
// the default one, which the trainer outruns (it is ahead of the newest
// rollouts: the groups stale at its own version are declined, then
// settled by it alone).
func TestStalenessHoldsWhereTrained(t *testing.T) {
	for _, lead := range []int64{-1, 0} {
		t.Run(fmt.Sprintf("lead %d", lead), func(t *testing.T) { testStalenessHoldsWhereTrained(t, lead) })
	}
}

func testStalenessHoldsWhereTrained(t *testing.T, lead int64) {
	const maxStale, groups = 1, 48
	var versions []int64
	for g := range groups {
		versions = append(versions, int64(g/3)) // rollouts slower than the trainer: it falls behind
	}
	root := t.TempDir()
	traintest.WriteVersionedShards(t, root, versions, 1, 4)
	r, obj := openGroupG(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := train.NewConsumer(ctx, r, obj, train.ConsumerConfig{Config: train.Config{MaxStaleness: maxStale, IncludeFiltered: true},
		Name: "t", Poll: 10 * time.Millisecond, MaxInflight: 4, MaxVersionLead: lead, LeaseTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	batches := make(chan *train.Delivery, 4)
	readErr := make(chan error, 1)
	go func() { // the client's buffer: up to MaxInflight batches ahead
		defer close(batches)
		for {
			d, err := c.Next(ctx)
			if err != nil {
				readErr <- err
				return
			}
			batches <- d
		}
	}()
	v, acked, violations := int64(0), 0, 0
	for d := range batches {
		gv := d.Record.Column(schemas.ColGroupVersion).(*array.Int64)
		for i := range gv.Len() {
			if v-gv.Value(i) > maxStale {
				violations++
				t.Errorf("batch %d trained at version %d holds a row of version %d", d.ID, v, gv.Value(i))
			}
		}
		d.Record.Release()
		time.Sleep(2 * time.Millisecond) // the optimizer step
		v++
		c.SetPolicyVersion(v)
		res, err := c.Ack(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		acked += res.Groups
	}
	if err := <-readErr; !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	st := c.Stats()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d groups trained, %d skipped as stale (%d declined first), trainer at version %d", acked, st.SkippedStale, st.DeclinedStale, v)
	if int64(acked)+st.SkippedStale != groups || acked == 0 || st.SkippedStale == 0 {
		t.Errorf("acknowledged %d + skipped %d, want %d, both > 0", acked, st.SkippedStale, groups)
	}
}

// TestBatchGroups: every batch holds exactly BatchGroups groups; the
// consumer waits for them while following, delivers short at the end of
// the input and after BatchWait, and counts the short ones.
func TestBatchGroups(t *testing.T) {
	open := func(t *testing.T, root string, follow bool, wait time.Duration) *train.Consumer {
		t.Helper()
		r, obj := openGroupG(t, root)
		c, err := train.NewConsumer(context.Background(), r, obj, train.ConsumerConfig{
			Config: train.Config{MaxStaleness: -1, IncludeFiltered: true, BatchGroups: 4, BatchWait: wait},
			Name:   "t", Poll: 10 * time.Millisecond, MaxInflight: 1, Follow: follow})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	next := func(t *testing.T, c *train.Consumer, within time.Duration) (int, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		d, err := c.Next(ctx)
		if err != nil {
			return 0, err
		}
		d.Record.Release()
		if _, err := c.Ack(context.Background(), d.ID); err != nil {
			t.Fatal(err)
		}
		return len(d.Groups), nil
	}

	t.Run("end of input", func(t *testing.T) {
		root := t.TempDir()
		traintest.WriteShards(t, root, 5, 2, 4) // 10 groups in shards of 2: batches cross shards
		c := open(t, root, false, 0)
		var sizes []int
		for {
			n, err := next(t, c, 10*time.Second)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			sizes = append(sizes, n)
		}
		if len(sizes) != 3 || sizes[0] != 4 || sizes[1] != 4 || sizes[2] != 2 || c.Stats().ShortBatches != 1 {
			t.Fatalf("batch sizes %v, short %d; want [4 4 2], 1", sizes, c.Stats().ShortBatches)
		}
		if err := c.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("following", func(t *testing.T) {
		root := t.TempDir()
		traintest.WriteShards(t, root, 1, 3, 4)
		c := open(t, root, true, 400*time.Millisecond)
		defer c.Close(context.Background())
		if n, err := next(t, c, 150*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("3 groups of 4 delivered (%d, %v) before the wait", n, err)
		}
		traintest.WriteShardsFrom(t, root, 3, 1, 1, 4)
		if n, err := next(t, c, 5*time.Second); err != nil || n != 4 {
			t.Fatalf("once the fourth group came: %d, %v; want 4", n, err)
		}
		traintest.WriteShardsFrom(t, root, 4, 1, 2, 4)
		start := time.Now()
		if n, err := next(t, c, 5*time.Second); err != nil || n != 2 || time.Since(start) < 300*time.Millisecond {
			t.Fatalf("two groups after BatchWait: %d, %v after %s; want 2 after about 400ms", n, err, time.Since(start))
		}
		if s := c.Stats().ShortBatches; s != 1 {
			t.Fatalf("short batches %d, want 1", s)
		}
	})
}

// TestLoopHoldsTheBoundAndTheStepSize: a closed loop in one process.
// Rollouts follow the trainer's published version, some of them slow
// (generated from weights a few versions old); the trainer is fast,
// advances a version per step, prefetches 4 steps (a reader goroutine
// ahead of it, MaxInflight 4) and asks for exactly 4 groups a step with
// --max-staleness 1. Every step holds exactly 4 groups and no row is more
// than 1 version behind the weights that train on it; once the rollouts
// stop and a last member drains the rest, acknowledged + skipped =
// committed.
func TestLoopHoldsTheBoundAndTheStepSize(t *testing.T) {
	const maxStale, perStep, rollouts = 1, 4, 480
	root := t.TempDir()
	r, obj := openGroupG(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	join := func(name string, follow bool) *train.Consumer {
		c, err := train.NewConsumer(ctx, r, obj, train.ConsumerConfig{
			Config: train.Config{MaxStaleness: maxStale, IncludeFiltered: true, BatchGroups: perStep},
			Name:   name, Poll: 5 * time.Millisecond, MaxInflight: 4, Follow: follow, LeaseTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	var published atomic.Int64
	written := make(chan struct{})
	go func() { // the rollouts: four groups a shard, at the published version, one in four 1-3 versions late
		defer close(written)
		for i := 0; i < rollouts; i += 4 {
			v := published.Load()
			if i%16 == 12 {
				v = max(0, v-int64(1+i%3))
			}
			traintest.WriteVersionedShardsFrom(t, root, i, []int64{v}, 4, 4)
			time.Sleep(time.Millisecond)
		}
	}()

	c := join("trainer", true)
	batches := make(chan *train.Delivery, 4)
	readCtx, stopReading := context.WithCancel(ctx)
	go func() {
		defer close(batches)
		for {
			d, err := c.Next(readCtx)
			if err != nil {
				return
			}
			batches <- d
		}
	}()
	v, acked, steps := int64(0), 0, 0
	check := func(d *train.Delivery) {
		t.Helper()
		if len(d.Groups) != perStep {
			t.Errorf("step %d: %d groups, want %d", steps, len(d.Groups), perStep)
		}
		gv := d.Record.Column(schemas.ColGroupVersion).(*array.Int64)
		for i := range gv.Len() {
			if v-gv.Value(i) > maxStale {
				t.Errorf("step %d trained at version %d holds a row of version %d", steps, v, gv.Value(i))
			}
		}
		d.Record.Release()
	}
	done := false
	for !done {
		select {
		case <-written:
			done, written = true, nil
			continue
		case d := <-batches:
			check(d)
			time.Sleep(4 * time.Millisecond) // the optimizer step: slower than the rollouts, so steps queue ahead
			v, steps = v+1, steps+1
			c.SetPolicyVersion(v)
			res, err := c.Ack(ctx, d.ID)
			if err != nil {
				t.Fatal(err)
			}
			acked += res.Groups
			published.Store(v) // the new weights serve the next rollouts
		}
	}
	stopReading()
	for d := range batches { // prefetched, not trained: they go back to the group
		d.Record.Release()
	}
	st := c.Stats()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// A last member at the trainer's version drains the rest (short at the
	// end of the input).
	last := join("drain", false)
	last.SetPolicyVersion(v)
	for {
		d, err := last.Next(ctx)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		d.Record.Release()
		res, err := last.Ack(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		acked += res.Groups
	}
	lst := last.Stats()
	_ = last.Close(ctx)
	p, err := train.GroupProgress(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d steps to version %d; %d groups acknowledged, %d skipped as stale (%d by the trainer), %d committed", steps, v, acked, p.GroupsStale, st.SkippedStale, rollouts)
	if int64(acked)+st.SkippedStale+lst.SkippedStale != rollouts || p.GroupsAcked != int64(acked) || p.GroupsAcked+p.GroupsSkip != rollouts {
		t.Errorf("acknowledged %d + skipped %d + %d != %d committed (the log: %d + %d)", acked, st.SkippedStale, lst.SkippedStale, rollouts, p.GroupsAcked, p.GroupsSkip)
	}
	if steps < 20 || st.SkippedStale == 0 {
		t.Errorf("%d steps, %d skipped: the loop should train and the late rollouts go stale", steps, st.SkippedStale)
	}
}

// openGroupG opens root for reading and its consumer group "g" (closed
// with the test).
func openGroupG(t *testing.T, root string) (*local.Reader, train.Objects) {
	t.Helper()
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	obj, err := r.Objects(train.GroupDir("g"))
	if err != nil {
		t.Fatal(err)
	}
	return r, obj
}
