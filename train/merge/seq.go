package merge

import (
	"fmt"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
)

// steps is the columns of a record of step rows that merging reads.
type steps struct {
	rec            arrow.RecordBatch
	gid, tid       *array.String
	prompt, resp   *array.List
	promptV, respV []int32
	// The prefix-delta columns (schemas.ColPromptPrefixLen), nil when the
	// record has none; step_index checks a delta row's predecessor.
	idx    *array.Int32
	prefix *array.Int32
	delta  *array.List
	deltaV []int32
	// filter_reason, read only when filtered rows are skipped.
	filter *array.String
}

func stepColumns(rec arrow.RecordBatch, skipFiltered bool) (*steps, error) {
	s := &steps{rec: rec}
	sc := rec.Schema()
	var err error
	col := func(name string) arrow.Array {
		idx := sc.FieldIndices(name)
		if len(idx) == 0 {
			if err == nil {
				err = fmt.Errorf("merge: the step rows have no column %s", name)
			}
			return nil
		}
		return rec.Column(idx[0])
	}
	s.gid, _ = col("group_id").(*array.String)
	s.tid, _ = col("trajectory_id").(*array.String)
	s.prompt, _ = col("prompt_ids").(*array.List)
	s.resp, _ = col("response_ids").(*array.List)
	if skipFiltered {
		s.filter, _ = col("filter_reason").(*array.String)
	}
	if err != nil {
		return nil, err
	}
	if s.gid == nil || s.tid == nil || s.prompt == nil || s.resp == nil || (skipFiltered && s.filter == nil) {
		return nil, fmt.Errorf("merge: unexpected column types in %s", sc)
	}
	pv, ok1 := s.prompt.ListValues().(*array.Int32)
	rv, ok2 := s.resp.ListValues().(*array.Int32)
	if !ok1 || !ok2 {
		return nil, fmt.Errorf("merge: prompt_ids and response_ids must be lists of int32")
	}
	s.promptV, s.respV = pv.Int32Values(), rv.Int32Values()
	opt := func(name string) arrow.Array {
		if idx := sc.FieldIndices(name); len(idx) > 0 {
			return rec.Column(idx[0])
		}
		return nil
	}
	s.idx, _ = opt("step_index").(*array.Int32)
	s.prefix, _ = opt("prompt_prefix_len").(*array.Int32)
	s.delta, _ = opt("prompt_delta_ids").(*array.List)
	if s.prompt.NullN() == 0 {
		return s, nil // every prompt whole: the delta columns are not needed
	}
	if s.idx == nil || s.prefix == nil || s.delta == nil {
		return nil, fmt.Errorf("merge: rows without whole prompt_ids need step_index, prompt_prefix_len and prompt_delta_ids (schema %s)", sc)
	}
	dv, ok := s.delta.ListValues().(*array.Int32)
	if !ok {
		return nil, fmt.Errorf("merge: prompt_delta_ids must be a list of int32")
	}
	s.deltaV = dv.Int32Values()
	return s, nil
}

func (s *steps) promptOf(i int) []int32 {
	a, b := s.prompt.ValueOffsets(i)
	return s.promptV[a:b]
}

func (s *steps) respOf(i int) []int32 {
	a, b := s.resp.ValueOffsets(i)
	return s.respV[a:b]
}

func (s *steps) deltaOf(i int) []int32 {
	a, b := s.delta.ValueOffsets(i)
	return s.deltaV[a:b]
}

// ref is a row of a seq: its part and its row in the part.
type ref struct{ part, row int32 }

// seq is step rows read in order from several records (a batch's groups,
// split over reader batches) as one sequence, without joining them.
//
// A row's prompt is whole (prompt_ids), or a prefix delta (prompt_ids
// null): the row before it, its predecessor step, then that step's
// response, then prompt_delta_ids (schemas/prefix writes them so).
// Merging works on the deltas: a delta row extends the sequence of every
// earlier row of its chain of deltas by construction, and its observation
// is its delta; only rows that start a merged row get their prompt
// rebuilt, and only a whole prompt after a delta chain is compared token
// by token (with the chain's pieces), as whole prompts always are.
//
// kept lists the rows that are merged: all of them, or those no filter
// marked. Skipped rows still carry the deltas of the rows after them.
type seq struct {
	parts []*steps
	at    []ref
	plen  []int // each row's whole prompt length
	kept  []int
}

func newSeq(recs []arrow.RecordBatch, skipFiltered bool) (*seq, error) {
	q := &seq{parts: make([]*steps, len(recs))}
	for k, rec := range recs {
		s, err := stepColumns(rec, skipFiltered)
		if err != nil {
			return nil, err
		}
		q.parts[k] = s
	}
	return q, q.index(skipFiltered)
}

