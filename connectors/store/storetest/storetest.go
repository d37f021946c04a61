// Package storetest is the conformance suite of store.Store: the same
// tests run against every backend (the local directory always, S3 when
// MinIO is up). A new backend is done when Run passes.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Backend opens stores of one kind. Each test asks NewRoot for a fresh,
// empty root.
type Backend struct {
	// NewRoot returns a fresh root (a folder, a prefix).
	NewRoot func(t *testing.T) string
	// Open opens root for writer.
	Open func(t *testing.T, root, writer string) (store.Store, error)
	// OpenReader opens root for reading.
	OpenReader func(t *testing.T, root string) (store.Reader, error)
	// Put writes data at rel under root behind the store's back (a user's
	// file, or a file a crashed writer left).
	Put func(t *testing.T, root, rel string, data []byte)
	// Exists reports whether rel exists under root.
	Exists func(t *testing.T, root, rel string) bool
	// Crash makes st's process vanish: whatever it holds (a lock) goes,
	// and nothing is cleaned up.
	Crash func(t *testing.T, st store.Store)
}

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	tests := []struct {
		name string
		fn   func(t *testing.T, b Backend)
	}{
		{"ShardInvisibleUntilCommit", testShardInvisibleUntilCommit},
		{"CreateRejectsPathsOutsideData", testCreateRejectsPaths},
		{"PublishNeverOverwrites", testPublishNeverOverwrites},
		{"WritersAppendTogether", testWritersAppendTogether},
		{"CommittedFromFollows", testCommittedFrom},
		{"EntriesFromShard", testEntriesFrom},
		{"AppendsAreLinear", testAppendsAreLinear},
		{"CreateOnlyObjects", testCreateOnlyObjects},
		{"SecondWriterRefusedOrFenced", testSecondWriter},
		{"CrashBetweenPublishAndAppend", testCrashBetweenPublishAndAppend},
		{"UnlistedIsNotData", testUnlistedIsNotData},
		{"SweepRemovesOwnUnlisted", testSweep},
		{"DeadLettersDurableAtCheckpoint", testDeadLetters},
		{"DeadLettersOfALostCheckpointCut", testDeadLettersLostCheckpoint},
		{"SettledSurvivesReopen", testSettledSurvivesReopen},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b) })
	}
}

