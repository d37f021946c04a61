// Package compact merges runs of small committed shards into larger files
// for the readers of the data as a whole — `sql`, `report` and `ui` — so
// that defining their views and scanning the steps open a few files, not
// one per commit of a long run.
//
// The manifest is not touched: the shards stay listed and where they are,
// and consumer groups, exports and writers read them as before (nothing
// they rely on changes, and a compaction can lose nothing). What
// compaction adds lives in the root's _compact folder, as create-only
// objects (store.Objects):
//
//   - <writer>-<first>-<end>.parquet holds the rows of the manifest's
//     shards first to end-1 (in the order of store.Reader.Committed), as
//     stored (prefix deltas kept: each shard's first row of a trajectory
//     is whole, so no chain crosses from one shard into the next) and in
//     order, with one more column, shard, naming the shard each row is
//     from;
//   - record-<n>.json is the n-th record: every merged file so far, and
//     how far the compactions have looked (Record.Upto). Records are
//     cumulative, so a reader takes the newest.
//   - snapshot-<n>-<writer>.parquet is the n-th record's Snapshot: one
//     row per shard before Upto (its manifest entry's columns and the
//     merged file holding it), and, in the record, the dead-letter marks
//     of the manifest's entries up to there. A reader of the data as a
//     whole (the views of `sql`) takes its shards from it and reads only
//     the manifest's entries after it (store.Reader.EntriesFrom), so that
//     its start-up does not grow with the run.
//
// A reader checks the snapshot against the manifest (the place and path
// of its last shard) and against the record (each range's shards), and
// each range of the record against the manifest when it reads the whole
// manifest (no snapshot, or one that does not match: the paths of its
// first and last shard); it reads the shards of a range that does not
// match, or whose file is missing, from their own files. The
// views read through the merged files are the views read through the
// shards, row for row: only the shards table's file column says where a
// shard's rows were read.
//
// Two compactions at once are safe: each writes its merged files under
// its own name, and of two creators of the next record one wins; the
// other's files are removed (by it, or by a later compaction once the
// newest record has looked past them). The shards stay: a vacuum that
// deletes those no consumer group can still need is not built.
package compact

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Dir is the folder of the merged files and records under the root.
const Dir = "_compact"

// ShardColumn is the column a merged file adds: the manifest path of the
// shard each row is from.
const ShardColumn = "shard"

// Range is a merged file: the rows of the shards First to End-1 of the
// manifest's shard list.
type Range struct {
	First int `json:"first"`
	End   int `json:"end"`
	// FirstPath and LastPath are the paths of shards First and End-1,
	// which a reader checks against its manifest.
	FirstPath string `json:"first_path"`
	LastPath  string `json:"last_path"`
	// File is the merged file's name in Dir.
	File string `json:"file"`
	Rows int64  `json:"rows"`
	// Bytes is the merged file's size.
	Bytes         int64  `json:"bytes"`
	SchemaVersion string `json:"schema_version"`
}

// Record is what the compactions have done so far.
type Record struct {
	// Seq is the record's number (its name).
	Seq int64 `json:"seq"`
	// Upto is how far the compactions have looked: the shards before it
	// are merged (in Ranges) or left alone for good (large ones, other
	// schema versions, runs too short to merge); those from it on are
	// looked at again.
	Upto   int     `json:"upto"`
	Ranges []Range `json:"ranges"`
	Writer string  `json:"writer"`
	// Snapshot holds what readers need of the manifest up to Upto (nil
	// in records of versions before snapshots, or when Upto is 0).
	Snapshot *Snapshot `json:"snapshot,omitempty"`
}

func recordName(seq int64) string { return fmt.Sprintf("record-%012d.json", seq) }

// Latest returns the newest record in objs (nil when there is none).
func Latest(ctx context.Context, objs store.Objects) (*Record, error) {
	for attempt := 0; ; attempt++ {
		names, err := objs.List(ctx, "record-")
		if err != nil {
			return nil, fmt.Errorf("compact: list records: %w", err)
		}
		if len(names) == 0 {
			return nil, nil
		}
		name := names[len(names)-1]
		data, err := objs.Get(ctx, name)
		if errors.Is(err, fs.ErrNotExist) && attempt < 3 {
			continue // removed as superseded since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("compact: read %s: %w", name, err)
		}
		var r Record
		if err := json.Unmarshal(data, &r); err != nil {
			return nil, fmt.Errorf("compact: record %s: %w", name, err)
		}
		if recordName(r.Seq) != name {
			return nil, fmt.Errorf("compact: record %s names itself %d", name, r.Seq)
		}
		return &r, nil
	}
}

