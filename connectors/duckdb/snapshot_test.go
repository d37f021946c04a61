package duckdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// snapshotViews digests every view but the shards table's file column.
const snapshotViews = `SELECT 'steps', count(*), bit_xor(hash(v)) FROM (SELECT * FROM steps) v
UNION ALL SELECT 'stored_steps', count(*), bit_xor(hash(v)) FROM (SELECT * FROM stored_steps) v
UNION ALL SELECT 'trajectories', count(*), bit_xor(hash(v)) FROM (SELECT * FROM trajectories) v
UNION ALL SELECT 'shards', count(*), bit_xor(hash(v)) FROM (SELECT * EXCLUDE (file) FROM shards) v
UNION ALL SELECT 'shard order', count(*), string_agg(seq::VARCHAR, ',') FROM shards
UNION ALL SELECT 'dead_letters', count(*), bit_xor(hash(v)) FROM (SELECT * FROM dead_letters) v
UNION ALL SELECT 'dead_letter_commits', count(*), string_agg(concat_ws('|', seq, committed_at, dlq_file, reason, dead_letters), ',' ORDER BY seq, dlq_file, reason) FROM dead_letter_commits`

func digestViews(t *testing.T, d *DB) string {
	t.Helper()
	rows := queryStrings(t, d, "SELECT concat_ws(' ', * COLUMNS(*)) FROM ("+snapshotViews+")")
	return strings.Join(rows, "\n")
}

