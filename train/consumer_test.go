package train

import (
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// openGroup returns the committed shards under root and a consumer
// group's log there.
func openGroup(t *testing.T, root, group string) (*local.Reader, Objects) {
	t.Helper()
	sh, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := sh.Objects(GroupDir(group))
	if err != nil {
		t.Fatal(err)
	}
	return sh, obj
}

// ledger records acknowledged groups across consumers.
type ledger struct {
	mu    sync.Mutex
	acked map[string]int
}

func (l *ledger) add(keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.acked[k]++
	}
}

// consume reads and acknowledges batches until EOF, or until stopAfter
// batches (0: no limit); it checks every batch against the budget and
// that it holds exactly its groups.
func consume(t *testing.T, c *Consumer, l *ledger, maxTokens int64, stopAfter int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for n := 0; stopAfter == 0 || n < stopAfter; n++ {
		d, err := c.Next(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if maxTokens > 0 && d.Tokens > maxTokens && !(d.Oversized && len(d.Groups) == 1) {
			t.Errorf("batch of %d tokens over the budget %d", d.Tokens, maxTokens)
		}
		gid := d.Record.Column(schemas.ColGroupID).(*array.String)
		seen := map[string]bool{}
		for i := 0; i < gid.Len(); i++ {
			seen[gid.Value(i)] = true
		}
		if len(seen) != len(d.Groups) {
			t.Errorf("batch lists %d groups, holds %d", len(d.Groups), len(seen))
		}
		d.Record.Release()
		res, err := c.Ack(ctx, d.ID)
		if err != nil && !errors.Is(err, ErrLeaseLost) {
			return err
		}
		if res.Lost == 0 {
			l.add(d.Groups)
		}
	}
	return nil
}

func TestConsumersShareWorkAndSurviveACrash(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 300)
	shareWorkAndSurvive(t, root, func(string) *GroupLog { return nil }, "a", "b")
}

