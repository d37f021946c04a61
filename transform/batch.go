package transform

import (
	"fmt"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Batch is an Arrow record of emitted groups, all of one group version
// (the shard partition). The receiver owns Record and must Release it.
type Batch struct {
	Version int64
	Record  arrow.RecordBatch
	Groups  []string // group keys in the record, for the manifest
}

// Batcher lays groups out as rows of schemas.StepSchema and computes their
// advantages. It reuses one RecordBuilder; it is not safe for concurrent
// use.
type Batcher struct {
	mem  memory.Allocator
	est  advantage.Estimator
	b    *array.RecordBuilder
	offs []int32
	rTr  []int32
}

// NewBatcher returns a Batcher allocating from mem.
func NewBatcher(mem memory.Allocator, est advantage.Estimator) *Batcher {
	return &Batcher{mem: mem, est: est, b: array.NewRecordBuilder(mem, schemas.StepSchema)}
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
		hi := lo + 1
		for hi < len(groups) && groups[hi].Version == groups[lo].Version {
			hi++
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
		prompt    = b.Field(schemas.ColPromptIDs).(*array.ListBuilder)
		resp      = b.Field(schemas.ColResponseIDs).(*array.ListBuilder)
		logp      = b.Field(schemas.ColResponseLogprobs).(*array.ListBuilder)
		tokV      = b.Field(schemas.ColTokenVersions).(*array.ListBuilder)
		teacher   = b.Field(schemas.ColTeacherLogprobs).(*array.ListBuilder)
		messages  = b.Field(schemas.ColMessages).(*array.StringBuilder)
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
		promptV   = prompt.ValueBuilder().(*array.Int32Builder)
		respV     = resp.ValueBuilder().(*array.Int32Builder)
		logpV     = logp.ValueBuilder().(*array.Float32Builder)
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

	// Trajectory-level columns for the estimator.
	bt.offs = append(bt.offs[:0], 0)
	bt.rTr = bt.rTr[:0]
	rewards := array.NewFloat64Builder(bt.mem)
	defer rewards.Release()
	keys := make([]string, 0, len(groups))
	nTraj := int32(0)
	for _, g := range groups {
		keys = append(keys, g.Key)
		n := int32(len(g.Trajectories))
		for _, t := range g.Trajectories {
			rewards.Append(t.Reward)
			for _, s := range t.Steps {
				bt.rTr = append(bt.rTr, nTraj)
				groupID.Append(g.Key)
				taskID.Append(s.TaskID)
				optString(role, s.Role)
				trajID.Append(s.TrajectoryID)
				stepID.Append(s.StepID)
				stepIdx.Append(int32(s.StepIndex))
				numSteps.Append(int32(t.NumSteps))
				policyV.Append(s.PolicyVersion)
				groupV.Append(g.Version)
				prompt.Append(true)
				promptV.AppendValues(s.PromptIDs, nil)
				resp.Append(true)
				respV.AppendValues(s.ResponseIDs, nil)
				logp.Append(true)
				logpV.AppendValues(s.ResponseLogprobs, nil)
				if s.HasTokenVersions {
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
				optJSON(messages, s.Messages)
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
				srcFile.Append(s.Source.File)
				srcLine.Append(s.Source.Line)
			}
			nTraj++
		}
		bt.offs = append(bt.offs, nTraj)
	}

	rw := rewards.NewFloat64Array()
	defer rw.Release()
	adv, err := bt.est.Compute(bt.mem, advantage.Groups{Offsets: bt.offs, Rewards: rw})
	if err != nil {
		// Leave the builder empty for the next batch.
		rec := b.NewRecordBatch()
		rec.Release()
		return Batch{}, fmt.Errorf("compute %s advantages: %w", bt.est.Name(), err)
	}
	defer adv.Release()
	rows := advantage.Broadcast(bt.mem, adv, bt.rTr)
	defer rows.Release()

	// The advantage column is the one field not appended above: assemble
	// the record from the builder's other columns and the broadcast values.
	advB := b.Field(schemas.ColAdvantage).(*array.Float64Builder)
	advB.AppendValues(rows.Float64Values(), nil)
	rec := b.NewRecordBatch()
	return Batch{Version: groups[0].Version, Record: rec, Groups: keys}, nil
}
