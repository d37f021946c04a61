package store

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// logEntry is entry i of a test log: a shard, a checkpoint (no path) or
// a dead-letter file, by i.
func logEntry(i int) schemas.ShardEntry {
	e := schemas.ShardEntry{Seq: int64(i), Writer: "w", RunID: "w", Settled: schemas.Settled{"s": {{int64(i), int64(i)}}}}
	switch i % 5 {
	case 1: // a checkpoint
	case 3:
		e.DeadLetters = &schemas.DeadLetterState{File: fmt.Sprintf("_dlq/w-%06d.jsonl", i)}
	default:
		e.Path = fmt.Sprintf("policy=0/part-w-%06d.parquet", i)
		e.GroupKeys = []string{fmt.Sprintf("task-%d", i)}
	}
	if i == 0 {
		e.Claims = []string{"s"}
	}
	return e
}

// segmentStore is the objects a snapshot's segments are written to.
type segmentStore map[string][]byte

func (m segmentStore) load(_ context.Context, name string) ([]byte, error) {
	if b, ok := m[name]; ok {
		return b, nil
	}
	return nil, fmt.Errorf("%s: %w", name, fs.ErrNotExist)
}

// write creates segs as a writer does before storing a snapshot: create
// only, the same bytes when one exists.
func (m segmentStore) write(t *testing.T, segs []Segment) {
	t.Helper()
	for _, g := range segs {
		if old, ok := m[g.Name]; ok && string(old) != string(g.Data) {
			t.Fatalf("segment %s sealed twice with other entries", g.Name)
		}
		m[g.Name] = g.Data
	}
}

// sameLog fails unless got lists what want lists: the shard and
// dead-letter entries in order, the settled positions, claims and writers.
func sameLog(t *testing.T, got, want *Log) {
	t.Helper()
	if g, w := got.Committed(), want.Committed(); !reflect.DeepEqual(g, w) {
		t.Fatalf("committed: %d entries, want %d", len(g), len(w))
	}
	kept := func(l *Log) (out []schemas.ShardEntry) {
		for _, k := range l.kept {
			out = append(out, l.entries[k])
		}
		return out
	}
	if g, w := kept(got), kept(want); !reflect.DeepEqual(g, w) {
		t.Fatalf("listed entries: %d, want %d", len(g), len(w))
	}
	if !reflect.DeepEqual(got.Settled(), want.Settled()) || !reflect.DeepEqual(got.claims, want.claims) || !reflect.DeepEqual(got.writers, want.writers) {
		t.Fatal("settled, claims or writers differ")
	}
}

// TestSnapshotSegments: snapshots seal full segments of listed entries
// once, name every sealed one, hold only the tail, and restore to the
// log; a log restored from a snapshot seals on from where it left off.
func TestSnapshotSegments(t *testing.T) {
	ctx := context.Background()
	objs := segmentStore{}
	l := NewLog()
	n := 0
	var heads [][]byte
	for _, upto := range []int{2, 9, 10, 31, 57} {
		for ; n < upto; n++ {
			l.Apply(logEntry(n))
		}
		head, segs, err := l.Snapshot(int64(n), 3)
		if err != nil {
			t.Fatal(err)
		}
		objs.write(t, segs)
		l.Sealed(segs)
		heads = append(heads, head)
		r, next, err := RestoreLog(ctx, head, objs.load)
		if err != nil || next != int64(n) {
			t.Fatalf("after %d entries: restore: next %d, %v", n, next, err)
		}
		sameLog(t, r, l)
		if tail := len(l.kept) - 3*len(r.segs); tail < 0 || tail >= 3 {
			t.Fatalf("after %d entries: %d kept entries outside the segments", n, tail)
		}
	}
	if len(objs) != len(l.kept)/3 {
		t.Fatalf("%d segments written for %d listed entries", len(objs), len(l.kept))
	}
	// A writer restored from an older snapshot seals the same segments,
	// with the same bytes (segmentStore.write checks), and its snapshot
	// restores to the same log.
	r, next, err := RestoreLog(ctx, heads[2], objs.load)
	if err != nil {
		t.Fatal(err)
	}
	for i := int(next); i < n; i++ {
		r.Apply(logEntry(i))
	}
	head, segs, err := r.Snapshot(int64(n), 3)
	if err != nil {
		t.Fatal(err)
	}
	objs.write(t, segs)
	back, _, err := RestoreLog(ctx, head, objs.load)
	if err != nil {
		t.Fatal(err)
	}
	sameLog(t, back, l)
	// A writer that opens from the head only (RestoreHead) appends and
	// snapshots as well without reading a segment, and reads them when
	// asked (Load).
	for i, h := range heads {
		lazy, next, err := RestoreHead(h, func(context.Context, string) ([]byte, error) {
			return nil, fmt.Errorf("a segment was read before Load")
		})
		if err != nil {
			t.Fatal(err)
		}
		for j := int(next); j < n; j++ {
			lazy.Apply(logEntry(j))
		}
		head, segs, err := lazy.Snapshot(int64(n), 3)
		if err != nil {
			t.Fatalf("head %d: %v", i, err)
		}
		objs.write(t, segs)
		lazy.Sealed(segs)
		back, _, err := RestoreLog(ctx, head, objs.load)
		if err != nil {
			t.Fatal(err)
		}
		sameLog(t, back, l)
		if i > 0 && lazy.Loaded() {
			t.Fatalf("head %d (with segments): loaded before Load", i)
		}
		lazy.load = objs.load
		if err := lazy.Load(ctx); err != nil {
			t.Fatal(err)
		}
		sameLog(t, lazy, l)
		if !lazy.Listed(logEntry(0).Path) {
			t.Fatalf("head %d: a shard of the first segment is not listed after Load", i)
		}
	}
	// Without segments (segSize 0, as snapshots before them) the snapshot
	// holds every listed entry and restores the same.
	head, segs, err = l.Snapshot(int64(n), 0)
	if err != nil || len(segs) != 0 {
		t.Fatal(err, len(segs))
	}
	if back, _, err = RestoreLog(ctx, head, objs.load); err != nil {
		t.Fatal(err)
	}
	sameLog(t, back, l)
}

