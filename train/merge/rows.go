package merge

import (
	"fmt"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// input is every column of the step rows that Rows reads.
type input struct {
	*steps
	task, role, sid, term, est *array.String
	numSteps, groupSize        *array.Int32
	pv, gv                     *array.Int64
	lp, tokAdv, tv             *array.List
	lpV, tokAdvV               []float32
	tvV                        []int64
	reward, adv                *array.Float64
	partial, correct           *array.Boolean
}

func inputColumns(s *steps) (*input, error) {
	rec := s.rec
	in := &input{steps: s}
	sc := rec.Schema()
	var missing []string
	col := func(name string) arrow.Array {
		idx := sc.FieldIndices(name)
		if len(idx) == 0 {
			missing = append(missing, name)
			return nil
		}
		return rec.Column(idx[0])
	}
	in.task, _ = col("task_id").(*array.String)
	in.role, _ = col("role").(*array.String)
	in.sid, _ = col("step_id").(*array.String)
	in.term, _ = col("termination_reason").(*array.String)
	in.est, _ = col("estimator").(*array.String)
	in.idx, _ = col("step_index").(*array.Int32)
	in.numSteps, _ = col("num_steps").(*array.Int32)
	in.groupSize, _ = col("group_size").(*array.Int32)
	in.pv, _ = col("policy_version").(*array.Int64)
	in.gv, _ = col("group_version").(*array.Int64)
	in.lp, _ = col("response_logprobs").(*array.List)
	in.tokAdv, _ = col("token_advantages").(*array.List)
	in.tv, _ = col("token_versions").(*array.List)
	in.reward, _ = col("reward").(*array.Float64)
	in.adv, _ = col("advantage").(*array.Float64)
	in.partial, _ = col("partial").(*array.Boolean)
	in.correct, _ = col("is_correct").(*array.Boolean)
	if len(missing) > 0 {
		return nil, fmt.Errorf("merge: the step rows have no column %v", missing)
	}
	if in.task == nil || in.role == nil || in.sid == nil || in.term == nil || in.est == nil || in.idx == nil ||
		in.numSteps == nil || in.groupSize == nil || in.pv == nil || in.gv == nil || in.lp == nil || in.tokAdv == nil ||
		in.reward == nil || in.adv == nil || in.partial == nil || in.correct == nil {
		return nil, fmt.Errorf("merge: unexpected column types in %s", sc)
	}
	lpV, ok1 := in.lp.ListValues().(*array.Float32)
	taV, ok2 := in.tokAdv.ListValues().(*array.Float32)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("merge: response_logprobs and token_advantages must be lists of float32")
	}
	in.lpV, in.tokAdvV = lpV.Float32Values(), taV.Float32Values()
	if in.tv != nil {
		tvV, ok := in.tv.ListValues().(*array.Int64)
		if !ok {
			return nil, fmt.Errorf("merge: token_versions must be a list of int64")
		}
		in.tvV = tvV.Int64Values()
	}
	return in, nil
}

// versionsOf returns row i's token versions, nil when it has none (its
// tokens are all at its policy_version).
func (in *input) versionsOf(i int) []int64 {
	if in.tv == nil || in.tv.IsNull(i) {
		return nil
	}
	a, b := in.tv.ValueOffsets(i)
	return in.tvV[a:b]
}

// logprobsOf returns row i's response logprobs (one per response token:
// the shard schema guarantees it, and Rows checks it).
func (in *input) logprobsOf(i int) []float32 {
	a, b := in.lp.ValueOffsets(i)
	return in.lpV[a:b]
}

// tokenAdvantagesOf returns row i's per-token advantages, nil when the
// row has none.
func (in *input) tokenAdvantagesOf(i int) []float32 {
	if in.tokAdv.IsNull(i) {
		return nil
	}
	a, b := in.tokAdv.ValueOffsets(i)
	if v := in.tokAdvV[a:b]; v != nil {
		return v
	}
	// An empty list in a record whose lists are all empty: still a step
	// with token advantages.
	return []float32{}
}

// builders are Schema's column builders.
type builders struct {
	rb                                    *array.RecordBuilder
	gid, task, role, tid, first, last     *array.StringBuilder
	term, est                             *array.StringBuilder
	firstIdx, lastIdx, merged, seg, nRows *array.Int32Builder
	numSteps, tokAdvSteps, act, obs, gs   *array.Int32Builder
	isLast, partial, correct              *array.BooleanBuilder
	pv, maxPV, gv                         *array.Int64Builder
	reward, adv, frac                     *array.Float64Builder
	prompt, resp, mask, lp, advs          *array.ListBuilder
	promptV, respV                        *array.Int32Builder
	maskV                                 *array.Int8Builder
	lpV, advsV                            *array.Float32Builder
	vers                                  *array.ListBuilder
	versV                                 *array.Int64Builder
}

