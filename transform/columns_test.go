package transform

import (
	"math/rand"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// The directly laid out columns equal what Arrow's builders make of the
// same rows (empty lists, null and empty messages included), batch after
// batch on recycled buffers that still hold the previous batch's bytes.
func TestDirectColumnsMatchBuilders(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	pool := &bufferPool{keep: poolKeep}
	promptType := schemas.StepSchema.Field(schemas.ColPromptIDs).Type.(*arrow.ListType)
	logpType := schemas.StepSchema.Field(schemas.ColResponseLogprobs).Type.(*arrow.ListType)
	var ids listColumn[int32]
	var lps listColumn[float32]
	var msgs textColumn
	for batch := 0; batch < 20; batch++ {
		mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
		ib := array.NewBuilder(mem, promptType).(*array.ListBuilder)
		fb := array.NewBuilder(mem, logpType).(*array.ListBuilder)
		sb := array.NewStringBuilder(mem)
		for r := 0; r < 1+rng.Intn(3000); r++ {
			n := rng.Intn(700) * rng.Intn(2) // half of them empty
			iv, fv := make([]int32, n), make([]float32, n)
			for k := range iv {
				iv[k], fv[k] = rng.Int31(), -rng.Float32()
			}
			ids.add(iv)
			lps.add(fv)
			ib.Append(true)
			ib.ValueBuilder().(*array.Int32Builder).AppendValues(iv, nil)
			fb.Append(true)
			fb.ValueBuilder().(*array.Float32Builder).AppendValues(fv, nil)
			var m []byte
			switch rng.Intn(3) {
			case 0: // null
			case 1:
				m = []byte{}
			default:
				m = make([]byte, rng.Intn(5000))
				rng.Read(m)
			}
			msgs.add(m)
			if m == nil {
				sb.AppendNull()
			} else {
				sb.BinaryBuilder.Append(m)
			}
		}
		for _, c := range []struct {
			name      string
			got, want arrow.Array
		}{
			{"ids", ids.array(pool, promptType), ib.NewArray()},
			{"logprobs", lps.array(pool, logpType), fb.NewArray()},
			{"messages", msgs.array(pool), sb.NewArray()},
		} {
			if !array.Equal(c.got, c.want) {
				t.Fatalf("batch %d: %s differ from the builder's", batch, c.name)
			}
			c.got.Release()
			c.want.Release()
		}
		ids.reset()
		lps.reset()
		msgs.reset()
		ib.Release()
		fb.Release()
		sb.Release()
		mem.AssertSize(t, 0)
	}
	if len(pool.idle) == 0 || pool.size > pool.keep {
		t.Fatalf("pool holds %d buffers, %d bytes (keep %d): released buffers were not recycled", len(pool.idle), pool.size, pool.keep)
	}
}
