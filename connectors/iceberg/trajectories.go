package iceberg

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/iceberg-go"
	"github.com/apache/iceberg-go/table"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TrajectoriesTable is the name of the trajectories' table.
const TrajectoriesTable = "trajectories"

// trajectorySchema is the trajectories table: one row per trajectory and
// shard, the columns of sql's trajectories view (connectors/duckdb) with
// their types, folded from the shard's steps as that view folds them.
var trajectorySchema = arrow.NewSchema([]arrow.Field{
	{Name: "group_id", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "group_version", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "trajectory_id", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "task_id", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "role", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "reward", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
	{Name: "num_steps", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
	{Name: "steps", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "prompt_tokens", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "response_tokens", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "min_policy_version", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "max_policy_version", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
	{Name: "is_correct", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
	{Name: "termination_reason", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "partial", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
	{Name: "filter_reason", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "advantage", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
	{Name: "estimator", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "group_size", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
	{Name: "expected_group_size", Type: arrow.PrimitiveTypes.Int32, Nullable: true},
	{Name: "shard", Type: arrow.BinaryTypes.String, Nullable: true},
	{Name: "pass", Type: arrow.FixedWidthTypes.Boolean, Nullable: true},
}, nil)

// firstStepColumns are the trajectory's values its first step carries
// (the first step, by step_index, where the value is not null): the
// step rows repeat them.
var firstStepColumns = []string{"task_id", "role", "reward", "num_steps", "is_correct", "termination_reason",
	"filter_reason", "advantage", "estimator", "group_size", "expected_group_size"}

// SyncTrajectories adds the trajectories of the shards committed since
// the table's position (PropShards, as the steps table's) to
// NAMESPACE.trajectories: one file per policy version and snapshot, at
// most MaxFilesPerCommit shards a snapshot, by the steps table's
// protocol. It returns the rows added.
func (s *Syncer) SyncTrajectories(ctx context.Context) (int64, error) {
	id := append(append(table.Identifier{}, s.cfg.Namespace...), TrajectoriesTable)
	var added int64
	conflicts := 0
	for {
		tbl, err := s.openTable(ctx, id, trajectorySchema, []string{"group_version"})
		if err != nil {
			return added, err
		}
		pos, err := Position(tbl)
		if err != nil {
			return added, err
		}
		batch, err := s.nextShards(ctx, id, pos)
		if err != nil || len(batch) == 0 {
			return added, err
		}
		step("trajectories")
		recs, err := s.trajectoryRows(ctx, batch)
		if err != nil {
			return added, err
		}
		var files []iceberg.DataFile
		var rows int64
		nonce := newNonce()
		for _, v := range sortedKeys(recs) {
			rec := recs[v]
			if err == nil {
				var f iceberg.DataFile
				f, err = writeRecord(ctx, tbl, rec, fmt.Sprintf("group_version=%d/trajectories-%d-%d-%s.parquet", v, pos.Shards, pos.Shards+len(batch), nonce), nil)
				files = append(files, f)
				rows += rec.NumRows()
			}
			rec.Release()
		}
		if err != nil {
			return added, err
		}
		next := Pos{Shards: pos.Shards + len(batch), LastShard: batch[len(batch)-1].Path}
		ok, err := s.commitFiles(ctx, id, tbl, files, iceberg.Properties{PropShards: strconv.Itoa(next.Shards), PropLastShard: next.LastShard})
		if err != nil {
			return added, err
		}
		if !ok {
			if conflicts++; conflicts > maxConflicts {
				return added, fmt.Errorf("iceberg: %d commits to %s lost a race in a row", conflicts, id)
			}
			continue
		}
		conflicts = 0
		added += rows
	}
}

// trajectoryRows folds the steps of each shard of entries into one row
// per trajectory (and shard), in the order of their first step rows,
// by policy version (group_version).
func (s *Syncer) trajectoryRows(ctx context.Context, entries []schemas.ShardEntry) (map[int64]arrow.RecordBatch, error) {
	mem := memory.NewGoAllocator()
	builders := map[int64]*array.RecordBuilder{}
	defer func() {
		for _, b := range builders {
			b.Release()
		}
	}()
	for _, e := range entries {
		folds, err := s.foldShard(ctx, e, mem)
		if err != nil {
			return nil, err
		}
		for _, f := range folds {
			b := builders[f.version]
			if b == nil {
				b = array.NewRecordBuilder(mem, trajectorySchema)
				builders[f.version] = b
			}
			f.append(b, e.Path)
		}
	}
	out := map[int64]arrow.RecordBatch{}
	for v, b := range builders {
		out[v] = b.NewRecordBatch()
	}
	return out, nil
}

// trajectoryFold is one trajectory's steps in one shard, folded.
type trajectoryFold struct {
	groupID, trajectoryID string
	version               int64
	first                 map[string]firstValue
	steps                 int64
	promptTokens          *int64
	responseTokens        *int64
	minPolicy, maxPolicy  *int64
	partial               *bool
}

// firstValue is a column's value at the lowest step_index seen so far
// where it is not null.
type firstValue struct {
	step  int32
	value any
}

// foldShard folds the shard e's step rows by (group_id, group_version,
// trajectory_id).
func (s *Syncer) foldShard(ctx context.Context, e schemas.ShardEntry, mem memory.Allocator) ([]*trajectoryFold, error) {
	rd, err := s.r.ReadShard(ctx, e, nil, mem)
	if err != nil {
		return nil, fmt.Errorf("iceberg: shard %s: %w", e.Path, err)
	}
	defer rd.Close()
	rd.KeepDeltas() // prompt_tokens counts a delta's prompt without rebuilding it
	var f folder
	if err := rd.Each(func(rec arrow.RecordBatch) error { f.add(rec); return nil }); err != nil {
		return nil, fmt.Errorf("iceberg: shard %s: %w", e.Path, err)
	}
	return f.order, nil
}

// folder folds step rows by (group_id, group_version, trajectory_id), in
// the order of each trajectory's first row.
type folder struct {
	byKey map[foldKey]*trajectoryFold
	order []*trajectoryFold
}

type foldKey struct {
	group, traj string
	version     int64
}

// add folds the rows of rec (a shard's rows as stored: prompt deltas kept).
func (fo *folder) add(rec arrow.RecordBatch) {
	if fo.byKey == nil {
		fo.byKey = map[foldKey]*trajectoryFold{}
	}
	col := func(name string) arrow.Array {
		if idx := rec.Schema().FieldIndices(name); len(idx) > 0 {
			return rec.Column(idx[0])
		}
		return nil
	}
	stepIdx := col("step_index")
	promptIDs, deltaIDs, prefixLen, responseIDs := col("prompt_ids"), col("prompt_delta_ids"), col("prompt_prefix_len"), col("response_ids")
	policy, partial := col("policy_version"), col("partial")
	firsts := make([]arrow.Array, len(firstStepColumns))
	for i, name := range firstStepColumns {
		firsts[i] = col(name)
	}
	groupCol, versionCol, trajCol := col("group_id"), col("group_version"), col("trajectory_id")
	for i := 0; i < int(rec.NumRows()); i++ {
		k := foldKey{str(groupCol, i), str(trajCol, i), i64(versionCol, i)}
		f := fo.byKey[k]
		if f == nil {
			f = &trajectoryFold{groupID: k.group, trajectoryID: k.traj, version: k.version, first: map[string]firstValue{}}
			fo.byKey[k] = f
			fo.order = append(fo.order, f)
		}
		f.steps++
		si := int32(i64(stepIdx, i))
		for c, name := range firstStepColumns {
			v, ok := value(firsts[c], i)
			if !ok {
				continue
			}
			if cur, seen := f.first[name]; !seen || si < cur.step {
				f.first[name] = firstValue{si, v}
			}
		}
		if n, ok := promptLen(promptIDs, deltaIDs, prefixLen, i); ok {
			f.promptTokens = addTo(f.promptTokens, n)
		}
		if n, ok := listLen(responseIDs, i); ok {
			f.responseTokens = addTo(f.responseTokens, n)
		}
		if v, ok := value(policy, i); ok {
			p := v.(int64)
			if f.minPolicy == nil || p < *f.minPolicy {
				f.minPolicy = &p
			}
			if f.maxPolicy == nil || p > *f.maxPolicy {
				f.maxPolicy = &p
			}
		}
		if v, ok := value(partial, i); ok {
			b := v.(bool)
			if f.partial == nil {
				f.partial = &b
			} else if b {
				*f.partial = true
			}
		}
	}
}

// append writes the fold as a row of trajectorySchema to b.
func (f *trajectoryFold) append(b *array.RecordBuilder, shard string) {
	fields := map[string]any{
		"group_id": f.groupID, "group_version": f.version, "trajectory_id": f.trajectoryID, "steps": f.steps,
		"prompt_tokens": deref(f.promptTokens), "response_tokens": deref(f.responseTokens),
		"min_policy_version": deref(f.minPolicy), "max_policy_version": deref(f.maxPolicy),
		"partial": deref(f.partial), "shard": shard,
	}
	for name, fv := range f.first {
		fields[name] = fv.value
	}
	// pass = coalesce(is_correct, reward > 0), as sql's view.
	if v, ok := f.first["is_correct"]; ok {
		fields["pass"] = v.value
	} else if v, ok := f.first["reward"]; ok {
		fields["pass"] = v.value.(float64) > 0
	}
	for i, fd := range trajectorySchema.Fields() {
		appendValue(b.Field(i), fields[fd.Name])
	}
}

func appendValue(b array.Builder, v any) {
	if v == nil {
		b.AppendNull()
		return
	}
	switch b := b.(type) {
	case *array.StringBuilder:
		b.Append(v.(string))
	case *array.Int64Builder:
		b.Append(v.(int64))
	case *array.Int32Builder:
		b.Append(v.(int32))
	case *array.Float64Builder:
		b.Append(v.(float64))
	case *array.BooleanBuilder:
		b.Append(v.(bool))
	default:
		panic(fmt.Sprintf("iceberg: no append for %T", b))
	}
}

// value is column a's row i as a Go value (false: null or no column).
func value(a arrow.Array, i int) (any, bool) {
	if a == nil || a.IsNull(i) {
		return nil, false
	}
	switch a := a.(type) {
	case *array.String:
		return a.Value(i), true
	case *array.LargeString:
		return a.Value(i), true
	case *array.Int64:
		return a.Value(i), true
	case *array.Int32:
		return a.Value(i), true
	case *array.Float64:
		return a.Value(i), true
	case *array.Boolean:
		return a.Value(i), true
	case *array.Dictionary:
		return value(a.Dictionary(), a.GetValueIndex(i))
	}
	return nil, false
}

func str(a arrow.Array, i int) string {
	v, _ := value(a, i)
	s, _ := v.(string)
	return s
}

func i64(a arrow.Array, i int) int64 {
	switch v, _ := value(a, i); v := v.(type) {
	case int64:
		return v
	case int32:
		return int64(v)
	}
	return 0
}

// listLen is the length of the list at row i (false: null or no column).
func listLen(a arrow.Array, i int) (int64, bool) {
	if a == nil || a.IsNull(i) {
		return 0, false
	}
	switch l := a.(type) {
	case *array.List:
		lo, hi := l.ValueOffsets(i)
		return hi - lo, true
	case *array.LargeList:
		lo, hi := l.ValueOffsets(i)
		return hi - lo, true
	}
	return 0, false
}

// promptLen is the whole prompt's length at row i, counted without
// rebuilding it: a delta's (prompt_prefix_len > 0) is the prefix's
// length and the delta's.
func promptLen(prompt, delta, prefixLen arrow.Array, i int) (int64, bool) {
	if p := i64(prefixLen, i); p > 0 {
		n, ok := listLen(delta, i)
		if !ok {
			return 0, false
		}
		return p + n, true
	}
	return listLen(prompt, i)
}

func addTo(sum *int64, n int64) *int64 {
	if sum == nil {
		return &n
	}
	*sum += n
	return sum
}

// deref is *p, or nil (a null) for a nil p.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

func sortedKeys(m map[int64]arrow.RecordBatch) []int64 {
	keys := make([]int64, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
