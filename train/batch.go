package train

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train/merge"
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
	// BatchGroups, if set, makes every trainer step exactly this many
	// groups (verl's train_batch_size in prompts), waiting for them. A
	// step is delivered short (counted: Counters.ShortBatches) only at the
	// end of the input (a consumer that does not follow) or once its first
	// group has waited BatchWait (0: never). With MaxTokens too, the
	// budget caps each batch: a step over it is split into several
	// batches of whole groups (Batch.StepPart), never truncated.
	BatchGroups int
	BatchWait   time.Duration
	// GroupMultiple, if set, makes the number of groups of every batch
	// a multiple of it (the data-parallel world size, at the group level):
	// BatchGroups must be a multiple of it; without BatchGroups a batch
	// the token budget closes keeps the largest multiple that fits and
	// carries the rest over. Only a short batch (the end of the input, or
	// BatchWait) may break it.
	GroupMultiple int
	// IncludeFiltered keeps rows that a filter marked (filter_reason).
	IncludeFiltered bool
	// RequireSampling, if set, skips (and counts) the groups with a step
	// not sampled as it says (SamplingRequirement).
	RequireSampling SamplingRequirement
	// Batch, if set, recomputes advantage over each batch (REINFORCE++
	// baseline, PRPO, batch std).
	Batch advantage.BatchEstimator
	// Allocator for the batches; default Go allocator.
	Allocator memory.Allocator
	// Layout of the delivered rows: one per step (default), or merged
	// trajectory rows (package merge), which the token budget then counts.
	Layout Layout
	// expand makes LayoutTrajectories rebuild whole prompts and join a
	// batch's groups before merging, as it does with a batch estimator
	// (benchmarks and tests compare the two paths).
	expand bool
}

// Layout is the row layout of delivered batches.
type Layout int

const (
	// LayoutSteps delivers one row per step, in the shard schema.
	LayoutSteps Layout = iota
	// LayoutTrajectories delivers merged trajectory rows (merge.Schema): the
	// steps of a trajectory that extend each other become one row.
	LayoutTrajectories
)

// ParseLayout parses "steps" or "trajectories".
func ParseLayout(s string) (Layout, error) {
	switch s {
	case "steps", "":
		return LayoutSteps, nil
	case "trajectories":
		return LayoutTrajectories, nil
	}
	return 0, fmt.Errorf("layout %q: want steps or trajectories", s)
}

func (l Layout) String() string {
	if l == LayoutTrajectories {
		return "trajectories"
	}
	return "steps"
}

// Batch is whole groups of rows. The receiver owns Record and must
// Release it.
type Batch struct {
	Record    arrow.RecordBatch
	Groups    []string
	Tokens    int64
	Oversized bool // a single group over the token budget
	// Merge, with LayoutTrajectories, tallies the merge (steps in, rows
	// out, action and observation tokens).
	Merge *merge.Stats
	// Finished is when each group's last trajectory finished at the
	// capture gateway, in Groups' order (zero: unknown, as for records
	// not captured by it): freshness is delivery time minus it.
	Finished []time.Time
	// StepPart places the batch in its trainer step.
	StepPart StepPart
}

// StepPart places a batch in its trainer step. With Config.BatchGroups
// and MaxTokens both set, a step of BatchGroups groups over the token
// budget is split into Parts batches of whole groups, delivered one after
// another (Part 0 first): the trainer accumulates them into one optimizer
// step and acknowledges each. Otherwise a step is one batch (Parts 1).
type StepPart struct {
	// Step numbers a Consumer's steps from 1 (0 from a Reader).
	Step   uint64 `json:"step"`
	Part   int    `json:"part"`
	Parts  int    `json:"parts"`
	Groups int    `json:"groups"` // the step's
}

// Counters are the reader's tallies.
type Counters struct {
	Groups int64 `json:"groups"`
	Rows   int64 `json:"rows"`
	// Steps counts the step rows delivered (Rows counts merged rows with
	// LayoutTrajectories).
	Steps           int64 `json:"steps"`
	Batches         int64 `json:"batches"`
	SkippedStale    int64 `json:"groups_skipped_stale"`
	SkippedFiltered int64 `json:"rows_skipped_filtered"`
	Oversized       int64 `json:"oversized_batches"`
	// SkippedEmpty counts groups left with no row after filtering.
	SkippedEmpty int64 `json:"groups_skipped_empty"`
	// ShortBatches counts steps delivered with fewer than BatchGroups
	// groups (the end of the input, or BatchWait).
	ShortBatches int64 `json:"short_batches"`
	// SplitSteps counts steps the token budget split into several
	// batches (Batch.StepPart).
	SplitSteps int64 `json:"split_steps"`
	// SkippedSampling counts groups skipped for a step not sampled as
	// Config.RequireSampling requires.
	SkippedSampling int64 `json:"groups_skipped_sampling"`
}

