package duckdb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"strings"

	duckdbdrv "github.com/duckdb/duckdb-go/v2"

	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// snapRows is a compaction snapshot (compact.Snapshot) the shards view
// starts from: its rows are read by DuckDB from file when a query reads
// the shards, so that a root of a million shards costs the views'
// start-up what its few compacted files and the entries after the
// snapshot cost.
type snapRows struct {
	file string // the snapshot file, local
	rows int64  // shards in it
}

// fromSnapshot is the start of an opening from the newest compaction
// record's snapshot: the manifest read only after the snapshot's last
// shard (store.Reader.EntriesFrom).
type fromSnapshot struct {
	snap   *compact.Snapshot
	file   string // the snapshot file, local
	ranges []compact.Range
	// tail is the manifest's entries after the snapshot's last shard.
	tail []schemas.ShardEntry
	// listed is the paths of tail's shards the snapshot lists already.
	listed map[string]bool
}

// snapshotStart checks comp's snapshot against st and against its
// record, and reads the manifest after it. fetch returns the local path
// of a file of the compaction folder (downloading it if need be). It
// returns nil, with a warning, when there is no snapshot or it cannot be
// used as it is (the caller reads the whole manifest), and an error only
// for what would fail a whole read too.
func (d *DB) snapshotStart(ctx context.Context, st store.Reader, comp compaction, fetch func(name string, size int64) (string, error)) (*fromSnapshot, error) {
	rec := comp.rec
	if rec == nil || rec.Snapshot == nil {
		return nil, nil
	}
	snap := rec.Snapshot
	fallback := func(why string, args ...any) (*fromSnapshot, error) {
		d.warnf("compaction snapshot %s not used (%s): the manifest is read whole", snap.File, fmt.Sprintf(why, args...))
		return nil, nil
	}
	switch {
	case !store.CheckName(snap.File) || !strings.HasSuffix(snap.File, ".parquet"):
		return fallback("not a plain Parquet file name")
	case !comp.files[snap.File]:
		return fallback("missing")
	case snap.Shards <= 0 || snap.Shards != rec.Upto:
		return fallback("it holds %d shards, the record has looked at %d", snap.Shards, rec.Upto)
	}
	next := 0
	for _, g := range rec.Ranges {
		if g.First < next || g.End <= g.First || g.End > snap.Shards || !store.CheckName(g.File) || !strings.HasSuffix(g.File, ".parquet") {
			return fallback("compacted file %s covers shards %d to %d, beyond or overlapping the others", g.File, g.First, g.End-1)
		}
		if !comp.files[g.File] {
			return fallback("compacted file %s is missing", g.File)
		}
		next = g.End
	}
	tail, err := st.EntriesFrom(ctx, snap.Shards-1)
	if err != nil {
		return nil, fmt.Errorf("duckdb: %w", err)
	}
	if len(tail) == 0 || tail[0].Path != snap.LastPath || tail[0].Seq != snap.LastSeq {
		got := "none"
		if len(tail) > 0 {
			got = fmt.Sprintf("%s at %d", tail[0].Path, tail[0].Seq)
		}
		return fallback("its last shard is %s at %d, the manifest's shard %d is %s", snap.LastPath, snap.LastSeq, snap.Shards-1, got)
	}
	file, err := fetch(snap.File, snap.Bytes)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return fallback("%v", err)
	}
	f := &fromSnapshot{snap: snap, file: file, ranges: rec.Ranges, tail: tail[1:]}
	if why, err := d.scanSnapshot(ctx, f); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return fallback("%v", err)
	} else if why != "" {
		return fallback("%s", why)
	}
	return f, nil
}

