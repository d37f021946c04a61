package export

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// DistillConfig says how per-token advantages are made.
type DistillConfig struct {
	// Distill recomputes token_advantages = advantage + clip(λ·Dₜ) for
	// every exported step when Recompute is set, and for steps whose
	// shard has none (ingest ran without --kl-coef) in any case (with
	// λ = 0: the advantage alone).
	Distill   advantage.Distill
	Recompute bool
	Progress  func(done, total int64)
	Allocator memory.Allocator
}

// DistillStats counts the export.
type DistillStats struct {
	Shards        int   `json:"shards"`
	Steps         int64 `json:"steps"`
	Scored        int64 `json:"steps_exported"`
	Unscored      int64 `json:"steps_without_teacher"`
	RequestGroups int64 `json:"request_groups"`
	RequestSteps  int64 `json:"request_steps"`
	Recomputed    int64 `json:"token_advantages_recomputed"`
}

// DistillSchema is the distillation dataset: one row per student step
// with teacher logprobs.
var DistillSchema = arrow.NewSchema([]arrow.Field{
	schemas.StepSchema.Field(schemas.ColGroupID),
	schemas.StepSchema.Field(schemas.ColTaskID),
	schemas.StepSchema.Field(schemas.ColRole),
	schemas.StepSchema.Field(schemas.ColTrajectoryID),
	schemas.StepSchema.Field(schemas.ColStepID),
	schemas.StepSchema.Field(schemas.ColStepIndex),
	schemas.StepSchema.Field(schemas.ColPolicyVersion),
	schemas.StepSchema.Field(schemas.ColGroupVersion),
	schemas.StepSchema.Field(schemas.ColPromptIDs),
	schemas.StepSchema.Field(schemas.ColResponseIDs),
	schemas.StepSchema.Field(schemas.ColResponseLogprobs),
	schemas.StepSchema.Field(schemas.ColTeacherLogprobs),
	schemas.StepSchema.Field(schemas.ColAdvantage),
	schemas.StepSchema.Field(schemas.ColTokenAdvantages),
}, nil)

// requestColumns are the further columns a scoring request needs to be a
// complete wire record again.
var requestColumns = []string{
	"token_versions", "messages", "step_reward", "done", "finish_reason", "model", "created_at", "metadata",
	"reward", "num_steps", "termination_reason", "signals", "is_correct", "expected_group_size", "trajectory_metadata",
}

// Distill writes the steps that carry teacher logprobs to out (Parquet,
// DistillSchema) and, if requests is not nil, every group holding a step
// without teacher logprobs to requests as wire-format JSON lines: its
// trajectory records and all its steps, those to score without
// teacher_logprobs. A teacher fills teacher_logprobs (one per response
// token) in those step lines and the file goes back through ingest (with
// --kl-coef for token advantages) into a new output.
func Distill(ctx context.Context, src train.Shards, cfg DistillConfig, out io.Writer, requests io.Writer) (DistillStats, error) {
	var st DistillStats
	entries, mem, prog, err := begin(ctx, src, cfg.Allocator, cfg.Progress)
	if err != nil {
		return st, err
	}
	st.Shards = len(entries)
	pw, err := parquet.NewWriter(out, DistillSchema, parquet.Options{Allocator: mem, Compact: true}, nil) // datasets: written once, read many times
	if err != nil {
		return st, err
	}
	cols := make([]string, DistillSchema.NumFields())
	for i := range cols {
		cols[i] = DistillSchema.Field(i).Name
	}
	var rq *requestWriter
	if requests != nil {
		cols = append(cols, requestColumns...)
		rq = &requestWriter{w: bufio.NewWriterSize(requests, 1<<20), st: &st}
	}
	for _, e := range entries {
		err := readColumns(ctx, src, e, mem, cols, func(rec arrow.RecordBatch) error {
			st.Steps += rec.NumRows()
			teacher := rec.Column(11).(*array.List)
			if rq != nil {
				if err := rq.add(rec); err != nil {
					return err
				}
			}
			scored := selectRows(mem, rec, DistillSchema, func(i int) bool { return teacher.IsValid(i) })
			if scored == nil {
				st.Unscored += rec.NumRows()
				return nil
			}
			defer scored.Release()
			st.Scored += scored.NumRows()
			st.Unscored += rec.NumRows() - scored.NumRows()
			ta := scored.Column(13)
			if cfg.Recompute || ta.NullN() > 0 {
				fresh, _, err := cfg.Distill.TokenAdvantages(mem, scored.Column(12).(*array.Float64), scored.Column(10).(*array.List), scored.Column(11).(*array.List))
				if err != nil {
					return err
				}
				defer fresh.Release()
				cols := append([]arrow.Array(nil), scored.Columns()...)
				cols[13] = fresh
				rec := array.NewRecordBatch(DistillSchema, cols, scored.NumRows())
				defer rec.Release()
				st.Recomputed += rec.NumRows()
				return pw.Write(rec)
			}
			return pw.Write(scored)
		})
		if err != nil {
			return st, err
		}
		if rq != nil {
			if err := rq.endGroup(); err != nil {
				return st, err
			}
		}
		prog.add(e.Bytes)
	}
	if rq != nil {
		if err := rq.w.Flush(); err != nil {
			return st, fmt.Errorf("export: requests: %w", err)
		}
	}
	return st, pw.Close()
}