// Valid returns the ranges of r that match committed (the manifest's
// shard entries, in order), and a warning for each that does not.
func (r *Record) Valid(committed []schemas.ShardEntry) (ok []Range, warnings []string) {
	if r == nil {
		return nil, nil
	}
	next := 0
	for _, g := range r.Ranges {
		switch {
		case g.First < next || g.End <= g.First || g.End > len(committed):
			warnings = append(warnings, fmt.Sprintf("compacted file %s covers shards %d to %d, beyond or overlapping the manifest's: read from the shards", g.File, g.First, g.End-1))
			continue
		case committed[g.First].Path != g.FirstPath || committed[g.End-1].Path != g.LastPath:
			warnings = append(warnings, fmt.Sprintf("compacted file %s does not match the manifest (shard %d is %s, not %s): read from the shards", g.File, g.First, committed[g.First].Path, g.FirstPath))
			continue
		case !store.CheckName(g.File) || !strings.HasSuffix(g.File, ".parquet"):
			warnings = append(warnings, fmt.Sprintf("compacted file name %q is not a plain Parquet file name: read from the shards", g.File))
			continue
		case !sameVersion(committed[g.First:g.End], g.SchemaVersion):
			warnings = append(warnings, fmt.Sprintf("compacted file %s holds shards of another schema version than %q: read from the shards", g.File, g.SchemaVersion))
			continue
		}
		ok = append(ok, g)
		next = g.End
	}
	return ok, warnings
}

func sameVersion(shards []schemas.ShardEntry, v string) bool {
	for _, e := range shards {
		if e.SchemaVersion != v {
			return false
		}
	}
	return true
}

// Config tunes a compaction. Zero values take the defaults noted.
type Config struct {
	// Writer names the compaction in its files' names and its record.
	Writer string
	// TargetBytes is a merged file's size aim (the sum of its shards'
	// sizes, which it is about). Default 64 MiB.
	TargetBytes int64
	// SmallBytes: shards of at least this size are left alone. Default
	// TargetBytes / 4.
	SmallBytes int64
	// MinShards is the fewest shards merged into one file. Default 16.
	MinShards int
	// MaxShards is the most shards merged into one file (the count of
	// files is what readers pay for). Default 1024.
	MaxShards int
	// Allocator for reading and writing shards (default Go's).
	Allocator memory.Allocator
}

func (c *Config) defaults() {
	if c.TargetBytes <= 0 {
		c.TargetBytes = 64 << 20
	}
	if c.SmallBytes <= 0 {
		c.SmallBytes = c.TargetBytes / 4
	}
	if c.MinShards <= 1 {
		c.MinShards = 16
	}
	if c.MaxShards < c.MinShards {
		c.MaxShards = max(1024, c.MinShards)
	}
	if c.Allocator == nil {
		c.Allocator = memory.DefaultAllocator
	}
}

// Stats says what a compaction did.
type Stats struct {
	// Shards is how many shards were merged, into Files files of Bytes.
	Shards, Files int
	Rows, Bytes   int64
	// Removed counts leftover files of earlier compactions removed.
	Removed int
	// Skipped says why runs of shards were left alone (they are read
	// from their own files).
	Skipped []string
	// Record is the record written (nil: nothing to do).
	Record *Record
}

// ErrRaced is a compaction whose record another compaction created first;
// its merged files are removed. Running it again continues from there.
var ErrRaced = errors.New("compact: another compaction recorded its work first")