// scanSnapshot reads the snapshot file once: it checks that the file
// has the shards of each range read from its compacted file, and no other
// shard (the first and last shard's places and paths, and the count),
// and sets f.listed to the paths of f.tail it lists (a shard the
// manifest lists again after the snapshot). It returns why the file does
// not match its record ("" when it does).
func (d *DB) scanSnapshot(ctx context.Context, f *fromSnapshot) (string, error) {
	var paths []string
	for _, e := range f.tail {
		if e.Path != "" {
			paths = append(paths, e.Path)
		}
	}
	rows, err := d.db.QueryContext(ctx, fmt.Sprintf(`WITH tail AS (SELECT DISTINCT unnest(?::VARCHAR[]) AS path)
SELECT s.%[1]s, min(s.%[2]s), max(s.%[2]s), count(*), arg_min(s.path, s.%[2]s), arg_max(s.path, s.%[2]s),
  coalesce(list(s.path) FILTER (WHERE tail.path IS NOT NULL), [])
FROM read_parquet(%[3]s) s LEFT JOIN tail ON s.path = tail.path GROUP BY s.%[1]s`, compact.SnapMerged, compact.SnapShard, sqlString(f.file)), paths)
	if err != nil {
		return "", err
	}
	defer rows.Close()
	byFile := make(map[string]compact.Range, len(f.ranges))
	for _, g := range f.ranges {
		byFile[g.File] = g
	}
	f.listed = map[string]bool{}
	n := 0
	for rows.Next() {
		var (
			name          sql.NullString
			first, last   string
			lo, hi, count int
			listed        []any
		)
		if err := rows.Scan(&name, &lo, &hi, &count, &first, &last, &listed); err != nil {
			return "", err
		}
		for _, p := range listed {
			if p, ok := p.(string); ok {
				f.listed[p] = true
			}
		}
		if !name.Valid {
			continue // the shards read from their own files (looseShards)
		}
		g, ok := byFile[name.String]
		if !ok || g.First != lo || g.End != hi+1 || count != g.End-g.First || g.FirstPath != first || g.LastPath != last {
			return fmt.Sprintf("its shards read from %s are not those the record lists", name.String), nil
		}
		n++
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if n != len(f.ranges) {
		return fmt.Sprintf("it names %d compacted files, the record %d", n, len(f.ranges)), nil
	}
	return "", nil
}

// layout makes the layout of an opening from the snapshot: the shards
// the snapshot reads from their own files and the shards after it (their
// files under base), the compacted files (under mergedDir), and the dead
// letters as committedDeadLetters gives them over the whole manifest. It
// returns a nil layout, with a warning, when the snapshot's rows are not
// as its record says (the caller reads the whole manifest). remote: shard
// paths must not start with "_" (as openRemote requires).
func (f *fromSnapshot) layout(ctx context.Context, d *DB, base, mergedDir string, remote bool) (*layout, []schemas.DeadLetterState, [][]dlMark, error) {
	l := &layout{base: base, mergedDir: mergedDir + string(filepath.Separator)}
	l.snap = &snapRows{file: f.file, rows: f.snap.Rows}
	for _, g := range f.ranges {
		l.snapMerged = append(l.snapMerged, shardFile{
			entry:  schemas.ShardEntry{SchemaVersion: g.SchemaVersion},
			at:     g.First,
			file:   filepath.Join(mergedDir, g.File),
			merged: true,
		})
	}
	fail := func(err error) (*layout, []schemas.DeadLetterState, [][]dlMark, error) {
		if ctx.Err() != nil {
			return nil, nil, nil, ctx.Err()
		}
		d.warnf("compaction snapshot %s not used (%v): the manifest is read whole", f.snap.File, err)
		return nil, nil, nil, nil
	}
	loose, err := d.looseShards(ctx, f.file, base)
	if err == nil && len(loose) != f.snap.Loose {
		err = fmt.Errorf("it holds %d shards read from their own files, its record says %d", len(loose), f.snap.Loose)
	}
	if err != nil {
		return fail(err)
	}
	// A shard the manifest lists again after the snapshot is read once,
	// as a whole read does (scanSnapshot looked the tail's paths up).
	l.shards = loose
	seen := maps.Clone(f.listed) // set by scanSnapshot
	if seen == nil {
		seen = map[string]bool{}
	}
	if _, err := d.addShards(l, f.tail, f.snap.Shards, seen, remote, func(i int) int64 { return f.tail[i].Seq }); err != nil {
		return nil, nil, nil, err
	}
	// The dead letters: the snapshot's marks, then the tail's.
	dls := make([]schemas.DeadLetterState, 0, len(f.snap.DeadLetters))
	marks := make([][]dlMark, 0, len(f.snap.DeadLetters))
	idx := map[string]int{}
	for _, dl := range f.snap.DeadLetters {
		idx[dl.File] = len(dls)
		dls = append(dls, schemas.DeadLetterState{File: dl.File, Bytes: dl.Bytes})
		ms := make([]dlMark, len(dl.Marks))
		for i, m := range dl.Marks {
			ms[i] = dlMark{seq: m.Seq, at: m.At, bytes: m.Bytes}
		}
		marks = append(marks, ms)
	}
	more, moreMarks := committedDeadLetters(f.tail, func(i int) int64 { return f.tail[i].Seq })
	for i, c := range more {
		j, ok := idx[c.File]
		if !ok {
			idx[c.File] = len(dls)
			dls = append(dls, c)
			marks = append(marks, moreMarks[i])
			continue
		}
		dls[j].Bytes = c.Bytes
		marks[j] = append(marks[j], moreMarks[i]...)
	}
	return l, dls, marks, nil
}

// looseShards reads the rows of the snapshot file that are read from
// their own files (not merged), in manifest order: what the layout needs
// of them (their rows in the shards view come from the file).
func (d *DB) looseShards(ctx context.Context, file, base string) ([]shardFile, error) {
	rows, err := d.db.QueryContext(ctx, fmt.Sprintf(`SELECT %[1]s, %[2]s, path, bytes, schema_version
FROM read_parquet(%[3]s) WHERE %[4]s IS NULL ORDER BY %[2]s`, compact.SnapSeq, compact.SnapShard, sqlString(file), compact.SnapMerged))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []shardFile
	for rows.Next() {
		var (
			s       shardFile
			at      int64
			version sql.NullString
		)
		e := &s.entry
		if err := rows.Scan(&s.seq, &at, &e.Path, &e.Bytes, &version); err != nil {
			return nil, err
		}
		if err := checkRel(e.Path); err != nil {
			return nil, fmt.Errorf("shard path %q is not a clean relative data path", e.Path)
		}
		s.at, e.Seq, e.SchemaVersion = int(at), s.seq, version.String
		s.file = filepath.Join(base, filepath.FromSlash(e.Path))
		s.fromSnap = true
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// appendFiles fills the table of the files the views read (viewFiles)
// through DuckDB's appender on conn.
func (l *layout) appendFiles(ctx context.Context, conn *sql.Conn) error {
	return conn.Raw(func(dc any) error {
		c, ok := dc.(driver.Conn)
		if !ok {
			return fmt.Errorf("files: unexpected driver connection %T", dc)
		}
		a, err := duckdbdrv.NewAppenderFromConn(c, "", viewFiles)
		if err != nil {
			return fmt.Errorf("files: %w", err)
		}
		for i, v := range l.bySchema() {
			if err := ctx.Err(); err != nil {
				return errors.Join(err, a.Close())
			}
			for j, f := range v.files {
				if err := a.AppendRow(int32(i), int32(j), f); err != nil {
					return errors.Join(fmt.Errorf("files: %w", err), a.Close())
				}
			}
		}
		if err := a.Close(); err != nil {
			return fmt.Errorf("files: %w", err)
		}
		return nil
	})
}

// snapSelect is the snapshot's rows as the shards table's columns.
func (l *layout) snapSelect() string {
	return fmt.Sprintf(`SELECT %[1]s AS seq, path, "rows", bytes, "groups", policy_version, committed_at, run_id, writer, recovered, schema_version,
  CASE WHEN %[2]s IS NULL THEN %[3]s || path ELSE %[4]s || %[2]s END AS file
FROM read_parquet(%[5]s)`, compact.SnapSeq, compact.SnapMerged, sqlString(l.base+"/"), sqlString(l.mergedDir), sqlString(l.snap.file))
}
