package transform

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/prefix"
)

// Batch is an Arrow record of emitted groups, all of one group version
// (the shard partition). The receiver owns Record and must Release it.
type Batch struct {
	Version int64
	Record  arrow.RecordBatch
	Groups  []string // group keys in the record, for the manifest
	// Settled holds the positions of every record (steps and trajectory
	// records) written in Record: committing the batch settles them.
	Settled schemas.Settled
}

// BatchConfig says how advantages and marks are computed.
type BatchConfig struct {
	Estimator advantage.Estimator
	// Label is written to the estimator column, e.g. "grpo/rllm".
	Label string
	// Distill, if set, fills token_advantages for steps with teacher
	// logprobs.
	Distill *advantage.Distill
	Filters []Filter
	// FullPrompts turns prefix-delta storage off: every row stores its
	// whole prompt and messages (the layout of schema 3).
	FullPrompts bool
}

// BatchCounters are the Batcher's tallies.
type BatchCounters struct {
	// Filtered counts marked trajectories by reason; a trajectory marked
	// for two reasons counts under both.
	Filtered map[string]int64 `json:"filtered"`
	// NoTeacher counts steps left without token_advantages because they
	// carry no teacher logprobs (only with distillation on).
	NoTeacher int64 `json:"steps_without_teacher"`
}

// Batcher lays groups out as rows of schemas.StepSchema and computes their
// advantages. It reuses one RecordBuilder; it is not safe for concurrent
// use.
type Batcher struct {
	mem      memory.Allocator
	cfg      BatchConfig
	b        *array.RecordBuilder
	offs     []int32
	rTr      []int32
	Counters BatchCounters

	// The big columns, laid out without the builders (columns.go).
	prompt, resp, delta listColumn[int32]
	logp                listColumn[float32]
	messages, msgDelta  textColumn
	pool                *bufferPool
}

// direct reports the columns the Batcher lays out itself.
func direct(col int) bool {
	switch col {
	case schemas.ColPromptIDs, schemas.ColResponseIDs, schemas.ColResponseLogprobs, schemas.ColMessages,
		schemas.ColPromptDeltaIDs, schemas.ColMessagesDelta:
		return true
	}
	return false
}

// NewBatcher returns a Batcher allocating from mem.
func NewBatcher(mem memory.Allocator, cfg BatchConfig) *Batcher {
	if cfg.Label == "" {
		cfg.Label = cfg.Estimator.Name()
	}
	return &Batcher{mem: mem, cfg: cfg, b: array.NewRecordBuilder(mem, schemas.StepSchema),
		Counters: BatchCounters{Filtered: map[string]int64{}}, pool: &bufferPool{keep: poolKeep}}
}

// Release frees the builder.
func (bt *Batcher) Release() { bt.b.Release() }

// Build turns groups into one Batch per group version, in ascending
// version order. On error nothing is returned and nothing leaks.
func (bt *Batcher) Build(groups []*Group) ([]Batch, error) {
	slices.SortStableFunc(groups, func(x, y *Group) int {
		switch {
		case x.Version < y.Version:
			return -1
		case x.Version > y.Version:
			return 1
		}
		return 0
	})
	var out []Batch
	for lo := 0; lo < len(groups); {
		// One version a batch, and no more prompt tokens and message
		// bytes than a column's int32 offsets hold once the prompts sent
		// as deltas are whole (maxColumnLoad).
		hi, load := lo+1, wholeLoad(groups[lo])
		for hi < len(groups) && groups[hi].Version == groups[lo].Version {
			l := wholeLoad(groups[hi])
			if load+l > maxColumnLoad {
				break
			}
			hi, load = hi+1, load+l
		}
		b, err := bt.build(groups[lo:hi])
		if err != nil {
			for _, o := range out {
				o.Record.Release()
			}
			return nil, err
		}
		out = append(out, b)
		lo = hi
	}
	return out, nil
}

// maxColumnLoad bounds wholeLoad over one batch: far below the 2^31
// values a column's int32 offsets hold. (Stage bounds a batch by the
// bytes received, which for prompts and messages sent as deltas says
// little of their whole size.)
var maxColumnLoad = 1 << 30

