package export

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// SFT formats.
const (
	FormatMessages         = "messages"          // {"messages": [...]}
	FormatPromptCompletion = "prompt-completion" // {"prompt": [...], "completion": [...]}
)

// SFTConfig chooses trajectories and the row format.
type SFTConfig struct {
	// MinReward keeps trajectories whose reward is at least *MinReward.
	MinReward *float64
	// BestOfN keeps, per task, the N trajectories of highest reward (ties:
	// the smaller trajectory_id); 0 keeps all.
	BestOfN int
	// Format is FormatMessages (default) or FormatPromptCompletion.
	Format string
	// IncludeFiltered keeps trajectories with rows a filter marked.
	IncludeFiltered bool
	// Dedupe drops rows whose conversation (and tools) repeat an earlier row.
	Dedupe bool
	// WithIDs adds task_id, trajectory_id and reward columns.
	WithIDs bool
	// Progress, if set, is called with bytes of shards read so far and
	// the total to read.
	Progress  func(done, total int64)
	Allocator memory.Allocator
}

// SFTStats counts what the export chose and wrote.
type SFTStats struct {
	Shards          int   `json:"shards"`
	Trajectories    int64 `json:"trajectories"`
	SkippedFiltered int64 `json:"skipped_filtered"`
	SkippedReward   int64 `json:"skipped_min_reward"`
	SkippedBestOfN  int64 `json:"skipped_best_of_n"`
	Chosen          int64 `json:"chosen"`
	NoMessages      int64 `json:"chosen_without_messages"`
	BadMessages     int64 `json:"steps_with_bad_messages"`
	NoCompletion    int64 `json:"conversations_without_completion"`
	Duplicates      int64 `json:"duplicates_dropped"`
	Rows            int64 `json:"rows"`
	RowsWithTools   int64 `json:"rows_with_tools"`
}

// trajectory is what the first pass keeps of a trajectory.
type trajectory struct {
	shard    int
	task     string
	id       string // group_id + NUL + trajectory_id
	tid      string
	reward   float64
	filtered bool
}

// SFT writes one row per conversation of every chosen trajectory: pass
// one reads ids, rewards and filter marks to choose; pass two reads the
// messages of the shards holding chosen trajectories.
func SFT(ctx context.Context, src train.Shards, cfg SFTConfig, out Rows) (SFTStats, error) {
	var st SFTStats
	if cfg.Format == "" {
		cfg.Format = FormatMessages
	}
	if cfg.Format != FormatMessages && cfg.Format != FormatPromptCompletion {
		return st, fmt.Errorf("export: format %q: want %s or %s", cfg.Format, FormatMessages, FormatPromptCompletion)
	}
	entries, mem, prog, err := begin(ctx, src, cfg.Allocator, cfg.Progress)
	if err != nil {
		return st, err
	}
	st.Shards = len(entries)

	// Pass one: choose.
	var trajs []*trajectory
	byID := map[string]*trajectory{}
	for i, e := range entries {
		if err := readTrajectories(ctx, src, e, mem, i, byID, &trajs); err != nil {
			return st, err
		}
		prog.add(e.Bytes)
	}
	st.Trajectories = int64(len(trajs))
	w := &sftWriter{cfg: cfg, out: out, st: &st, chosen: choose(trajs, cfg, &st), dedupe: map[[32]byte]bool{}}

	// Pass two: the conversations of the chosen, shard by shard.
	need := map[int]bool{}
	for _, t := range w.chosen {
		need[t.shard] = true
	}
	prog.total = prog.done
	for i, e := range entries {
		if need[i] {
			prog.total += e.Bytes
		}
	}
	for i, e := range entries {
		if !need[i] {
			continue
		}
		steps, order, err := w.readSteps(ctx, src, e, mem, i)
		if err != nil {
			return st, err
		}
		for _, key := range order {
			if err := w.write(key, steps[key]); err != nil {
				return st, err
			}
		}
		prog.add(e.Bytes)
	}
	return st, nil
}

// trajectoryKey is a trajectory's key: its shard's index in the run, its
// group id and its trajectory id.
func trajectoryKey(shard int, gid, tid string) string {
	return fmt.Sprintf("%d\x00%s\x00%s", shard, gid, tid)
}

