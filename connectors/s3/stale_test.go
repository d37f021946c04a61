package s3

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// afterCreate is a journal's objects that, once armed, runs then after
// the first record it creates has landed, before the journal looks
// behind it.
type afterCreate struct {
	store.Objects
	mu   sync.Mutex
	then func()
}

func (o *afterCreate) Create(ctx context.Context, name string, data []byte) error {
	err := o.Objects.Create(ctx, name, data)
	o.mu.Lock()
	then := o.then
	if _, record := store.ParseNumbered(name, ""); !record {
		then = nil
	}
	if then != nil {
		o.then = nil
	}
	o.mu.Unlock()
	if err == nil && then != nil {
		then()
	}
	return err
}

// TestIntegrationStaleAppendThatLanded: a writer's manifest entry lands,
// then, before the writer checks the slot behind it, another writer
// appends on and compacts the log past it. The append sees ErrStale; the
// reloaded snapshot has the entry, so it is not appended again: every
// shard is in the manifest once.
func TestIntegrationStaleAppendThatLanded(t *testing.T) {
	cfg := testConfig(t)
	cfg.SnapshotEvery = 2
	ctx := context.Background()
	a, b := open(t, cfg, "writer-a"), open(t, cfg, "writer-b")
	for _, s := range []*Store{a, b} {
		if err := s.Claim(ctx, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	shard := func(w string, i int) schemas.ShardEntry {
		return schemas.ShardEntry{Path: fmt.Sprintf("policy=0/part-%s-%06d.parquet", w, i), Rows: 1}
	}
	for i := range 3 { // entries 0-3 with the claims; a snapshot at 2
		if err := a.Append(ctx, shard("writer-a", i)); err != nil {
			t.Fatal(err)
		}
	}
	hook := &afterCreate{Objects: a.manifest}
	a.journal = store.NewJournal(hook)
	var bErr error
	hook.then = func() {
		// b appends past a's entry: snapshots, each compacting the
		// records below the one before it, until the slot behind a's
		// entry is gone.
		for i := range 4 {
			if bErr = b.Append(ctx, shard("writer-b", i)); bErr != nil {
				return
			}
		}
	}
	stale := shard("writer-a", 3)
	if err := a.Append(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if bErr != nil {
		t.Fatal(bErr)
	}
	if hook.then != nil {
		t.Fatal("the hook never ran")
	}
	r, err := OpenReader(ctx, cfg, "reader")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	es, err := r.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range es {
		if e.Path != "" {
			count[e.Path]++
		}
	}
	for i := range 4 {
		for _, w := range []string{"writer-a", "writer-b"} {
			if p := shard(w, i).Path; count[p] != 1 {
				t.Errorf("%s is in the manifest %d times, want once", p, count[p])
			}
		}
	}
}
