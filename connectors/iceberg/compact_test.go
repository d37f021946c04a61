package iceberg

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
)

// tableRows is every row of the steps table as text (each column's
// value), sorted, and the number of data files it lists.
func tableRows(t *testing.T, cat *Catalog) ([]string, int) {
	t.Helper()
	ctx := context.Background()
	tbl, err := cat.LoadTable(ctx, []string{"rllm", StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := tbl.Scan().PlanFiles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	arr, err := tbl.Scan().ToArrowTable(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer arr.Release()
	rd := array.NewTableReader(arr, 1024)
	defer rd.Release()
	var rows []string
	for rd.Next() {
		rec := rd.RecordBatch()
		for i := 0; i < int(rec.NumRows()); i++ {
			var b strings.Builder
			for c := 0; c < int(rec.NumCols()); c++ {
				fmt.Fprintf(&b, "%s=%s|", rec.ColumnName(c), rec.Column(c).ValueStr(i))
			}
			rows = append(rows, b.String())
		}
	}
	slices.Sort(rows)
	return rows, len(tasks)
}

// TestCompactReplacesSmallFiles: compaction merges each version's small
// files into few, in one snapshot, and readers see the same rows (every
// column, prompt deltas as stored) with the position unchanged; a sync
// after it adds the new shards, and only they; a second compaction
// merges what is small again.
func TestCompactReplacesSmallFiles(t *testing.T) {
	dir := t.TempDir()
	root := commitRuns(t, dir, 0, 6, 3)
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	sy := newSyncer(t, cat, root, 1000)
	if _, err := sy.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	n := len(committed(t, root))
	before, filesBefore := tableRows(t, cat)
	res, err := sy.Compact(context.Background(), CompactConfig{TargetSize: 1 << 30, MinFiles: 2})
	if err != nil {
		t.Fatal(err)
	}
	after, filesAfter := tableRows(t, cat)
	if res.FilesRemoved < 2 || filesAfter != filesBefore-res.FilesRemoved+res.FilesAdded || filesAfter >= filesBefore {
		t.Fatalf("compaction %+v: %d files before, %d after", res, filesBefore, filesAfter)
	}
	if !slices.Equal(before, after) || len(after) == 0 {
		t.Fatalf("the rows changed: %d before, %d after", len(before), len(after))
	}
	tbl, err := cat.LoadTable(context.Background(), []string{"rllm", StepsTable})
	if err != nil {
		t.Fatal(err)
	}
	if pos, err := Position(tbl); err != nil || pos.Shards != n {
		t.Fatalf("position after compaction %+v (%v), want %d", pos, err, n)
	}
	// Each merged file holds one version, as the partition says.
	tasks, err := tbl.Scan().PlanFiles(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if task.File.Count() == 0 {
			t.Errorf("%s is empty", task.File.FilePath())
		}
		if _, ok := partitionVersion(task.File); !ok {
			t.Errorf("%s has no version", task.File.FilePath())
		}
	}
	// New shards: the next sync adds them once; nothing else moves.
	commitRuns(t, dir, 6, 2, 3)
	got, err := sy.Sync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n2 := len(committed(t, root))
	if got.Shards != n2-n || got.Position != n2 {
		t.Fatalf("sync after compaction: %+v, want %d shards added, %d held", got, n2-n, n2)
	}
	rows, _ := tableRows(t, cat)
	if len(rows) != len(before)+int(got.Rows) {
		t.Fatalf("%d rows, want %d + %d", len(rows), len(before), got.Rows)
	}
	again, err := sy.Compact(context.Background(), CompactConfig{TargetSize: 1 << 30, MinFiles: 2})
	if err != nil || again.FilesRemoved == 0 {
		t.Fatalf("second compaction: %+v (%v)", again, err)
	}
	if rows2, _ := tableRows(t, cat); !slices.Equal(rows, rows2) {
		t.Fatal("the second compaction changed the rows")
	}
}

// TestCompactRacesSyncs: compactions and syncs at once (each its own
// syncer, as separate processes would be) lose no row and double none:
// in the end the table holds every committed shard's rows once.
func TestCompactRacesSyncs(t *testing.T) {
	dir := t.TempDir()
	root := commitRuns(t, dir, 0, 4, 3)
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	if _, err := newSyncer(t, cat, root, 2).Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	commitRuns(t, dir, 4, 4, 3)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 4 {
		wg.Add(1)
		sy := newSyncer(t, cat, root, 2)
		go func() {
			defer wg.Done()
			for range 3 {
				var err error
				if i%2 == 0 {
					_, err = sy.Sync(context.Background())
				} else {
					_, err = sy.Compact(context.Background(), CompactConfig{TargetSize: 1 << 30, MinFiles: 2})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, err := newSyncer(t, cat, root, 1000).Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	rows, _ := tableRows(t, cat)
	// The rows of every shard once: as many as a table synced afresh.
	fresh := testCatalog(t, t.TempDir(), "sqlite")
	defer fresh.Close()
	if _, err := newSyncer(t, fresh, root, 1000).Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	want, _ := tableRows(t, fresh)
	if !slices.Equal(rows, want) {
		t.Fatalf("after racing compactions: %d rows, a fresh sync %d", len(rows), len(want))
	}
}
