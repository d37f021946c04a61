package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// foldingShards records where a consumer starts reading the manifest.
type foldingShards struct {
	Shards
	f    follower
	mu   sync.Mutex
	from []int
}

func (s *foldingShards) CommittedFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error) {
	s.mu.Lock()
	s.from = append(s.from, n)
	s.mu.Unlock()
	return s.f.CommittedFrom(ctx, n)
}

func (s *foldingShards) first() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.from[0]
}

func withFolds(t *testing.T, every, most int) {
	t.Helper()
	e, m := foldEvery, foldMax
	foldEvery, foldMax = every, most
	t.Cleanup(func() { foldEvery, foldMax = e, m })
}

// A long run's group state must not keep every shard ever done: done
// shards at the front of the manifest are folded into a low watermark,
// members start reading the manifest there, and the progress still
// counts every shard and group. Every group is delivered once, also to a
// member that joins after the folds and to shards committed later.
func TestLowWatermarkFoldsDoneShards(t *testing.T) {
	withFolds(t, 4, 8)
	root := t.TempDir()
	for i := range 20 {
		writeShardsTo(t, root, i*10, 10)
	}
	sh, obj := openGroup(t, root, "g")
	all, err := sh.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(name string) ConsumerConfig {
		return ConsumerConfig{Config: Config{MaxStaleness: -1, MaxTokens: 16, IncludeFiltered: true}, Name: name, LeaseTimeout: time.Hour, Poll: time.Millisecond}
	}
	l := &ledger{acked: map[string]int{}}
	a, err := NewConsumer(context.Background(), sh, obj, cfg("a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := consume(t, a, l, 16, 0); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	c, err := openCoordinator(context.Background(), obj, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.st.Low < int64(len(all)-foldEvery) || len(c.st.Shards) > foldEvery+1 {
		t.Fatalf("after %d shards done: low watermark %d, %d shard states kept", len(all), c.st.Low, len(c.st.Shards))
	}
	if c.st.LowPath != all[c.st.Low-1].Path {
		t.Fatalf("low path %s, the manifest's shard there is %s", c.st.LowPath, all[c.st.Low-1].Path)
	}
	p, err := GroupProgress(context.Background(), obj)
	if err != nil {
		t.Fatal(err)
	}
	if p.Shards != len(all) || p.Done != len(all) || p.GroupsAcked != 200 {
		t.Fatalf("progress %+v, want %d shards done and 200 groups acknowledged", p, len(all))
	}
	// A member joining later starts at the watermark (one shard before
	// it, to check it), and gets exactly the groups committed after.
	for i := 20; i < 24; i++ {
		writeShardsTo(t, root, i*10, 10)
	}
	fs := &foldingShards{Shards: sh, f: sh}
	b, err := NewConsumer(context.Background(), fs, obj, cfg("b"))
	if err != nil {
		t.Fatal(err)
	}
	if err := consume(t, b, l, 16, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fs.first() != int(c.st.Low)-1 {
		t.Fatalf("the new member read the manifest from shard %d, want %d (the watermark's)", fs.first(), c.st.Low-1)
	}
	if len(l.acked) != 240 {
		t.Fatalf("%d groups acknowledged, want 240", len(l.acked))
	}
	for k, n := range l.acked {
		if n != 1 {
			t.Fatalf("group %s acknowledged %d times", k, n)
		}
	}
	if p, _ := GroupProgress(context.Background(), obj); p.GroupsAcked != 240 || p.Done != p.Shards {
		t.Fatalf("progress %+v", p)
	}
}

// A group log whose watermark names a shard the manifest does not list
// there (the group of another output root) is refused, not trusted.
func TestLowWatermarkOfAnotherManifestRefused(t *testing.T) {
	withFolds(t, 2, 4)
	root := t.TempDir()
	for i := range 6 {
		writeShardsTo(t, root, i*10, 10)
	}
	sh, obj := openGroup(t, root, "g")
	a, err := NewConsumer(context.Background(), sh, obj, ConsumerConfig{Config: Config{MaxStaleness: -1, IncludeFiltered: true}, Name: "a", LeaseTimeout: time.Hour, Poll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := consume(t, a, &ledger{acked: map[string]int{}}, 0, 0); err != nil {
		t.Fatal(err)
	}
	a.Close(context.Background())
	other := t.TempDir()
	for i := range 6 {
		writeShardsTo(t, other, 100+i*10, 10)
	}
	osh, _ := openGroup(t, other, "g")
	b, err := NewConsumer(context.Background(), osh, obj, ConsumerConfig{Config: Config{MaxStaleness: -1}, Name: "b", LeaseTimeout: time.Hour, Poll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer b.abandon()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = b.Next(ctx)
	if err == nil || errors.Is(err, io.EOF) || !strings.Contains(err.Error(), "folded") {
		t.Fatalf("a group log of another manifest: %v, want it refused", err)
	}
}

// A fold that does not start at the watermark, names a shard twice, or
// names one not done is ignored; a valid one drops the states and keeps
// the counts.
func TestFoldRules(t *testing.T) {
	st := &groupState{Shards: map[string]*shardState{
		"a": {Done: true, NAcked: 3}, "b": {Done: true, NAcked: 1, NSkip: 2}, "c": {Holder: "m/1"},
	}}
	for _, f := range []*foldEvent{
		{From: 1, Paths: []string{"a"}},
		{From: 0, Paths: []string{"a", "a"}},
		{From: 0, Paths: []string{"a", "c"}},
		{From: 0, Paths: []string{"x"}},
		{From: 0},
	} {
		st.fold(f)
		if st.Low != 0 || len(st.Shards) != 3 {
			t.Fatalf("fold %+v applied: %+v", f, st)
		}
	}
	st.fold(&foldEvent{From: 0, Paths: []string{"a", "b"}, Version: 7})
	if st.Low != 2 || st.LowPath != "b" || st.LowVersion != 7 || st.LowAcked != 4 || st.LowSkipped != 2 || len(st.Shards) != 1 {
		t.Fatalf("after a valid fold: %+v", st)
	}
	// An acknowledgement of a folded shard does not bring it back.
	st.apply(&event{Seq: 5, Member: "m/1", Ack: []marks{{Shard: "a", Groups: []int32{0}}}, Totals: map[string]int32{"b": 3}})
	if len(st.Shards) != 1 || st.Shards["a"] != nil {
		t.Fatalf("a folded shard came back: %+v", st.Shards)
	}
}

// A member that read the manifest before another member consumed and
// folded the shards must not take a folded shard (it has no state any
// more) for a new one: whether it still holds the folded entries
// (foldMax large) or drops them (small).
func TestMemberBehindAFoldLeasesNoFoldedShard(t *testing.T) {
	for _, most := range []int{4, 1000} {
		t.Run(fmt.Sprint("foldMax=", most), func(t *testing.T) {
			withFolds(t, 2, most)
			root := t.TempDir()
			for i := range 8 {
				writeShardsTo(t, root, i*10, 10)
			}
			sh, obj := openGroup(t, root, "g")
			cfg := func(name string) ConsumerConfig {
				return ConsumerConfig{Config: Config{MaxStaleness: -1, IncludeFiltered: true}, Name: name, LeaseTimeout: time.Hour, Poll: time.Hour}
			}
			behind, err := NewConsumer(context.Background(), sh, obj, cfg("behind"))
			if err != nil {
				t.Fatal(err)
			}
			defer behind.abandon()
			if err := behind.follow(context.Background()); err != nil { // reads the manifest now, not again for an hour
				t.Fatal(err)
			}
			l := &ledger{acked: map[string]int{}}
			busy, err := NewConsumer(context.Background(), sh, obj, cfg("busy"))
			if err != nil {
				t.Fatal(err)
			}
			if err := consume(t, busy, l, 0, 0); err != nil {
				t.Fatal(err)
			}
			if err := busy.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if err := behind.coord.refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			var low int64
			behind.coord.view(func(st *groupState) { low = st.Low })
			if low == 0 {
				t.Fatal("nothing was folded")
			}
			if err := consume(t, behind, l, 0, 0); err != nil {
				t.Fatal(err)
			}
			if len(l.acked) != 80 {
				t.Fatalf("%d groups acknowledged, want 80", len(l.acked))
			}
			for k, n := range l.acked {
				if n != 1 {
					t.Fatalf("group %s acknowledged %d times (low watermark %d)", k, n, low)
				}
			}
		})
	}
}
