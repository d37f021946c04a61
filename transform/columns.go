package transform

import (
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/bitutil"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// The bulk of a batch is three token lists and the chat messages of each
// row. Arrow's builders would size their buffers to the next power of
// two, clear them, and copy each value in through a builder; these
// columns are laid out directly instead: the rows' slices are gathered
// while the other columns are appended, and each column's offsets and
// values are then written once into buffers of the exact size, taken from
// a pool of the buffers of batches already encoded (every byte is
// written, so they need no clearing).

// listColumn gathers the rows of a list column (null rows only through
// addNull).
type listColumn[T int32 | float32] struct {
	rows  [][]T
	total int
	nulls []int // the null rows
}

func (c *listColumn[T]) add(v []T) {
	c.rows = append(c.rows, v)
	c.total += len(v)
}

// addNull adds a null row.
func (c *listColumn[T]) addNull() {
	c.nulls = append(c.nulls, len(c.rows))
	c.rows = append(c.rows, nil)
}

// reset forgets the rows (their slices go to the garbage collector).
func (c *listColumn[T]) reset() {
	clear(c.rows)
	c.rows, c.total, c.nulls = c.rows[:0], 0, c.nulls[:0]
}

// array lays the rows out as a list array of type typ.
func (c *listColumn[T]) array(pool *bufferPool, typ *arrow.ListType) arrow.Array {
	checkOffsets(c.total)
	offs := pool.buffer((len(c.rows) + 1) * 4)
	vals := pool.buffer(c.total * int(unsafe.Sizeof(T(0))))
	o := arrow.Int32Traits.CastFromBytes(offs.Bytes())
	v := unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(vals.Bytes()))), c.total)
	n := 0
	for i, r := range c.rows {
		o[i] = int32(n)
		n += copy(v[n:], r)
	}
	o[len(c.rows)] = int32(n)
	var valid *memory.Buffer
	if len(c.nulls) > 0 {
		valid = pool.buffer(int(bitutil.BytesForBits(int64(len(c.rows)))))
		bits := valid.Bytes()
		for i := range bits {
			bits[i] = 0xff
		}
		for _, r := range c.nulls {
			bitutil.ClearBit(bits, r)
		}
		defer valid.Release()
	}
	values := array.NewData(typ.Elem(), c.total, []*memory.Buffer{nil, vals}, nil, 0, 0)
	defer values.Release()
	data := array.NewData(typ, len(c.rows), []*memory.Buffer{valid, offs}, []arrow.ArrayData{values}, len(c.nulls), 0)
	defer data.Release()
	offs.Release()
	vals.Release()
	return array.MakeFromData(data)
}

// textColumn gathers the rows of a nullable string column; a nil row is
// null.
type textColumn struct {
	rows  [][]byte
	total int
	nulls int
}

func (c *textColumn) add(v []byte) {
	c.rows = append(c.rows, v)
	c.total += len(v)
	if v == nil {
		c.nulls++
	}
}

func (c *textColumn) reset() {
	clear(c.rows)
	c.rows, c.total, c.nulls = c.rows[:0], 0, 0
}

// array lays the rows out as a string array.
func (c *textColumn) array(pool *bufferPool) arrow.Array {
	checkOffsets(c.total)
	var valid *memory.Buffer
	if c.nulls > 0 {
		valid = pool.buffer(int(bitutil.BytesForBits(int64(len(c.rows)))))
		bits := valid.Bytes()
		clear(bits)
		for i, r := range c.rows {
			if r != nil {
				bitutil.SetBit(bits, i)
			}
		}
	}
	offs := pool.buffer((len(c.rows) + 1) * 4)
	vals := pool.buffer(c.total)
	o := arrow.Int32Traits.CastFromBytes(offs.Bytes())
	v := vals.Bytes()
	n := 0
	for i, r := range c.rows {
		o[i] = int32(n)
		n += copy(v[n:], r)
	}
	o[len(c.rows)] = int32(n)
	data := array.NewData(arrow.BinaryTypes.String, len(c.rows), []*memory.Buffer{valid, offs, vals}, nil, c.nulls, 0)
	defer data.Release()
	for _, b := range []*memory.Buffer{valid, offs, vals} {
		if b != nil {
			b.Release()
		}
	}
	return array.MakeFromData(data)
}

// checkOffsets panics, as Arrow's builders do, when a column's values
// outgrow its int32 offsets (batches are cut far below: maxBatchBytes).
func checkOffsets(total int) {
	if total > math.MaxInt32 {
		panic(fmt.Sprintf("transform: %d values overflow a column's int32 offsets", total))
	}
}

// bufferPool hands out buffers that are not cleared, recycling those of
// released arrays. It keeps at most keep bytes of idle buffers; it is
// safe for concurrent use (arrays are released by the encoder).
type bufferPool struct {
	mu   sync.Mutex
	idle [][]byte
	size int // bytes in idle
	keep int
}

// poolKeep bounds the idle buffers: about two batches' worth of the
// big columns.
const poolKeep = 32 << 20

// buffer returns a buffer of n bytes with undefined contents, released to
// the pool when its last reference goes.
func (p *bufferPool) buffer(n int) *memory.Buffer {
	return memory.NewBufferWithAllocator(p.Allocate(n), p)
}

// Allocate returns n bytes of a recycled buffer that fits best, or new
// ones. The bytes are not cleared: callers overwrite them all.
func (p *bufferPool) Allocate(n int) []byte {
	p.mu.Lock()
	best := -1
	for i, b := range p.idle {
		if cap(b) >= n && (best < 0 || cap(b) < cap(p.idle[best])) {
			best = i
		}
	}
	if best >= 0 && cap(p.idle[best]) <= 2*n+4096 {
		b := p.idle[best]
		p.idle[best] = p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		p.size -= cap(b)
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, max(n, 64))
}

// Reallocate is part of memory.Allocator; the pool's buffers are never
// resized.
func (p *bufferPool) Reallocate(n int, b []byte) []byte {
	if n <= cap(b) {
		return b[:n]
	}
	nb := p.Allocate(n)
	copy(nb, b)
	p.Free(b)
	return nb
}

// Free takes b back, unless the pool holds enough.
func (p *bufferPool) Free(b []byte) {
	if cap(b) < 4096 {
		return // small: not worth keeping
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.size+cap(b) > p.keep {
		return
	}
	p.idle = append(p.idle, b[:0])
	p.size += cap(b)
}
