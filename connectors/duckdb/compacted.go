package duckdb

import (
	"context"
	"path/filepath"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// compaction is what a compaction (connectors/compact) left in a root:
// its newest record and the files in its folder.
type compaction struct {
	rec   *compact.Record
	files map[string]bool
}

// readCompaction reads the newest compaction record of st and lists the
// compacted files, before the manifest is read (the manifest only grows:
// it then holds every shard the record names). Anything it cannot read
// is a warning: the shards are read from their own files.
func (d *DB) readCompaction(ctx context.Context, st store.Reader) compaction {
	objs, err := st.Objects(compact.Dir)
	if err != nil {
		d.warnf("compacted files not read (%v): the shards are read from their own files", err)
		return compaction{}
	}
	rec, err := compact.Latest(ctx, objs)
	if err != nil {
		d.warnf("compacted files not read (%v): the shards are read from their own files", err)
		return compaction{}
	}
	if rec == nil {
		return compaction{}
	}
	names, err := objs.List(ctx, "")
	if err != nil {
		d.warnf("compacted files not listed (%v): the shards are read from their own files", err)
		return compaction{}
	}
	c := compaction{rec: rec, files: make(map[string]bool, len(names))}
	for _, n := range names {
		c.files[n] = true
	}
	return c
}

// apply has l's shards that the record's ranges hold read from the
// compacted files, found in dir: the ranges that match committed (the
// manifest's shard entries) and whose file is there. The others keep
// their own files, with a warning for each range passed over. It returns
// the ranges used.
func (c compaction) apply(d *DB, committed []schemas.ShardEntry, l *layout, dir string) []compact.Range {
	ranges, warnings := c.rec.Valid(committed)
	for _, w := range warnings {
		d.warnf("%s", w)
	}
	var use []compact.Range // in order, not overlapping (Valid)
	for _, g := range ranges {
		if !c.files[g.File] {
			d.warnf("compacted file %s is missing: shards %d to %d read from their own files", g.File, g.First, g.End-1)
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
	return use
}