// wholeLoad is an upper bound of what g's rows put in any one list or
// text column: its prompt tokens and message bytes counted whole.
func wholeLoad(g *Group) int {
	n := 0
	for _, t := range g.Trajectories {
		c := newChain(t.Steps)
		prompt := make([]int, len(t.Steps))
		msgs := make([]int, len(t.Steps))
		for k, s := range t.Steps {
			p := c.parentOf(k) // earlier than k: its lengths are known
			switch {
			case s.PromptIDs != nil || p < 0:
				prompt[k] = len(s.PromptIDs)
			default:
				prompt[k] = prompt[p] + len(c.steps[p].ResponseIDs) + len(s.PromptDeltaIDs)
			}
			switch {
			case s.Messages != nil:
				msgs[k] = len(s.Messages)
			case s.msgTail != nil && p >= 0:
				msgs[k] = msgs[p] + len(s.msgTail)
			case s.MessagesAdded != nil && p >= 0:
				msgs[k] = msgs[p] + len(s.MessagesAdded)
			default:
				msgs[k] = len(s.MessagesAdded)
			}
			n += prompt[k] + msgs[k] + len(s.ResponseIDs)
		}
	}
	return n
}

// record takes the batch's columns: the builders' and the direct ones.
func (bt *Batcher) record() arrow.RecordBatch {
	sc := schemas.StepSchema
	cols := make([]arrow.Array, sc.NumFields())
	for i := range cols {
		switch i {
		case schemas.ColPromptIDs:
			cols[i] = bt.prompt.array(bt.pool, sc.Field(i).Type.(*arrow.ListType))
		case schemas.ColResponseIDs:
			cols[i] = bt.resp.array(bt.pool, sc.Field(i).Type.(*arrow.ListType))
		case schemas.ColResponseLogprobs:
			cols[i] = bt.logp.array(bt.pool, sc.Field(i).Type.(*arrow.ListType))
		case schemas.ColMessages:
			cols[i] = bt.messages.array(bt.pool)
		case schemas.ColPromptDeltaIDs:
			cols[i] = bt.delta.array(bt.pool, sc.Field(i).Type.(*arrow.ListType))
		case schemas.ColMessagesDelta:
			cols[i] = bt.msgDelta.array(bt.pool)
		default:
			cols[i] = bt.b.Field(i).NewArray()
		}
	}
	rec := array.NewRecordBatch(sc, cols, int64(cols[0].Len()))
	for _, c := range cols {
		c.Release()
	}
	return rec
}

// resetDirect empties the direct columns for the next batch.
func (bt *Batcher) resetDirect() {
	bt.prompt.reset()
	bt.resp.reset()
	bt.logp.reset()
	bt.messages.reset()
	bt.delta.reset()
	bt.msgDelta.reset()
}

// chain resolves a complete trajectory's steps (sorted by step index)
// sent as deltas of a parent (parent_step_id: validated by the Assembler
// as an earlier step). Whole prompts and messages are built only where
// needed: a step whose parent is its predecessor is stored as the same
// delta without ever building its whole prompt, so memory stays linear
// in the turns for producers that send deltas.
type chain struct {
	steps  []*Step
	parent []int // index of each step's parent, -1 for none
}

func newChain(steps []*Step) *chain {
	c := &chain{steps: steps}
	var idx map[string]int
	for i, s := range steps {
		if s.ParentStepID == "" {
			continue
		}
		if idx == nil {
			idx = make(map[string]int, len(steps))
			for j, o := range steps {
				idx[o.StepID] = j
			}
			c.parent = make([]int, len(steps))
			for j := range c.parent {
				c.parent[j] = -1
			}
		}
		if j, ok := idx[s.ParentStepID]; ok && j < i {
			c.parent[i] = j
		}
	}
	return c
}

// parentOf returns the index of step k's parent, or -1.
func (c *chain) parentOf(k int) int {
	if c.parent == nil {
		return -1
	}
	return c.parent[k]
}

// prompt returns step k's whole prompt, building it (once) when sent as a
// delta.
func (c *chain) prompt(k int) []int32 {
	s := c.steps[k]
	if s.PromptIDs != nil {
		return s.PromptIDs
	}
	p := c.parentOf(k)
	if p < 0 {
		return []int32{} // not reached: the Assembler emits only valid chains
	}
	pp, pr := c.prompt(p), c.steps[p].ResponseIDs
	w := make([]int32, 0, len(pp)+len(pr)+len(s.PromptDeltaIDs))
	s.PromptIDs = append(append(append(w, pp...), pr...), s.PromptDeltaIDs...)
	return s.PromptIDs
}

