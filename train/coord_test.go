package train

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
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
				e.Ack = []marks{{shard, groups}}
			} else {
				e.Skip = []marks{{shard, groups}}
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

// A member opening the log from a snapshot sees the state a full replay
// gives.
func TestLogSnapshots(t *testing.T) {
	obj := newObjects(t)
	ctx := context.Background()
	rng := rand.New(rand.NewSource(1))
	members := make([]*coordinator, 3)
	for i := range members {
		members[i], _ = openCoordinator(ctx, obj, fmt.Sprintf("m%d/1", i))
		members[i].snapEvery = 16
	}
	for n := 0; n < 200; n++ {
		c := members[rng.Intn(len(members))]
		shard := fmt.Sprintf("s%d", rng.Intn(6))
		if err := c.append(ctx, func(_ *groupState, e *event) bool {
			switch rng.Intn(4) {
			case 0:
				e.Lease = []string{shard}
				if rng.Intn(2) == 0 {
					e.Expect = map[string]int64{shard: int64(rng.Intn(n + 1))}
				}
			case 1:
				e.Ack = []marks{{shard, []int32{int32(rng.Intn(8))}}}
			case 2:
				e.Skip = []marks{{shard, []int32{int32(rng.Intn(8))}}}
				e.Totals = map[string]int32{shard: 8}
			case 3:
				e.Release = []string{shard}
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
	}
	snaps, _ := obj.List(ctx, "snap-")
	if len(snaps) < 10 {
		t.Fatalf("%d snapshots after 200 events every 16", len(snaps))
	}
	fromSnap, err := openCoordinator(ctx, obj, "x/1")
	if err != nil {
		t.Fatal(err)
	}
	full := &coordinator{obj: obj, snapEvery: SnapshotEvery, st: &groupState{Shards: map[string]*shardState{}}}
	if err := full.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(fromSnap.st)
	b, _ := json.Marshal(full.st)
	if string(a) != string(b) || full.st.Next != 200 {
		t.Fatalf("state from snapshot differs from full replay:\n%s\n%s", a, b)
	}
}