// former gathers admitted groups into batches within the token budget.
type former struct {
	cfg      *Config
	mem      memory.Allocator
	counters *Counters
	pending  []*group
	tokens   int64
	since    time.Time // when the first pending group was added
}

// CheckBatchGroups reports whether a step of groups groups can be made of
// batches of a multiple of multiple groups (Config.BatchGroups,
// GroupMultiple; 0: unset).
func CheckBatchGroups(groups, multiple int) error {
	if groups > 0 && multiple > 1 && groups%multiple != 0 {
		return fmt.Errorf("batch groups %d are not a multiple of the group multiple %d", groups, multiple)
	}
	return nil
}

// MaxPolicyVersion is the largest policy version a trainer may report
// (schemas.MaxPolicyVersion, 2^53). Versions come from clients and flags;
// CheckPolicyVersion keeps them in [0, 2^53].
const MaxPolicyVersion = schemas.MaxPolicyVersion

// CheckPolicyVersion reports whether v is a policy version a trainer may
// report: 0 ≤ v ≤ MaxPolicyVersion.
func CheckPolicyVersion(v int64) error {
	if v < 0 || v > MaxPolicyVersion {
		return fmt.Errorf("policy version %d out of range [0, 2^53]", v)
	}
	return nil
}

// stale reports whether g is more than MaxStaleness versions behind
// policyVersion.
func (f *former) stale(g *group, policyVersion int64) bool {
	return f.cfg.MaxStaleness >= 0 && behind(policyVersion, g.version) > uint64(f.cfg.MaxStaleness)
}

// behind is how many versions version is behind policy (0 when it is not
// behind), exact for any two int64s: the difference of two int64s always
// fits a uint64, where policy-version in int64 could wrap (a group of
// version -2^63 would look newer than every policy).
func behind(policy, version int64) uint64 {
	if version >= policy {
		return 0
	}
	return uint64(policy) - uint64(version)
}

// passOver counts g's filtered rows and reports whether g is passed over:
// stale at policyVersion, or left without rows by the filters (counted).
func (f *former) passOver(g *group, policyVersion int64) bool {
	f.counters.SkippedFiltered += g.filtered
	switch {
	case f.stale(g, policyVersion):
		f.counters.SkippedStale++
		return true
	case g.rows == 0:
		f.counters.SkippedEmpty++
		return true
	case !f.sampled(g):
		f.counters.SkippedSampling++
		return true
	}
	return false
}

// fits reports whether g can join the pending batch (an empty batch
// takes any group, however large).
func (f *former) fits(g *group) bool {
	if f.cfg.BatchGroups > 0 {
		return len(f.pending) < f.cfg.BatchGroups
	}
	return len(f.pending) == 0 || (f.cfg.MaxTokens > 0 && f.tokens+g.tokens <= f.cfg.MaxTokens)
}

// splits reports whether a step may be split by the token budget.
func (f *former) splits() bool { return f.cfg.BatchGroups > 0 && f.cfg.MaxTokens > 0 }

// cut says how many of the pending groups the batch formed now leaves for
// the next (GroupMultiple without BatchGroups: those over the largest
// multiple), and whether the batch is short (fewer than BatchGroups, or
// than GroupMultiple). Only after ready.
func (f *former) cut() (carry int, short bool) {
	n := len(f.pending)
	if f.cfg.BatchGroups > 0 {
		return 0, n < f.cfg.BatchGroups
	}
	if m := f.cfg.GroupMultiple; m > 1 {
		if n < m {
			return 0, true
		}
		return n % m, false
	}
	return 0, false
}

func (f *former) add(g *group) {
	if len(f.pending) == 0 {
		f.since = time.Now()
	}
	f.pending = append(f.pending, g)
	f.tokens += g.tokens
}

// full reports whether the pending groups make a whole batch of
// BatchGroups (never without BatchGroups: the token budget decides).
func (f *former) full() bool {
	return f.cfg.BatchGroups > 0 && len(f.pending) >= f.cfg.BatchGroups
}