func open(t *testing.T, b Backend, root, writer string) store.Store {
	t.Helper()
	st, err := b.Open(t, root, writer)
	if err != nil {
		t.Fatalf("open %s as %s: %v", root, writer, err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func reader(t *testing.T, b Backend, root string) store.Reader {
	t.Helper()
	r, err := b.OpenReader(t, root)
	if err != nil {
		t.Fatalf("open reader %s: %v", root, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func committedPaths(t *testing.T, r store.Reader) []string {
	t.Helper()
	es, err := r.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.Path)
	}
	sort.Strings(out)
	return out
}

// shardName is the sink's name for shard seq of writer in partition 0.
func shardName(writer string, seq int) string {
	return fmt.Sprintf("%s=0/part-%s-%06d.parquet", schemas.PartitionKey, writer, seq)
}

// commit writes data as shard rel and commits it settling the positions
// of stream.
func commit(t *testing.T, st store.Store, rel string, data []byte, stream string, pos ...int64) error {
	t.Helper()
	ctx := context.Background()
	p, err := st.Create(ctx, rel)
	if err != nil {
		t.Fatalf("create %s: %v", rel, err)
	}
	if _, err := p.Write(data); err != nil {
		t.Fatal(err)
	}
	return p.Commit(ctx, entry(stream, pos...))
}

// started opens root as writer "wa", claims stream "f" in generation gen
// and commits shard 1 of wa, settling position 1.
func started(t *testing.T, b Backend, root string, gen int64) store.Store {
	t.Helper()
	a := open(t, b, root, "wa")
	if err := a.Claim(context.Background(), []string{"f"}, gen); err != nil {
		t.Fatal(err)
	}
	if err := commit(t, a, shardName("wa", 1), []byte("a1"), "f", 1); err != nil {
		t.Fatal(err)
	}
	return a
}

func entry(stream string, pos ...int64) schemas.ShardEntry {
	e := schemas.ShardEntry{Rows: int64(len(pos)), SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Now().UTC()}
	if stream != "" {
		e.Settled = schemas.Settled{}
		for _, p := range pos {
			e.Settled.Add(stream, p)
		}
	}
	return e
}

func testShardInvisibleUntilCommit(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	st := open(t, b, root, "w1")
	rel := shardName("w1", 1)
	p, err := st.Create(ctx, rel)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("shard bytes "), 1000)
	if _, err := p.Write(data); err != nil {
		t.Fatal(err)
	}
	r := reader(t, b, root)
	if got := committedPaths(t, r); len(got) != 0 || b.Exists(t, root, rel) {
		t.Fatalf("before Commit: committed %v, published %v", got, b.Exists(t, root, rel))
	}
	if err := p.Commit(ctx, entry("f", 1, 2)); err != nil {
		t.Fatal(err)
	}
	es, err := r.Committed(ctx)
	if err != nil || len(es) != 1 || es[0].Path != rel || es[0].Bytes != int64(len(data)) || es[0].Writer != "w1" {
		t.Fatalf("after Commit: %+v %v", es, err)
	}
	got, err := r.Get(ctx, rel)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read back %d bytes, %v; want %d", len(got), err, len(data))
	}
	if p.Abort() != nil {
		t.Fatal("Abort after Commit is not a no-op")
	}
	// Aborted: nothing published, nothing listed.
	p2, err := st.Create(ctx, shardName("w1", 2))
	if err != nil {
		t.Fatal(err)
	}
	p2.Write([]byte("x"))
	if err := p2.Abort(); err != nil {
		t.Fatal(err)
	}
	if b.Exists(t, root, shardName("w1", 2)) || len(committedPaths(t, r)) != 1 {
		t.Fatal("an aborted shard is visible")
	}
}

func testCreateRejectsPaths(t *testing.T, b Backend) {
	st := open(t, b, b.NewRoot(t), "w1")
	for _, rel := range []string{"", "../x.parquet", "/etc/x.parquet", "a/../../x.parquet", "_manifest/x.parquet",
		"policy=1/_dlq/x.parquet", `a\..\x.parquet`, "a//b.parquet", "./a.parquet", "a/\x00.parquet"} {
		if p, err := st.Create(context.Background(), rel); err == nil {
			p.Abort()
			t.Errorf("Create(%q) accepted", rel)
		}
	}
}

// A committed shard is never replaced: a second Create of its path fails,
// at Create or at Commit (an error wrapping fs.ErrExist), and the shard
// keeps its bytes and its one entry.
func testPublishNeverOverwrites(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	st := open(t, b, root, "w1")
	rel := shardName("w1", 1)
	if err := commit(t, st, rel, []byte("first"), "f", 1); err != nil {
		t.Fatal(err)
	}
	if p, err := st.Create(ctx, rel); err == nil {
		if _, err := p.Write([]byte("second")); err != nil {
			t.Fatal(err)
		}
		err := p.Commit(ctx, entry("f", 2))
		if err == nil {
			t.Fatal("a committed shard's path was committed again")
		}
		if !errors.Is(err, fs.ErrExist) {
			t.Errorf("committing over a shard: %v, want an error wrapping fs.ErrExist", err)
		}
	}
	r := reader(t, b, root)
	if got := committedPaths(t, r); strings.Join(got, ",") != rel {
		t.Fatalf("committed %v, want %s once", got, rel)
	}
	if got, err := r.Get(ctx, rel); err != nil || string(got) != "first" {
		t.Fatalf("the shard reads %q (%v), want its first bytes", got, err)
	}
	if st.Settled().Contains(schemas.Source{Stream: "f", Line: 2}) {
		t.Fatal("the refused commit settled its positions")
	}
}

// Writers of one root append together where the backend allows several
// (S3: each its own streams); a backend that refuses a second writer
// (local: ErrLocked) passes by refusing.
func testWritersAppendTogether(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	const writers, each = 3, 8
	stores := make([]store.Store, writers)
	for i := range stores {
		st, err := b.Open(t, root, fmt.Sprintf("w%d", i))
		if errors.Is(err, store.ErrLocked) && i > 0 {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		stores[i] = st
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for i, st := range stores {
		stream := fmt.Sprintf("s%d", i)
		if err := st.Claim(ctx, []string{stream}, 0); err != nil {
			t.Fatal(err)
		}
		for k := range each {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- commit(t, st, shardName(st.Writer(), k), []byte{byte(i), byte(k)}, stream, int64(k))
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	es, err := reader(t, b, root).Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]bool{}
	for i, e := range es {
		if paths[e.Path] {
			t.Fatalf("%s listed twice", e.Path)
		}
		paths[e.Path] = true
		if i > 0 && e.Seq < es[i-1].Seq { // a group commit's record holds several
			t.Fatalf("entries out of order: seq %d after %d", e.Seq, es[i-1].Seq)
		}
	}
	if len(paths) != writers*each {
		t.Fatalf("%d shards listed, want %d", len(paths), writers*each)
	}
	// A late reader sees every writer's positions settled.
	last := open(t, b, root, "wlast")
	for i := range writers {
		for k := range each {
			if !last.Settled().Contains(schemas.Source{Stream: fmt.Sprintf("s%d", i), Line: int64(k)}) {
				t.Fatalf("position %d of s%d not settled for a later writer", k, i)
			}
		}
	}
}

// A follower holding the first n shard entries reads only the rest, in
// order, across checkpoints (and, on a backend that compacts, across
// snapshots), and they equal Committed's.
func testCommittedFrom(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	st := open(t, b, root, "w1")
	r := reader(t, b, root)
	var held []schemas.ShardEntry
	follow := func() {
		t.Helper()
		more, err := r.CommittedFrom(ctx, len(held))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, more...)
	}
	seq := 0
	for round := range 4 {
		for k := 0; k <= round; k++ {
			seq++
			if err := commit(t, st, shardName("w1", seq), []byte{byte(seq)}, "f", int64(seq)); err != nil {
				t.Fatal(err)
			}
			if err := st.Append(ctx, entry("f", int64(1000+seq))); err != nil {
				t.Fatal(err)
			}
		}
		follow()
		if len(held) != seq {
			t.Fatalf("round %d: a follower holds %d shard entries, want %d", round, len(held), seq)
		}
	}
	if more, err := r.CommittedFrom(ctx, len(held)); err != nil || len(more) != 0 {
		t.Fatalf("at the end: %d more (%v), want none", len(more), err)
	}
	all := committedPaths(t, r)
	for i, e := range held {
		if e.Path != all[i] || e.Path != shardName("w1", i+1) {
			t.Fatalf("entry %d: %s, Committed has %s, want %s", i, e.Path, all[i], shardName("w1", i+1))
		}
	}
	if tail, err := r.CommittedFrom(ctx, 8); err != nil || len(tail) != 2 || tail[0].Path != shardName("w1", 9) {
		t.Fatalf("CommittedFrom(8): %v %v", tail, err)
	}
}

// EntriesFrom(n) is Entries from the nth shard entry on, checkpoints
// between shards included, each entry with its place in the manifest as
// Seq: the same from a fresh reader (which may start at a mark or a
// snapshot) as from one that read everything.
func testEntriesFrom(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	st := open(t, b, root, "w1")
	const shards = 12
	for i := 1; i <= shards; i++ {
		for range i % 3 { // 0, 1 or 2 checkpoints after each shard
			if err := st.Append(ctx, entry("f", int64(1000*i+i%3))); err != nil {
				t.Fatal(err)
			}
		}
		if err := commit(t, st, shardName("w1", i), []byte{byte(i)}, "f", int64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Append(ctx, entry("f", 99999)); err != nil {
		t.Fatal(err)
	}
	r := reader(t, b, root)
	all, err := r.EntriesFrom(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := r.Entries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(entries) || len(all) < shards { // a backend that snapshots may drop checkpoints that hold nothing
		t.Fatalf("EntriesFrom(0) has %d entries, Entries %d", len(all), len(entries))
	}
	var at []int // the place of each shard entry in all
	for i, e := range all {
		if e.Path != entries[i].Path || e.Rows != entries[i].Rows {
			t.Fatalf("EntriesFrom(0)[%d] = %s, Entries has %s", i, e.Path, entries[i].Path)
		}
		if i > 0 && e.Seq < all[i-1].Seq { // a group commit's record holds several
			t.Fatalf("entry %d has seq %d after %d: not the manifest's places", i, e.Seq, all[i-1].Seq)
		}
		if e.Path != "" {
			at = append(at, i)
		}
	}
	if len(at) != shards {
		t.Fatalf("%d shard entries, want %d", len(at), shards)
	}
	for n := 0; n <= shards; n++ {
		for _, fresh := range []bool{false, true} {
			rd := r
			if fresh {
				rd = reader(t, b, root)
			}
			got, err := rd.EntriesFrom(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			if n == shards {
				if len(got) != 0 {
					t.Fatalf("EntriesFrom(%d) past the last shard: %d entries", n, len(got))
				}
				continue
			}
			want := all[at[n]:]
			if n == 0 {
				want = all
			}
			if len(got) != len(want) {
				t.Fatalf("EntriesFrom(%d) (fresh %t): %d entries, want %d", n, fresh, len(got), len(want))
			}
			for i := range got {
				if got[i].Path != want[i].Path || got[i].Seq != want[i].Seq || !reflect.DeepEqual(got[i].Settled, want[i].Settled) {
					t.Fatalf("EntriesFrom(%d)[%d] (fresh %t) = %s seq %d, want %s seq %d", n, i, fresh, got[i].Path, got[i].Seq, want[i].Path, want[i].Seq)
				}
			}
		}
	}
}

// Appends from many goroutines make one log: every entry once, in one
// order that every reader sees.
func testAppendsAreLinear(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	st := open(t, b, root, "w1")
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%3 == 0 {
				errs <- st.Append(ctx, entry("s", int64(i)))
				return
			}
			errs <- commit(t, st, shardName("w1", i), []byte{byte(i)}, "s", int64(i))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	es, err := reader(t, b, root).Entries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for _, e := range es {
		for _, r := range e.Settled["s"] {
			for x := r[0]; x <= r[1]; x++ {
				if seen[x] {
					t.Fatalf("position %d settled twice", x)
				}
				seen[x] = true
			}
		}
	}
	// Checkpoints may be folded into a snapshot (compaction); shards stay
	// listed.
	shards := 0
	for _, e := range es {
		if e.Path != "" {
			shards++
		}
	}
	if shards != n-(n+2)/3 {
		t.Fatalf("%d shards listed, want %d", shards, n-(n+2)/3)
	}
	if got := st.Settled()["s"].Len(); got != n {
		t.Fatalf("writer's Settled has %d positions, want %d", got, n)
	}
	for i := 1; i < len(es); i++ {
		if es[i].Seq < es[i-1].Seq { // a group commit's record holds several
			t.Fatalf("entries out of order: seq %d after %d", es[i].Seq, es[i-1].Seq)
		}
	}
}

func testCreateOnlyObjects(t *testing.T, b Backend) {
	root := b.NewRoot(t)
	r := reader(t, b, root)
	obj, err := r.Objects("_consumers/g")
	if err != nil {
		t.Fatal(err)
	}
	RunObjects(t, obj)
}

// RunObjects is the conformance suite of store.Objects, on an empty obj:
// create-only (of racing creators exactly one wins), sorted listing by
// prefix, idempotent delete, names of one path element only.
func RunObjects(t *testing.T, obj store.Objects) {
	t.Helper()
	ctx := context.Background()
	const n = 8
	var wg sync.WaitGroup
	wins := make(chan int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := obj.Create(ctx, "00001.json", []byte(fmt.Sprint(i)))
			switch {
			case err == nil:
				wins <- i
			case !errors.Is(err, fs.ErrExist):
				t.Errorf("creator %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(wins)
	var won []int
	for i := range wins {
		won = append(won, i)
	}
	if len(won) != 1 {
		t.Fatalf("%d creators won, want 1", len(won))
	}
	got, err := obj.Get(ctx, "00001.json")
	if err != nil || string(got) != fmt.Sprint(won[0]) {
		t.Fatalf("Get: %q %v, want the winner's %d", got, err, won[0])
	}
	if _, err := obj.Get(ctx, "00002.json"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Get of a missing object: %v", err)
	}
	for _, name := range []string{"snap-1.json", "00003.json", "00002.json"} {
		if err := obj.Create(ctx, name, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	names, err := obj.List(ctx, "0")
	if err != nil || strings.Join(names, ",") != "00001.json,00002.json,00003.json" {
		t.Fatalf("List: %v %v", names, err)
	}
	if err := obj.Delete(ctx, "00002.json"); err != nil {
		t.Fatal(err)
	}
	if err := obj.Delete(ctx, "00002.json"); err != nil {
		t.Fatalf("deleting a missing object: %v", err)
	}
	if names, _ := obj.List(ctx, ""); strings.Join(names, ",") != "00001.json,00003.json,snap-1.json" {
		t.Fatalf("List after Delete: %v", names)
	}
	for _, bad := range []string{"", "a/b", "..", "."} {
		if err := obj.Create(ctx, bad, []byte("x")); err == nil {
			t.Errorf("Create(%q) accepted", bad)
		}
	}
}

// A second writer on the same root is refused (store.ErrLocked) or fences
// the first: the first's later commits of the streams the second claimed
// fail with store.ErrFenced. Either way the manifest stays readable and
// holds every commit that succeeded, once.
func testSecondWriter(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	a := started(t, b, root, 1)
	second, err := b.Open(t, root, "wb")
	if err != nil {
		if !errors.Is(err, store.ErrLocked) {
			t.Fatalf("second writer refused without store.ErrLocked: %v", err)
		}
		if !strings.Contains(err.Error(), "wa") {
			t.Errorf("the refusal does not name the writer holding the root: %v", err)
		}
		// The first goes on as if nothing happened.
		if err := commit(t, a, shardName("wa", 2), []byte("a2"), "f", 2); err != nil {
			t.Fatal(err)
		}
		if got := committedPaths(t, reader(t, b, root)); len(got) != 2 {
			t.Fatalf("committed %v", got)
		}
		// Once the first has gone, a writer gets in.
		a.Close()
		c := open(t, b, root, "wc")
		if err := commit(t, c, shardName("wc", 1), []byte("c1"), "f", 3); err != nil {
			t.Fatal(err)
		}
		if got := committedPaths(t, reader(t, b, root)); len(got) != 3 {
			t.Fatalf("committed %v", got)
		}
		return
	}
	defer second.Close()
	if err := second.Claim(ctx, []string{"f"}, 2); err != nil {
		t.Fatal(err)
	}
	err = commit(t, a, shardName("wa", 2), []byte("a2"), "f", 2)
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("the fenced writer committed: %v", err)
	}
	if err := a.Append(ctx, entry("f", 3)); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("the fenced writer appended a checkpoint: %v", err)
	}
	// A claim older than the stream's latest is refused.
	if err := a.Claim(ctx, []string{"f"}, 1); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("a claim of an older generation took the stream back: %v", err)
	}
	if err := commit(t, second, shardName("wb", 1), []byte("b1"), "f", 2); err != nil {
		t.Fatal(err)
	}
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if got := committedPaths(t, reader(t, b, root)); strings.Join(got, ",") != shardName("wa", 1)+","+shardName("wb", 1) {
		t.Fatalf("committed %v", got)
	}
	if b.Exists(t, root, shardName("wa", 2)) {
		t.Fatal("the fenced writer's shard is still published")
	}
}

// A writer that dies after publishing a shard and before listing it leaves
// an object that is not data; the next writer removes it, and keeps the
// committed ones.
func testCrashBetweenPublishAndAppend(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	a := started(t, b, root, 0)
	b.Put(t, root, shardName("wa", 2), []byte("published, never listed"))
	b.Crash(t, a)
	if got := committedPaths(t, reader(t, b, root)); strings.Join(got, ",") != shardName("wa", 1) {
		t.Fatalf("committed %v", got)
	}
	c := open(t, b, root, "wc")
	if err := c.Claim(ctx, []string{"f"}, 0); err != nil {
		t.Fatal(err)
	}
	if b.Exists(t, root, shardName("wa", 2)) {
		t.Fatal("the dead writer's unlisted shard survived the next writer's start")
	}
	if !b.Exists(t, root, shardName("wa", 1)) {
		t.Fatal("a committed shard was removed")
	}
	if s := c.Settled(); !s.Contains(schemas.Source{Stream: "f", Line: 1}) || s.Contains(schemas.Source{Stream: "f", Line: 2}) {
		t.Fatalf("settled %v", s)
	}
}

// Files the store did not create are never listed and never removed.
func testUnlistedIsNotData(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	a := started(t, b, root, 0)
	foreign := []string{
		"backup/" + shardName("wa", 1),           // a copy of a committed shard
		schemas.PartitionKey + "=0/mine.parquet", // a user's file in a partition
		store.DeadLetterDir + "/notes.txt",
		"_tmp/notes.txt",
		shardName("someone", 7), // named like a shard of a writer the store never had
	}
	for _, rel := range foreign {
		b.Put(t, root, rel, []byte("not the store's"))
	}
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	b.Crash(t, a)
	c := open(t, b, root, "wc")
	if err := c.Claim(ctx, []string{"f"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, rel := range foreign {
		if !b.Exists(t, root, rel) {
			t.Errorf("%s was removed", rel)
		}
	}
	if got := committedPaths(t, reader(t, b, root)); strings.Join(got, ",") != shardName("wa", 1) {
		t.Fatalf("committed %v", got)
	}
}

func testSweep(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	a := open(t, b, root, "wa")
	if err := a.Claim(ctx, nil, 0); err != nil {
		t.Fatal(err)
	}
	if err := commit(t, a, shardName("wa", 1), []byte("a1"), "", 0); err != nil {
		t.Fatal(err)
	}
	b.Put(t, root, shardName("wa", 2), []byte("an append that failed after the upload"))
	if err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Exists(t, root, shardName("wa", 2)) || !b.Exists(t, root, shardName("wa", 1)) {
		t.Fatalf("after Sweep: unlisted %v, listed %v", b.Exists(t, root, shardName("wa", 2)), b.Exists(t, root, shardName("wa", 1)))
	}
}

func letter(stream string, pos int64) schemas.DeadLetter {
	return schemas.DeadLetter{Reason: schemas.ReasonMalformedJSON, Error: "bad", Source: schemas.Source{Stream: stream, Line: pos}, Record: []byte(fmt.Sprintf("{bad %d", pos))}
}

// Dead letters are durable once a checkpoint's entry lists them; what was
// written after the last checkpoint is cut by Reset, or by the next
// writer after a crash, and never read as committed.
func testDeadLetters(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	a := open(t, b, root, "wa")
	if err := a.Claim(ctx, []string{"f"}, 0); err != nil {
		t.Fatal(err)
	}
	dl := a.DeadLetters()
	if err := dl.Write(ctx, []schemas.DeadLetter{letter("f", 1), letter("f", 2)}, []schemas.Source{{Stream: "f", Line: 3}}); err != nil {
		t.Fatal(err)
	}
	settled, state, err := dl.Checkpoint(ctx)
	if err != nil || state == nil || settled["f"].Len() != 3 {
		t.Fatalf("checkpoint: %v %+v %v", settled, state, err)
	}
	e := entry("", 0)
	e.Settled, e.DeadLetters = settled, state
	if err := a.Append(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := dl.Write(ctx, []schemas.DeadLetter{letter("f", 4)}, nil); err != nil {
		t.Fatal(err)
	}
	dl.Reset()
	if err := dl.Write(ctx, []schemas.DeadLetter{letter("f", 5)}, nil); err != nil {
		t.Fatal(err)
	}
	if c := dl.Counts()[schemas.ReasonMalformedJSON]; c != 3 {
		t.Fatalf("counts %d after a reset, want 3", c)
	}
	// Not checkpointed when the writer dies.
	b.Crash(t, a)

	c := open(t, b, root, "wc")
	if err := c.Claim(ctx, []string{"f"}, 0); err != nil {
		t.Fatal(err)
	}
	r := reader(t, b, root)
	es, err := r.Entries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range es {
		if e.DeadLetters == nil {
			continue
		}
		lines = committedLetters(ctx, t, r, e.DeadLetters)
		if exists := b.Exists(t, root, e.DeadLetters.File); !exists {
			t.Fatalf("%s is gone", e.DeadLetters.File)
		}
		// The next writer cut what was not committed (local), or it never
		// was uploaded (S3).
		if full, _ := r.Get(ctx, e.DeadLetters.File); int64(len(full)) != e.DeadLetters.Bytes {
			t.Fatalf("%s holds %d bytes past its committed %d", e.DeadLetters.File, len(full), e.DeadLetters.Bytes)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0], `"line":1`) || !strings.Contains(lines[1], `"line":2`) {
		t.Fatalf("committed dead letters: %q", lines)
	}
	if s := c.Settled(); s["f"].Len() != 3 || s.Contains(schemas.Source{Stream: "f", Line: 4}) {
		t.Fatalf("settled %v", s)
	}
}

// A checkpoint whose entry did not land (a Kafka generation ended between
// the two) settles nothing: Reset cuts its letters too, and the next
// generation, reading the record again, dead-letters it once more; what
// is committed holds it once.
func testDeadLettersLostCheckpoint(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	a := open(t, b, root, "wa")
	if err := a.Claim(ctx, []string{"f"}, 1); err != nil {
		t.Fatal(err)
	}
	dl := a.DeadLetters()
	for gen := range 3 {
		if err := dl.Write(ctx, []schemas.DeadLetter{letter("f", 1)}, nil); err != nil {
			t.Fatal(err)
		}
		settled, state, err := dl.Checkpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if gen < 2 {
			dl.Reset() // the generation ended: the entry never appended
			continue
		}
		e := entry("", 0)
		e.Settled, e.DeadLetters = settled, state
		if err := a.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	r := reader(t, b, root)
	es, err := r.Entries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range es {
		if e.DeadLetters == nil {
			continue
		}
		lines = append(lines, committedLetters(ctx, t, r, e.DeadLetters)...)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], `"line":1`) {
		t.Fatalf("committed dead letters: %q, want the letter once", lines)
	}
}

// committedLetters returns the lines of dead-letter file dl.File that dl
// commits.
func committedLetters(ctx context.Context, t *testing.T, r store.Reader, dl *schemas.DeadLetterState) []string {
	t.Helper()
	data, err := r.Get(ctx, dl.File)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(data)) < dl.Bytes {
		t.Fatalf("%s holds %d bytes, %d committed", dl.File, len(data), dl.Bytes)
	}
	return strings.Split(strings.TrimSuffix(string(data[:dl.Bytes]), "\n"), "\n")
}

func testSettledSurvivesReopen(t *testing.T, b Backend) {
	ctx := context.Background()
	root := b.NewRoot(t)
	a := open(t, b, root, "wa")
	if err := a.Claim(ctx, []string{"f", "g"}, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := commit(t, a, shardName("wa", i+1), []byte{byte(i)}, "f", int64(2*i), int64(2*i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Append(ctx, entry("g", 7)); err != nil {
		t.Fatal(err)
	}
	a.Close()
	c := open(t, b, root, "wc")
	s := c.Settled()
	if len(s["f"]) != 1 || s["f"][0] != [2]int64{0, 9} || !s.Contains(schemas.Source{Stream: "g", Line: 7}) {
		t.Fatalf("settled after reopen: %v", s)
	}
	if got := committedPaths(t, c); len(got) != 5 {
		t.Fatalf("the writer lists %d shards, want 5", len(got))
	}
}
