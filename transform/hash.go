package transform

import (
	"encoding/binary"
	"hash/maphash"
	"math"
	"unsafe"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// seed is per process: hashes never leave memory.
var seed = maphash.MakeSeed()

// hasher writes typed values into a maphash with length prefixes, so that
// different field splits never hash alike.
type hasher struct{ h maphash.Hash }

func newHasher() *hasher {
	h := &hasher{}
	h.h.SetSeed(seed)
	return h
}

func (h *hasher) str(s string) {
	h.u64(uint64(len(s)))
	h.h.WriteString(s)
}

func (h *hasher) bytes(b []byte) {
	h.u64(uint64(len(b)))
	h.long(b)
}

// long adds b: a long one through one call of the runtime's hash of the
// whole slice (the Hash's Write goes 128 bytes at a time), its 64 bits
// written in its place.
func (h *hasher) long(b []byte) {
	if len(b) <= 128 {
		h.h.Write(b)
		return
	}
	h.u64(maphash.Bytes(seed, b))
}

func (h *hasher) u64(v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	h.h.Write(b[:])
}

func (h *hasher) f64(v float64) { h.u64(math.Float64bits(v)) }

func (h *hasher) flag(v bool) {
	if v {
		h.h.WriteByte(1)
	} else {
		h.h.WriteByte(0)
	}
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
	h := newHasher()
	h.h.WriteByte('s')
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
	return h.h.Sum64()
}

// trajHash hashes every decoded field of a trajectory record.
func trajHash(t *schemas.Trajectory) uint64 {
	h := newHasher()
	h.h.WriteByte('t')
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
	h.flag(t.Metadata != nil)
	h.bytes(t.Metadata)
	return h.h.Sum64()
}

// idHash identifies a record by kind and id, for the memory of closed
// groups.
func idHash(kind byte, id string) uint64 {
	h := newHasher()
	h.h.WriteByte(kind)
	h.str(id)
	return h.h.Sum64()
}
