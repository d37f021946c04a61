package duckdb

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// compacted has l's shards that a compaction merged (connectors/compact)
// read from the merged files, found in dir: the newest record's ranges
// that match committed (the manifest's shard entries) and whose file
// check accepts (it exists, or will be downloaded). The others keep their
// own files, with a warning for each range passed over.
func (d *DB) compacted(ctx context.Context, st store.Reader, committed []schemas.ShardEntry, l *layout, dir string, check func(compact.Range) error) error {
	objs, err := st.Objects(compact.Dir)
	if err != nil {
		return fmt.Errorf("duckdb: %w", err)
	}
	rec, err := compact.Latest(ctx, objs)
	if err != nil {
		return fmt.Errorf("duckdb: %w", err)
	}
	ranges, warnings := rec.Valid(committed)
	for _, w := range warnings {
		d.warnf("%s", w)
	}
	if len(ranges) == 0 {
		return nil
	}
	var use []compact.Range // in order, not overlapping (Valid)
	for _, g := range ranges {
		if err := check(g); err != nil {
			d.warnf("compacted file %s: %v: shards %d to %d read from their own files", g.File, err, g.First, g.End-1)
			continue
		}
		use = append(use, g)
	}
	k := 0
	for i := range l.shards { // in the order of their places
		s := &l.shards[i]
		for k < len(use) && use[k].End <= s.at {
			k++
		}
		if k < len(use) && use[k].First <= s.at {
			s.file, s.merged = filepath.Join(dir, use[k].File), true
		}
	}
	if len(use) > 0 {
		l.mergedDir = dir + string(filepath.Separator)
	}
	return nil
}