// ready reports whether the pending groups may go as a batch now: a whole
// one, or any without BatchGroups, or a short one when short is allowed
// (the end of the input) or BatchWait has passed.
func (f *former) ready(short bool) bool {
	n := len(f.pending)
	switch {
	case n == 0:
		return false
	case f.full() || short || (f.cfg.BatchWait > 0 && time.Since(f.since) >= f.cfg.BatchWait):
		return true
	case f.cfg.BatchGroups > 0:
		return false
	}
	return n >= max(f.cfg.GroupMultiple, 1)
}

// holds reports whether a pending group is of shard p.
func (f *former) holds(p string) bool {
	return slices.ContainsFunc(f.pending, func(g *group) bool { return g.shard == p })
}

// take forms the pending groups into one step (nil when none): one batch,
// or, when split and the token budget splits steps (splits), as many
// batches of whole groups as the budget makes (a group alone over it is
// a batch of its own). It hands back each batch's groups; the caller
// releases them. A batch estimator sees the whole step. carry groups at
// the end stay pending (GroupMultiple).
func (f *former) take(split bool, carry int) ([]*Batch, [][]*group, error) {
	if len(f.pending) == 0 {
		return nil, nil, nil
	}
	groups := f.pending[:len(f.pending)-carry]
	f.pending = slices.Clone(f.pending[len(f.pending)-carry:])
	f.tokens = 0
	for _, g := range f.pending {
		f.tokens += g.tokens
	}
	if carry > 0 {
		f.since = time.Now()
	}
	parts := [][]*group{groups}
	if split && f.splits() {
		parts = f.split(groups)
	}
	var out []*Batch
	fail := func(err error) ([]*Batch, [][]*group, error) {
		for _, b := range out {
			b.Record.Release()
		}
		return nil, parts, err
	}
	if len(parts) > 1 && f.cfg.Batch != nil {
		recs, err := f.estimatedParts(groups, parts)
		if err != nil {
			return fail(err)
		}
		for i, r := range recs {
			out = append(out, f.done(batchOf(parts[i]), parts[i], r.rec, r.steps))
			out[i].Merge = r.merge
		}
	} else {
		for _, p := range parts {
			b, err := f.one(p)
			if err != nil {
				return fail(err)
			}
			out = append(out, b)
		}
	}
	for i, b := range out {
		b.StepPart = StepPart{Part: i, Parts: len(out), Groups: len(groups)}
	}
	if len(out) > 1 {
		f.counters.SplitSteps++
	}
	return out, parts, nil
}

// split cuts a step's groups into runs within the token budget.
func (f *former) split(groups []*group) [][]*group {
	var parts [][]*group
	var cur []*group
	var tokens int64
	for _, g := range groups {
		if len(cur) > 0 && tokens+g.tokens > f.cfg.MaxTokens {
			parts, cur, tokens = append(parts, cur), nil, 0
		}
		cur = append(cur, g)
		tokens += g.tokens
	}
	return append(parts, cur)
}

// batchOf is a Batch's group fields for groups.
func batchOf(groups []*group) *Batch {
	b := &Batch{}
	for _, g := range groups {
		b.Groups = append(b.Groups, g.key)
		b.Finished = append(b.Finished, g.finished)
		b.Tokens += g.tokens
	}
	return b
}

// partRec is one part of a step: its record, its step rows and its merge.
type partRec struct {
	rec   arrow.RecordBatch
	steps int64
	merge *merge.Stats
}

// estimatedParts runs the batch estimator over the whole step, then cuts
// its rows into the parts' (and merges each, with LayoutTrajectories).
func (f *former) estimatedParts(groups []*group, parts [][]*group) ([]partRec, error) {
	joined := joinedParts(groups)
	rec, err := concat(f.mem, joined)
	for _, p := range joined {
		p.Release()
	}
	if err != nil {
		return nil, err
	}
	est, err := applyBatchEstimator(f.mem, f.cfg.Batch, rec)
	rec.Release()
	if err != nil {
		return nil, err
	}
	defer est.Release()
	var out []partRec
	var lo int64
	for _, p := range parts {
		var n int64
		for _, g := range p {
			for _, r := range g.parts {
				n += r.NumRows()
			}
		}
		pr := partRec{rec: est.NewSlice(lo, lo+n), steps: n}
		lo += n
		if f.cfg.Layout == LayoutTrajectories {
			m, st, err := merge.Rows(f.mem, pr.rec)
			pr.rec.Release()
			if err != nil {
				for _, o := range out {
					o.rec.Release()
				}
				return nil, fmt.Errorf("train: %w", err)
			}
			pr.rec, pr.merge = m, &st
		}
		out = append(out, pr)
	}
	return out, nil
}