// selectRows returns the rows of rec where keep holds, with the columns
// of schema (the first fields of rec), or nil when none is kept.
func selectRows(mem memory.Allocator, rec arrow.RecordBatch, schema *arrow.Schema, keep func(int) bool) arrow.RecordBatch {
	n := int(rec.NumRows())
	var runs [][2]int64
	for i := 0; i < n; {
		if !keep(i) {
			i++
			continue
		}
		j := i
		for j < n && keep(j) {
			j++
		}
		runs = append(runs, [2]int64{int64(i), int64(j)})
		i = j
	}
	if len(runs) == 0 {
		return nil
	}
	cols := make([]arrow.Array, schema.NumFields())
	var rows int64
	for _, r := range runs {
		rows += r[1] - r[0]
	}
	for c := range cols {
		parts := make([]arrow.Array, len(runs))
		for k, r := range runs {
			parts[k] = array.NewSlice(rec.Column(c), r[0], r[1])
		}
		if len(parts) == 1 {
			cols[c] = parts[0]
			continue
		}
		joined, err := array.Concatenate(parts, mem)
		for _, p := range parts {
			p.Release()
		}
		if err != nil {
			panic(fmt.Sprintf("export: concatenate slices of one array: %v", err)) // same types by construction
		}
		cols[c] = joined
	}
	out := array.NewRecordBatch(schema, cols, rows)
	for _, c := range cols {
		c.Release()
	}
	return out
}

// requestWriter buffers a group's wire records and writes them when the
// group holds a step without teacher logprobs.
type requestWriter struct {
	w  *bufio.Writer
	st *DistillStats

	group    string // group_id and group_version of the buffered group
	buf      []byte
	steps    int64
	unscored bool
	seen     map[string]bool // trajectories written in the group
}

func (r *requestWriter) endGroup() error {
	if r.unscored {
		if _, err := r.w.Write(r.buf); err != nil {
			return fmt.Errorf("export: requests: %w", err)
		}
		r.st.RequestGroups++
		r.st.RequestSteps += r.steps
	}
	r.group, r.buf, r.steps, r.unscored, r.seen = "", r.buf[:0], 0, false, map[string]bool{}
	return nil
}

