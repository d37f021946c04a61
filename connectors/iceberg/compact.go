package iceberg

import (
	"context"
	"fmt"
	"strconv"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// CompactConfig says which of the steps table's files Compact merges.
type CompactConfig struct {
	// TargetSize is the size of a merged file; files of a quarter of it
	// or more are left alone. Default 128 MiB.
	TargetSize int64
	// MinFiles is the fewest small files of a partition worth merging.
	// Default 8.
	MinFiles int
	// MaxFiles bounds the files one run replaces (its commit's size).
	// Default 10000.
	MaxFiles int
}

// CompactResult is what a compaction did.
type CompactResult struct {
	Partitions   int   `json:"partitions"`    // policy versions whose files were merged
	FilesRemoved int   `json:"files_removed"` // small files replaced
	FilesAdded   int   `json:"files_added"`   // merged files that replace them
	Rows         int64 `json:"rows"`          // rows they hold
	BytesRemoved int64 `json:"bytes_removed"`
	BytesAdded   int64 `json:"bytes_added"`
	Conflicts    int   `json:"conflicts"` // commits that lost a race and were redone
	Snapshot     int64 `json:"snapshot"`  // the table's snapshot after
}

// Compact merges the steps table's small files, partition by partition
// (one policy version each), into files of about TargetSize under the
// table's data folder, and replaces them in one snapshot: readers see
// the same rows before and after, the table's position (the shards it
// holds) is unchanged, and a sync that commits meanwhile makes the
// compaction start again (never a lost or doubled row). The shards
// stay in the root (the manifest's); only the table stops listing them.
// Rows keep their order within a file, so a trajectory's rows (its
// prompt deltas) stay together and in order.
func (s *Syncer) Compact(ctx context.Context, cfg CompactConfig) (CompactResult, error) {
	if cfg.TargetSize <= 0 {
		cfg.TargetSize = 128 << 20
	}
	if cfg.MinFiles < 2 {
		cfg.MinFiles = 8
	}
	if cfg.MaxFiles <= 0 {
		cfg.MaxFiles = 10000
	}
	var res CompactResult
	for {
		step("compact load")
		tbl, err := s.open(ctx)
		if err != nil {
			return res, err
		}
		res.Snapshot = snapshotID(tbl)
		if tbl.CurrentSnapshot() == nil {
			return res, nil
		}
		pos, err := Position(tbl)
		if err != nil {
			return res, err
		}
		tasks, err := tbl.Scan().PlanFiles(ctx)
		if err != nil {
			return res, fmt.Errorf("iceberg: plan %s's files: %w", s.id, err)
		}
		bins := compactionBins(tasks, cfg)
		if len(bins) == 0 {
			return res, nil
		}
		var removed, added []iceberg.DataFile
		var rows, bytesIn, bytesOut int64
		attempt := newNonce()
		for i, b := range bins {
			step("compact write")
			out, n, err := s.mergeFiles(ctx, tbl, b, fmt.Sprintf("%s-%d", attempt, i))
			if err != nil {
				return res, err
			}
			removed = append(removed, b.files...)
			added = append(added, out...)
			rows += n
			for _, f := range b.files {
				bytesIn += f.FileSizeBytes()
			}
			for _, f := range out {
				bytesOut += f.FileSizeBytes()
			}
		}
		step("compact commit")
		ok, err := s.commit(ctx, s.id, tbl, removed, added,
			iceberg.Properties{PropShards: strconv.Itoa(pos.Shards), PropLastShard: pos.LastShard})
		if err != nil {
			return res, err
		}
		if !ok {
			if res.Conflicts++; res.Conflicts > maxConflicts {
				return res, fmt.Errorf("iceberg: %d compactions of %s lost a race in a row", res.Conflicts, s.id)
			}
			continue
		}
		parts := map[string]bool{}
		for _, b := range bins {
			parts[b.partition] = true
		}
		res.Partitions += len(parts)
		res.FilesRemoved += len(removed)
		res.FilesAdded += len(added)
		res.Rows += rows
		res.BytesRemoved += bytesIn
		res.BytesAdded += bytesOut
		if back, err := s.open(ctx); err == nil {
			res.Snapshot = snapshotID(back)
		}
		return res, nil
	}
}

// compactionBin is small files of one partition to merge into one (or,
// across schema versions, a few) file.
type compactionBin struct {
	partition string
	version   int64
	files     []iceberg.DataFile
}

// compactionBins groups the small files of tasks by partition, in plan
// order, into bins of about cfg.TargetSize; partitions with fewer than
// cfg.MinFiles small files are left alone, as are files with deletes.
func compactionBins(tasks []table.FileScanTask, cfg CompactConfig) []compactionBin {
	small := map[string][]iceberg.DataFile{}
	versions := map[string]int64{}
	var order []string
	for _, t := range tasks {
		f := t.File
		if len(t.DeleteFiles) > 0 || f.FileSizeBytes() >= cfg.TargetSize/4 {
			continue
		}
		v, ok := partitionVersion(f)
		if !ok {
			continue
		}
		key := strconv.FormatInt(v, 10)
		if _, seen := small[key]; !seen {
			order = append(order, key)
		}
		small[key] = append(small[key], f)
		versions[key] = v
	}
	var bins []compactionBin
	budget := cfg.MaxFiles
	for _, key := range order {
		files := small[key]
		if len(files) < cfg.MinFiles || budget < 2 {
			continue
		}
		files = files[:min(len(files), budget)]
		var cur compactionBin
		var size int64
		flush := func() {
			if len(cur.files) >= 2 {
				bins = append(bins, cur)
				budget -= len(cur.files)
			}
			cur, size = compactionBin{partition: key, version: versions[key]}, 0
		}
		cur = compactionBin{partition: key, version: versions[key]}
		for _, f := range files {
			if size > 0 && size+f.FileSizeBytes() > cfg.TargetSize {
				flush()
			}
			cur.files = append(cur.files, f)
			size += f.FileSizeBytes()
		}
		flush()
	}
	return bins
}

// partitionVersion is the group_version a data file of the steps table
// holds (its partition value).
func partitionVersion(f iceberg.DataFile) (int64, bool) {
	for _, v := range f.Partition() {
		switch v := v.(type) {
		case int64:
			return v, true
		case int32:
			return int64(v), true
		case int:
			return int64(v), true
		}
	}
	return 0, false
}

// mergeFiles writes the rows of b's files, in order and as stored
// (deltas kept), into new files under the table's data folder: one,
// or one more wherever the schema changes from one file to the next.
func (s *Syncer) mergeFiles(ctx context.Context, tbl *table.Table, b compactionBin, attempt string) ([]iceberg.DataFile, int64, error) {
	fsys, err := tbl.FS(ctx)
	if err != nil {
		return nil, 0, err
	}
	mem := memory.NewGoAllocator()
	var (
		out     []iceberg.DataFile
		cur     *tableFile
		curSc   *arrow.Schema
		curMeta string
		rows    int64
	)
	finish := func() error {
		if cur == nil {
			return nil
		}
		df, err := cur.finish(ctx)
		cur = nil
		if err != nil {
			return err
		}
		out = append(out, df)
		return nil
	}
	fail := func(err error) ([]iceberg.DataFile, int64, error) {
		if cur != nil {
			cur.abort()
		}
		return nil, 0, err
	}
	for _, f := range b.files {
		src, err := fsys.Open(f.FilePath())
		if err != nil {
			return fail(fmt.Errorf("iceberg: open %s: %w", f.FilePath(), err))
		}
		rd, err := parquet.OpenStored(ctx, f.FilePath(), src, nil, mem)
		if err != nil {
			_ = src.Close()
			return fail(err)
		}
		meta, _ := rd.FooterValue(schemas.FooterSchemaKey)
		err = rd.Each(func(rec arrow.RecordBatch) error {
			if cur != nil && (!curSc.Equal(rec.Schema()) || meta != curMeta) {
				if err := finish(); err != nil {
					return err
				}
			}
			if cur == nil {
				name := fmt.Sprintf("group_version=%d/compacted-%s-%d.parquet", b.version, attempt, len(out))
				var kv map[string]string
				if meta != "" {
					kv = map[string]string{schemas.FooterSchemaKey: meta}
				}
				var err error
				if cur, err = createFile(ctx, tbl, name, rec.Schema(), kv, mem); err != nil {
					return err
				}
				curSc, curMeta = rec.Schema(), meta
			}
			rows += rec.NumRows()
			return cur.write(rec)
		})
		_ = rd.Close()
		_ = src.Close()
		if err != nil {
			return fail(err)
		}
	}
	if err := finish(); err != nil {
		return fail(err)
	}
	return out, rows, nil
}