// Run merges the runs of small shards the newest record has not looked at
// into files of about cfg.TargetBytes, and records them.
func Run(ctx context.Context, st store.Reader, cfg Config) (Stats, error) {
	cfg.defaults()
	if !store.CheckName(cfg.Writer) {
		return Stats{}, fmt.Errorf("compact: writer name %q is not a plain name", cfg.Writer)
	}
	objs, err := st.Objects(Dir)
	if err != nil {
		return Stats{}, fmt.Errorf("compact: %w", err)
	}
	// The record first, then the manifest: the manifest only grows, so
	// it holds every shard the record names.
	prev, err := Latest(ctx, objs)
	if err != nil {
		return Stats{}, err
	}
	entries, err := st.EntriesFrom(ctx, 0)
	if err != nil {
		return Stats{}, fmt.Errorf("compact: %w", err)
	}
	var committed []schemas.ShardEntry
	for _, e := range entries {
		if e.Path != "" {
			committed = append(committed, e)
		}
	}
	var out Stats
	rec := &Record{Writer: cfg.Writer}
	if prev != nil {
		valid, warnings := prev.Valid(committed)
		if len(warnings) > 0 || prev.Upto > len(committed) {
			return Stats{}, fmt.Errorf("compact: the newest record (%d) does not match the manifest: %s", prev.Seq, strings.Join(warnings, "; "))
		}
		rec.Seq, rec.Upto, rec.Ranges = prev.Seq+1, prev.Upto, valid
		if out.Removed, err = removeLeftovers(ctx, objs, prev); err != nil {
			return Stats{}, err
		}
	}
	plan, upto := planRanges(committed, rec.Upto, cfg)
	if len(plan) == 0 && upto == rec.Upto && (upto == 0 || prev.Snapshot != nil) {
		return out, nil
	}
	var made []string
	cleanup := func() {
		for _, f := range made {
			_ = objs.Delete(context.WithoutCancel(ctx), f)
		}
	}
	for _, g := range plan {
		g.File = fmt.Sprintf("%s-%d-%d.parquet", cfg.Writer, g.First, g.End)
		data, rows, err := merge(ctx, st, committed[g.First:g.End], cfg.Allocator)
		if errors.Is(err, errUnmergeable) {
			// Left alone for good (upto passes it): a shard that is not
			// as the manifest and schema say is read from its own file.
			out.Skipped = append(out.Skipped, err.Error())
			continue
		}
		if err != nil {
			cleanup()
			return Stats{}, err
		}
		// The name is this compaction's own: one already there is an
		// earlier attempt of this request that landed.
		if err := objs.Create(ctx, g.File, data); err != nil && !errors.Is(err, fs.ErrExist) {
			cleanup()
			return Stats{}, fmt.Errorf("compact: save %s: %w", g.File, err)
		}
		made = append(made, g.File)
		g.Rows, g.Bytes, g.SchemaVersion = rows, int64(len(data)), schemas.SchemaVersion
		rec.Ranges = append(rec.Ranges, g)
		out.Shards += g.End - g.First
		out.Files++
		out.Rows += rows
		out.Bytes += g.Bytes
	}
	rec.Upto = upto
	if upto > 0 {
		snap, data, err := buildSnapshot(entries, upto, rec.Ranges, cfg.Allocator)
		if err != nil {
			cleanup()
			return Stats{}, err
		}
		snap.File = snapshotName(rec.Seq, cfg.Writer)
		if err := objs.Create(ctx, snap.File, data); err != nil && !errors.Is(err, fs.ErrExist) {
			cleanup()
			return Stats{}, fmt.Errorf("compact: save %s: %w", snap.File, err)
		}
		made = append(made, snap.File)
		rec.Snapshot = snap
	}
	data, err := json.Marshal(rec)
	if err != nil {
		cleanup()
		return Stats{}, fmt.Errorf("compact: record: %w", err)
	}
	if err := objs.Create(ctx, recordName(rec.Seq), data); err != nil {
		// After a retried request the record there may be ours.
		if !errors.Is(err, fs.ErrExist) {
			cleanup()
			return Stats{}, fmt.Errorf("compact: save record %d: %w", rec.Seq, err)
		}
		if there, gerr := objs.Get(ctx, recordName(rec.Seq)); gerr != nil || !bytes.Equal(there, data) {
			cleanup()
			return Stats{}, fmt.Errorf("%w (record %d)", ErrRaced, rec.Seq)
		}
	}
	// Records are cumulative: keep the one before (a reader may be
	// reading it) and its snapshot, remove older ones and the snapshots
	// of compactions that lost a race or died before their record.
	if names, err := objs.List(ctx, "record-"); err == nil {
		for _, n := range names {
			if n < recordName(rec.Seq-1) {
				_ = objs.Delete(ctx, n)
			}
		}
	}
	if names, err := objs.List(ctx, "snapshot-"); err == nil {
		keep := map[string]bool{}
		for _, r := range []*Record{prev, rec} {
			if r != nil && r.Snapshot != nil {
				keep[r.Snapshot.File] = true
			}
		}
		for _, n := range names {
			if !keep[n] && n < snapshotName(rec.Seq, "") {
				_ = objs.Delete(ctx, n)
			}
		}
	}
	out.Record = rec
	return out, nil
}