func newBuilders(mem memory.Allocator) *builders {
	rb := array.NewRecordBuilder(mem, Schema)
	f := func(i int) array.Builder { return rb.Field(i) }
	b := &builders{rb: rb}
	b.gid, b.task, b.role, b.tid = f(ColGroupID).(*array.StringBuilder), f(ColTaskID).(*array.StringBuilder), f(ColRole).(*array.StringBuilder), f(ColTrajectoryID).(*array.StringBuilder)
	b.first, b.last = f(ColFirstStepID).(*array.StringBuilder), f(ColLastStepID).(*array.StringBuilder)
	b.term, b.est = f(ColTerminationReason).(*array.StringBuilder), f(ColEstimator).(*array.StringBuilder)
	b.firstIdx, b.lastIdx, b.merged = f(ColFirstStepIndex).(*array.Int32Builder), f(ColLastStepIndex).(*array.Int32Builder), f(ColStepsMerged).(*array.Int32Builder)
	b.seg, b.nRows, b.numSteps = f(ColSegment).(*array.Int32Builder), f(ColRowsInTrajectory).(*array.Int32Builder), f(ColNumSteps).(*array.Int32Builder)
	b.tokAdvSteps, b.act, b.obs, b.gs = f(ColTokenAdvantageSteps).(*array.Int32Builder), f(ColActionTokens).(*array.Int32Builder), f(ColObservationTokens).(*array.Int32Builder), f(ColGroupSize).(*array.Int32Builder)
	b.isLast, b.partial, b.correct = f(ColIsLast).(*array.BooleanBuilder), f(ColPartial).(*array.BooleanBuilder), f(ColIsCorrect).(*array.BooleanBuilder)
	b.pv, b.maxPV, b.gv = f(ColPolicyVersion).(*array.Int64Builder), f(ColMaxPolicyVersion).(*array.Int64Builder), f(ColGroupVersion).(*array.Int64Builder)
	b.reward, b.adv, b.frac = f(ColReward).(*array.Float64Builder), f(ColAdvantage).(*array.Float64Builder), f(ColActionFraction).(*array.Float64Builder)
	b.prompt, b.resp, b.mask = f(ColPromptIDs).(*array.ListBuilder), f(ColResponseIDs).(*array.ListBuilder), f(ColResponseMask).(*array.ListBuilder)
	b.lp, b.advs = f(ColRolloutLogProbs).(*array.ListBuilder), f(ColAdvantages).(*array.ListBuilder)
	b.promptV, b.respV = b.prompt.ValueBuilder().(*array.Int32Builder), b.resp.ValueBuilder().(*array.Int32Builder)
	b.maskV = b.mask.ValueBuilder().(*array.Int8Builder)
	b.lpV, b.advsV = b.lp.ValueBuilder().(*array.Float32Builder), b.advs.ValueBuilder().(*array.Float32Builder)
	b.vers = f(ColResponseVersions).(*array.ListBuilder)
	b.versV = b.vers.ValueBuilder().(*array.Int64Builder)
	return b
}

// Rows merges the step rows of rec (whole groups, each trajectory's steps
// contiguous and in step order; prompts whole or prefix deltas of the row
// before) into rows of Schema. The receiver releases the record.
func Rows(mem memory.Allocator, rec arrow.RecordBatch) (arrow.RecordBatch, Stats, error) {
	return RowsOf(mem, []arrow.RecordBatch{rec}, false)
}

// RowsOf is Rows over the step rows of parts read in order as one
// sequence, built into one record without joining the parts first. With
// skipFiltered, rows a filter marked (filter_reason) are left out as if
// they had been dropped before merging (a delta row after them still
// rebuilds from them). The caller still owns parts.
func RowsOf(mem memory.Allocator, parts []arrow.RecordBatch, skipFiltered bool) (arrow.RecordBatch, Stats, error) {
	q, err := newSeq(parts, skipFiltered)
	if err != nil {
		return nil, Stats{}, err
	}
	m := &merger{q: q, ins: make([]*input, len(q.parts))}
	for k, s := range q.parts {
		if m.ins[k], err = inputColumns(s); err != nil {
			return nil, Stats{}, err
		}
	}
	if err := m.checkLengths(); err != nil {
		return nil, Stats{}, err
	}
	// Plan the merged rows first, so every value buffer is allocated once
	// at its final size.
	plan, promptN, responseN := m.plan()
	m.b = newBuilders(mem)
	defer m.b.rb.Release()
	m.b.reserve(len(plan), promptN, responseN)
	for _, sp := range plan {
		m.appendRow(sp)
	}
	return m.b.rb.NewRecordBatch(), m.st, nil
}

