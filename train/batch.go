package train

import (
	"context"
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
)

// Config says what a trainer accepts.
type Config struct {
	// PolicyVersion is the trainer's current policy version.
	PolicyVersion int64
	// MaxStaleness skips groups whose group_version is more than this
	// many versions behind PolicyVersion; negative means no bound.
	MaxStaleness int64
	// MaxTokens is the budget of a batch, prompt and response tokens of
	// every row. A group larger than the budget is a batch of its own
	// (Batch.Oversized). Zero means one group per batch.
	MaxTokens int64
	// IncludeFiltered keeps rows that a filter marked (filter_reason).
	IncludeFiltered bool
	// Batch, if set, recomputes advantage over each batch (REINFORCE++
	// baseline, PRPO, batch std).
	Batch advantage.BatchEstimator
	// Allocator for the batches; default Go allocator.
	Allocator memory.Allocator
}

// Batch is whole groups of rows. The receiver owns Record and must
// Release it.
type Batch struct {
	Record    arrow.RecordBatch
	Groups    []string
	Tokens    int64
	Oversized bool // a single group over the token budget
}

// Counters are the reader's tallies.
type Counters struct {
	Groups          int64 `json:"groups"`
	Rows            int64 `json:"rows"`
	Batches         int64 `json:"batches"`
	SkippedStale    int64 `json:"groups_skipped_stale"`
	SkippedFiltered int64 `json:"rows_skipped_filtered"`
	Oversized       int64 `json:"oversized_batches"`
}

// group is the rows of one group: slices of reader batches.
type group struct {
	key     string
	version int64
	parts   []arrow.RecordBatch // retained slices
	tokens  int64
	rows    int64
}

func (g *group) release() {
	for _, p := range g.parts {
		p.Release()
	}
	g.parts = nil
}

// Reader forms batches from shards.
type Reader struct {
	cfg      Config
	mem      memory.Allocator
	Counters Counters

	cur     *group
	pending []*group
	tokens  int64
	emit    func(Batch) error
}

// NewReader returns a Reader with cfg.
func NewReader(cfg Config) *Reader {
	mem := cfg.Allocator
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	return &Reader{cfg: cfg, mem: mem}
}

// ReadShards reads the shards at paths, in order, calling emit with every
// batch; it flushes the last batch at the end.
func (r *Reader) ReadShards(ctx context.Context, paths []string, emit func(Batch) error) error {
	r.emit = emit
	defer r.discard()
	for _, p := range paths {
		if err := parquet.ReadFile(ctx, p, nil, r.mem, r.add); err != nil {
			return err
		}
		// A group never spans shards: the next shard's first rows, even
		// under the same key, are another group.
		if err := r.closeGroup(); err != nil {
			return err
		}
	}
	return r.flush()
}

// add splits a reader batch at group boundaries (rows of a group are
// contiguous in a shard, possibly across reader batches).
func (r *Reader) add(rec arrow.RecordBatch) error {
	if !rec.Schema().HasField("group_version") {
		return fmt.Errorf("train: shard without group_version (schema %s)", rec.Schema())
	}
	col := func(name string) arrow.Array { return rec.Column(rec.Schema().FieldIndices(name)[0]) }
	gid := col("group_id").(*array.String)
	ver := col("group_version").(*array.Int64)
	prompt := col("prompt_ids").(*array.List)
	resp := col("response_ids").(*array.List)
	fr := col("filter_reason").(*array.String)
	n := int(rec.NumRows())
	for i := 0; i < n; {
		key := gid.Value(i)
		end := i + 1
		for end < n && gid.Value(end) == key {
			end++
		}
		if r.cur != nil && r.cur.key != key {
			if err := r.closeGroup(); err != nil {
				return err
			}
		}
		if r.cur == nil {
			r.cur = &group{key: key, version: ver.Value(i)}
		}
		// Keep the runs of rows in [i, end) that pass the filter.
		for j := i; j < end; {
			if !r.cfg.IncludeFiltered && fr.IsValid(j) {
				r.Counters.SkippedFiltered++
				j++
				continue
			}
			k := j
			for k < end && (r.cfg.IncludeFiltered || fr.IsNull(k)) {
				ps, pe := prompt.ValueOffsets(k)
				rs, re := resp.ValueOffsets(k)
				r.cur.tokens += (pe - ps) + (re - rs)
				k++
			}
			r.cur.parts = append(r.cur.parts, rec.NewSlice(int64(j), int64(k)))
			r.cur.rows += int64(k - j)
			j = k
		}
		i = end
	}
	return nil
}

// closeGroup admits the current group (staleness) into the pending batch.
func (r *Reader) closeGroup() error {
	g := r.cur
	r.cur = nil
	if g == nil {
		return nil
	}
	if r.cfg.MaxStaleness >= 0 && r.cfg.PolicyVersion-g.version > r.cfg.MaxStaleness {
		r.Counters.SkippedStale++
		g.release()
		return nil
	}
	if g.rows == 0 {
		g.release()
		return nil
	}
	if len(r.pending) > 0 && (r.cfg.MaxTokens <= 0 || r.tokens+g.tokens > r.cfg.MaxTokens) {
		if err := r.flush(); err != nil {
			g.release()
			return err
		}
	}
	r.pending = append(r.pending, g)
	r.tokens += g.tokens
	return nil
}