// shareWorkAndSurvive runs consumer group "trainers" over root's 300
// groups: a victim acknowledges a few batches, takes one more and dies
// holding its shards; the survivors take them over and finish. logOf
// gives a member its process's shared log (nil: a log of its own). It
// checks that every group was acknowledged exactly once, that the dead
// member's late acknowledgement is refused and that the log says so, and
// returns the group's objects.
func shareWorkAndSurvive(t *testing.T, root string, logOf func(name string) *GroupLog, survivors ...string) Objects {
	t.Helper()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	cfg := func(name string) ConsumerConfig {
		return ConsumerConfig{
			Config:       Config{MaxStaleness: -1, MaxTokens: 40, IncludeFiltered: true, Allocator: mem},
			Name:         name,
			LeaseTimeout: 600 * time.Millisecond,
			Poll:         20 * time.Millisecond,
			MaxInflight:  2,
			Log:          logOf(name),
		}
	}
	ctx := context.Background()
	l := &ledger{acked: map[string]int{}}
	sh, obj := openGroup(t, root, "trainers")

	// The victim acknowledges a few batches, takes one more without
	// acknowledging it, and dies holding its shards.
	victim, err := NewConsumer(ctx, sh, obj, cfg("victim"))
	if err != nil {
		t.Fatal(err)
	}
	if err := consume(t, victim, l, 40, 3); err != nil {
		t.Fatal(err)
	}
	d, err := victim.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.Record.Release()
	victim.abandon()

	var wg sync.WaitGroup
	var alive []*Consumer
	for _, name := range survivors {
		sh, obj := openGroup(t, root, "trainers")
		c, err := NewConsumer(ctx, sh, obj, cfg(name))
		if err != nil {
			t.Fatal(err)
		}
		alive = append(alive, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := consume(t, c, l, 40, 0); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// The dead member's late acknowledgement is refused: its shard moved on.
	if _, err := victim.Ack(ctx, d.ID); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("late ack of a dead member: %v, want ErrLeaseLost", err)
	}
	var takeovers int64
	for _, c := range alive {
		takeovers += c.Stats().Takeovers
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if takeovers == 0 {
		t.Error("no shard was taken over from the dead member")
	}
	if len(l.acked) != 300 {
		t.Errorf("%d groups acknowledged, want 300", len(l.acked))
	}
	for k, n := range l.acked {
		if n != 1 {
			t.Errorf("group %s acknowledged %d times", k, n)
		}
	}
	p, err := GroupProgress(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if p.GroupsAcked != 300 || p.Done != p.Shards || p.GroupsSkip != 0 {
		t.Errorf("log progress %+v, want 300 groups acknowledged, every shard done", p)
	}
	return obj
}

func TestConsumerRestartResumesAfterLastAck(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 120)
	sh, obj := openGroup(t, root, "g")
	cfg := ConsumerConfig{Config: Config{MaxStaleness: -1, MaxTokens: 16, IncludeFiltered: true}, Name: "trainer-0", LeaseTimeout: time.Hour, Poll: 10 * time.Millisecond}
	l := &ledger{acked: map[string]int{}}
	first, err := NewConsumer(context.Background(), sh, obj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := consume(t, first, l, 16, 25); err != nil {
		t.Fatal(err)
	}
	// One batch delivered, never acknowledged: it must come again.
	d, err := first.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	unacked := d.Groups
	d.Record.Release()
	first.abandon() // crash: the lease (an hour) is still held

	// The same name takes its shards back at once, despite the lease.
	second, err := NewConsumer(context.Background(), sh, obj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	before := len(l.acked)
	if before != 50 {
		t.Fatalf("%d groups acknowledged before the crash, want 50 (25 batches of 2)", before)
	}
	l2 := &ledger{acked: map[string]int{}}
	if err := consume(t, second, l2, 16, 0); err != nil {
		t.Fatal(err)
	}
	for k := range l2.acked {
		if l.acked[k] > 0 {
			t.Errorf("group %s delivered again after its acknowledgement", k)
		}
	}
	for _, k := range unacked {
		if l2.acked[k] != 1 {
			t.Errorf("unacknowledged group %s not delivered after the restart", k)
		}
	}
	if len(l.acked)+len(l2.acked) != 120 {
		t.Errorf("%d + %d groups, want 120", len(l.acked), len(l2.acked))
	}
	if err := second.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestConsumerStalenessFollowsPolicyVersion(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 80) // versions g%4
	sh, obj := openGroup(t, root, "g")
	c, err := NewConsumer(context.Background(), sh, obj, ConsumerConfig{
		Config: Config{PolicyVersion: 3, MaxStaleness: 1, MaxTokens: 8},
		Name:   "t", Poll: 10 * time.Millisecond,
		MaxVersionLead: 2, // the trainer runs 2 ahead of the newest data (3) below
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var versions []int64
	for {
		d, err := c.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ver := d.Record.Column(schemas.ColGroupVersion).(*array.Int64)
		for i := 0; i < ver.Len(); i++ {
			if c.policy.Load()-ver.Value(i) > 1 {
				t.Errorf("row of version %d delivered at policy version %d", ver.Value(i), c.policy.Load())
			}
		}
		versions = append(versions, ver.Value(0))
		d.Record.Release()
		if _, err := c.Ack(ctx, d.ID); err != nil {
			t.Fatal(err)
		}
		if len(versions) == 10 {
			c.SetPolicyVersion(5) // from now on only version 4 passes (no 5 exists)
		}
	}
	st := c.Stats()
	// Groups 0..79, one per batch (8-token budget, filtered rows dropped).
	if st.GroupsAcked+st.SkippedStale+st.SkippedEmpty != 80 {
		t.Errorf("acked %d + stale %d + empty %d != 80", st.GroupsAcked, st.SkippedStale, st.SkippedEmpty)
	}
	if st.SkippedStale < 40 {
		t.Errorf("only %d stale groups skipped", st.SkippedStale)
	}
	p, _ := GroupProgress(ctx, obj)
	if p.Done != p.Shards || p.GroupsAcked+p.GroupsSkip != 80 {
		t.Errorf("log progress %+v: skipped groups must settle their shards", p)
	}
	_ = c.Close(ctx)
}

func TestConsumerFollowsNewShards(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 10)
	sh, obj := openGroup(t, root, "g")
	c, err := NewConsumer(context.Background(), sh, obj, ConsumerConfig{
		Config: Config{MaxStaleness: -1, IncludeFiltered: true}, Name: "t", Follow: true, Poll: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := map[string]bool{}
	for len(got) < 25 {
		if len(got) == 10 {
			writeShardsTo(t, root, 10, 15)
		}
		d, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("after %d groups: %v", len(got), err)
		}
		for _, g := range d.Groups {
			got[g] = true
		}
		d.Record.Release()
		if _, err := c.Ack(ctx, d.ID); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Close(ctx)
}

// TestConsumerVersionFarAheadIsCapped: a member reporting a policy
// version far ahead of the data (2^53, in range) with --max-staleness 3
// would pass every group over as stale, settling them for the whole group
// unread. Its version counts at most MaxVersionLead ahead of the newest
// committed group version for what it settles: it skips only the groups
// stale at that cap; the others, stale at its own version, it neither
// trains on nor settles but leaves to the other members (declined), who
// train them. With no cap (negative) it skips them all.
func TestConsumerVersionFarAheadIsCapped(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lead      int64
		wantStale int64
	}{
		{"default lead", 0, 20}, // versions 0..3, newest 3: judged at 3+1 = 4, only version 0 stale
		{"lead 3", 3, 60},       // judged at 6: only version 3 within the bound
		{"lead 5", 5, 80},       // judged at 8: the member opted out of the protection
		{"no cap", -1, 80},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			writeShardsTo(t, root, 0, 80) // versions g%4
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			join := func(name string, version int64) *Consumer {
				sh, obj := openGroup(t, root, "g")
				c, err := NewConsumer(ctx, sh, obj, ConsumerConfig{
					Config: Config{PolicyVersion: version, MaxStaleness: 3, MaxTokens: 8},
					Name:   name, Poll: 10 * time.Millisecond, MaxVersionLead: tc.lead,
				})
				if err != nil {
					t.Fatal(err)
				}
				return c
			}
			run := func(c *Consumer) <-chan error {
				done := make(chan error, 1)
				go func() {
					for {
						d, err := c.Next(ctx)
						if err != nil {
							done <- err
							return
						}
						d.Record.Release()
						if _, err := c.Ack(ctx, d.ID); err != nil {
							done <- err
							return
						}
					}
				}()
				return done
			}
			ahead := join("ahead", MaxPolicyVersion)
			aheadDone := run(ahead)
			// It judges every group first (the others wait, so that it
			// meets all of them), then an honest member joins.
			var aheadErr error
			for st := ahead.Stats(); st.SkippedStale+st.DeclinedStale < 80 && aheadErr == nil; st = ahead.Stats() {
				select {
				case aheadErr = <-aheadDone: // done alone: every group stale at the cap
				case <-time.After(5 * time.Millisecond):
				}
			}
			honest := join("honest", 3)
			if err := <-run(honest); err != io.EOF {
				t.Fatal(err)
			}
			if aheadErr == nil {
				aheadErr = <-aheadDone
			}
			if aheadErr != io.EOF {
				t.Fatal(aheadErr)
			}
			a, h := ahead.Stats(), honest.Stats()
			if a.GroupsAcked != 0 || a.SkippedStale != tc.wantStale || a.DeclinedStale != 80-tc.wantStale {
				t.Errorf("far ahead: acked %d, skipped %d, declined %d; want 0, %d, %d", a.GroupsAcked, a.SkippedStale, a.DeclinedStale, tc.wantStale, 80-tc.wantStale)
			}
			if h.GroupsAcked != 80-tc.wantStale || h.SkippedStale != 0 {
				t.Errorf("honest: acked %d, skipped %d; want %d, 0", h.GroupsAcked, h.SkippedStale, 80-tc.wantStale)
			}
			_ = ahead.Close(ctx)
			_ = honest.Close(ctx)
			_, obj := openGroup(t, root, "g")
			p, err := GroupProgress(ctx, obj)
			if err != nil {
				t.Fatal(err)
			}
			if p.GroupsAcked+p.GroupsSkip != 80 || p.GroupsStale != tc.wantStale {
				t.Errorf("the log: acked %d + skipped %d (stale %d), want 80 with %d stale", p.GroupsAcked, p.GroupsSkip, p.GroupsStale, tc.wantStale)
			}
			var byVersion int64
			for _, vc := range p.StaleByVersion {
				byVersion += vc.Groups
			}
			if len(p.Members) != 2 || p.Members[0].Name != "ahead" || p.Members[0].SkippedStale != tc.wantStale || byVersion != tc.wantStale {
				t.Errorf("the log's stale skips by member %+v, by version %+v; want %d by ahead", p.Members, p.StaleByVersion, tc.wantStale)
			}
		})
	}
}

// TestDeclinedGroupsSettleAlone: a member far ahead of the data that is
// alone in its group leases the groups it declined again once nobody took
// them for a third of the lease timeout, and settles them as stale at its
// own version: nothing waits forever, nothing is trained out of bound.
func TestDeclinedGroupsSettleAlone(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 40)
	sh, obj := openGroup(t, root, "g")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := NewConsumer(ctx, sh, obj, ConsumerConfig{
		Config: Config{PolicyVersion: 100, MaxStaleness: 3, MaxTokens: 8},
		Name:   "t", Poll: 10 * time.Millisecond, LeaseTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Next(ctx); err != io.EOF {
		t.Fatalf("Next: %v, want io.EOF", err)
	}
	st := c.Stats()
	if st.GroupsAcked != 0 || st.SkippedStale != 40 || st.DeclinedStale != 30 {
		t.Errorf("acked %d, skipped %d, declined %d; want 0, 40, 30", st.GroupsAcked, st.SkippedStale, st.DeclinedStale)
	}
	var n int64
	for _, v := range st.StaleByVersion {
		n += v
	}
	if n != 40 || st.StaleByVersion[2] != 10 {
		t.Errorf("stale by version %v, want 10 of each of 0..3", st.StaleByVersion)
	}
	_ = c.Close(ctx)
}