// merger builds the merged rows of one sequence of step rows.
type merger struct {
	q   *seq
	ins []*input // the columns of q's parts
	b   *builders
	st  Stats

	// Scratch reused from row to row.
	ones, zeros []int8
	zf, fill    []float32
	vfill       []int64
	pieces      [][]int32
}

// row is the part's columns and the row in it of step row i of q.
func (m *merger) row(i int) (*input, int) {
	a := m.q.at[i]
	return m.ins[a.part], int(a.row)
}

// checkLengths refuses a kept step whose logprobs or token advantages do
// not match its response tokens one for one.
func (m *merger) checkLengths() error {
	for _, i := range m.q.kept {
		in, r := m.row(i)
		if lp := in.logprobsOf(r); len(lp) != len(in.respOf(r)) {
			return fmt.Errorf("merge: step %q has %d logprobs for %d response tokens", in.sid.Value(r), len(lp), len(in.respOf(r)))
		}
		if ta := in.tokenAdvantagesOf(r); ta != nil && len(ta) != len(in.respOf(r)) {
			return fmt.Errorf("merge: step %q has %d token advantages for %d response tokens", in.sid.Value(r), len(ta), len(in.respOf(r)))
		}
	}
	return nil
}

// plan cuts each trajectory's kept rows into merged rows (spans hold
// positions in q.kept) where a step does not continue the one before,
// and counts the prompt and response tokens they will hold.
func (m *merger) plan() (plan []span, promptN, responseN int) {
	q, kept := m.q, m.q.kept
	n := len(kept)
	for start := 0; start < n; {
		// The trajectory's rows: kept[start:end].
		end := start + 1
		for end < n && q.sameTrajectory(kept[end], kept[start]) {
			end++
		}
		first := len(plan)
		plan = append(plan, span{first: start})
		for k := start + 1; k < end; k++ {
			if !q.continues(kept[k], kept[k-1]) {
				plan[len(plan)-1].last = k - 1
				plan = append(plan, span{first: k})
			}
		}
		plan[len(plan)-1].last = end - 1
		for k := first; k < len(plan); k++ {
			plan[k].seg, plan[k].rows = int32(k-first), int32(len(plan)-first)
			f, l := kept[plan[k].first], kept[plan[k].last]
			promptN += q.plen[f]
			responseN += q.plen[l] + q.respLen(l) - q.plen[f]
		}
		m.st.Trajectories++
		m.st.Steps += int64(end - start)
		m.st.MaxRowsPerTrajectory = max(m.st.MaxRowsPerTrajectory, int32(len(plan)-first))
		start = end
	}
	return plan, promptN, responseN
}

// reserve sizes the builders for rows merged rows holding promptN prompt
// and responseN response tokens.
func (b *builders) reserve(rows, promptN, responseN int) {
	b.rb.Reserve(rows)
	for _, lb := range []*array.ListBuilder{b.prompt, b.resp, b.mask, b.lp, b.advs, b.vers} {
		lb.Reserve(rows)
	}
	b.versV.Reserve(responseN)
	b.promptV.Reserve(promptN)
	b.respV.Reserve(responseN)
	b.maskV.Reserve(responseN)
	b.lpV.Reserve(responseN)
	b.advsV.Reserve(responseN)
}

// tokens appends the response side of merged row sp: each step's
// observation (the prompt tokens after the step before: mask 0, logprob
// and advantage 0) then its response; it returns the action and
// observation tokens, the steps with token advantages and the policy
// versions' range.
func (m *merger) tokens(sp span) (action, obs, tokAdvSteps int, minPV, maxPV int64) {
	q, b, kept := m.q, m.b, m.q.kept
	fin, fr := m.row(kept[sp.first])
	minPV, maxPV = fin.pv.Value(fr), fin.pv.Value(fr)
	for k := sp.first; k <= sp.last; k++ {
		i := kept[k]
		in, r := m.row(i)
		if k > sp.first {
			prev := kept[k-1]
			m.pieces = q.prompt(i, q.plen[prev]+q.respLen(prev), m.pieces[:0])
			for _, delta := range m.pieces {
				m.zeros = grow(m.zeros, len(delta), 0)
				m.zf = fillF(m.zf, len(delta), 0)
				b.respV.AppendValues(delta, nil)
				b.maskV.AppendValues(m.zeros[:len(delta)], nil)
				b.lpV.AppendValues(m.zf, nil)
				b.advsV.AppendValues(m.zf, nil)
				m.vfill = fillI(m.vfill, len(delta), -1)
				b.versV.AppendValues(m.vfill, nil)
				obs += len(delta)
			}
			minPV, maxPV = min(minPV, in.pv.Value(r)), max(maxPV, in.pv.Value(r))
		}
		resp := in.respOf(r)
		if tv := in.versionsOf(r); len(tv) == len(resp) && len(tv) > 0 {
			b.versV.AppendValues(tv, nil)
			for _, v := range tv {
				minPV, maxPV = min(minPV, v), max(maxPV, v)
			}
		} else {
			m.vfill = fillI(m.vfill, len(resp), in.pv.Value(r))
			b.versV.AppendValues(m.vfill, nil)
		}
		m.ones = grow(m.ones, len(resp), 1)
		b.respV.AppendValues(resp, nil)
		b.maskV.AppendValues(m.ones[:len(resp)], nil)
		b.lpV.AppendValues(in.logprobsOf(r), nil)
		if ta := in.tokenAdvantagesOf(r); ta != nil {
			b.advsV.AppendValues(ta, nil)
			tokAdvSteps++
		} else {
			m.fill = fillF(m.fill, len(resp), float32(in.adv.Value(r)))
			b.advsV.AppendValues(m.fill, nil)
		}
		action += len(resp)
	}
	return action, obs, tokAdvSteps, minPV, maxPV
}

