package sink_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// batches builds n single-trajectory groups at the given version.
func batches(t *testing.T, mem memory.Allocator, version, n int) []transform.Batch {
	t.Helper()
	a := transform.NewAssembler(transform.Config{GroupSize: 1})
	var d ingest.Decoder
	for i := range n {
		for _, l := range []string{
			fmt.Sprintf(`{"type":"step","step_id":"v%d-s%d","task_id":"v%d-t%d","trajectory_id":"v%d-r%d","step_index":0,"policy_version":%d,"prompt_ids":[1,2,3],"response_ids":[4],"response_logprobs":[-1]}`, version, i, version, i, version, i, version),
			fmt.Sprintf(`{"type":"trajectory","trajectory_id":"v%d-r%d","task_id":"v%d-t%d","reward":%d,"num_steps":1}`, version, i, version, i, i%2),
		} {
			rec, err := d.Decode([]byte(l))
			if err != nil {
				t.Fatal(err)
			}
			it := ingest.Item{Source: schemas.Source{File: "in", Line: int64(i)}, Raw: []byte(l), Rec: rec}
			a.Add(&it, time.Now())
		}
	}
	groups := a.Take().Groups
	bt := transform.NewBatcher(mem, transform.BatchConfig{Estimator: mustGRPO()})
	defer bt.Release()
	out, err := bt.Build(groups)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func countRows(t *testing.T, root string, e schemas.ShardEntry) int64 {
	t.Helper()
	var n int64
	err := parquet.ReadFile(context.Background(), filepath.Join(root, e.Path), []string{"step_id"}, memory.DefaultAllocator, func(r arrow.RecordBatch) error {
		n += r.NumRows()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newSink(t *testing.T, root string, cfg sink.Config) (*local.Store, *sink.Sink) {
	t.Helper()
	st, err := local.Open(root, "r")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st, sink.New(st, cfg)
}

// committed returns the store's shard entries.
func committed(t *testing.T, st *local.Store) []schemas.ShardEntry {
	t.Helper()
	e, err := st.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestSinkRollsBySizeAndAge(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	st, sk := newSink(t, root, sink.Config{ShardSize: 1, FlushInterval: time.Hour, RunID: "r"})
	now := time.Now()
	for _, b := range batches(t, mem, 0, 10) {
		if err := sk.Write(ctx, b, now); err != nil {
			t.Fatal(err)
		}
	}
	// ShardSize 1 byte: every write commits a shard at once.
	if err := sk.Wait(); err != nil {
		t.Fatal(err)
	}
	if sk.Totals.Shards != 1 || sk.Totals.Rows != 10 {
		t.Fatalf("totals %+v", sk.Totals)
	}
	for _, b := range batches(t, mem, 3, 4) {
		if err := sk.Write(ctx, b, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := sk.Wait(); err != nil {
		t.Fatal(err)
	}
	entries := committed(t, st)
	if len(entries) != 2 || entries[1].Path != "policy=3/part-r-000002.parquet" || entries[1].Rows != 4 || entries[1].Groups != 4 {
		t.Fatalf("entries %+v", entries)
	}
	for _, e := range entries {
		if got := countRows(t, root, e); got != e.Rows {
			t.Fatalf("%s: %d rows, manifest says %d", e.Path, got, e.Rows)
		}
	}

	// Age: a quiet partition is committed at the flush interval.
	_, sk = newSink(t, t.TempDir(), sink.Config{FlushInterval: time.Minute, RunID: "r"})
	for _, b := range batches(t, mem, 1, 2) {
		if err := sk.Write(ctx, b, now); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(sk.Tick(ctx, now.Add(59*time.Second)), sk.Wait()); err != nil || sk.Totals.Shards != 0 {
		t.Fatalf("committed early: %v %+v", err, sk.Totals)
	}
	if err := errors.Join(sk.Tick(ctx, now.Add(time.Minute)), sk.Wait()); err != nil || sk.Totals.Shards != 1 {
		t.Fatalf("not committed at the interval: %v %+v", err, sk.Totals)
	}
}

func TestSinkAbortLeavesNoData(t *testing.T) {
	root := t.TempDir()
	mem := memory.NewGoAllocator()
	_, sk := newSink(t, root, sink.Config{RunID: "r"})
	for _, b := range batches(t, mem, 0, 3) {
		if err := sk.Write(context.Background(), b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := sk.Abort(); err != nil {
		t.Fatal(err)
	}
	var files []string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if !d.IsDir() && filepath.Dir(p) != filepath.Join(root, local.ManifestDir) {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 0 {
		t.Fatalf("left behind: %v", files)
	}
}

// A crash after the rename but before the manifest append leaves a
// published shard that the manifest does not list: it is not data, and the
// next writer removes it (its name is a known writer's), with the dead
// writer's temporary files; files the store did not create stay.
func TestUnlistedShardIsRemoved(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	mem := memory.NewGoAllocator()
	st, sk := newSink(t, root, sink.Config{RunID: "r"})
	for _, b := range batches(t, mem, 2, 5) {
		if err := sk.Write(ctx, b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := sk.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st.Close()
	mpath := filepath.Join(root, local.ManifestDir, local.ManifestFile)
	entries, err := local.ReadManifest(root)
	if err != nil || len(entries) != 1 || entries[0].Path != "policy=2/part-r-000001.parquet" {
		t.Fatalf("manifest %+v %v", entries, err)
	}
	// The entry was never appended, and a second one is torn.
	if err := os.WriteFile(mpath, []byte(`{"path":"policy=9/x.parq`), 0o644); err != nil {
		t.Fatal(err)
	}
	litter := map[string]bool{
		local.TmpDir + "/r.0123456789abcdef.tmp": false, // a dead writer's
		local.TmpDir + "/notes.txt":              true,  // a user's
		"policy=2/copy.parquet":                  true,
		"backup/policy=2/part-r-000001.parquet":  true,
	}
	for rel := range litter {
		p := filepath.Join(root, filepath.FromSlash(rel))
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st2, err := local.Open(root, "r2")
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	if e := committed(t, st2); len(e) != 0 {
		t.Fatalf("committed %+v", e)
	}
	if _, err := os.Stat(filepath.Join(root, "policy=2", "part-r-000001.parquet")); !os.IsNotExist(err) {
		t.Fatal("unlisted shard kept")
	}
	for rel, keep := range litter {
		_, err := os.Stat(filepath.Join(root, filepath.FromSlash(rel)))
		if kept := err == nil; kept != keep {
			t.Errorf("%s: kept %v, want %v", rel, kept, keep)
		}
	}
	again, err := local.ReadManifest(root)
	if err != nil || len(again) != 0 {
		t.Fatalf("manifest after repair: %v %+v", err, again)
	}
}

func mustGRPO() advantage.Estimator {
	e, err := advantage.New("grpo", advantage.Options{Compat: advantage.RLLM})
	if err != nil {
		panic(err)
	}
	return e
}

// With two lanes, batches of one partition alternate between two shards
// encoded concurrently; every row lands once (the batches repeat group
// keys round after round; rows are what is counted).
func TestSinkLanes(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	st, sk := newSink(t, root, sink.Config{Lanes: 2, FlushInterval: time.Hour, RunID: "r"})
	var want int64
	for round := 0; round < 6; round++ {
		for _, b := range batches(t, mem, 0, 5) {
			want += b.Record.NumRows()
			if err := sk.Write(ctx, b, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sk.Close(ctx); err != nil {
		t.Fatal(err)
	}
	entries := committed(t, st)
	var shards int
	var rows int64
	seen := map[string]bool{}
	for _, e := range entries {
		if e.Path == "" {
			continue
		}
		shards++
		rows += e.Rows
		if got := countRows(t, root, e); got != e.Rows {
			t.Fatalf("%s: %d rows, manifest says %d", e.Path, got, e.Rows)
		}
		if e.Rows == 0 {
			t.Fatalf("%s is empty", e.Path)
		}
		seen[e.Path] = true
	}
	if shards != 2 || len(seen) != 2 || rows != want {
		t.Fatalf("%d shards with %d rows; want 2 lanes' shards with %d", shards, rows, want)
	}
}

// Lanes are shared among the partitions being written: with two lanes and
// two partitions written in turn, each partition writes one shard; a
// partition written after the other stopped gets both lanes again.
func TestSinkLanesShared(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	st, sk := newSink(t, root, sink.Config{Lanes: 2, FlushInterval: time.Hour, RunID: "r"})
	var want int64
	for round := 0; round < 6; round++ {
		for _, v := range []int{0, 1} {
			for _, b := range batches(t, mem, v, 5) {
				want += b.Record.NumRows()
				if err := sk.Write(ctx, b, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := sk.Close(ctx); err != nil {
		t.Fatal(err)
	}
	perVersion := map[int64]int{}
	var rows int64
	for _, e := range committed(t, st) {
		if e.Path == "" {
			continue
		}
		perVersion[e.PolicyVersion]++
		rows += e.Rows
	}
	if perVersion[0] != 1 || perVersion[1] != 1 || rows != want {
		t.Fatalf("shards per partition %v, %d rows; want one shard each, %d rows", perVersion, rows, want)
	}

	// Partition 2 alone, then 3 alone: both lanes each (3 once 2 has not
	// been written for 32 batches).
	st, sk = newSink(t, t.TempDir(), sink.Config{Lanes: 2, FlushInterval: time.Hour, RunID: "r"})
	for _, v := range []int{2, 3} {
		for round := 0; round < 40; round++ {
			for _, b := range batches(t, mem, v, 5) {
				if err := sk.Write(ctx, b, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if err := sk.Close(ctx); err != nil {
		t.Fatal(err)
	}
	perVersion = map[int64]int{}
	for _, e := range committed(t, st) {
		if e.Path != "" {
			perVersion[e.PolicyVersion]++
		}
	}
	// 3's second lane opens after 32 batches; its first-lane shard from
	// before is still open, so 3 has two shards, as 2 has.
	if perVersion[2] != 2 || perVersion[3] != 2 {
		t.Fatalf("shards per partition %v; want two each", perVersion)
	}
}

// TestSinkBurstOfVersions writes one group of each of 2,000 versions
// (rising, then a few falling): beyond MaxPartitions open at once,
// versions share shards instead of making one tiny shard each, every row
// is written once, and an entry's policy version is its smallest.
func TestSinkBurstOfVersions(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	st, sk := newSink(t, root, sink.Config{FlushInterval: time.Hour, RunID: "r", MaxPartitions: 4, MaxOpenShards: 8})
	now := time.Now()
	versions := make([]int, 0, 2010)
	for v := range 2000 {
		versions = append(versions, v+100)
	}
	for v := 10; v > 0; v-- {
		versions = append(versions, v) // below every open partition
	}
	for _, v := range versions {
		for _, b := range batches(t, mem, v, 1) {
			if err := sk.Write(ctx, b, now); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sk.Close(ctx); err != nil {
		t.Fatal(err)
	}
	entries := committed(t, st)
	if len(entries) > 8 {
		t.Fatalf("%d shards for a burst of versions, want at most 8", len(entries))
	}
	var rows int64
	for _, e := range entries {
		got := countRows(t, root, e)
		if got != e.Rows {
			t.Fatalf("%s: %d rows, manifest says %d", e.Path, got, e.Rows)
		}
		rows += got
		var lowest int64 = -1
		err := parquet.ReadFile(ctx, filepath.Join(root, e.Path), []string{"policy_version"}, memory.DefaultAllocator, func(r arrow.RecordBatch) error {
			for _, v := range r.Column(0).(*array.Int64).Int64Values() {
				if lowest < 0 || v < lowest {
					lowest = v
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if e.PolicyVersion != lowest {
			t.Fatalf("%s: entry's policy version %d, smallest in the shard %d", e.Path, e.PolicyVersion, lowest)
		}
	}
	if rows != int64(len(versions)) {
		t.Fatalf("%d rows committed, want %d", rows, len(versions))
	}
}

// gatedStore holds every shard commit until release is closed (or fails
// it with failWith).
type gatedStore struct {
	*local.Store
	started  chan string
	release  chan struct{}
	failWith error
}

func (g *gatedStore) Create(ctx context.Context, rel string) (store.Pending, error) {
	p, err := g.Store.Create(ctx, rel)
	return &gatedPending{Pending: p, g: g, rel: rel}, err
}

type gatedPending struct {
	store.Pending
	g   *gatedStore
	rel string
}

func (p *gatedPending) Commit(ctx context.Context, e schemas.ShardEntry) error {
	p.g.started <- p.rel
	<-p.g.release
	if p.g.failWith != nil {
		p.Pending.Abort()
		return p.g.failWith
	}
	return p.Pending.Commit(ctx, e)
}

// TestSinkCommitsInFlight: a shard's commit runs while the next batches
// are written, at most MaxCommits at once, and a failed commit fails the
// next call.
func TestSinkCommitsInFlight(t *testing.T) {
	ctx := context.Background()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	st, err := local.Open(t.TempDir(), "r")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	g := &gatedStore{Store: st, started: make(chan string, 8), release: make(chan struct{})}
	sk := sink.New(g, sink.Config{ShardSize: 1, FlushInterval: time.Hour, RunID: "r", MaxCommits: 2})
	// ShardSize 1: every write commits its shard. Two commits may wait
	// on the store while writing goes on.
	for v := range 2 {
		for _, b := range batches(t, mem, v, 1) {
			if err := sk.Write(ctx, b, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	<-g.started
	<-g.started
	third := make(chan error, 1)
	go func() {
		var err error
		for _, b := range batches(t, mem, 2, 1) {
			err = errors.Join(err, sk.Write(ctx, b, time.Now()))
		}
		third <- err
	}()
	select {
	case err := <-third:
		t.Fatalf("a third commit did not wait for a slot (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(g.release)
	if err := <-third; err != nil {
		t.Fatal(err)
	}
	if err := sk.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if sk.Totals.Shards != 3 || len(committed(t, st)) != 3 {
		t.Fatalf("totals %+v, entries %d", sk.Totals, len(committed(t, st)))
	}

	// A failed commit is reported by the next Write, and by Close.
	g2 := &gatedStore{Store: st, started: make(chan string, 8), release: make(chan struct{}), failWith: errors.New("upload refused")}
	close(g2.release)
	sk = sink.New(g2, sink.Config{ShardSize: 1, FlushInterval: time.Hour, RunID: "r2"})
	for _, b := range batches(t, mem, 0, 1) {
		if err := sk.Write(ctx, b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := sk.Wait(); !errors.Is(err, g2.failWith) {
		t.Fatalf("Wait: %v", err)
	}
	for _, b := range batches(t, mem, 0, 1) {
		if err := sk.Write(ctx, b, time.Now()); !errors.Is(err, g2.failWith) {
			t.Fatalf("Write after a failed commit: %v", err)
		}
	}
	if err := errors.Join(sk.Close(ctx), sk.Abort()); !errors.Is(err, g2.failWith) {
		t.Fatalf("Close after a failed commit: %v", err)
	}
}

// TestSinkBurstWithLanesAndDefaults: with two lanes and the default
// limits (MaxOpenShards 8, below DefaultMaxPartitions), a burst of
// versions still shares partitions: a lane wanted where no shard is free
// shares one of its partition's instead of closing another partition.
func TestSinkBurstWithLanesAndDefaults(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	st, sk := newSink(t, root, sink.Config{FlushInterval: time.Hour, RunID: "r", Lanes: 2})
	now := time.Now()
	for v := range 3000 {
		for _, b := range batches(t, mem, v, 1) {
			if err := sk.Write(ctx, b, now); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sk.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(committed(t, st)); n > sink.DefaultMaxPartitions {
		t.Fatalf("%d shards for 3,000 versions, want at most %d (a shard per partition)", n, sink.DefaultMaxPartitions)
	}
}