// Every runs Run, then, if interval > 0, again every interval until stop
// is closed (it returns nil then, between runs). report is told each
// run's outcome; a run that lost a race (ErrRaced) is reported and the
// next one continues its work, any other error ends the loop.
func Every(ctx context.Context, st store.Reader, cfg Config, interval time.Duration, stop <-chan struct{}, report func(Stats, time.Duration, error)) error {
	for {
		start := time.Now()
		out, err := Run(ctx, st, cfg)
		switch {
		case err == nil:
			report(out, time.Since(start), nil)
		case interval > 0 && errors.Is(err, ErrRaced):
			report(out, time.Since(start), err)
		default:
			return err
		}
		if interval <= 0 {
			return nil
		}
		t := time.NewTimer(interval)
		select {
		case <-stop:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// errUnmergeable marks shards that cannot be merged as they are (columns
// not those of the schema, rows not as the manifest lists them).
var errUnmergeable = errors.New("not merged")

// planRanges picks, from shard from on, the runs of small shards of the
// current schema version to merge: a run closes when its shards reach
// cfg.TargetBytes or cfg.MaxShards, or at a shard that is not merged (then
// it is merged if it has cfg.MinShards). upto is where the next
// compaction starts: past every shard decided on, at the start of the run
// still open at the end.
func planRanges(committed []schemas.ShardEntry, from int, cfg Config) (plan []Range, upto int) {
	upto = from
	start, sum := from, int64(0)
	seen := map[string]bool{} // a shard listed twice (old manifests) is read once: never merged
	for _, e := range committed[:from] {
		seen[e.Path] = true
	}
	closeRun := func(end int) {
		if end-start >= cfg.MinShards {
			plan = append(plan, Range{First: start, End: end, FirstPath: committed[start].Path, LastPath: committed[end-1].Path})
		}
		start, sum, upto = end, 0, end
	}
	for i := from; i < len(committed); i++ {
		e := committed[i]
		twice := seen[e.Path]
		seen[e.Path] = true
		if e.SchemaVersion != schemas.SchemaVersion || e.Bytes >= cfg.SmallBytes || e.Path == "" || twice {
			closeRun(i)
			start, upto = i+1, i+1 // left alone
			continue
		}
		sum += e.Bytes
		if sum >= cfg.TargetBytes || i+1-start >= cfg.MaxShards {
			closeRun(i + 1)
		}
	}
	return plan, upto
}

// merge reads shards as stored and returns one Parquet file of their rows
// in order, with the shard column. Every shard must have the columns of
// the first, which must be those of schemas.StepSchema (by name).
func merge(ctx context.Context, st store.Reader, shards []schemas.ShardEntry, mem memory.Allocator) ([]byte, int64, error) {
	var buf bytes.Buffer
	var size int64
	for _, e := range shards {
		size += e.Bytes
	}
	buf.Grow(int(min(size+size/4, 1<<30)) + 1<<20) // re-encoded at about the shards' size: no doubling
	meta := map[string]string{
		schemas.FooterSchemaKey: schemas.SchemaVersion,
		"rllm_pipe.compacted":   strconv.Itoa(len(shards)) + " shards, " + shards[0].Path + " to " + shards[len(shards)-1].Path,
	}
	var (
		w      *parquet.Writer
		schema *arrow.Schema // the first shard's columns, then the shard column
	)
	for _, e := range shards {
		err := eachRecord(ctx, st, e, mem, func(rec arrow.RecordBatch) error {
			if schema == nil {
				if err := namesOf(rec.Schema(), schemas.StepSchema); err != nil {
					return fmt.Errorf("%w: %w", errUnmergeable, err)
				}
				fields := make([]arrow.Field, 0, rec.Schema().NumFields()+1)
				for _, f := range rec.Schema().Fields() {
					fields = append(fields, arrow.Field{Name: f.Name, Type: f.Type, Nullable: f.Nullable})
				}
				schema = arrow.NewSchema(append(fields, arrow.Field{Name: ShardColumn, Type: arrow.BinaryTypes.String}), nil)
				var err error
				if w, err = parquet.NewWriter(&buf, schema, parquet.Options{Allocator: mem}, meta); err != nil {
					return err
				}
			}
			if err := sameColumns(rec.Schema(), schema); err != nil {
				return fmt.Errorf("%w: %w", errUnmergeable, err)
			}
			return writeWithShard(w, schema, rec, e.Path, mem)
		})
		if err != nil {
			return nil, 0, fmt.Errorf("compact: shard %s: %w", e.Path, err)
		}
	}
	if w == nil {
		return nil, 0, fmt.Errorf("compact: shards %s to %s hold no rows: %w", shards[0].Path, shards[len(shards)-1].Path, errUnmergeable)
	}
	if err := w.Close(); err != nil {
		return nil, 0, fmt.Errorf("compact: %w", err)
	}
	var want int64
	for _, e := range shards {
		want += e.Rows
	}
	if w.Rows() != want {
		return nil, 0, fmt.Errorf("compact: shards %s to %s hold %d rows, but the manifest lists %d: %w", shards[0].Path, shards[len(shards)-1].Path, w.Rows(), want, errUnmergeable)
	}
	return buf.Bytes(), w.Rows(), nil
}

// eachRecord calls fn with the record batches of shard e, as stored.
func eachRecord(ctx context.Context, st store.Reader, e schemas.ShardEntry, mem memory.Allocator, fn func(arrow.RecordBatch) error) error {
	r, err := st.ReadShard(ctx, e, nil, mem)
	if err != nil {
		return err
	}
	defer r.Close()
	r.KeepDeltas()
	return r.Each(fn)
}

// writeWithShard writes rec to w with the shard column set to path.
func writeWithShard(w *parquet.Writer, schema *arrow.Schema, rec arrow.RecordBatch, path string, mem memory.Allocator) error {
	n := int(rec.NumRows())
	b := array.NewStringBuilder(mem)
	b.Reserve(n)
	b.ReserveData(n * len(path))
	for range n {
		b.Append(path)
	}
	col := b.NewArray()
	b.Release()
	defer col.Release()
	out := array.NewRecordBatch(schema, append(append([]arrow.Array(nil), rec.Columns()...), col), int64(n))
	defer out.Release()
	return w.Write(out)
}

// namesOf checks that got has the columns of want, by name.
func namesOf(got, want *arrow.Schema) error {
	if got.NumFields() != want.NumFields() {
		return fmt.Errorf("%d columns, not the %d of schema %s", got.NumFields(), want.NumFields(), schemas.SchemaVersion)
	}
	for i, f := range got.Fields() {
		if f.Name != want.Field(i).Name {
			return fmt.Errorf("column %d is %s, not %s as in schema %s", i, f.Name, want.Field(i).Name, schemas.SchemaVersion)
		}
	}
	return nil
}

// sameColumns checks that got has the columns of want but its last (the
// shard column), by name and type (field metadata aside).
func sameColumns(got, want *arrow.Schema) error {
	if got.NumFields() != want.NumFields()-1 {
		return fmt.Errorf("%d columns, not the %d of the shards before", got.NumFields(), want.NumFields()-1)
	}
	for i, f := range got.Fields() {
		w := want.Field(i)
		if f.Name != w.Name || !arrow.TypeEqual(f.Type, w.Type) {
			return fmt.Errorf("column %d is %s %s, not %s %s as in the shards before", i, f.Name, f.Type, w.Name, w.Type)
		}
	}
	return nil
}

// removeLeftovers removes the merged files no record will list: those of
// compactions that lost a race or died before their record, over shards
// the newest record (prev) has looked past. Files beyond it may belong to
// a compaction under way.
func removeLeftovers(ctx context.Context, objs store.Objects, prev *Record) (int, error) {
	names, err := objs.List(ctx, "")
	if err != nil {
		return 0, fmt.Errorf("compact: list: %w", err)
	}
	listed := map[string]bool{}
	for _, g := range prev.Ranges {
		listed[g.File] = true
	}
	n := 0
	for _, name := range names {
		end, ok := fileEnd(name)
		if !ok || listed[name] || end > prev.Upto {
			continue
		}
		if err := objs.Delete(ctx, name); err != nil {
			return n, fmt.Errorf("compact: remove %s: %w", name, err)
		}
		n++
	}
	return n, nil
}

// fileEnd parses <writer>-<first>-<end>.parquet.
func fileEnd(name string) (int, bool) {
	base, ok := strings.CutSuffix(name, ".parquet")
	if !ok {
		return 0, false
	}
	rest, endS, ok := cutLast(base, "-")
	if !ok {
		return 0, false
	}
	writer, firstS, ok := cutLast(rest, "-")
	if !ok || writer == "" {
		return 0, false
	}
	first, err1 := strconv.Atoi(firstS)
	end, err2 := strconv.Atoi(endS)
	if err1 != nil || err2 != nil || first < 0 || end <= first {
		return 0, false
	}
	return end, true
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
