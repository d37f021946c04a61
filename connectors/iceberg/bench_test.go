package iceberg

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// fakeRoot makes a root of n committed shards cheaply: the shards of one
// real run (three versions), hard-linked in turn n times in all, and a
// manifest listing the links (each entry its original's with its own
// path), so that a sync reads n footers and adds n files as it would n
// shards, a third of them in each version's partition.
func fakeRoot(b *testing.B, dir string, n int) string {
	b.Helper()
	root := commitRuns(b, dir, 0, 1, 6)
	man := filepath.Join(root, "_manifest", "shards.jsonl")
	data, err := os.ReadFile(man)
	if err != nil {
		b.Fatal(err)
	}
	var tmpls []schemas.ShardEntry
	for _, l := range splitLines(data) {
		var e schemas.ShardEntry
		if json.Unmarshal(l, &e) == nil && e.Path != "" {
			tmpls = append(tmpls, e)
		}
	}
	f, err := os.OpenFile(man, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		b.Fatal(err)
	}
	w := bufio.NewWriter(f)
	src := make([]string, len(tmpls))
	for i := range n {
		k := i % len(tmpls)
		t := tmpls[k]
		if i/len(tmpls)%50_000 == 0 {
			// A file system bounds the links to one file: a fresh copy
			// every 50,000.
			src[k] = filepath.Join(root, fmt.Sprintf("%s/src-%d-%07d.parquet", filepath.Dir(t.Path), k, i))
			body, err := os.ReadFile(filepath.Join(root, t.Path))
			if err != nil {
				b.Fatal(err)
			}
			if err := os.WriteFile(src[k], body, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		e := t
		e.Path = fmt.Sprintf("%s/fake-%07d.parquet", filepath.Dir(t.Path), i)
		e.Settled = nil
		if err := os.Link(src[k], filepath.Join(root, e.Path)); err != nil {
			b.Fatal(err)
		}
		line, _ := json.Marshal(e)
		w.Write(append(line, '\n'))
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	f.Close()
	return root
}

func splitLines(data []byte) [][]byte {
	var out [][]byte
	for len(data) > 0 {
		i := 0
		for i < len(data) && data[i] != '\n' {
			i++
		}
		out = append(out, data[:i])
		if i < len(data) {
			i++
		}
		data = data[i:]
	}
	return out
}

// BenchmarkSync: a root of 10k and 100k shards synced into the SQLite
// catalog, 1000 files a commit (files added a second, commits a second),
// then the table opened and its scan planned, whole and for one version
// (what a reader pays at that size); then the table compacted (its small
// files merged per version) and planned again. At 10k, the trajectories
// table's sync too (it reads every shard's rows, where the steps table
// reads footers). `make bench-iceberg` runs it.
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("files=%d", n), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				dir := b.TempDir()
				root := fakeRoot(b, dir, n)
				cat := testCatalog(b, dir, "sqlite")
				r := newSyncer(b, cat, root, 1000)
				b.StartTimer()
				ctx := context.Background()
				start := time.Now()
				res, err := r.syncSteps(ctx)
				took := time.Since(start)
				if err != nil || res.Shards != n {
					b.Fatalf("sync: %+v, %v", res, err)
				}
				b.ReportMetric(float64(n)/took.Seconds(), "files/s")
				b.ReportMetric(float64(res.Commits)/took.Seconds(), "commits/s")
				open, all, one := planTimes(b, cat, r, n)
				b.ReportMetric(float64(open.Microseconds())/1e3, "open-ms")
				b.ReportMetric(float64(all.Microseconds())/1e3, "plan-all-ms")
				b.ReportMetric(float64(one.Microseconds())/1e3, "plan-version-ms")

				start = time.Now()
				cres, err := r.Compact(ctx, CompactConfig{MaxFiles: n})
				took = time.Since(start)
				if err != nil || cres.FilesRemoved != n {
					b.Fatalf("compact: %+v, %v", cres, err)
				}
				b.ReportMetric(took.Seconds(), "compact-s")
				b.ReportMetric(float64(cres.FilesAdded), "files-after")
				_, all, one = planTimes(b, cat, r, cres.FilesAdded)
				b.ReportMetric(float64(all.Microseconds())/1e3, "compacted-plan-all-ms")
				b.ReportMetric(float64(one.Microseconds())/1e3, "compacted-plan-version-ms")

				if n <= 10_000 {
					start = time.Now()
					rows, err := r.SyncTrajectories(ctx)
					took = time.Since(start)
					if err != nil || rows == 0 {
						b.Fatalf("trajectories: %d rows, %v", rows, err)
					}
					b.ReportMetric(float64(n)/took.Seconds(), "trajectory-shards/s")
				}
				b.StopTimer()
				cat.Close()
			}
		})
	}
}

// planTimes opens r's steps table and plans its scan, whole (files
// files) and for one version of three.
func planTimes(b *testing.B, cat *Catalog, r *Syncer, files int) (open, all, one time.Duration) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	tbl, err := cat.LoadTable(ctx, r.Table())
	if err != nil {
		b.Fatal(err)
	}
	open = time.Since(start)
	start = time.Now()
	tasks, err := tbl.Scan().PlanFiles(ctx)
	if err != nil || len(tasks) != files {
		b.Fatalf("plan: %d files, want %d, %v", len(tasks), files, err)
	}
	all = time.Since(start)
	start = time.Now()
	pruned, err := tbl.Scan(table.WithRowFilter(iceberg.EqualTo(iceberg.Reference("group_version"), int64(1)))).PlanFiles(ctx)
	if err != nil || len(pruned) == 0 || len(pruned) > max(files/2, 1) {
		b.Fatalf("plan of one version: %d of %d files, %v", len(pruned), files, err)
	}
	one = time.Since(start)
	return open, all, one
}