// add buffers the records of rec's rows (columns: DistillSchema's, then
// requestColumns).
func (r *requestWriter) add(rec arrow.RecordBatch) error {
	str := func(c int) *array.String { return rec.Column(c).(*array.String) }
	gid, task, role, tid, sid := str(0), str(1), str(2), str(3), str(4)
	idx := rec.Column(5).(*array.Int32)
	pv := rec.Column(6).(*array.Int64)
	gv := rec.Column(7).(*array.Int64)
	prompt, resp, lp, teacher := rec.Column(8).(*array.List), rec.Column(9).(*array.List), rec.Column(10).(*array.List), rec.Column(11).(*array.List)
	n := len(DistillSchema.Fields())
	tv := rec.Column(n + 0).(*array.List)
	msgs := str(n + 1)
	stepReward := rec.Column(n + 2).(*array.Float64)
	done := rec.Column(n + 3).(*array.Boolean)
	finish, model := str(n+4), str(n+5)
	created := rec.Column(n + 6).(*array.Timestamp)
	meta := str(n + 7)
	reward := rec.Column(n + 8).(*array.Float64)
	numSteps := rec.Column(n + 9).(*array.Int32)
	term := str(n + 10)
	signals := rec.Column(n + 11).(*array.Map)
	correct := rec.Column(n + 12).(*array.Boolean)
	groupSize := rec.Column(n + 13).(*array.Int32)
	tmeta := str(n + 14)
	for i := 0; i < int(rec.NumRows()); i++ {
		key := gid.Value(i) + "\x00" + strconv.FormatInt(gv.Value(i), 10)
		if key != r.group {
			if err := r.endGroup(); err != nil {
				return err
			}
			r.group = key
		}
		b := r.buf
		if !r.seen[tid.Value(i)] {
			r.seen[tid.Value(i)] = true
			b = append(b, `{"type":"trajectory","trajectory_id":`...)
			b = appendJSONString(b, tid.Value(i))
			b = append(b, `,"task_id":`...)
			b = appendJSONString(b, task.Value(i))
			b = append(b, `,"group_id":`...)
			b = appendJSONString(b, gid.Value(i))
			b = optString(b, `,"role":`, role, i)
			b = append(b, `,"reward":`...)
			b = appendFloat(b, reward.Value(i), 64)
			b = append(b, `,"num_steps":`...)
			b = strconv.AppendInt(b, int64(numSteps.Value(i)), 10)
			b = append(b, `,"group_size":`...)
			b = strconv.AppendInt(b, int64(groupSize.Value(i)), 10)
			b = optString(b, `,"termination_reason":`, term, i)
			if correct.IsValid(i) {
				b = append(b, `,"is_correct":`...)
				b = strconv.AppendBool(b, correct.Value(i))
			}
			if signals.IsValid(i) {
				s, e := signals.ValueOffsets(i)
				keys := signals.Keys().(*array.String)
				items := signals.Items().(*array.Float64)
				b = append(b, `,"signals":{`...)
				for k := s; k < e; k++ {
					if k > s {
						b = append(b, ',')
					}
					b = appendJSONString(b, keys.Value(int(k)))
					b = append(b, ':')
					b = appendFloat(b, items.Value(int(k)), 64)
				}
				b = append(b, '}')
			}
			b = optRaw(b, `,"metadata":`, tmeta, i)
			b = append(b, "}\n"...)
		}
		b = append(b, `{"type":"step","step_id":`...)
		b = appendJSONString(b, sid.Value(i))
		b = append(b, `,"task_id":`...)
		b = appendJSONString(b, task.Value(i))
		b = append(b, `,"group_id":`...)
		b = appendJSONString(b, gid.Value(i))
		b = optString(b, `,"role":`, role, i)
		b = append(b, `,"trajectory_id":`...)
		b = appendJSONString(b, tid.Value(i))
		b = append(b, `,"step_index":`...)
		b = strconv.AppendInt(b, int64(idx.Value(i)), 10)
		b = append(b, `,"policy_version":`...)
		b = strconv.AppendInt(b, pv.Value(i), 10)
		b = append(b, `,"prompt_ids":`...)
		b = appendInt32List(b, prompt, i)
		b = append(b, `,"response_ids":`...)
		b = appendInt32List(b, resp, i)
		b = append(b, `,"response_logprobs":`...)
		b = appendFloat32List(b, lp, i)
		if teacher.IsValid(i) {
			b = append(b, `,"teacher_logprobs":`...)
			b = appendFloat32List(b, teacher, i)
		} else {
			r.unscored = true
		}
		if tv.IsValid(i) {
			b = append(b, `,"token_versions":`...)
			s, e := tv.ValueOffsets(i)
			vals := tv.ListValues().(*array.Int64)
			b = append(b, '[')
			for k := s; k < e; k++ {
				if k > s {
					b = append(b, ',')
				}
				b = strconv.AppendInt(b, vals.Value(int(k)), 10)
			}
			b = append(b, ']')
		}
		b = optRaw(b, `,"messages":`, msgs, i)
		if stepReward.IsValid(i) {
			b = append(b, `,"reward":`...)
			b = appendFloat(b, stepReward.Value(i), 64)
		}
		if done.IsValid(i) {
			b = append(b, `,"done":`...)
			b = strconv.AppendBool(b, done.Value(i))
		}
		b = optString(b, `,"finish_reason":`, finish, i)
		b = optString(b, `,"model":`, model, i)
		if created.IsValid(i) {
			b = append(b, `,"created_at":"`...)
			b = time.UnixMicro(int64(created.Value(i))).UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
			b = append(b, '"')
		}
		b = optRaw(b, `,"metadata":`, meta, i)
		b = append(b, "}\n"...)
		r.buf = b
		r.steps++
	}
	return nil
}

// optString appends key and the JSON string of row i when it is not null.
func optString(b []byte, key string, a *array.String, i int) []byte {
	if a.IsNull(i) {
		return b
	}
	return appendJSONString(append(b, key...), a.Value(i))
}

// optRaw appends key and row i's JSON text as stored when it is not null.
func optRaw(b []byte, key string, a *array.String, i int) []byte {
	if a.IsNull(i) {
		return b
	}
	return append(append(b, key...), a.Value(i)...)
}

func appendJSONString(b []byte, s string) []byte {
	data, _ := json.Marshal(s)
	return append(b, data...)
}

// appendFloat writes the shortest text that reads back to the same value
// at bits precision (shards hold finite values only).
func appendFloat(b []byte, f float64, bits int) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, "null"...)
	}
	return strconv.AppendFloat(b, f, 'g', -1, bits)
}

func appendInt32List(b []byte, l *array.List, i int) []byte {
	s, e := l.ValueOffsets(i)
	vals := l.ListValues().(*array.Int32).Int32Values()
	b = append(b, '[')
	for k := s; k < e; k++ {
		if k > s {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(vals[k]), 10)
	}
	return append(b, ']')
}

func appendFloat32List(b []byte, l *array.List, i int) []byte {
	s, e := l.ValueOffsets(i)
	vals := l.ListValues().(*array.Float32).Float32Values()
	b = append(b, '[')
	for k := s; k < e; k++ {
		if k > s {
			b = append(b, ',')
		}
		b = appendFloat(b, float64(vals[k]), 32)
	}
	return append(b, ']')
}