// readTrajectories adds the trajectories of shard e (the i-th) to byID
// and, in order of first appearance, to trajs: what pass one chooses by.
func readTrajectories(ctx context.Context, src train.Shards, e schemas.ShardEntry, mem memory.Allocator, i int, byID map[string]*trajectory, trajs *[]*trajectory) error {
	return readColumns(ctx, src, e, mem, []string{"task_id", "group_id", "trajectory_id", "reward", "filter_reason"}, func(rec arrow.RecordBatch) error {
		task := rec.Column(0).(*array.String)
		gid := rec.Column(1).(*array.String)
		tid := rec.Column(2).(*array.String)
		rew := rec.Column(3).(*array.Float64)
		fr := rec.Column(4).(*array.String)
		for r := 0; r < int(rec.NumRows()); r++ {
			key := trajectoryKey(i, gid.Value(r), tid.Value(r))
			t := byID[key]
			if t == nil {
				t = &trajectory{shard: i, task: task.Value(r), id: key, tid: tid.Value(r), reward: rew.Value(r)}
				byID[key] = t
				*trajs = append(*trajs, t)
			}
			if fr.IsValid(r) {
				t.filtered = true
			}
		}
		return nil
	})
}

// sftStep is what pass two reads of a chosen trajectory's step.
type sftStep struct {
	index    int32
	messages []byte
	metadata []byte
}

// sftWriter is pass two: it writes the conversations of the chosen
// trajectories.
type sftWriter struct {
	cfg    SFTConfig
	out    Rows
	st     *SFTStats
	chosen chosenSet
	dedupe map[[32]byte]bool // Dedupe: digests of the rows written
}

// readSteps reads the steps of the chosen trajectories of shard e (the
// i-th), by trajectory key, and the keys in order of first appearance.
func (w *sftWriter) readSteps(ctx context.Context, src train.Shards, e schemas.ShardEntry, mem memory.Allocator, i int) (map[string][]sftStep, []string, error) {
	steps := map[string][]sftStep{}
	var order []string
	err := readColumns(ctx, src, e, mem, []string{"group_id", "trajectory_id", "step_index", "messages", "metadata"}, func(rec arrow.RecordBatch) error {
		gid := rec.Column(0).(*array.String)
		tid := rec.Column(1).(*array.String)
		idx := rec.Column(2).(*array.Int32)
		msgs := rec.Column(3).(*array.String)
		meta := rec.Column(4).(*array.String)
		for r := 0; r < int(rec.NumRows()); r++ {
			key := trajectoryKey(i, gid.Value(r), tid.Value(r))
			if !w.chosen[key].isChosen() {
				continue
			}
			if steps[key] == nil {
				order = append(order, key)
			}
			s := sftStep{index: idx.Value(r)}
			if msgs.IsValid(r) {
				s.messages = []byte(msgs.Value(r))
			}
			if meta.IsValid(r) {
				s.metadata = []byte(meta.Value(r))
			}
			steps[key] = append(steps[key], s)
		}
		return nil
	})
	return steps, order, err
}

// write writes the conversations of trajectory key, whose steps are ss.
func (w *sftWriter) write(key string, ss []sftStep) error {
	sort.SliceStable(ss, func(a, b int) bool { return ss[a].index < ss[b].index })
	var parsed [][]message
	var declared []any
	for _, s := range ss {
		if declared == nil && s.metadata != nil {
			var m struct {
				Tools []any `json:"tools"`
			}
			if json.Unmarshal(s.metadata, &m) == nil && len(m.Tools) > 0 {
				declared = m.Tools
			}
		}
		if s.messages == nil {
			continue
		}
		ms, err := parseMessages(s.messages)
		if err != nil {
			w.st.BadMessages++
			continue
		}
		parsed = append(parsed, ms)
	}
	convs := conversations(parsed)
	if len(convs) == 0 {
		w.st.NoMessages++
		return nil
	}
	t := w.chosen[key]
	for _, conv := range convs {
		row, ok := w.row(conv, declared)
		if !ok {
			continue
		}
		if w.cfg.WithIDs {
			row["task_id"], row["trajectory_id"], row["reward"] = t.task, t.tid, t.reward
		}
		if err := w.out.Write(row); err != nil {
			return err
		}
		w.st.Rows++
		if row["tools"] != nil {
			w.st.RowsWithTools++
		}
	}
	return nil
}

