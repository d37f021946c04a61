package train

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
)

// A replayed group delivers its batches in the plan's order even when a
// member leaves holding one: while member c holds batch 0 unacknowledged,
// member d gets nothing after it; once c has left, d receives batch 0
// first, then the rest in order.
func TestReplayOrderWhenAMemberLeavesHoldingABatch(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 20)
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := func(name string) ConsumerConfig {
		return ConsumerConfig{Config: Config{MaxStaleness: -1, MaxTokens: 30, Allocator: mem}, Name: name, Poll: 10 * time.Millisecond, LeaseTimeout: time.Minute}
	}
	sh, obj := openGroup(t, root, "orig")
	o, err := NewConsumer(ctx, sh, obj, cfg("o"))
	if err != nil {
		t.Fatal(err)
	}
	orig := drain(t, o, 0, func(int) int64 { return 0 })
	if err := o.Close(ctx); err != nil {
		t.Fatal(err)
	}
	consumed, err := ReadConsumed(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(orig) < 4 {
		t.Fatalf("%d batches: too few to test an order", len(orig))
	}
	_, robj := openGroup(t, root, "again")
	if err := CreateReplay(ctx, robj, ReplayPlan{From: "orig", Batches: consumed}); err != nil {
		t.Fatal(err)
	}
	planned := func(groups []string) int {
		for i, b := range consumed {
			var ids []string
			for _, g := range b.Groups {
				ids = append(ids, g.GroupID)
			}
			if slices.Equal(ids, groups) {
				return i
			}
		}
		return -1
	}

	c, err := NewConsumer(ctx, sh, robj, cfg("c"))
	if err != nil {
		t.Fatal(err)
	}
	held, err := c.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held.Record.Release()
	if i := planned(held.Groups); i != 0 {
		t.Fatalf("c's first batch is the plan's batch %d", i)
	}
	d, err := NewConsumer(ctx, sh, robj, cfg("d"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(ctx)
	type next struct {
		d   *Delivery
		err error
	}
	first := make(chan next, 1)
	go func() {
		dl, err := d.Next(ctx)
		first <- next{dl, err}
	}()
	select {
	case n := <-first:
		if n.err == nil {
			n.d.Record.Release()
			t.Fatalf("d received the plan's batch %d while c held batch 0", planned(n.d.Groups))
		}
		t.Fatal(n.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := c.Close(ctx); err != nil { // c leaves holding batch 0
		t.Fatal(err)
	}
	var order []int
	n := <-first
	for {
		if n.err == io.EOF {
			break
		}
		if n.err != nil {
			t.Fatal(n.err)
		}
		order = append(order, planned(n.d.Groups))
		n.d.Record.Release()
		if _, err := d.Ack(ctx, n.d.ID); err != nil {
			t.Fatal(err)
		}
		n.d, n.err = d.Next(ctx)
	}
	want := make([]int, len(consumed))
	for i := range want {
		want[i] = i
	}
	if !slices.Equal(order, want) {
		t.Fatalf("d received the plan's batches %v, want %v", order, want)
	}
}