// promptLen is the length of step k's whole prompt, without building it.
func (c *chain) promptLen(k int) int {
	s := c.steps[k]
	if s.PromptIDs != nil {
		return len(s.PromptIDs)
	}
	p := c.parentOf(k)
	if p < 0 {
		return 0
	}
	return c.promptLen(p) + len(c.steps[p].ResponseIDs) + len(s.PromptDeltaIDs)
}

// messages returns step k's whole messages (nil: none), building them
// (once) when sent as messages_added.
func (c *chain) messages(k int) []byte {
	s := c.steps[k]
	if s.Messages == nil && s.msgTail != nil {
		if p := c.parentOf(k); p >= 0 {
			pm := c.messages(p)
			s.Messages = append(append(make([]byte, 0, len(pm)-1+len(s.msgTail)), pm[:len(pm)-1]...), s.msgTail...)
		}
		return s.Messages
	}
	if s.Messages != nil || s.MessagesAdded == nil {
		return s.Messages
	}
	if p := c.parentOf(k); p >= 0 {
		s.Messages = joinMessages(c.messages(p), s.MessagesAdded)
	} else {
		s.Messages = s.MessagesAdded
	}
	return s.Messages
}

// hasMessages reports whether step k's whole messages hold at least one
// message, without building them.
func (c *chain) hasMessages(k int) bool {
	s := c.steps[k]
	if s.msgTail != nil {
		m := c.messages(k)
		return len(m) >= 2 && len(bytes.TrimSpace(m[1:len(m)-1])) > 0
	}
	if s.Messages != nil || s.MessagesAdded == nil {
		return len(s.Messages) >= 2 && len(bytes.TrimSpace(s.Messages[1:len(s.Messages)-1])) > 0
	}
	if len(bytes.TrimSpace(s.MessagesAdded[1:len(s.MessagesAdded)-1])) > 0 {
		return true
	}
	p := c.parentOf(k)
	return p >= 0 && c.hasMessages(p)
}

// joinMessages returns the JSON array text of prev's messages followed by
// added's (both arrays' text; prev may be nil: none).
func joinMessages(prev, added []byte) []byte {
	if len(prev) < 2 {
		return added
	}
	inner := bytes.TrimSpace(added[1 : len(added)-1])
	if len(inner) == 0 {
		return prev
	}
	out := append(make([]byte, 0, len(prev)+len(inner)+1), prev[:len(prev)-1]...)
	if len(bytes.TrimSpace(prev[1:len(prev)-1])) > 0 {
		out = append(out, ',')
	}
	out = append(out, inner...)
	return append(out, ']')
}

// addPrompt lays out the prompt and messages of step k of c: as a delta
// of step k-1's when they extend it (checked token by token and byte by
// byte, or given so by the producer: a delta of its predecessor), else
// whole.
func (bt *Batcher) addPrompt(c *chain, k int, prefixLen *array.Int32Builder) {
	s := c.steps[k]
	prev := -1
	if k > 0 && !bt.cfg.FullPrompts && c.steps[k-1].StepIndex == s.StepIndex-1 {
		prev = k - 1
	}
	switch {
	case prev >= 0 && s.PromptIDs == nil && c.parentOf(k) == prev && c.promptLen(prev)+len(c.steps[prev].ResponseIDs) > 0:
		// Sent as a delta of its predecessor: stored as it came. (A
		// delta of an empty predecessor is its whole prompt: stored
		// whole below, since a null prompt needs a prefix to read.)
		bt.prompt.addNull()
		bt.delta.add(s.PromptDeltaIDs)
		prefixLen.Append(int32(c.promptLen(prev) + len(c.steps[prev].ResponseIDs)))
	default:
		w := c.prompt(k)
		p := 0
		// A step found apart on arrival does not extend its predecessor
		// (whose whole prompt need not be rebuilt to see it again).
		if prev >= 0 && !s.promptApart {
			p = prefix.Extends(w, c.prompt(prev), c.steps[prev].ResponseIDs)
		}
		if p > 0 {
			bt.prompt.addNull()
			bt.delta.add(w[p:])
		} else {
			bt.prompt.add(w)
			bt.delta.add(nil)
		}
		prefixLen.Append(int32(p))
	}
	switch {
	case prev >= 0 && s.Messages == nil && s.msgTail != nil && c.parentOf(k) == prev:
		// Kept as the delta of its predecessor on arrival.
		bt.messages.add(nil)
		bt.msgDelta.add(s.msgTail)
	case prev >= 0 && s.Messages == nil && s.MessagesAdded != nil && c.parentOf(k) == prev &&
		(c.steps[prev].Messages != nil || c.steps[prev].MessagesAdded != nil || c.steps[prev].msgTail != nil):
		// The predecessor's messages (minus "]"), then these.
		inner := bytes.TrimSpace(s.MessagesAdded[1 : len(s.MessagesAdded)-1])
		d := make([]byte, 0, len(inner)+2)
		if len(inner) > 0 && c.hasMessages(prev) {
			d = append(d, ',')
		}
		bt.messages.add(nil)
		bt.msgDelta.add(append(append(d, inner...), ']'))
	default:
		m := c.messages(k)
		if prev >= 0 && m != nil && !s.msgsApart {
			if pm := c.messages(prev); prefix.MessagesExtend(m, pm) {
				bt.messages.add(nil)
				bt.msgDelta.add(m[len(pm)-1:])
				return
			}
		}
		bt.messages.add(m)
		bt.msgDelta.add(nil)
	}
}