// appendRow appends merged row sp.
func (m *merger) appendRow(sp span) {
	b, kept := m.b, m.q.kept
	first, last := kept[sp.first], kept[sp.last]
	fin, fr := m.row(first)
	lin, lr := m.row(last)
	b.prompt.Append(true)
	m.pieces = m.q.prompt(first, 0, m.pieces[:0])
	for _, p := range m.pieces {
		b.promptV.AppendValues(p, nil)
	}
	b.resp.Append(true)
	b.mask.Append(true)
	b.lp.Append(true)
	b.vers.Append(true)
	b.advs.Append(true)
	action, obs, tokAdvSteps, minPV, maxPV := m.tokens(sp)
	b.gid.Append(fin.gid.Value(fr))
	b.task.Append(fin.task.Value(fr))
	appendNullableString(b.role, fin.role, fr)
	b.tid.Append(fin.tid.Value(fr))
	b.first.Append(fin.sid.Value(fr))
	b.last.Append(lin.sid.Value(lr))
	b.firstIdx.Append(fin.idx.Value(fr))
	b.lastIdx.Append(lin.idx.Value(lr))
	b.merged.Append(int32(sp.last - sp.first + 1))
	b.seg.Append(sp.seg)
	b.nRows.Append(sp.rows)
	b.numSteps.Append(fin.numSteps.Value(fr))
	b.isLast.Append(lin.idx.Value(lr) == lin.numSteps.Value(lr)-1)
	b.pv.Append(minPV)
	b.maxPV.Append(maxPV)
	b.gv.Append(fin.gv.Value(fr))
	b.reward.Append(fin.reward.Value(fr))
	b.adv.Append(fin.adv.Value(fr))
	b.tokAdvSteps.Append(int32(tokAdvSteps))
	b.act.Append(int32(action))
	b.obs.Append(int32(obs))
	frac := 1.0
	if action+obs > 0 {
		frac = float64(action) / float64(action+obs)
	}
	b.frac.Append(frac)
	b.gs.Append(fin.groupSize.Value(fr))
	b.partial.Append(fin.partial.Value(fr))
	if fin.correct.IsNull(fr) {
		b.correct.AppendNull()
	} else {
		b.correct.Append(fin.correct.Value(fr))
	}
	appendNullableString(b.term, fin.term, fr)
	b.est.Append(fin.est.Value(fr))
	m.st.Rows++
	m.st.ActionTokens += int64(action)
	m.st.ObservationTokens += int64(obs)
	m.st.PromptTokens += int64(m.q.plen[first])
}

// span is one merged row: its first and last step rows (positions in the
// kept rows), its place among its trajectory's rows and how many rows the
// trajectory has.
type span struct {
	first, last int
	seg, rows   int32
}

func appendNullableString(b *array.StringBuilder, a *array.String, i int) {
	if a.IsNull(i) {
		b.AppendNull()
	} else {
		b.Append(a.Value(i))
	}
}

// grow returns s with at least n items, all v.
func grow(s []int8, n int, v int8) []int8 {
	for len(s) < n {
		s = append(s, v)
	}
	return s
}

// fillF returns n items, all v, reusing s's memory.
func fillI(s []int64, n int, v int64) []int64 {
	s = slices.Grow(s[:0], n)[:n]
	for i := range s {
		s[i] = v
	}
	return s
}

func fillF(s []float32, n int, v float32) []float32 {
	s = slices.Grow(s[:0], n)[:n]
	for i := range s {
		s[i] = v
	}
	return s
}
