package transform

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"sync"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// seed is per process: hashes never leave memory.
var seed = maphash.MakeSeed()

// hasher lays typed values out in a buffer with length prefixes, so that
// different field splits never hash alike, long fields as their XXH3, and
// hashes the buffer once with the runtime's seeded hash. (Writing each
// field into a maphash.Hash, and hashing long fields with the runtime's
// hash, cost about twice as much: docs/performance.md#kernels-and-components. XXH3's seeded form
// builds a secret on every call.)
type hasher struct {
	buf []byte
	bp  *[]byte // the pool's handle of buf
}

func (h *hasher) str(s string) {
	h.u64(uint64(len(s)))
	h.buf = append(h.buf, s...)
}

func (h *hasher) bytes(b []byte) {
	h.u64(uint64(len(b)))
	h.long(b)
}

// long adds b: a long one as its own 64-bit hash, written in its place.
func (h *hasher) long(b []byte) {
	if len(b) <= 128 {
		h.buf = append(h.buf, b...)
		return
	}
	h.u64(xxh3.Hash(b))
}

func (h *hasher) u64(v uint64) { h.buf = binary.LittleEndian.AppendUint64(h.buf, v) }

func (h *hasher) f64(v float64) { h.u64(math.Float64bits(v)) }

func (h *hasher) flag(v bool) {
	if v {
		h.buf = append(h.buf, 1)
	} else {
		h.buf = append(h.buf, 0)
	}
}

// bufs recycles hashers' buffers (a buffer of its own per record was a
// quarter of the records' allocations).
var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// newHasher starts a hasher of a record of kind on a recycled buffer;
// sum returns the buffer.
func newHasher(kind byte) hasher {
	bp := bufs.Get().(*[]byte)
	return hasher{buf: append((*bp)[:0], kind), bp: bp}
}

func (h *hasher) sum() uint64 {
	v := maphash.Bytes(seed, h.buf)
	*h.bp = h.buf[:0]
	bufs.Put(h.bp)
	return v
}

// raw is the memory of a slice of fixed-size values.
func raw[T int32 | float32 | int64](v []T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(v))), len(v)*int(unsafe.Sizeof(T(0))))
}

func (h *hasher) i32s(v []int32) {
	h.u64(uint64(len(v)))
	h.long(raw(v))
}

func (h *hasher) f32s(v []float32) {
	h.u64(uint64(len(v)))
	h.long(raw(v))
}

func (h *hasher) i64s(v []int64) {
	h.u64(uint64(len(v)))
	h.long(raw(v))
}

// stepHash hashes every decoded field of a step: two records with equal
// hashes carry the same content (unknown fields aside).
func stepHash(s *schemas.Step) uint64 {
	h := newHasher('s')
	h.str(s.StepID)
	h.str(s.TaskID)
	h.str(s.GroupID)
	h.str(s.Role)
	h.str(s.TrajectoryID)
	h.u64(uint64(s.StepIndex))
	h.u64(uint64(s.PolicyVersion))
	h.i32s(s.PromptIDs)
	h.str(s.ParentStepID)
	h.i32s(s.PromptDeltaIDs)
	h.bytes(s.MessagesAdded)
	h.i32s(s.ResponseIDs)
	h.f32s(s.ResponseLogprobs)
	h.flag(s.HasTokenVersions)
	h.i64s(s.TokenVersions)
	h.flag(s.HasTeacher)
	h.f32s(s.TeacherLogprobs)
	h.flag(s.Messages != nil)
	h.bytes(s.Messages)
	h.flag(s.Metadata != nil)
	h.bytes(s.Metadata)
	h.flag(s.HasReward)
	h.f64(s.Reward)
	h.flag(s.HasDone)
	h.flag(s.Done)
	h.str(s.FinishReason)
	h.str(s.Model)
	h.flag(s.HasCreatedAt)
	h.u64(uint64(s.CreatedAt))
	return h.sum()
}

// trajHash hashes every decoded field of a trajectory record.
func trajHash(t *schemas.Trajectory) uint64 {
	h := newHasher('t')
	h.str(t.TrajectoryID)
	h.str(t.TaskID)
	h.str(t.GroupID)
	h.str(t.Role)
	h.f64(t.Reward)
	h.u64(uint64(t.NumSteps))
	h.str(t.TerminationReason)
	h.flag(t.HasSignals)
	h.u64(uint64(len(t.Signals)))
	for _, s := range t.Signals {
		h.str(s.Name)
		h.f64(s.Value)
	}
	h.flag(t.HasIsCorrect)
	h.flag(t.IsCorrect)
	h.u64(uint64(t.GroupSize))
	if t.RejectedSteps > 0 { // absent before the field existed: hashes unchanged
		h.u64(uint64(t.RejectedSteps))
	}
	h.flag(t.Metadata != nil)
	h.bytes(t.Metadata)
	return h.sum()
}

// idHash identifies a record by kind and id, for the memory of closed
// groups.
func idHash(kind byte, id string) uint64 {
	h := newHasher(kind)
	h.str(id)
	return h.sum()
}