// reserve sizes the builders for groups once, so that appending never
// grows (copies and clears) a buffer.
func (bt *Batcher) reserve(groups []*Group, b *array.RecordBuilder) {
	var rows, teacher, versions, meta, stepIDs, trajIDs, taskIDs, groupIDs int
	for _, g := range groups {
		for _, t := range g.Trajectories {
			for _, s := range t.Steps {
				rows++
				teacher += len(s.TeacherLogprobs)
				if s.MixedVersions() {
					versions += len(s.TokenVersions)
				}
				meta += len(s.Metadata)
				stepIDs += len(s.StepID)
				trajIDs += len(s.TrajectoryID)
				taskIDs += len(s.TaskID)
				groupIDs += len(g.Key)
			}
		}
	}
	for i := 0; i < b.Schema().NumFields(); i++ {
		if !direct(i) {
			b.Field(i).Reserve(rows)
		}
	}
	b.Field(schemas.ColTeacherLogprobs).(*array.ListBuilder).ValueBuilder().Reserve(teacher)
	b.Field(schemas.ColTokenVersions).(*array.ListBuilder).ValueBuilder().Reserve(versions)
	b.Field(schemas.ColMetadata).(*array.StringBuilder).ReserveData(meta)
	b.Field(schemas.ColStepID).(*array.StringBuilder).ReserveData(stepIDs)
	b.Field(schemas.ColTrajectoryID).(*array.StringBuilder).ReserveData(trajIDs)
	b.Field(schemas.ColTaskID).(*array.StringBuilder).ReserveData(taskIDs)
	b.Field(schemas.ColGroupID).(*array.StringBuilder).ReserveData(groupIDs)
}

