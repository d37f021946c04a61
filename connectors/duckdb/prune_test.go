package duckdb

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TestPruneDownloads: a download folder kept across openings, as the live
// view keeps it over an S3 output, holds after PruneDownloads only the
// files the open views read: the copies of shards merged by a compaction
// since they were downloaded go, and so does an older snapshot; the views
// answer as before, and as over a fresh folder.
func TestPruneDownloads(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	var entries []schemas.ShardEntry
	addShards := func(n int) {
		for range n {
			i := len(entries)
			rel := fmt.Sprintf("policy=%d/part-w-%06d.parquet", i%2, i)
			writeStepFile(t, filepath.Join(root, filepath.FromSlash(rel)), []string{fmt.Sprintf("s%d", i)})
			entries = append(entries, schemas.ShardEntry{Writer: "w", Path: rel, Rows: 1, Groups: 1, GroupKeys: []string{fmt.Sprintf("task-%d", i)},
				RunID: "w", SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Date(2026, 12, 1, 0, 0, i, 0, time.UTC)})
		}
		writeManifest(t, root, entries)
	}
	reader := func() remoteOnly {
		r, err := local.OpenReader(root)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return remoteOnly{r}
	}
	keep := t.TempDir()
	open := func(dir string) *DB {
		d, err := OpenRemote(ctx, reader(), Options{DownloadDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	files := func() map[string]bool {
		got := map[string]bool{}
		for _, sub := range []string{"shards", "compacted"} {
			filepath.WalkDir(filepath.Join(keep, sub), func(path string, e fs.DirEntry, err error) error {
				if err == nil && !e.IsDir() {
					rel, _ := filepath.Rel(keep, path)
					got[filepath.ToSlash(rel)] = true
				}
				return nil
			})
		}
		return got
	}
	compactRun := func(writer string) {
		if _, err := compact.Run(ctx, reader(), compact.Config{Writer: writer, MinShards: 2, MaxShards: 3}); err != nil {
			t.Fatal(err)
		}
		d := open(t.TempDir())
		defer d.Close()
		if d.layout.snap == nil {
			t.Fatalf("no snapshot after compaction %s: %q", writer, d.Warnings())
		}
	}
	// prune opens the views over the kept folder after the previous ones
	// closed, prunes, and checks what is left: exactly the files the
	// views read, which answer as over a fresh folder.
	prune := func(prev *DB) *DB {
		t.Helper()
		prev.Close()
		d := open(keep)
		if _, err := d.PruneDownloads(); err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{}
		l := d.layout
		for _, s := range append(append([]shardFile(nil), l.shards...), l.snapMerged...) {
			rel, _ := filepath.Rel(keep, s.file)
			want[filepath.ToSlash(rel)] = true
		}
		if l.snap != nil {
			rel, _ := filepath.Rel(keep, l.snap.file)
			want[filepath.ToSlash(rel)] = true
		}
		if got := files(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("download folder after pruning:\n%v\nwant the files the views read:\n%v", got, want)
		}
		fresh := open(t.TempDir())
		defer fresh.Close()
		if got, want := digestViews(t, d), digestViews(t, fresh); got != want {
			t.Fatalf("views after pruning:\n%s\nwant:\n%s", got, want)
		}
		return d
	}

	addShards(10)
	d := open(keep)
	if got := len(files()); got != 10 {
		t.Fatalf("%d files downloaded, want the 10 shards", got)
	}
	compactRun("c1") // 9 shards merged in 3 files
	d = prune(d)
	for i := range 9 {
		if rel := "shards/" + entries[i].Path; files()[rel] {
			t.Fatalf("%s was merged, its copy is kept", rel)
		}
	}
	snap1 := d.layout.snap.file
	addShards(7)
	compactRun("c2")
	d = prune(d)
	if _, err := os.Stat(snap1); err == nil || d.layout.snap.file == snap1 {
		t.Fatalf("the older snapshot's copy %s is kept", snap1)
	}
	d.Close()

	// Without a kept folder there is nothing to prune, nor for a local
	// output (whatever the folder holds).
	d = open("")
	defer d.Close()
	if n, err := d.PruneDownloads(); n != 0 || err != nil {
		t.Fatalf("pruned %d files (%v) of an opening's own folder", n, err)
	}
	before := files()
	dl, err := OpenLocal(ctx, root, Options{DownloadDir: keep})
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Close()
	if n, err := dl.PruneDownloads(); n != 0 || err != nil || fmt.Sprint(files()) != fmt.Sprint(before) {
		t.Fatalf("a local opening pruned %d files (%v)", n, err)
	}
}