// index lays out the rows, computes their prompt lengths and checks that
// every delta row follows its predecessor.
func (q *seq) index(skipFiltered bool) error {
	var n int
	for _, s := range q.parts {
		n += int(s.rec.NumRows())
	}
	q.at = make([]ref, 0, n)
	q.plen = make([]int, 0, n)
	q.kept = make([]int, 0, n)
	for k, s := range q.parts {
		for r := range int(s.rec.NumRows()) {
			i := len(q.at)
			q.at = append(q.at, ref{int32(k), int32(r)})
			if !s.prompt.IsNull(r) {
				q.plen = append(q.plen, len(s.promptOf(r)))
			} else {
				p := int(s.prefix.Value(r))
				if i == 0 || p == 0 || !q.follows(i) || p != q.plen[i-1]+q.respLen(i-1) {
					return fmt.Errorf("merge: row %d (trajectory %q) has no whole prompt_ids and its predecessor is not the row before it: a prefix-delta row read without its predecessor", i, s.tid.Value(r))
				}
				q.plen = append(q.plen, p+len(s.deltaOf(r)))
			}
			if !skipFiltered || s.filter.IsNull(r) {
				q.kept = append(q.kept, i)
			}
		}
	}
	return nil
}

func (q *seq) row(i int) (*steps, int) {
	a := q.at[i]
	return q.parts[a.part], int(a.row)
}

// follows reports whether row i is the step after row i-1 of the same
// group and trajectory.
func (q *seq) follows(i int) bool {
	s, r := q.row(i)
	p, pr := q.row(i - 1)
	return s.gid.Value(r) == p.gid.Value(pr) && s.tid.Value(r) == p.tid.Value(pr) &&
		p.idx != nil && s.idx.Value(r) == p.idx.Value(pr)+1
}

func (q *seq) whole(i int) bool {
	s, r := q.row(i)
	return !s.prompt.IsNull(r)
}

func (q *seq) resp(i int) []int32 {
	s, r := q.row(i)
	return s.respOf(r)
}

func (q *seq) respLen(i int) int {
	s, r := q.row(i)
	a, b := s.resp.ValueOffsets(r)
	return int(b - a)
}

// sameTrajectory reports whether rows i and j have one group and
// trajectory.
func (q *seq) sameTrajectory(i, j int) bool {
	s, r := q.row(i)
	p, pr := q.row(j)
	return s.gid.Value(r) == p.gid.Value(pr) && s.tid.Value(r) == p.tid.Value(pr)
}

// continues reports whether row b continues the merged row whose last
// step is row a (a < b): same group and trajectory, and b's prompt begins
// with a's prompt and response.
func (q *seq) continues(b, a int) bool {
	if !q.sameTrajectory(b, a) {
		return false
	}
	c := b
	for !q.whole(c) {
		// c's prompt begins with c-1's prompt and response.
		if c--; c == a {
			return true
		}
	}
	n := q.plen[a] + q.respLen(a)
	if q.plen[b] < n {
		return false
	}
	if c == b && q.whole(a) {
		s, r := q.row(b)
		p, pr := q.row(a)
		return extends(s.promptOf(r), p.promptOf(pr), p.respOf(pr))
	}
	return equalPrefix(q.prompt(b, 0, nil), append(q.prompt(a, 0, nil), q.resp(a)), n)
}

// extends reports whether prompt begins with prev's prompt followed by
// prev's response: the running sequence of a row whose last step is prev.
func extends(prompt, prevPrompt, prevResp []int32) bool {
	n := len(prevPrompt) + len(prevResp)
	return len(prompt) >= n && slices.Equal(prompt[:len(prevPrompt)], prevPrompt) && slices.Equal(prompt[len(prevPrompt):n], prevResp)
}

// prompt appends to dst the pieces of row i's whole prompt from token
// from on, in order: the row's own prompt_ids when whole, else the end of
// its predecessor's prompt and response, then its delta.
func (q *seq) prompt(i, from int, dst [][]int32) [][]int32 {
	if s, r := q.row(i); !s.prompt.IsNull(r) {
		return append(dst, s.promptOf(r)[from:])
	}
	need, start := q.plen[i]-from, len(dst)
	take := func(p []int32) {
		k := min(need, len(p))
		if k > 0 {
			dst = append(dst, p[len(p)-k:])
		}
		need -= k
	}
	// Backwards from i, then put in order.
	for c := i; need > 0; c-- {
		s, r := q.row(c)
		if !s.prompt.IsNull(r) {
			take(s.promptOf(r))
			break
		}
		take(s.deltaOf(r))
		if need > 0 {
			take(q.resp(c - 1))
		}
	}
	slices.Reverse(dst[start:])
	return dst
}

// equalPrefix reports whether the first n tokens of x and y (pieces of
// sequences of at least n tokens) are equal.
func equalPrefix(x, y [][]int32, n int) bool {
	var a, b []int32
	for n > 0 {
		for len(a) == 0 {
			a, x = x[0], x[1:]
		}
		for len(b) == 0 {
			b, y = y[0], y[1:]
		}
		k := min(len(a), len(b), n)
		if !slices.Equal(a[:k], b[:k]) {
			return false
		}
		a, b, n = a[k:], b[k:], n-k
	}
	return true
}