func (bt *Batcher) build(groups []*Group) (Batch, error) {
	b := bt.b
	var (
		groupID   = b.Field(schemas.ColGroupID).(*array.StringBuilder)
		taskID    = b.Field(schemas.ColTaskID).(*array.StringBuilder)
		role      = b.Field(schemas.ColRole).(*array.StringBuilder)
		trajID    = b.Field(schemas.ColTrajectoryID).(*array.StringBuilder)
		stepID    = b.Field(schemas.ColStepID).(*array.StringBuilder)
		stepIdx   = b.Field(schemas.ColStepIndex).(*array.Int32Builder)
		numSteps  = b.Field(schemas.ColNumSteps).(*array.Int32Builder)
		policyV   = b.Field(schemas.ColPolicyVersion).(*array.Int64Builder)
		groupV    = b.Field(schemas.ColGroupVersion).(*array.Int64Builder)
		tokV      = b.Field(schemas.ColTokenVersions).(*array.ListBuilder)
		teacher   = b.Field(schemas.ColTeacherLogprobs).(*array.ListBuilder)
		reward    = b.Field(schemas.ColReward).(*array.Float64Builder)
		stepRew   = b.Field(schemas.ColStepReward).(*array.Float64Builder)
		gsize     = b.Field(schemas.ColGroupSize).(*array.Int32Builder)
		expSize   = b.Field(schemas.ColExpectedGroupSize).(*array.Int32Builder)
		partial   = b.Field(schemas.ColPartial).(*array.BooleanBuilder)
		finish    = b.Field(schemas.ColFinishReason).(*array.StringBuilder)
		term      = b.Field(schemas.ColTerminationReason).(*array.StringBuilder)
		done      = b.Field(schemas.ColDone).(*array.BooleanBuilder)
		correct   = b.Field(schemas.ColIsCorrect).(*array.BooleanBuilder)
		model     = b.Field(schemas.ColModel).(*array.StringBuilder)
		created   = b.Field(schemas.ColCreatedAt).(*array.TimestampBuilder)
		meta      = b.Field(schemas.ColMetadata).(*array.StringBuilder)
		trajMeta  = b.Field(schemas.ColTrajectoryMetadata).(*array.StringBuilder)
		signals   = b.Field(schemas.ColSignals).(*array.MapBuilder)
		srcFile   = b.Field(schemas.ColSourceFile).(*array.StringBuilder)
		srcLine   = b.Field(schemas.ColSourceLine).(*array.Int64Builder)
		filterR   = b.Field(schemas.ColFilterReason).(*array.StringBuilder)
		srcTopic  = b.Field(schemas.ColSourceTopic).(*array.StringBuilder)
		srcPart   = b.Field(schemas.ColSourcePartition).(*array.Int32Builder)
		srcOff    = b.Field(schemas.ColSourceOffset).(*array.Int64Builder)
		tokAdv    = b.Field(schemas.ColTokenAdvantages).(*array.ListBuilder)
		estim     = b.Field(schemas.ColEstimator).(*array.StringBuilder)
		prefixLen = b.Field(schemas.ColPromptPrefixLen).(*array.Int32Builder)
		tokVV     = tokV.ValueBuilder().(*array.Int64Builder)
		teacherV  = teacher.ValueBuilder().(*array.Float32Builder)
		sigKeys   = signals.KeyBuilder().(*array.StringBuilder)
		sigVals   = signals.ItemBuilder().(*array.Float64Builder)
		optString = func(sb *array.StringBuilder, v string) {
			if v == "" {
				sb.AppendNull()
			} else {
				sb.Append(v)
			}
		}
		optJSON = func(sb *array.StringBuilder, v []byte) {
			if v == nil {
				sb.AppendNull()
			} else {
				sb.BinaryBuilder.Append(v)
			}
		}
	)

	bt.reserve(groups, b)
	defer bt.resetDirect()

	// Trajectory-level columns for the estimator.
	bt.offs = append(bt.offs[:0], 0)
	bt.rTr = bt.rTr[:0]
	rewards := array.NewFloat64Builder(bt.mem)
	defer rewards.Release()
	lengths := array.NewInt64Builder(bt.mem)
	defer lengths.Release()
	keys := make([]string, 0, len(groups))
	settled := schemas.Settled{}
	nTraj := int32(0)
	for _, g := range groups {
		keys = append(keys, g.Key)
		for _, t := range g.Trajectories {
			settled.Add(t.Source.Stream, t.Source.Position())
			for _, s := range t.Steps {
				settled.Add(s.Source.Stream, s.Source.Position())
			}
		}
		n := int32(len(g.Trajectories))
		zeroVar := true
		for _, t := range g.Trajectories {
			zeroVar = zeroVar && t.Reward == g.Trajectories[0].Reward
		}
		for _, t := range g.Trajectories {
			ch := newChain(t.Steps)
			rewards.Append(t.Reward)
			var respTokens int64
			for _, s := range t.Steps {
				respTokens += int64(len(s.ResponseIDs))
			}
			lengths.Append(respTokens)
			reason := reasons(bt.cfg.Filters, t, zeroVar)
			if reason != "" {
				for _, r := range strings.Split(reason, ",") {
					bt.Counters.Filtered[r]++
				}
			}
			for k, s := range t.Steps {
				bt.rTr = append(bt.rTr, nTraj)
				groupID.Append(g.Key)
				taskID.Append(s.TaskID)
				// A record that names no role inherits its trajectory's.
				r := s.Role
				if r == "" {
					r = t.Role
				}
				optString(role, r)
				trajID.Append(s.TrajectoryID)
				stepID.Append(s.StepID)
				stepIdx.Append(int32(s.StepIndex))
				numSteps.Append(int32(t.NumSteps))
				policyV.Append(s.PolicyVersion)
				groupV.Append(g.Version)
				bt.addPrompt(ch, k, prefixLen)
				bt.resp.add(s.ResponseIDs)
				bt.logp.add(s.ResponseLogprobs)
				if s.HasTokenVersions && s.MixedVersions() {
					tokV.Append(true)
					tokVV.AppendValues(s.TokenVersions, nil)
				} else {
					tokV.AppendNull()
				}
				if s.HasTeacher {
					teacher.Append(true)
					teacherV.AppendValues(s.TeacherLogprobs, nil)
				} else {
					teacher.AppendNull()
				}
				reward.Append(t.Reward)
				if s.HasReward {
					stepRew.Append(s.Reward)
				} else {
					stepRew.AppendNull()
				}
				gsize.Append(n)
				expSize.Append(int32(g.Expected))
				partial.Append(g.Partial())
				optString(finish, s.FinishReason)
				optString(term, t.TerminationReason)
				if s.HasDone {
					done.Append(s.Done)
				} else {
					done.AppendNull()
				}
				if t.HasIsCorrect {
					correct.Append(t.IsCorrect)
				} else {
					correct.AppendNull()
				}
				optString(model, s.Model)
				if s.HasCreatedAt {
					created.Append(arrow.Timestamp(s.CreatedAt))
				} else {
					created.AppendNull()
				}
				optJSON(meta, s.Metadata)
				optJSON(trajMeta, t.Metadata)
				if t.HasSignals {
					signals.Append(true)
					for _, sg := range t.Signals {
						sigKeys.Append(sg.Name)
						sigVals.Append(sg.Value)
					}
				} else {
					signals.AppendNull()
				}
				if s.Source.Topic != "" {
					srcFile.AppendNull()
					srcLine.AppendNull()
					srcTopic.Append(s.Source.Topic)
					srcPart.Append(s.Source.Partition)
					srcOff.Append(s.Source.Offset)
				} else {
					srcFile.Append(s.Source.File)
					srcLine.Append(s.Source.Line)
					srcTopic.AppendNull()
					srcPart.AppendNull()
					srcOff.AppendNull()
				}
				optString(filterR, reason)
				tokAdv.AppendNull() // replaced below when distillation is on
				estim.Append(bt.cfg.Label)
			}
			nTraj++
		}
		bt.offs = append(bt.offs, nTraj)
	}

	rw := rewards.NewFloat64Array()
	defer rw.Release()
	ln := lengths.NewInt64Array()
	defer ln.Release()
	fail := func(err error) (Batch, error) {
		// Leave the builders empty for the next batch (no record: the
		// advantage column has no rows yet).
		for i := 0; i < bt.b.Schema().NumFields(); i++ {
			if !direct(i) {
				bt.b.Field(i).NewArray().Release()
			}
		}
		return Batch{}, err
	}
	adv, err := bt.cfg.Estimator.Compute(bt.mem, advantage.Groups{Offsets: bt.offs, Rewards: rw, Lengths: ln})
	if err != nil {
		return fail(fmt.Errorf("compute %s advantages: %w", bt.cfg.Estimator.Name(), err))
	}
	defer adv.Release()
	rows := advantage.Broadcast(bt.mem, adv, bt.rTr)
	defer rows.Release()

	// The advantage and token_advantages columns are the fields not
	// appended above: they come from the kernels.
	advB := b.Field(schemas.ColAdvantage).(*array.Float64Builder)
	advB.AppendValues(rows.Float64Values(), nil)
	rec := bt.record()
	if bt.cfg.Distill == nil {
		return Batch{Version: groups[0].Version, Record: rec, Groups: keys, Settled: settled}, nil
	}
	defer rec.Release()
	tok, missing, err := bt.cfg.Distill.TokenAdvantages(bt.mem, rows,
		rec.Column(schemas.ColResponseLogprobs).(*array.List), rec.Column(schemas.ColTeacherLogprobs).(*array.List))
	if err != nil {
		return Batch{}, fmt.Errorf("distillation: %w", err)
	}
	defer tok.Release()
	bt.Counters.NoTeacher += int64(missing)
	cols := make([]arrow.Array, rec.NumCols())
	copy(cols, rec.Columns())
	cols[schemas.ColTokenAdvantages] = tok
	out := array.NewRecordBatch(schemas.StepSchema, cols, rec.NumRows())
	return Batch{Version: groups[0].Version, Record: out, Groups: keys, Settled: settled}, nil
}
