// Package prefix is the prefix-delta storage of multi-turn prompts: a
// step whose prompt begins with its predecessor's prompt and response
// stores only the tokens after them, and a step whose chat messages begin
// with its predecessor's stores only the messages it adds (schemas.
// ColPromptPrefixLen documents the columns).
//
// Extends and MessagesExtend decide, by comparing every token and byte
// (a hash is not enough: a delta is never wrong), what the writer
// (transform.Batcher) stores; Expander gives readers the whole prompts
// and messages back, row by row in shard order, holding only the row
// before.
package prefix

import (
	"bytes"
	"fmt"
	"slices"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Extends returns how many leading tokens of prompt are its
// predecessor's prompt followed by its response: len(prev)+len(resp)
// when prompt begins with them (and they are not empty), else 0.
func Extends[T ~int32 | ~int64](prompt, prev, resp []T) int {
	n := len(prev) + len(resp)
	if n == 0 || len(prompt) < n || !sameInts(prompt[:len(prev)], prev) || !sameInts(prompt[len(prev):n], resp) {
		return 0
	}
	return n
}

// Diverges returns where prompt stops following its predecessor's prompt
// followed by its response: the length of their common prefix (len(prompt)
// when prompt is all of it, shorter). A prompt that Extends them diverges
// nowhere: len(prev)+len(resp).
func Diverges[T ~int32 | ~int64](prompt, prev, resp []T) int {
	i := 0
	for ; i < len(prompt) && i < len(prev); i++ {
		if prompt[i] != prev[i] {
			return i
		}
	}
	if i < len(prev) {
		return i
	}
	for j := 0; i < len(prompt) && j < len(resp); i, j = i+1, j+1 {
		if prompt[i] != resp[j] {
			return i
		}
	}
	return i
}

// sameInts reports whether a and b hold the same integers, comparing their
// memory (bytes.Equal's vector loop; slices.Equal goes element by element,
// several times slower on the long prompts of multi-turn steps).
func sameInts[T ~int32 | ~int64](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	size := len(a) * int(unsafe.Sizeof(a[0]))
	return bytes.Equal(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(a))), size),
		unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), size))
}

// MessagesExtend reports whether msgs (a JSON array's text) begins with
// prev's text up to its closing bracket: then msgs is stored as
// msgs[len(prev)-1:], and rebuilt as prev[:len(prev)-1] ++ that.
func MessagesExtend(msgs, prev []byte) bool {
	return len(prev) >= 2 && prev[len(prev)-1] == ']' && len(msgs) >= len(prev) &&
		bytes.Equal(msgs[:len(prev)-1], prev[:len(prev)-1])
}

// Expander rebuilds whole prompts and messages from the rows of one
// shard, read in order; it is not safe for concurrent use. Rows of a
// trajectory are contiguous and in step order in a shard, so the row
// before a delta row is its predecessor.
type Expander struct {
	mem memory.Allocator
	// The previous row: its trajectory, step, whole prompt, response and
	// whole messages.
	traj   string
	step   int32
	prompt []int32
	resp   []int32
	msgs   []byte
	valid  bool
}

// NewExpander returns an Expander for one shard, allocating from mem.
func NewExpander(mem memory.Allocator) *Expander { return &Expander{mem: mem} }

// columns finds what Expand needs in rec by name; ok is false when rec
// has no delta columns (a shard of an older schema, or a projection that
// asked for neither prompts nor messages).
type columns struct {
	traj, step, prompt, resp, prefix, delta, msgs, msgDelta int
}

func find(sc *arrow.Schema) (c columns, ok bool) {
	idx := func(name string) int {
		if is := sc.FieldIndices(name); len(is) == 1 {
			return is[0]
		}
		return -1
	}
	c = columns{
		traj: idx("trajectory_id"), step: idx("step_index"),
		prompt: idx("prompt_ids"), resp: idx("response_ids"),
		prefix: idx("prompt_prefix_len"), delta: idx("prompt_delta_ids"),
		msgs: idx("messages"), msgDelta: idx("messages_delta"),
	}
	// Something to rebuild: a delta column, and a whole column asked for.
	return c, (c.prefix >= 0 || c.msgDelta >= 0) && (c.prompt >= 0 || c.msgs >= 0)
}

