package advantage

import (
	"math"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// lists builds a LIST<FLOAT> column; a nil row is null.
func lists(mem memory.Allocator, rows [][]float32) *array.List {
	b := array.NewListBuilder(mem, arrow.PrimitiveTypes.Float32)
	defer b.Release()
	vb := b.ValueBuilder().(*array.Float32Builder)
	for _, r := range rows {
		if r == nil {
			b.AppendNull()
			continue
		}
		b.Append(true)
		vb.AppendValues(r, nil)
	}
	return b.NewListArray()
}

func TestDistill(t *testing.T) {
	// ../shared/ANCHORS.md §2: teacher [−0.1,−2.0,−0.5], student
	// [−0.3,−0.2,−0.5] → d = [0.2,−1.8,0]; clip ±1 → [0.2,−1,0];
	// γ = 0.5 → [−0.7,−1.8,0].
	teacherRow := []float32{-0.1, -2.0, -0.5}
	studentRow := []float32{-0.3, -0.2, -0.5}
	cases := []struct {
		name string
		d    Distill
		adv  float64
		want []float64
	}{
		{"plain", Distill{Coef: 1}, 0, []float64{0.2, -1.8, 0}},
		{"clip", Distill{Coef: 1, Clip: 1}, 0, []float64{0.2, -1, 0}},
		{"discount", Distill{Coef: 1, Discount: 0.5}, 0, []float64{-0.7, -1.8, 0}},
		{"coef, clip and discount on an advantage", Distill{Coef: 2, Clip: 1, Discount: 0.5}, 0.25, []float64{0.25 - 1, 0.25 - 1, 0.25}},
		{"coef", Distill{Coef: 0.5}, 1, []float64{1.1, 0.1, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			adv := f64(mem, []float64{tc.adv, 5})
			defer adv.Release()
			student := lists(mem, [][]float32{studentRow, {-1}})
			defer student.Release()
			teacher := lists(mem, [][]float32{teacherRow, nil})
			defer teacher.Release()
			out, missing, err := tc.d.TokenAdvantages(mem, adv, student, teacher)
			if err != nil {
				t.Fatal(err)
			}
			defer out.Release()
			if missing != 1 || !out.IsNull(1) || out.IsNull(0) {
				t.Fatalf("missing %d, nulls %v %v", missing, out.IsNull(0), out.IsNull(1))
			}
			s, e := out.ValueOffsets(0)
			vals := out.ListValues().(*array.Float32).Float32Values()[s:e]
			if len(vals) != len(tc.want) {
				t.Fatalf("%d values", len(vals))
			}
			for i, w := range tc.want {
				if math.Abs(float64(vals[i])-w) > 1e-6 {
					t.Fatalf("token %d = %v, want %v", i, vals[i], w)
				}
			}
		})
	}
}

func TestDistillLengthMismatch(t *testing.T) {
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	adv := f64(mem, []float64{0})
	defer adv.Release()
	s := lists(mem, [][]float32{{-1, -2}})
	defer s.Release()
	tt := lists(mem, [][]float32{{-1}})
	defer tt.Release()
	if _, _, err := (Distill{Coef: 1}).TokenAdvantages(mem, adv, s, tt); err == nil {
		t.Fatal("mismatched lengths accepted")
	}
}
