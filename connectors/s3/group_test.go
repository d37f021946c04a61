package s3

import (
	"context"
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

// TestIntegrationGroupCommit: stores whose lanes commit at once (four
// stores of eight lanes, racing each other too) commit each shard
// exactly once, in records that hold several entries.
func TestIntegrationGroupCommit(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	const stores, lanes, each = 4, 8, 6
	var wg sync.WaitGroup
	errs := make(chan error, stores*lanes)
	for w := range stores {
		s := open(t, cfg, fmt.Sprintf("w%d", w))
		var streams []string
		for l := range lanes {
			streams = append(streams, fmt.Sprintf("s/%d/%d", w, l))
		}
		if err := s.Claim(ctx, streams, 0); err != nil {
			t.Fatal(err)
		}
		for l, stream := range streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range each {
					if err := commitShard(ctx, s, fmt.Sprintf("policy=0/part-w%d-%03d%03d.parquet", w, l, i), stream, int64(i)); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
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
	if len(seen) != stores*lanes*each || most < 2 {
		t.Fatalf("%d shards listed (want %d), at most %d in one record (want a group commit)", len(seen), stores*lanes*each, most)
	}
	t.Logf("%d shards in %d records (at most %d in one)", len(es), len(perRecord), most)
}

// TestIntegrationGroupCommitFencesOneEntry: of the appends queued
// together, one settling a stream another writer has claimed fails with
// ErrFenced; the others land.
func TestIntegrationGroupCommitFencesOneEntry(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	a := open(t, cfg, "a")
	if err := a.Claim(ctx, []string{"mine", "lost"}, 1); err != nil {
		t.Fatal(err)
	}
	b := open(t, cfg, "b")
	if err := b.Claim(ctx, []string{"lost"}, 2); err != nil {
		t.Fatal(err)
	}
	if err := a.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	// Queue several appends at once; one of them settles "lost".
	var wg sync.WaitGroup
	results := make([]error, 6)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stream := "mine"
			if i == 3 {
				stream = "lost"
			}
			results[i] = commitShard(ctx, a, fmt.Sprintf("policy=0/part-a-%06d.parquet", i), stream, int64(i))
		}()
	}
	wg.Wait()
	for i, err := range results {
		if (i == 3) != errors.Is(err, ErrFenced) || (i != 3 && err != nil) {
			t.Errorf("append %d: %v", i, err)
		}
	}
	es, err := b.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, e := range es {
		listed[e.Path] = true
	}
	for i := range results {
		if listed[fmt.Sprintf("policy=0/part-a-%06d.parquet", i)] != (i != 3) {
			t.Errorf("shard %d listed %v", i, !(i != 3))
		}
	}
}