// Columns returns the columns Expand needs besides those asked for, so
// that a reader projecting prompt_ids or messages reads them too.
func Columns(asked []string) []string {
	if len(asked) == 0 {
		return nil // all
	}
	need := map[string][]string{
		"prompt_ids": {"trajectory_id", "step_index", "response_ids", "prompt_prefix_len", "prompt_delta_ids"},
		"messages":   {"trajectory_id", "step_index", "response_ids", "prompt_ids", "prompt_prefix_len", "prompt_delta_ids", "messages_delta"},
	}
	out := slices.Clone(asked)
	for _, a := range asked {
		for _, n := range need[a] {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	return out
}

// Expand returns rec with prompt_ids and messages whole on every row
// (the delta columns left as they are). The caller releases both. A delta
// row whose predecessor is not the row before it is an error: the shard
// is not one this package wrote.
func (x *Expander) Expand(rec arrow.RecordBatch) (arrow.RecordBatch, error) {
	c, ok := find(rec.Schema())
	if !ok {
		rec.Retain()
		return rec, nil
	}
	if c.traj < 0 || c.step < 0 || c.resp < 0 || c.prompt < 0 || (c.prefix >= 0) != (c.delta >= 0) {
		return nil, fmt.Errorf("prefix: rebuilding prompts needs trajectory_id, step_index, prompt_ids, response_ids, prompt_prefix_len and prompt_delta_ids")
	}
	traj := rec.Column(c.traj).(*array.String)
	step := rec.Column(c.step).(*array.Int32)
	prompt := rec.Column(c.prompt).(*array.List)
	promptV := prompt.ListValues().(*array.Int32).Int32Values()
	resp := rec.Column(c.resp).(*array.List)
	respV := resp.ListValues().(*array.Int32).Int32Values()
	var (
		prefix *array.Int32
		delta  *array.List
		deltaV []int32
		msgs   *array.String
		msgD   *array.String
	)
	if c.prefix >= 0 {
		prefix = rec.Column(c.prefix).(*array.Int32)
		delta = rec.Column(c.delta).(*array.List)
		deltaV = delta.ListValues().(*array.Int32).Int32Values()
	}
	if c.msgs >= 0 && c.msgDelta >= 0 {
		msgs = rec.Column(c.msgs).(*array.String)
		msgD = rec.Column(c.msgDelta).(*array.String)
	}
	n := int(rec.NumRows())
	if prompt.NullN() == 0 && !hasDeltas(prefix, msgD) {
		// Every row is whole (short trajectories, resets, old layouts):
		// the record as it is, and its last row for the next record.
		x.keepLast(traj, step, prompt, promptV, resp, respV, msgs)
		rec.Retain()
		return rec, nil
	}
	pb := array.NewBuilder(x.mem, rec.Schema().Field(c.prompt).Type).(*array.ListBuilder)
	defer pb.Release()
	pv := pb.ValueBuilder().(*array.Int32Builder)
	var mb *array.StringBuilder
	if msgs != nil {
		mb = array.NewStringBuilder(x.mem)
		defer mb.Release()
		mb.Reserve(n)
	}
	pb.Reserve(n)
	for i := range n {
		t, s := traj.Value(i), step.Value(i)
		follows := x.valid && t == x.traj && s == x.step+1
		var whole []int32
		p := 0
		if prefix != nil {
			p = int(prefix.Value(i))
		}
		switch {
		case p == 0:
			if prompt.IsNull(i) {
				return nil, fmt.Errorf("prefix: row %d (%s step %d): prompt_ids null without a prefix", i, t, s)
			}
			lo, hi := prompt.ValueOffsets(i)
			whole = promptV[lo:hi]
		case !follows || p != len(x.prompt)+len(x.resp):
			return nil, fmt.Errorf("prefix: row %d (%s step %d) extends %d tokens of a predecessor that is not the row before it", i, t, s, p)
		default:
			lo, hi := delta.ValueOffsets(i)
			whole = append(append(append(make([]int32, 0, p+int(hi-lo)), x.prompt...), x.resp...), deltaV[lo:hi]...)
		}
		pb.Append(true)
		pv.AppendValues(whole, nil)
		lo, hi := resp.ValueOffsets(i)
		x.prompt = append(x.prompt[:0], whole...)
		x.resp = append(x.resp[:0], respV[lo:hi]...)
		x.traj, x.step, x.valid = t, s, true
		if mb == nil {
			continue
		}
		switch {
		case msgD.IsValid(i):
			if !follows || len(x.msgs) == 0 {
				return nil, fmt.Errorf("prefix: row %d (%s step %d): messages extend a predecessor that is not the row before it", i, t, s)
			}
			x.msgs = append(x.msgs[:len(x.msgs)-1], msgD.Value(i)...)
			mb.BinaryBuilder.Append(x.msgs)
		case msgs.IsValid(i):
			x.msgs = append(x.msgs[:0], msgs.Value(i)...)
			mb.BinaryBuilder.Append(x.msgs)
		default:
			x.msgs = x.msgs[:0]
			mb.AppendNull()
		}
	}
	cols := slices.Clone(rec.Columns())
	pa := pb.NewArray()
	defer pa.Release()
	cols[c.prompt] = pa
	if mb != nil {
		ma := mb.NewArray()
		defer ma.Release()
		cols[c.msgs] = ma
	}
	return array.NewRecordBatch(rec.Schema(), cols, rec.NumRows()), nil
}

// hasDeltas reports whether any row of a record is stored as a delta.
func hasDeltas(prefix *array.Int32, msgD *array.String) bool {
	if msgD != nil && msgD.NullN() < msgD.Len() {
		return true
	}
	if prefix != nil {
		for _, p := range prefix.Int32Values() {
			if p > 0 {
				return true
			}
		}
	}
	return false
}

// keepLast remembers the last row of a record whose rows are all whole,
// as the predecessor of the next record's first row.
func (x *Expander) keepLast(traj *array.String, step *array.Int32, prompt *array.List, promptV []int32, resp *array.List, respV []int32, msgs *array.String) {
	i := traj.Len() - 1
	if i < 0 {
		return
	}
	lo, hi := prompt.ValueOffsets(i)
	x.prompt = append(x.prompt[:0], promptV[lo:hi]...)
	lo, hi = resp.ValueOffsets(i)
	x.resp = append(x.resp[:0], respV[lo:hi]...)
	x.msgs = x.msgs[:0]
	if msgs != nil && msgs.IsValid(i) {
		x.msgs = append(x.msgs, msgs.Value(i)...)
	}
	x.traj, x.step, x.valid = traj.Value(i), step.Value(i), true
}