// TestSnapshotEqualsWholeManifest: views opened from a compaction
// snapshot and the manifest after it answer as views over the whole
// manifest, locally and through downloads, with a dead-letter file whose
// marks span the snapshot (growing, repeated, shrinking, on checkpoints),
// shards the snapshot reads from their own files (another schema version,
// a large one, one listed twice) and shards after it.
func TestSnapshotEqualsWholeManifest(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "_dlq"), 0o755); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for i := range 6 {
		lines = append(lines, dlLine(t, []schemas.Reason{schemas.ReasonMalformedJSON, schemas.ReasonLate, schemas.ReasonMissingField}[i%3], int64(i+1), fmt.Sprintf(`{"n":%d}`, i)))
	}
	upto := func(n int) int64 { return int64(len(strings.Join(lines[:n], ""))) }
	b1 := dlLine(t, schemas.ReasonInvalidValue, 1, "{}")
	if err := os.WriteFile(filepath.Join(root, "_dlq", "run-a.jsonl"), []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "_dlq", "run-b.jsonl"), []byte(b1), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	var entries []schemas.ShardEntry
	n := 0
	shard := func(version string, bytes int64, dl *schemas.DeadLetterState) {
		rel := fmt.Sprintf("policy=%d/part-w-%06d.parquet", n%2, n)
		var drop []string
		if version != schemas.SchemaVersion {
			drop = []string{"prompt_prefix_len", "prompt_delta_ids", "messages_delta"}
		}
		writeStepFile(t, filepath.Join(root, filepath.FromSlash(rel)), []string{fmt.Sprintf("s%d", n), fmt.Sprintf("t%d", n)}, drop...)
		entries = append(entries, schemas.ShardEntry{Writer: "w", Path: rel, Rows: 2, Bytes: bytes, Groups: 1, PolicyVersion: int64(n % 2),
			RunID: "w", SchemaVersion: version, CommittedAt: t0.Add(time.Duration(len(entries)) * time.Second), DeadLetters: dl})
		n++
	}
	checkpoint := func(dl *schemas.DeadLetterState) {
		entries = append(entries, schemas.ShardEntry{Writer: "w", RunID: "w", CommittedAt: t0.Add(time.Duration(len(entries)) * time.Second), DeadLetters: dl})
	}
	a := func(k int) *schemas.DeadLetterState {
		return &schemas.DeadLetterState{File: "_dlq/run-a.jsonl", Bytes: upto(k)}
	}
	shard(schemas.SchemaVersion, 100, a(1))
	checkpoint(a(2))
	shard(schemas.SchemaVersion, 100, a(2)) // a mark no longer than the one before
	shard(schemas.SchemaVersion, 100, nil)
	shard("3", 100, nil)                    // another schema version: read from its own file
	shard(schemas.SchemaVersion, 100, a(1)) // a shrinking mark
	shard(schemas.SchemaVersion, 100, nil)
	shard(schemas.SchemaVersion, 100, a(3))
	shard(schemas.SchemaVersion, 1<<40, nil) // large: left alone
	dup := entries[2]
	dup.CommittedAt = t0.Add(time.Duration(len(entries)) * time.Second)
	entries = append(entries, dup) // listed twice: read once
	shard(schemas.SchemaVersion, 100, nil)
	shard(schemas.SchemaVersion, 100, nil)
	for i := range entries {
		entries[i].Seq = int64(i)
	}
	writeManifest(t, root, entries)

	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	st, err := compact.Run(ctx, r, compact.Config{Writer: "c1", MinShards: 2, MaxShards: 3})
	if err != nil {
		t.Fatal(err)
	}
	if st.Record == nil || st.Record.Snapshot == nil || st.Files != 2 {
		t.Fatalf("compaction: %+v, want 2 merged files and a snapshot", st)
	}
	snap := st.Record.Snapshot
	if snap.Shards != 9 || snap.Loose != 2 || snap.Rows != 8 {
		t.Fatalf("snapshot of %d shards (%d rows, %d loose), want 9 shards, 8 rows (one listed twice), 2 loose", snap.Shards, snap.Rows, snap.Loose)
	}
	// run-a's marks in the snapshot: those a line can belong to (its
	// first three lines'), not the repeated or shrunk ones, and the last
	// (the entry listed twice repeats a mark).
	if dl := snap.DeadLetters; len(dl) != 1 || len(dl[0].Marks) != 4 || dl[0].Bytes != upto(2) ||
		dl[0].Marks[0].Seq != 0 || dl[0].Marks[1].Seq != 1 || dl[0].Marks[2].Seq != 7 || dl[0].Marks[3].Seq != 9 {
		t.Fatalf("snapshot's dead letters %+v, want run-a's marks at entries 0, 1, 7 and 9", dl)
	}
	// After the snapshot: more marks on run-a (on a checkpoint, a shard),
	// a new dead-letter file, more shards.
	checkpoint(a(4))
	shard(schemas.SchemaVersion, 100, a(5))
	shard(schemas.SchemaVersion, 100, &schemas.DeadLetterState{File: "_dlq/run-b.jsonl", Bytes: int64(len(b1))})
	shard(schemas.SchemaVersion, 100, a(6))
	again := entries[0] // a merged shard listed again: read once
	again.CommittedAt = t0.Add(time.Duration(len(entries)) * time.Second)
	again.DeadLetters = nil
	entries = append(entries, again)
	for i := range entries {
		entries[i].Seq = int64(i)
	}
	writeManifest(t, root, entries)

	openWith := func(remote bool, o Options) *DB {
		t.Helper()
		var d *DB
		var err error
		if remote {
			rr, rerr := local.OpenReader(root)
			if rerr != nil {
				t.Fatal(rerr)
			}
			d, err = Open(ctx, remoteOnly{rr}, o)
		} else {
			d, err = OpenLocal(ctx, root, o)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	// Without a download folder the snapshot's copy is temporary: the
	// printed views would name a file gone after Close.
	for _, remote := range []bool{false, true} {
		if _, err := openWith(remote, Options{}).ViewsSQL(); !errors.Is(err, ErrViewsNeedCopies) {
			t.Fatalf("remote %t: views over a temporary snapshot copy: %v, want ErrViewsNeedCopies", remote, err)
		}
	}
	open := func(remote bool) (string, *DB) {
		t.Helper()
		d := openWith(remote, Options{DownloadDir: t.TempDir()})
		return digestViews(t, d), d
	}
	for _, remote := range []bool{false, true} {
		got, d := open(remote)
		if w := d.Warnings(); d.layout.snap == nil || len(w) != 1 || !strings.Contains(w[0], "listed twice") {
			t.Fatalf("remote %t: opened without the snapshot, or other warnings than the shard listed twice: %q", remote, w)
		}
		// The printed views, run in a DuckDB of their own, answer the same.
		db, err := sql.Open("duckdb", "")
		if err != nil {
			t.Fatal(err)
		}
		script, err := d.ViewsSQL()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(script); err != nil {
			db.Close()
			t.Fatalf("remote %t: running the printed views: %v", remote, err)
		}
		var printed []string
		rows, err := db.Query("SELECT concat_ws(' ', * COLUMNS(*)) FROM (" + snapshotViews + ")")
		if err != nil {
			db.Close()
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			if err := rows.Scan(&s); err != nil {
				t.Fatal(err)
			}
			printed = append(printed, s)
		}
		rows.Close()
		db.Close()
		if p := strings.Join(printed, "\n"); p != got {
			t.Errorf("remote %t: the printed views answer\n%s\nwant\n%s", remote, p, got)
		}
		// The sandbox is closed over the files read.
		if _, err := d.Query(ctx, "SELECT * FROM read_text('/etc/hostname')"); !errors.Is(err, ErrRefused) {
			t.Errorf("remote %t: a host file read: %v, want ErrRefused", remote, err)
		}
		if d.Shards() != 13 {
			t.Errorf("remote %t: %d shards, want 13 (15 listed, two of them twice)", remote, d.Shards())
		}
		// The same root read whole: the snapshot moved aside (as a later
		// compaction removes it: the open views still read their copy).
		file := filepath.Join(root, compact.Dir, snap.File)
		if err := os.Rename(file, file+".aside"); err != nil {
			t.Fatal(err)
		}
		if again := digestViews(t, d); again != got {
			t.Errorf("remote %t: with the snapshot removed, the open views answer\n%s\nwant\n%s", remote, again, got)
		}
		want, w := open(remote)
		if err := os.Rename(file+".aside", file); err != nil {
			t.Fatal(err)
		}
		if w.layout.snap != nil {
			t.Fatal("the snapshot moved aside was read")
		}
		if got != want {
			t.Errorf("remote %t: from the snapshot\n%s\nwant (the whole manifest)\n%s", remote, got, want)
		}
		if !strings.Contains(want, "dead_letter_commits 7") {
			t.Errorf("remote %t: want 7 dead-letter commits:\n%s", remote, want)
		}
	}
}
