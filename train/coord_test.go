package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

func newObjects(t *testing.T) Objects {
	t.Helper()
	sh, err := local.OpenReader(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	obj, err := sh.Objects(GroupDir("g"))
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

func TestLogRules(t *testing.T) {
	obj := newObjects(t)
	ctx := context.Background()
	a, _ := openCoordinator(ctx, obj, "a/1")
	b, _ := openCoordinator(ctx, obj, "b/1")
	a2, _ := openCoordinator(ctx, obj, "a/2") // a restarted
	// lease leases shard; expect >= 0 names the holder's LeaseSeq seen (a
	// takeover).
	lease := func(c *coordinator, shard string, expect int64) bool {
		if err := c.append(ctx, func(_ *groupState, e *event) bool {
			e.Lease = []string{shard}
			if expect >= 0 {
				e.Expect = map[string]int64{shard: expect}
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		var held bool
		c.view(func(st *groupState) { held = st.Shards[shard].Holder == c.member })
		return held
	}
	settle := func(c *coordinator, shard string, ack bool, groups ...int32) {
		if err := c.append(ctx, func(_ *groupState, e *event) bool {
			if ack {
				e.Ack = []marks{{Shard: shard, Groups: groups}}
			} else {
				e.Skip = []marks{{Shard: shard, Groups: groups}}
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	state := func(c *coordinator, shard string) shardState {
		_ = c.refresh(ctx)
		var s shardState
		c.view(func(st *groupState) { s = *st.Shards[shard] })
		return s
	}
	if !lease(a, "s1", -1) {
		t.Fatal("a could not lease a free shard")
	}
	if lease(b, "s1", -1) {
		t.Fatal("b leased a shard a holds")
	}
	settle(a, "s1", true, 0, 1)
	settle(b, "s1", true, 2) // b does not hold s1: ignored
	if s := state(a, "s1"); s.NAcked != 2 || s.Acked[2] {
		t.Fatalf("after a's ack of 0,1 and b's of 2: %+v", s)
	}
	// The restarted a takes its shard back at once; the old a's acks are
	// refused from then on.
	if !lease(a2, "s1", -1) {
		t.Fatal("a restarted could not take its own shard")
	}
	settle(a, "s1", true, 3)
	if s := state(a2, "s1"); s.Acked[3] {
		t.Fatal("an earlier incarnation's ack was accepted")
	}
	settle(a2, "s1", true, 1, 3) // 1 is already acked: not counted twice
	settle(a2, "s1", false, 4)
	if err := a2.append(ctx, func(_ *groupState, e *event) bool {
		e.Totals = map[string]int32{"s1": 5}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	if s := state(b, "s1"); s.Done || s.NAcked != 3 || s.NSkip != 1 || s.Total != 5 {
		t.Fatalf("0, 1, 3 acked, 4 skipped of 5: want not done, %+v", s)
	}
	settle(a2, "s1", true, 2)
	if s := state(b, "s1"); !s.Done || s.Holder != "" || s.NAcked != 4 {
		t.Fatalf("every group settled: want done and free, %+v", s)
	}
	if lease(b, "s1", -1) {
		t.Fatal("a done shard was leased")
	}
	// A takeover names the holder's last lease event; a renewal since
	// refuses it.
	if !lease(b, "s2", -1) {
		t.Fatal("b could not lease a free shard")
	}
	var seq int64
	b.view(func(st *groupState) { seq = st.Shards["s2"].LeaseSeq })
	if !lease(b, "s2", -1) { // b renews: the lease moves on
		t.Fatal("b could not renew")
	}
	if lease(a2, "s2", seq) {
		t.Fatal("a takeover naming a lease the holder has renewed since was accepted")
	}
	b.view(func(st *groupState) { seq = st.Shards["s2"].LeaseSeq })
	if !lease(a2, "s2", seq) {
		t.Fatal("a takeover naming the holder's last lease was refused")
	}
	// An empty shard (no group) is done once counted.
	if !lease(a2, "s3", -1) {
		t.Fatal("lease s3")
	}
	if err := a2.append(ctx, func(_ *groupState, e *event) bool { e.Totals = map[string]int32{"s3": 0}; return true }); err != nil {
		t.Fatal(err)
	}
	if s := state(b, "s3"); !s.Done {
		t.Fatalf("an empty shard read to the end is not done: %+v", s)
	}
}

// randomEvent builds a random event over six shards.
func randomEvent(rng *rand.Rand, n int) func(*groupState, *event) bool {
	shard := fmt.Sprintf("s%d", rng.Intn(6))
	kind := rng.Intn(4)
	expect := rng.Intn(2) == 0
	seen := int64(rng.Intn(n + 1))
	group := int32(rng.Intn(8))
	return func(_ *groupState, e *event) bool {
		switch kind {
		case 0:
			e.Lease = []string{shard}
			if expect {
				e.Expect = map[string]int64{shard: seen}
			}
		case 1:
			e.Ack = []marks{{Shard: shard, Groups: []int32{group}}}
		case 2:
			e.Skip = []marks{{Shard: shard, Groups: []int32{group}}}
			e.Totals = map[string]int32{shard: 8}
		case 3:
			e.Release = []string{shard}
		}
		return true
	}
}

// mirror replays every event as it is appended (before a compaction can
// delete it): the full replay a snapshot must agree with.
type mirror struct{ st *groupState }

func (m *mirror) follow(t *testing.T, ctx context.Context, obj Objects) {
	t.Helper()
	for {
		data, err := obj.Get(ctx, store.RecordName(m.st.Next))
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		var e event
		if err := json.Unmarshal(data, &e); err != nil {
			t.Fatal(err)
		}
		e.Seq = m.st.Next
		m.st.apply(&e)
	}
}

func (m *mirror) equal(t *testing.T, c *coordinator) {
	t.Helper()
	a, _ := json.Marshal(c.st)
	b, _ := json.Marshal(m.st)
	if string(a) != string(b) {
		t.Fatalf("state differs from the full replay:\n%s\n%s", a, b)
	}
}

// A member opening the log from a snapshot sees the state a full replay
// gives, and the log is compacted: the events before the second latest
// snapshot are gone.
func TestLogSnapshots(t *testing.T) {
	obj := newObjects(t)
	ctx := context.Background()
	rng := rand.New(rand.NewSource(1))
	members := make([]*coordinator, 3)
	for i := range members {
		members[i], _ = openCoordinator(ctx, obj, fmt.Sprintf("m%d/1", i))
		members[i].snapEvery = 16
	}
	m := &mirror{st: &groupState{Shards: map[string]*shardState{}}}
	for n := 0; n < 200; n++ {
		c := members[rng.Intn(len(members))]
		if err := c.append(ctx, randomEvent(rng, n)); err != nil {
			t.Fatal(err)
		}
		m.follow(t, ctx, obj)
	}
	names, _ := obj.List(ctx, "")
	names = slices.DeleteFunc(names, func(n string) bool { return strings.HasPrefix(n, auditPrefix) }) // the audit stays
	snaps, _ := obj.List(ctx, "snap-")
	if len(snaps) != 2 || len(names) > 2+2*16 {
		t.Fatalf("after 200 events, snapshots every 16: %d objects, %d snapshots (%v)", len(names), len(snaps), snaps)
	}
	fromSnap, err := openCoordinator(ctx, obj, "x/1")
	if err != nil {
		t.Fatal(err)
	}
	if m.st.Next != 200 {
		t.Fatalf("full replay reached %d", m.st.Next)
	}
	m.equal(t, fromSnap)
}

// A member that slept through compactions (its next event was deleted)
// notices, reloads, and appends at the end of the log, not in the hole.
func TestStaleMemberReloads(t *testing.T) {
	obj := newObjects(t)
	ctx := context.Background()
	rng := rand.New(rand.NewSource(2))
	sleeper, _ := openCoordinator(ctx, obj, "sleeper/1")
	busy, _ := openCoordinator(ctx, obj, "busy/1")
	busy.snapEvery = 8
	m := &mirror{st: &groupState{Shards: map[string]*shardState{}}}
	for n := 0; n < 5; n++ {
		if err := busy.append(ctx, randomEvent(rng, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := sleeper.refresh(ctx); err != nil || sleeper.st.Next != 5 {
		t.Fatalf("sleeper at %d: %v", sleeper.st.Next, err)
	}
	for n := 5; n < 100; n++ {
		if err := busy.append(ctx, randomEvent(rng, n)); err != nil {
			t.Fatal(err)
		}
		m.follow(t, ctx, obj)
	}
	if _, err := obj.Get(ctx, store.RecordName(5)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("event 5 not compacted: %v", err)
	}
	// Appending, the sleeper creates event 5 (a hole), sees it is behind,
	// reloads, and lands at 100.
	if err := sleeper.append(ctx, func(_ *groupState, e *event) bool { e.Release = []string{"s0"}; return true }); err != nil {
		t.Fatal(err)
	}
	if sleeper.st.Next != 101 {
		t.Fatalf("sleeper appended and stands at %d, want 101", sleeper.st.Next)
	}
	if err := busy.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	m.follow(t, ctx, obj)
	m.equal(t, busy)
	m.equal(t, sleeper)
	// A reader behind a compaction catches up too.
	if err := busy.append(ctx, randomEvent(rng, 101)); err != nil {
		t.Fatal(err)
	}
	reader := &coordinator{groupLog: &groupLog{obj: obj, log: store.NewJournal(obj), snapEvery: SnapshotEvery, st: &groupState{Next: 3, Shards: map[string]*shardState{}}}}
	if err := reader.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	m.follow(t, ctx, obj)
	m.equal(t, reader)

	// A damaged log (its snapshots gone): a reader behind the compaction
	// fails, instead of reloading nothing for ever.
	snaps, err := obj.List(ctx, "snap-")
	if err != nil || len(snaps) == 0 {
		t.Fatalf("snapshots %v: %v", snaps, err)
	}
	for _, n := range snaps {
		if err := obj.Delete(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	lost := &coordinator{groupLog: &groupLog{obj: obj, log: store.NewJournal(obj), snapEvery: SnapshotEvery, st: &groupState{Next: 3, Shards: map[string]*shardState{}}}}
	refreshed := make(chan error, 1)
	go func() { refreshed <- lost.refresh(ctx) }()
	select {
	case err := <-refreshed:
		if err == nil || !strings.Contains(err.Error(), "compacted away") {
			t.Fatalf("refresh behind a compaction with no snapshot: %v, want an error", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("refresh behind a compaction with no snapshot still running after a minute")
	}
}

// failing is an Objects that stops working (the process died) after
// budget operations.
type failing struct {
	Objects
	budget int
}

var errDied = errors.New("died")

func (f *failing) spend() error {
	if f.budget <= 0 {
		return errDied
	}
	f.budget--
	return nil
}

func (f *failing) Create(ctx context.Context, name string, data []byte) error {
	if err := f.spend(); err != nil {
		return err
	}
	return f.Objects.Create(ctx, name, data)
}

func (f *failing) Get(ctx context.Context, name string) ([]byte, error) {
	if err := f.spend(); err != nil {
		return nil, err
	}
	return f.Objects.Get(ctx, name)
}

func (f *failing) List(ctx context.Context, prefix string) ([]string, error) {
	if err := f.spend(); err != nil {
		return nil, err
	}
	return f.Objects.List(ctx, prefix)
}

func (f *failing) Delete(ctx context.Context, name string) error {
	if err := f.spend(); err != nil {
		return err
	}
	return f.Objects.Delete(ctx, name)
}

// A member dies at every step of appends, snapshots and compactions (the
// store's operations are its steps: after each one, it stops): whoever
// opens the log next sees every event that was appended, exactly once.
func TestLogSurvivesDeathAtEveryStep(t *testing.T) {
	ctx := context.Background()
	for budget := 0; budget < 120; budget++ {
		obj := newObjects(t)
		rng := rand.New(rand.NewSource(int64(budget)))
		m := &mirror{st: &groupState{Shards: map[string]*shardState{}}}
		// Some history, with two snapshots.
		healthy, _ := openCoordinator(ctx, obj, "h/1")
		healthy.snapEvery = 4
		for n := 0; n < 10; n++ {
			if err := healthy.append(ctx, randomEvent(rng, n)); err != nil {
				t.Fatal(err)
			}
			m.follow(t, ctx, obj)
		}
		f := &failing{Objects: obj, budget: budget}
		dying, err := openCoordinator(ctx, f, "d/1")
		if err == nil {
			dying.snapEvery = 4
			for n := 10; n < 30; n++ {
				err := dying.append(ctx, randomEvent(rng, n))
				m.follow(t, ctx, obj)
				if err != nil {
					break
				}
			}
		}
		m.follow(t, ctx, obj)
		next, err := openCoordinator(ctx, obj, "n/1")
		if err != nil {
			t.Fatalf("budget %d: %v", budget, err)
		}
		m.equal(t, next)
		// And the log goes on.
		next.snapEvery = 4
		for n := 0; n < 12; n++ {
			if err := next.append(ctx, randomEvent(rng, n)); err != nil {
				t.Fatalf("budget %d: %v", budget, err)
			}
			m.follow(t, ctx, obj)
		}
		again, _ := openCoordinator(ctx, obj, "a/1")
		m.equal(t, again)
	}
}

// hooked runs before once, ahead of the first Create.
type hooked struct {
	Objects
	before func()
}

func (h *hooked) Create(ctx context.Context, name string, data []byte) error {
	if b := h.before; b != nil {
		h.before = nil
		b()
	}
	return h.Objects.Create(ctx, name, data)
}

// The log is compacted past a member between its read to the end and its
// create: the create lands in a hole, which the member sees; it reloads
// and appends at the end.
func TestAppendIntoCompactedHole(t *testing.T) {
	obj := newObjects(t)
	ctx := context.Background()
	rng := rand.New(rand.NewSource(3))
	busy, _ := openCoordinator(ctx, obj, "busy/1")
	busy.snapEvery = 4
	m := &mirror{st: &groupState{Shards: map[string]*shardState{}}}
	h := &hooked{Objects: obj}
	sleeper, _ := openCoordinator(ctx, h, "sleeper/1")
	h.before = func() {
		for n := 0; n < 20; n++ {
			if err := busy.append(ctx, randomEvent(rng, n)); err != nil {
				t.Fatal(err)
			}
			m.follow(t, ctx, obj)
		}
	}
	if err := sleeper.append(ctx, func(_ *groupState, e *event) bool { e.Release = []string{"s0"}; return true }); err != nil {
		t.Fatal(err)
	}
	if sleeper.st.Next != 21 {
		t.Fatalf("sleeper stands at %d, want 21", sleeper.st.Next)
	}
	m.follow(t, ctx, obj)
	m.equal(t, sleeper)
	fresh, _ := openCoordinator(ctx, obj, "fresh/1")
	m.equal(t, fresh)
}
