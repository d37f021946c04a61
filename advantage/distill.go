package advantage

import (
	"fmt"
	"math"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Distill is on-policy distillation per token (rLLM, tinker-cookbook): on
// the student's own tokens, dₜ = teacher_lpₜ − student_lpₜ, the discounted
// future sum Dₜ = Σ_{k≥t} γ^{k−t}·d_k within the step, and the token
// advantage A + clip(λ·Dₜ, −c, c).
type Distill struct {
	Coef     float64 // λ
	Clip     float64 // c; 0 means no clipping
	Discount float64 // γ; 0 means Dₜ = dₜ
}

// TokenAdvantages returns a LIST<FLOAT> column with one list per row: the
// row's advantage plus the clipped distillation term for each response
// token. Rows whose teacher list is null get null (counted in missing).
func (d Distill) TokenAdvantages(mem memory.Allocator, adv *array.Float64, student, teacher *array.List) (out *array.List, missing int, err error) {
	n := adv.Len()
	if student.Len() != n || teacher.Len() != n {
		return nil, 0, fmt.Errorf("advantage: distill over %d advantages, %d student and %d teacher rows", n, student.Len(), teacher.Len())
	}
	sv := student.ListValues().(*array.Float32).Float32Values()
	tv := teacher.ListValues().(*array.Float32).Float32Values()
	// Non-nullable items, as in schemas.StepSchema.
	b := array.NewBuilder(mem, arrow.ListOfNonNullable(arrow.PrimitiveTypes.Float32)).(*array.ListBuilder)
	defer b.Release()
	vb := b.ValueBuilder().(*array.Float32Builder)
	vb.Reserve(len(sv))
	var scratch []float32
	for i := 0; i < n; i++ {
		if teacher.IsNull(i) {
			b.AppendNull()
			missing++
			continue
		}
		ss, se := student.ValueOffsets(i)
		ts, te := teacher.ValueOffsets(i)
		if se-ss != te-ts {
			return nil, 0, fmt.Errorf("advantage: row %d has %d student and %d teacher logprobs", i, se-ss, te-ts)
		}
		m := int(se - ss)
		scratch = scratch[:0]
		scratch = append(scratch, make([]float32, m)...)
		a := adv.Value(i)
		var future float64
		for t := m - 1; t >= 0; t-- {
			dt := float64(tv[int(ts)+t]) - float64(sv[int(ss)+t])
			future = dt + d.Discount*future
			v := d.Coef * future
			if d.Clip > 0 {
				v = math.Max(-d.Clip, math.Min(d.Clip, v))
			}
			scratch[t] = float32(a + v)
		}
		b.Append(true)
		vb.AppendValues(scratch, nil)
	}
	return b.NewListArray(), missing, nil
}
