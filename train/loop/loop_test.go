package loop

import (
	"context"
	"errors"
	"io"
	"sort"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/traintest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func versions(t *testing.T, root, group string) (*local.Reader, func() Publication) {
	t.Helper()
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	obj, err := r.Objects(VersionsDir(group))
	if err != nil {
		t.Fatal(err)
	}
	return r, func() Publication {
		t.Helper()
		p, ok, err := Served(context.Background(), obj)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return Publication{PolicyVersion: -1}
		}
		return p
	}
}

// The served version is the highest published: ranks publishing the same
// version publish it once, a lower one changes nothing, and versions are
// per consumer group.
func TestServedIsTheHighestPublished(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	r, served := versions(t, root, "g")
	if got := served().PolicyVersion; got != -1 {
		t.Fatalf("nothing published: served %d", got)
	}
	obj, _ := r.Objects(VersionsDir("g"))
	first, err := Publish(ctx, obj, 3, "rank-0")
	if err != nil {
		t.Fatal(err)
	}
	again, err := Publish(ctx, obj, 3, "rank-1")
	if err != nil || again != first || again.By != "rank-0" {
		t.Fatalf("the same version again: %+v, %v; want the first publication %+v", again, err, first)
	}
	if _, err := Publish(ctx, obj, 12, "rank-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := Publish(ctx, obj, 5, "lagging"); err != nil {
		t.Fatal(err)
	}
	if p := served(); p.PolicyVersion != 12 || p.By != "rank-1" || p.At.IsZero() {
		t.Fatalf("served %+v, want 12 by rank-1", p)
	}
	_, other := versions(t, root, "other")
	if got := other().PolicyVersion; got != -1 {
		t.Fatalf("another group sees version %d", got)
	}
	for _, v := range []int64{-1, train.MaxPolicyVersion + 1} {
		if _, err := Publish(ctx, obj, v, "x"); err == nil {
			t.Errorf("version %d published", v)
		}
	}
}

// Publications beyond Keep are pruned, oldest first, and the served
// version is still the highest.
func TestPublicationsArePruned(t *testing.T) {
	ctx := context.Background()
	r, served := versions(t, t.TempDir(), "g")
	obj, _ := r.Objects(VersionsDir("g"))
	for v := int64(0); v < Keep+20; v++ {
		if _, err := Publish(ctx, obj, v, "t"); err != nil {
			t.Fatal(err)
		}
	}
	names, err := obj.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != Keep || names[0] != name(20) {
		t.Fatalf("%d publications kept (first %s), want %d from %s", len(names), names[0], Keep, name(20))
	}
	if got := served().PolicyVersion; got != Keep+19 {
		t.Fatalf("served %d, want %d", got, Keep+19)
	}
}

// The follower counts committed and consumed groups, reads only what is
// new each time, and reports the keys committed since its last look.
func TestFollower(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root := t.TempDir()
	traintest.WriteShards(t, root, 2, 3, 4) // groups g000..g005
	r, _ := versions(t, root, "g")
	f, err := NewFollower(r, "g")
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(s.CommittedKeys)
	if s.Committed != 6 || s.Consumed != 0 || s.HasServed || s.Trained != -1 || len(s.CommittedKeys) != 6 || s.CommittedKeys[5] != "g005" {
		t.Fatalf("first state %+v", s)
	}

	// A trainer consumes four groups and publishes version 7; two more
	// groups are committed.
	obj, _ := r.Objects(train.GroupDir("g"))
	c, err := train.NewConsumer(ctx, r, obj, train.ConsumerConfig{Config: train.Config{MaxStaleness: -1, IncludeFiltered: true},
		Name: "t", Poll: 10 * time.Millisecond, MaxInflight: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		d, err := c.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		d.Record.Release()
		c.SetPolicyVersion(int64(5 + i)) // a step per batch: the acknowledgements carry 5..8
		if _, err := c.Ack(ctx, d.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Close(ctx); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	vobj, _ := r.Objects(VersionsDir("g"))
	if _, err := Publish(ctx, vobj, 7, "t"); err != nil {
		t.Fatal(err)
	}
	traintest.WriteShardsFrom(t, root, 6, 1, 2, 4)
	s, err = f.State(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Committed != 8 || s.Consumed != 4 || !s.HasServed || s.Served.PolicyVersion != 7 || s.Trained != 8 || len(s.CommittedKeys) != 2 || s.CommittedKeys[0] != "g006" {
		t.Fatalf("second state %+v", s)
	}
	if _, err := NewFollower(r, "../x"); err == nil {
		t.Fatal("a group name that is a path was taken")
	}
}
