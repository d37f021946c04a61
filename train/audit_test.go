package train

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// seenBatch is a delivered batch as the trainer saw it.
type seenBatch struct {
	id     uint64
	groups []string
	policy int64
	ipc    []byte
	rows   int64
}

func ipcBytes(t *testing.T, rec arrow.RecordBatch) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, ipc.WithSchema(rec.Schema()))
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// drain consumes c until EOF or stopAfter batches (0: no limit),
// acknowledging each at policy version policy(n).
func drain(t *testing.T, c *Consumer, stopAfter int, policy func(n int) int64) []seenBatch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out []seenBatch
	for n := 0; stopAfter == 0 || n < stopAfter; n++ {
		d, err := c.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		pv := policy(n)
		c.SetPolicyVersion(pv)
		out = append(out, seenBatch{id: d.ID, groups: d.Groups, policy: pv, ipc: ipcBytes(t, d.Record), rows: d.Record.NumRows()})
		d.Record.Release()
		if _, err := c.Ack(ctx, d.ID); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func TestAuditSurvivesCompactionAndReplayRepeatsTheBatches(t *testing.T) {
	root := t.TempDir()
	for i := range 3 {
		writeShardsTo(t, root, i*30, 30)
	}
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	ctx := context.Background()
	cfg := func(name string, maxTokens, pv, staleness int64) ConsumerConfig {
		return ConsumerConfig{
			Config: Config{PolicyVersion: pv, MaxStaleness: staleness, MaxTokens: maxTokens, Allocator: mem},
			Name:   name, LeaseTimeout: 300 * time.Millisecond, Poll: 10 * time.Millisecond,
		}
	}
	sh, obj := openGroup(t, root, "orig")
	c, err := NewConsumer(ctx, sh, obj, cfg("m", 20, 0, 2))
	if err != nil {
		t.Fatal(err)
	}
	c.coord.snapEvery = 3 // compact often
	// The policy moves on as it trains: some groups go stale (skipped,
	// not audited).
	orig := drain(t, c, 0, func(n int) int64 { return int64(n / 4) })
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if len(orig) < 20 {
		t.Fatalf("only %d batches", len(orig))
	}
	names, _ := obj.List(ctx, "")
	if slices.Contains(names, "00000000000000000000.json") || !slices.ContainsFunc(names, func(n string) bool { return n == auditName(3) }) {
		t.Fatalf("no compaction or no audit segment: %v", names)
	}

	got, err := ReadConsumed(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(orig) {
		t.Fatalf("audit has %d batches, %d were acknowledged", len(got), len(orig))
	}
	for i, b := range got {
		o := orig[i]
		var ids []string
		var steps int64
		for _, g := range b.Groups {
			ids = append(ids, g.GroupID)
			steps += g.Steps
			if g.Trajectories < 1 || g.Trajectories > 2 || int64(g.Trajectories) != g.Steps {
				t.Errorf("batch %d group %s: %d trajectories, %d steps (one step each)", i, g.GroupID, g.Trajectories, g.Steps)
			}
		}
		if b.BatchID != o.id || b.PolicyVersion != o.policy || !slices.Equal(ids, o.groups) || steps != o.rows || b.Member != c.Stats().Member {
			t.Fatalf("audit batch %d = %+v, acknowledged id %d at %d with %v (%d rows)", i, b, o.id, o.policy, o.groups, o.rows)
		}
		if i > 0 && b.Seq <= got[i-1].Seq {
			t.Fatalf("audit out of order at %d", i)
		}
	}

	p, err := GroupProgress(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Members) != 1 || p.Members[0].Name != "m" || p.Members[0].Batches != int64(len(orig)) ||
		p.Members[0].PolicyVersion != orig[len(orig)-1].policy || p.Members[0].Leased != 0 {
		t.Fatalf("members: %+v", p.Members)
	}

	// Replay: another budget and a policy far ahead with no staleness
	// allowed change nothing; a member crashes halfway holding a batch and
	// restarts under its name: it takes that batch back first, so the
	// order holds (another name would take it over after the lease
	// timeout, later in the order).
	_, robj := openGroup(t, root, "again")
	plan := ReplayPlan{From: "orig", Batches: got}
	if err := CreateReplay(ctx, robj, plan); err != nil {
		t.Fatal(err)
	}
	if err := CreateReplay(ctx, robj, plan); err != nil {
		t.Fatalf("the same plan again: %v", err)
	}
	if err := CreateReplay(ctx, robj, ReplayPlan{From: "orig", Batches: got[1:]}); !errors.Is(err, ErrReplayExists) {
		t.Fatalf("another plan: %v", err)
	}
	r1, err := NewConsumer(ctx, sh, robj, cfg("r1", 1000, 99, 0))
	if err != nil {
		t.Fatal(err)
	}
	r1.coord.snapEvery = 3
	half := len(orig) / 2
	replayed := drain(t, r1, half, func(int) int64 { return 99 })
	d, err := r1.Next(ctx) // taken, never acknowledged
	if err != nil {
		t.Fatal(err)
	}
	d.Record.Release()
	r1.abandon() // crash: its lease must time out
	if p, err := GroupProgress(ctx, robj); err != nil || len(p.Members) != 1 || p.Members[0].Leased != 1 || p.Members[0].PolicyVersion != 99 {
		t.Fatalf("the replay group's members while r1 holds a lease: %+v (%v)", p.Members, err)
	}
	r2, err := NewConsumer(ctx, sh, robj, cfg("r1", 0, 0, -1))
	if err != nil {
		t.Fatal(err)
	}
	replayed = append(replayed, drain(t, r2, 0, func(int) int64 { return 100 })...)
	if err := r2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if len(replayed) != len(orig) {
		t.Fatalf("replay delivered %d batches, the original %d", len(replayed), len(orig))
	}
	for i := range orig {
		if !slices.Equal(replayed[i].groups, orig[i].groups) || !bytes.Equal(replayed[i].ipc, orig[i].ipc) {
			t.Fatalf("replayed batch %d differs: groups %v vs %v, Arrow equal %v", i, replayed[i].groups, orig[i].groups, bytes.Equal(replayed[i].ipc, orig[i].ipc))
		}
	}
	again, err := ReadConsumed(ctx, robj)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != len(orig) {
		t.Fatalf("the replay group's audit has %d batches", len(again))
	}
	for i, b := range again {
		if b.Groups[0].Shard != got[i].Groups[0].Shard || b.Groups[0].Ordinal != got[i].Groups[0].Ordinal {
			t.Fatalf("replay audit %d names %+v, want the original's shard groups", i, b.Groups[0])
		}
	}
}

func TestCountTrajectories(t *testing.T) {
	b := array.NewStringBuilder(memory.DefaultAllocator)
	defer b.Release()
	for _, v := range []string{"a", "a", "b", "c", "c"} {
		b.Append(v)
	}
	col := b.NewStringArray()
	defer col.Release()
	sc := arrow.NewSchema([]arrow.Field{{Name: "trajectory_id", Type: arrow.BinaryTypes.String}}, nil)
	rec := array.NewRecordBatch(sc, []arrow.Array{col}, 5)
	defer rec.Release()
	a, z := rec.NewSlice(0, 3), rec.NewSlice(3, 5)
	defer a.Release()
	defer z.Release()
	if n := countTrajectories(&group{parts: []arrow.RecordBatch{a, z}}); n != 3 {
		t.Fatalf("%d trajectories, want 3", n)
	}
}

// A replay follows its plan, whatever the order: here the batches and
// the groups in each reversed, so the shards are read backwards.
func TestReplayFollowsAnyPlan(t *testing.T) {
	root := t.TempDir()
	for i := range 2 {
		writeShardsTo(t, root, i*20, 20)
	}
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	ctx := context.Background()
	cfg := ConsumerConfig{Config: Config{MaxStaleness: -1, MaxTokens: 30, Allocator: mem}, Name: "m", Poll: 10 * time.Millisecond}
	sh, obj := openGroup(t, root, "orig")
	c, err := NewConsumer(ctx, sh, obj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	orig := drain(t, c, 0, func(int) int64 { return 0 })
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := ReadConsumed(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	var plan ReplayPlan
	for i := len(got) - 1; i >= 0; i-- {
		b := got[i]
		b.Groups = slices.Clone(b.Groups)
		slices.Reverse(b.Groups)
		plan.Batches = append(plan.Batches, b)
	}
	_, robj := openGroup(t, root, "backwards")
	if err := CreateReplay(ctx, robj, plan); err != nil {
		t.Fatal(err)
	}
	r, err := NewConsumer(ctx, sh, robj, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	var n int
	for ; ; n++ {
		d, err := r.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, g := range plan.Batches[n].Groups {
			want = append(want, g.GroupID)
		}
		gid := d.Record.Column(schemas.ColGroupID).(*array.String)
		var rows []string
		for i := 0; i < gid.Len(); i++ {
			if i == 0 || gid.Value(i) != gid.Value(i-1) {
				rows = append(rows, gid.Value(i))
			}
		}
		d.Record.Release()
		if !slices.Equal(d.Groups, want) || !slices.Equal(rows, want) {
			t.Fatalf("batch %d: groups %v, rows of %v, planned %v", n, d.Groups, rows, want)
		}
		if _, err := r.Ack(ctx, d.ID); err != nil {
			t.Fatal(err)
		}
	}
	if n != len(orig) {
		t.Fatalf("replayed %d batches of %d", n, len(orig))
	}
}

// Logs written before the audit (acknowledgements without a batch) read
// as no consumed batch, and the audit names parse back.
func TestAuditOfOlderLogs(t *testing.T) {
	obj := newObjects(t)
	ctx := context.Background()
	c, _ := openCoordinator(ctx, obj, "a/1")
	for _, build := range []func(*groupState, *event) bool{
		func(_ *groupState, e *event) bool { e.Lease = []string{"s"}; return true },
		func(_ *groupState, e *event) bool { e.Ack = []marks{{Shard: "s", Groups: []int32{0}}}; return true },
	} {
		if err := c.append(ctx, build); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ReadConsumed(ctx, obj)
	if err != nil || len(got) != 0 {
		t.Fatalf("older log: %v, %v", got, err)
	}
	if p, err := GroupProgress(ctx, obj); err != nil || len(p.Members) != 1 || p.Members[0].Batches != 0 || p.Members[0].Leased != 1 {
		t.Fatalf("older log's members: %+v, %v", p.Members, err)
	}
}

func FuzzParseNumbered(f *testing.F) {
	f.Add(auditName(42), auditPrefix)
	f.Add("00000000000000000007.json", "")
	f.Add("audit-x.json", auditPrefix)
	f.Fuzz(func(t *testing.T, name, prefix string) {
		n, ok := store.ParseNumbered(name, prefix)
		if ok && (n < 0 || (prefix == auditPrefix && auditName(n) != name)) {
			t.Fatalf("%q parsed as %d", name, n)
		}
	})
}