// one forms one batch of groups.
func (f *former) one(groups []*group) (*Batch, error) {
	b := batchOf(groups)
	parts := joinedParts(groups)
	defer func() {
		for _, p := range parts {
			p.Release()
		}
	}()
	if f.cfg.mergesDeltas() {
		// Merged straight from the groups' parts, deltas and all.
		rec, st, err := merge.RowsOf(f.mem, parts, !f.cfg.IncludeFiltered)
		if err != nil {
			return nil, fmt.Errorf("train: %w", err)
		}
		b.Merge = &st
		return f.done(b, groups, rec, st.Steps), nil
	}
	rec, err := concat(f.mem, parts)
	if err != nil {
		return nil, err
	}
	if f.cfg.Batch != nil {
		out, err := applyBatchEstimator(f.mem, f.cfg.Batch, rec)
		rec.Release()
		if err != nil {
			return nil, err
		}
		rec = out
	}
	steps := rec.NumRows()
	if f.cfg.Layout == LayoutTrajectories {
		out, st, err := merge.Rows(f.mem, rec)
		rec.Release()
		if err != nil {
			return nil, fmt.Errorf("train: %w", err)
		}
		rec, b.Merge = out, &st
	}
	return f.done(b, groups, rec, steps), nil
}

// done completes b with its record of rows, made of steps step rows, and
// counts it.
func (f *former) done(b *Batch, groups []*group, rec arrow.RecordBatch, steps int64) *Batch {
	b.Record = rec
	b.Oversized = len(groups) == 1 && f.cfg.MaxTokens > 0 && b.Tokens > f.cfg.MaxTokens
	f.counters.Batches++
	f.counters.Groups += int64(len(groups))
	f.counters.Rows += rec.NumRows()
	f.counters.Steps += steps
	if b.Oversized {
		f.counters.Oversized++
	}
	return b
}

// dropStale removes and returns the pending groups that policyVersion
// has made stale since they were admitted.
func (f *former) dropStale(policyVersion int64) []*group {
	var stale []*group
	kept := f.pending[:0]
	for _, g := range f.pending {
		if f.stale(g, policyVersion) {
			stale = append(stale, g)
			f.tokens -= g.tokens
		} else {
			kept = append(kept, g)
		}
	}
	f.pending = kept
	return stale
}

func (f *former) discard() {
	for _, g := range f.pending {
		g.release()
	}
	f.pending, f.tokens = nil, 0
}

// Reader forms batches from a fixed list of shard files, without
// coordination (a Consumer is the coordinated, following form).
type Reader struct {
	cfg      Config
	mem      memory.Allocator
	Counters Counters
}

// NewReader returns a Reader with cfg.
func NewReader(cfg Config) *Reader {
	mem := cfg.Allocator
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	return &Reader{cfg: cfg, mem: mem}
}

// ReadShards reads the shard files at paths, in order, calling emit with
// every batch; it flushes the last batch at the end.
func (r *Reader) ReadShards(ctx context.Context, paths []string, emit func(Batch) error) error {
	f := &former{cfg: &r.cfg, mem: r.mem, counters: &r.Counters}
	defer f.discard()
	flush := func(end bool) error {
		if !f.ready(end) {
			return nil
		}
		carry, short := f.cut()
		if short {
			r.Counters.ShortBatches++
		}
		bs, parts, err := f.take(true, carry)
		for _, p := range parts {
			releaseGroups(p)
		}
		for i, b := range bs {
			if err == nil {
				err = emit(*b)
			} else {
				bs[i].Record.Release()
			}
		}
		return err
	}
	for _, p := range paths {
		rd, err := parquet.OpenFile(ctx, p, r.cfg.shardColumns(), r.mem)
		if err != nil {
			return err
		}
		sr := newShardReader(p, rd, &r.cfg)
		err = func() error {
			defer sr.close()
			for {
				g, err := sr.next()
				if err != nil || g == nil {
					return err
				}
				if f.passOver(g, r.cfg.PolicyVersion) {
					g.release()
					continue
				}
				if !f.fits(g) {
					if err := flush(false); err != nil {
						g.release()
						return err
					}
				}
				f.add(g)
			}
		}()
		if err != nil {
			return err
		}
	}
	for len(f.pending) > 0 {
		if err := flush(true); err != nil {
			return err
		}
	}
	return nil
}

func releaseGroups(groups []*group) {
	for _, g := range groups {
		g.release()
	}
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