// row is the row of one conversation in the configured format; false
// when it is left out (no completion to split off, or a duplicate).
func (w *sftWriter) row(conv []message, declared []any) (map[string]any, bool) {
	row := map[string]any{}
	if w.cfg.Format == FormatMessages {
		row["messages"] = values(conv)
	} else {
		p, c, ok := splitCompletion(conv)
		if !ok {
			w.st.NoCompletion++
			return nil, false
		}
		row["prompt"], row["completion"] = values(p), values(c)
	}
	if usesTools(conv) {
		row["tools"] = toolSchemas(conv, declared)
	}
	if w.cfg.Dedupe {
		data, _ := json.Marshal(row)
		sum := sha256.Sum256(data)
		if w.dedupe[sum] {
			w.st.Duplicates++
			return nil, false
		}
		w.dedupe[sum] = true
	}
	return row, true
}

// chosenSet maps trajectory keys to the chosen ones.
type chosenSet map[string]*trajectory

func (t *trajectory) isChosen() bool { return t != nil }

// choose applies the filter mark, the reward floor and best-of-n.
func choose(trajs []*trajectory, cfg SFTConfig, st *SFTStats) chosenSet {
	byTask := map[string][]*trajectory{}
	var tasks []string
	for _, t := range trajs {
		switch {
		case t.filtered && !cfg.IncludeFiltered:
			st.SkippedFiltered++
			continue
		case cfg.MinReward != nil && t.reward < *cfg.MinReward:
			st.SkippedReward++
			continue
		}
		if byTask[t.task] == nil {
			tasks = append(tasks, t.task)
		}
		byTask[t.task] = append(byTask[t.task], t)
	}
	out := chosenSet{}
	for _, task := range tasks {
		ts := byTask[task]
		if cfg.BestOfN > 0 && len(ts) > cfg.BestOfN {
			sort.SliceStable(ts, func(a, b int) bool {
				if ts[a].reward != ts[b].reward {
					return ts[a].reward > ts[b].reward
				}
				return ts[a].tid < ts[b].tid
			})
			st.SkippedBestOfN += int64(len(ts) - cfg.BestOfN)
			ts = ts[:cfg.BestOfN]
		}
		for _, t := range ts {
			out[t.id] = t
		}
	}
	st.Chosen = int64(len(out))
	return out
}

// readColumns calls fn with record batches of the named columns of shard
// e (in the order named).
func readColumns(ctx context.Context, src train.Shards, e schemas.ShardEntry, mem memory.Allocator, cols []string, fn func(arrow.RecordBatch) error) error {
	rd, err := src.ReadShard(ctx, e, cols, mem)
	if err != nil {
		return fmt.Errorf("export: shard %s: %w", e.Path, err)
	}
	defer rd.Close()
	for {
		rec, err := rd.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("export: shard %s: %w", e.Path, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// Projected columns come in schema order; put them in the order asked.
		sc := rec.Schema()
		arrs := make([]arrow.Array, len(cols))
		fields := make([]arrow.Field, len(cols))
		for i, c := range cols {
			idx := sc.FieldIndices(c)
			if len(idx) == 0 {
				return fmt.Errorf("export: shard %s has no column %s", e.Path, c)
			}
			arrs[i], fields[i] = rec.Column(idx[0]), sc.Field(idx[0])
		}
		view := array.NewRecordBatch(arrow.NewSchema(fields, nil), arrs, rec.NumRows())
		err = fn(view)
		view.Release()
		if err != nil {
			return err
		}
	}
}

// begin lists the committed shards to export and starts the progress
// report over their bytes; mem defaults to Go's allocator.
func begin(ctx context.Context, src train.Shards, mem memory.Allocator, fn func(done, total int64)) ([]schemas.ShardEntry, memory.Allocator, *progress, error) {
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	entries, err := src.Committed(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	return entries, mem, newProgress(fn, entries), nil
}

// progress reports bytes of shards read.
type progress struct {
	fn          func(done, total int64)
	done, total int64
}

func newProgress(fn func(done, total int64), entries []schemas.ShardEntry) *progress {
	p := &progress{fn: fn}
	for _, e := range entries {
		p.total += e.Bytes
	}
	p.report()
	return p
}

func (p *progress) add(n int64) {
	p.done += n
	p.report()
}

func (p *progress) report() {
	if p.fn != nil {
		p.fn(p.done, p.total)
	}
}
