package local

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// committedFromEveryShard checks that a fresh reader's CommittedFrom(n)
// is the whole list's tail for every n, and returns how many of those
// reads started at a mark instead of the manifest's beginning.
func committedFromEveryShard(t *testing.T, root string) (fromMarks int) {
	t.Helper()
	ctx := context.Background()
	r, err := OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	all, err := r.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	entries, err := r.EntriesFrom(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var at []int // the place of each shard entry in entries
	for i, e := range entries {
		if e.Seq != int64(i) {
			t.Fatalf("EntriesFrom(0)[%d] has seq %d", i, e.Seq)
		}
		if e.Path != "" {
			at = append(at, i)
		}
	}
	for n := 0; n <= len(all)+1; n++ {
		// EntriesFrom(n) on a fresh reader (which starts at a mark): the
		// whole read's entries from shard n on, checkpoints included.
		other, _ := OpenReader(root)
		tail, err := other.EntriesFrom(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		var wantTail []schemas.ShardEntry
		if n < len(at) {
			wantTail = entries[at[n]:]
		}
		if len(tail) != len(wantTail) {
			t.Fatalf("EntriesFrom(%d) on a fresh reader: %d entries, want %d", n, len(tail), len(wantTail))
		}
		for i := range tail {
			if tail[i].Path != wantTail[i].Path || tail[i].Seq != wantTail[i].Seq {
				t.Fatalf("EntriesFrom(%d)[%d] = %s (seq %d), want %s (seq %d)", n, i, tail[i].Path, tail[i].Seq, wantTail[i].Path, wantTail[i].Seq)
			}
		}
		fresh, _ := OpenReader(root)
		got, err := fresh.CommittedFrom(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		want := all[min(n, len(all)):]
		if len(got) != len(want) {
			t.Fatalf("CommittedFrom(%d) on a fresh reader: %d entries, want %d", n, len(got), len(want))
		}
		for i := range got {
			if got[i].Path != want[i].Path || got[i].Seq != want[i].Seq {
				t.Fatalf("CommittedFrom(%d)[%d] = %s (seq %d), want %s (seq %d)", n, i, got[i].Path, got[i].Seq, want[i].Path, want[i].Seq)
			}
		}
		if fresh.from.Offset > 0 {
			fromMarks++
		}
		// The same reader asked for everything after starts over.
		if every, err := fresh.Committed(ctx); err != nil || len(every) != len(all) {
			t.Fatalf("Committed after CommittedFrom(%d): %d entries (%v), want %d", n, len(every), err, len(all))
		}
	}
	return fromMarks
}

// A follower asking for the shards from the nth on starts at a mark of
// the writer state, not at the manifest's first line, and gets exactly
// the entries a whole read gives, whatever n, across runs, checkpoints
// between the shards, and a state from before marks.
func TestReaderStartsAtMarks(t *testing.T) {
	saved := stateEvery
	stateEvery = 5
	t.Cleanup(func() { stateEvery = saved })
	ctx := context.Background()
	root := t.TempDir()
	pos := int64(0)
	run := func(writer string, shards int) {
		t.Helper()
		s, err := Open(root, writer)
		if err != nil {
			t.Fatal(err)
		}
		for i := range shards {
			pos++
			p, err := s.Create(ctx, fmt.Sprintf("policy=%d/part-%s-%06d.parquet", i%3, writer, i))
			if err != nil {
				t.Fatal(err)
			}
			p.Write([]byte("x"))
			if err := p.Commit(ctx, schemas.ShardEntry{Rows: 1, Settled: schemas.Settled{"f": {{pos, pos}}}}); err != nil {
				t.Fatal(err)
			}
			if i%4 == 0 { // a checkpoint without a shard
				pos++
				if err := s.Append(ctx, schemas.ShardEntry{Settled: schemas.Settled{"f": {{pos, pos}}}}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	run("w1", 23)
	run("w2", 2)
	run("w3", 30)
	if n := committedFromEveryShard(t, root); n < 40 {
		t.Fatalf("only %d of the reads started at a mark", n)
	}
	// A state from before marks: the next writer reads the manifest whole
	// and writes them.
	st, err := readState(root)
	if err != nil {
		t.Fatal(err)
	}
	st.Marks = nil
	data, _ := json.Marshal(st)
	if err := os.WriteFile(filepath.Join(root, ManifestDir, StateFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	committedFromEveryShard(t, root)
	run("w4", 7)
	if n := committedFromEveryShard(t, root); n < 40 {
		t.Fatalf("after a state without marks: only %d of the reads started at a mark", n)
	}
	// A mark that does not name the start of its entry (a manifest
	// edited by hand) is not trusted.
	st, _ = readState(root)
	for i := range st.Marks {
		st.Marks[i].Offset += 3
	}
	data, _ = json.Marshal(st)
	if err := os.WriteFile(filepath.Join(root, ManifestDir, StateFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
	committedFromEveryShard(t, root)
}