// flush emits the pending groups as one batch.
func (r *Reader) flush() error {
	if len(r.pending) == 0 {
		return nil
	}
	groups := r.pending
	r.pending, r.tokens = nil, 0
	defer func() {
		for _, g := range groups {
			g.release()
		}
	}()
	var parts []arrow.RecordBatch
	b := Batch{}
	for _, g := range groups {
		parts = append(parts, g.parts...)
		b.Groups = append(b.Groups, g.key)
		b.Tokens += g.tokens
	}
	rec, err := concat(r.mem, parts)
	if err != nil {
		return err
	}
	if r.cfg.Batch != nil {
		out, err := applyBatchEstimator(r.mem, r.cfg.Batch, rec)
		rec.Release()
		if err != nil {
			return err
		}
		rec = out
	}
	b.Record = rec
	b.Oversized = len(groups) == 1 && r.cfg.MaxTokens > 0 && b.Tokens > r.cfg.MaxTokens
	r.Counters.Batches++
	r.Counters.Groups += int64(len(groups))
	r.Counters.Rows += rec.NumRows()
	if b.Oversized {
		r.Counters.Oversized++
	}
	return r.emit(b)
}

func (r *Reader) discard() {
	if r.cur != nil {
		r.cur.release()
		r.cur = nil
	}
	for _, g := range r.pending {
		g.release()
	}
	r.pending = nil
}

// concat joins record slices of one schema into one record.
func concat(mem memory.Allocator, parts []arrow.RecordBatch) (arrow.RecordBatch, error) {
	if len(parts) == 1 {
		parts[0].Retain()
		return parts[0], nil
	}
	sc := parts[0].Schema()
	cols := make([]arrow.Array, sc.NumFields())
	defer func() {
		for _, c := range cols {
			if c != nil {
				c.Release()
			}
		}
	}()
	var rows int64
	for _, p := range parts {
		rows += p.NumRows()
	}
	for i := range cols {
		arrs := make([]arrow.Array, len(parts))
		for j, p := range parts {
			arrs[j] = p.Column(i)
		}
		c, err := array.Concatenate(arrs, mem)
		if err != nil {
			return nil, fmt.Errorf("train: concatenate %s: %w", sc.Field(i).Name, err)
		}
		cols[i] = c
	}
	return array.NewRecordBatch(sc, cols, rows), nil
}

// applyBatchEstimator recomputes advantage over rec: one reward per
// trajectory (rows of a trajectory are contiguous), groups by group_id,
// roles for PRPO, response tokens for token-weighted whitening; the
// result is broadcast to the rows.
func applyBatchEstimator(mem memory.Allocator, est advantage.BatchEstimator, rec arrow.RecordBatch) (arrow.RecordBatch, error) {
	col := func(name string) arrow.Array { return rec.Column(rec.Schema().FieldIndices(name)[0]) }
	gid := col("group_id").(*array.String)
	tid := col("trajectory_id").(*array.String)
	rew := col("reward").(*array.Float64)
	role := col("role").(*array.String)
	resp := col("response_ids").(*array.List)
	var (
		offsets = []int32{0}
		rewards []float64
		lengths []int64
		roles   []string
		valid   []bool
		rowTraj = make([]int32, rec.NumRows())
	)
	for i := 0; i < int(rec.NumRows()); i++ {
		newGroup := i > 0 && gid.Value(i) != gid.Value(i-1)
		if newGroup {
			offsets = append(offsets, int32(len(rewards)))
		}
		if i == 0 || newGroup || tid.Value(i) != tid.Value(i-1) {
			rewards = append(rewards, rew.Value(i))
			lengths = append(lengths, 0)
			roles = append(roles, role.Value(i))
			valid = append(valid, role.IsValid(i))
		}
		rs, re := resp.ValueOffsets(i)
		lengths[len(lengths)-1] += re - rs
		rowTraj[i] = int32(len(rewards) - 1)
	}
	offsets = append(offsets, int32(len(rewards)))
	rb := array.NewFloat64Builder(mem)
	defer rb.Release()
	rb.AppendValues(rewards, nil)
	lb := array.NewInt64Builder(mem)
	defer lb.Release()
	lb.AppendValues(lengths, nil)
	sb := array.NewStringBuilder(mem)
	defer sb.Release()
	sb.AppendValues(roles, valid)
	rewardsA, lengthsA, rolesA := rb.NewFloat64Array(), lb.NewInt64Array(), sb.NewStringArray()
	defer rewardsA.Release()
	defer lengthsA.Release()
	defer rolesA.Release()
	adv, err := est.ComputeBatch(mem, advantage.BatchGroups{Groups: advantage.Groups{Offsets: offsets, Rewards: rewardsA, Lengths: lengthsA}, Roles: rolesA})
	if err != nil {
		return nil, fmt.Errorf("train: %s: %w", est.Name(), err)
	}
	defer adv.Release()
	rows := advantage.Broadcast(mem, adv, rowTraj)
	defer rows.Release()
	cols := make([]arrow.Array, rec.NumCols())
	copy(cols, rec.Columns())
	cols[rec.Schema().FieldIndices("advantage")[0]] = rows
	return array.NewRecordBatch(rec.Schema(), cols, rec.NumRows()), nil
}
