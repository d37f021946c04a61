package s3

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// commitShard uploads a shard at rel through s and commits it settling
// position pos of stream.
func commitShard(ctx context.Context, s *Store, rel, stream string, pos int64) error {
	p, err := s.Create(ctx, rel)
	if err != nil {
		return err
	}
	fmt.Fprintf(p, "shard %s", rel)
	return p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{stream: {{pos, pos}}}})
}

// TestIntegrationGroupCommit: writers that stage every entry at once
// commit each shard exactly once, in records that hold several entries
// (the group commit happened), and leave no staged object behind.
func TestIntegrationGroupCommit(t *testing.T) {
	cfg := testConfig(t)
	cfg.AlwaysStage = true
	ctx := context.Background()
	const writers, each = 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		s := open(t, cfg, fmt.Sprintf("w%d", w))
		stream := fmt.Sprintf("s/%d", w)
		if err := s.Claim(ctx, []string{stream}, 0); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := commitShard(ctx, s, fmt.Sprintf("policy=0/part-w%d-%06d.parquet", w, i), stream, int64(i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	r := open(t, cfg, "reader")
	es, err := r.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen, perRecord := map[string]bool{}, map[int64]int{}
	for _, e := range es {
		if seen[e.Path] {
			t.Fatalf("%s listed twice", e.Path)
		}
		seen[e.Path] = true
		perRecord[e.Seq]++
	}
	most := 0
	for _, n := range perRecord {
		most = max(most, n)
	}
	if len(seen) != writers*each || most < 2 {
		t.Fatalf("%d shards listed (want %d), at most %d in one record (want a group commit)", len(seen), writers*each, most)
	}
	if left, err := r.staged.List(ctx, ""); err != nil || len(left) != 0 {
		t.Fatalf("staged objects left: %v (%v)", left, err)
	}
	t.Logf("%d shards in %d records", len(es), len(perRecord))
}

// TestIntegrationStagedEntryIsFenced: a zombie whose stream was claimed
// by another writer stages an entry: the sealer rejects it, the zombie's
// commit fails with ErrFenced, and the manifest never lists its shard.
// An entry its owner staged before losing the stream is sealed by the
// new owner's claim, before the claim.
func TestIntegrationStagedEntryIsFenced(t *testing.T) {
	cfg := testConfig(t)
	cfg.AlwaysStage = true
	ctx := context.Background()
	a := open(t, cfg, "a")
	if err := a.Claim(ctx, []string{"s"}, 1); err != nil {
		t.Fatal(err)
	}
	// a stages an entry and dies before sealing it.
	early := schemas.ShardEntry{Path: "policy=0/part-a-000001.parquet", Writer: "a", Nonce: "n1", Rows: 1, Settled: schemas.Settled{"s": {{1, 1}}}}
	if err := a.putIfAbsent(ctx, a.key(early.Path), bytes.NewReader([]byte("x")), 1, ""); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(early)
	if err := a.staged.Create(ctx, stagedName(early.Path), data); err != nil {
		t.Fatal(err)
	}
	// Its own sweep leaves the staged shard alone.
	a.touched["policy=0"] = true
	if removed, err := a.RemoveOwnOrphans(ctx); err != nil || len(removed) != 0 {
		t.Fatalf("a's sweep removed %v (%v): a staged shard is not an orphan", removed, err)
	}
	b := open(t, cfg, "b")
	if err := b.Claim(ctx, []string{"s"}, 2); err != nil {
		t.Fatal(err)
	}
	if !b.Settled()["s"].Contains(1) {
		t.Fatal("b's claim did not seal the entry a staged before it")
	}
	// a, not knowing it lost the stream, commits again: fenced.
	err := commitShard(ctx, a, "policy=0/part-a-000002.parquet", "s", 2)
	if !errors.Is(err, ErrFenced) {
		t.Fatalf("the zombie's staged commit: %v, want ErrFenced", err)
	}
	es, err := b.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if e.Path == "policy=0/part-a-000002.parquet" {
			t.Fatal("the manifest lists the fenced shard")
		}
	}
	if err := b.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Settled()["s"].Contains(2) {
		t.Fatal("the fenced entry's position is settled")
	}
}