// TestRestoreRefusesBadSegments: a segment that is missing, holds other
// than its count, or does not follow the one before is an error, never a
// shorter list.
func TestRestoreRefusesBadSegments(t *testing.T) {
	ctx := context.Background()
	l := NewLog()
	for i := range 20 {
		l.Apply(logEntry(i))
	}
	head, segs, err := l.Snapshot(20, 4)
	if err != nil || len(segs) < 2 {
		t.Fatal(err, len(segs))
	}
	full := segmentStore{}
	full.write(t, segs)
	missing := segmentStore{}
	missing.write(t, segs[1:])
	short := segmentStore{}
	short.write(t, segs)
	short[segs[0].Name] = []byte("[]")
	for name, objs := range map[string]segmentStore{"missing": missing, "short": short} {
		if _, _, err := RestoreLog(ctx, head, objs.load); err == nil {
			t.Errorf("%s segment: restored", name)
		}
	}
	if _, _, err := RestoreLog(ctx, head, full.load); err != nil {
		t.Fatal(err)
	}
	// A snapshot whose segments leave a gap.
	l.segs = []SegmentRef{{Name: SegmentName(4, 4), First: 4, Count: 4}}
	gap, _, err := l.Snapshot(20, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := RestoreLog(ctx, gap, full.load); err == nil {
		t.Error("a snapshot whose first segment starts at 4: restored")
	}
}

// A follower that asks a lazily restored log for the shards from the
// nth on gets what the whole log lists, and the log reads only the
// segments holding them; a later call that needs more reads more, and a
// snapshot without shard counts (sealed before them) is read whole.
func TestLoadFromReadsOnlyTheLastSegments(t *testing.T) {
	ctx := context.Background()
	objs := segmentStore{}
	l := NewLog()
	for i := range 200 {
		l.Apply(logEntry(i))
	}
	head, segs, err := l.Snapshot(200, 7)
	if err != nil {
		t.Fatal(err)
	}
	objs.write(t, segs)
	all := l.Committed()
	for _, n := range []int{0, 1, 50, len(all) - 9, len(all) - 1, len(all), len(all) + 5} {
		var mu sync.Mutex // segments are read concurrently
		read := map[string]bool{}
		lazy, _, err := RestoreHead(head, func(ctx context.Context, name string) ([]byte, error) {
			mu.Lock()
			read[name] = true
			mu.Unlock()
			return objs.load(ctx, name)
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := lazy.LoadFrom(ctx, n); err != nil {
			t.Fatal(err)
		}
		got := lazy.CommittedFrom(n)
		if want := all[min(n, len(all)):]; len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
			t.Fatalf("CommittedFrom(%d): %d entries, want %d", n, len(got), len(want))
		}
		// Each segment holds 7 kept entries, about 4 shards.
		if need := (len(all)-n)/4 + 2; len(read) > need {
			t.Fatalf("CommittedFrom(%d) read %d segments for %d shards", n, len(read), len(all)-n)
		}
		// Then from an earlier shard, and everything.
		if err := lazy.LoadFrom(ctx, n/2); err != nil {
			t.Fatal(err)
		}
		if got, want := lazy.CommittedFrom(n/2), all[min(n/2, len(all)):]; len(got) != len(want) || len(got) > 0 && !reflect.DeepEqual(got, want) {
			t.Fatalf("CommittedFrom(%d) after CommittedFrom(%d): %d entries", n/2, n, len(got))
		}
		if err := lazy.Load(ctx); err != nil {
			t.Fatal(err)
		}
		sameLog(t, lazy, l)
	}
	// Segments sealed before they counted their shards: read whole.
	var snap logSnapshot
	if err := json.Unmarshal(head, &snap); err != nil {
		t.Fatal(err)
	}
	for i := range snap.Segments {
		snap.Segments[i].Shards = nil
	}
	old, _ := json.Marshal(snap)
	var read atomic.Int64
	lazy, _, err := RestoreHead(old, func(ctx context.Context, name string) ([]byte, error) {
		read.Add(1)
		return objs.load(ctx, name)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := lazy.LoadFrom(ctx, len(all)-1); err != nil || read.Load() != int64(len(snap.Segments)) || !lazy.Loaded() {
		t.Fatalf("old segments: read %d of %d (%v)", read.Load(), len(snap.Segments), err)
	}
	if got := lazy.CommittedFrom(len(all) - 1); len(got) != 1 || got[0].Path != all[len(all)-1].Path {
		t.Fatalf("old segments: CommittedFrom: %v", got)
	}
}
