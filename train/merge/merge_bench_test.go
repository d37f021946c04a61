package merge

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// benchSteps is a record of multi-turn step rows shaped like the agent
// runs of examples/bench_padded.py: trajs trajectories of 12 to 22 turns,
// a 1,024-token first prompt, 200-token observations, 300-token actions
// and a context reset in 2% of the steps (whole prompts, as readers give
// them).
func benchSteps(b *testing.B, mem memory.Allocator, trajs int) arrow.RecordBatch {
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = rng.Int32N(150000)
		}
		return s
	}
	var steps []step
	for t := range trajs {
		turns := 12 + rng.IntN(11)
		prompt := tokens(1024)
		for k := range turns {
			if k > 0 {
				if rng.Float64() < 0.02 {
					prompt = tokens(1024)
				} else {
					prev := steps[len(steps)-1]
					prompt = append(append(append([]int32(nil), prev.prompt...), prev.resp...), tokens(200)...)
				}
			}
			steps = append(steps, step{traj: fmt.Sprintf("t%04d", t), idx: int32(k), num: int32(turns), prompt: prompt, resp: tokens(300), adv: 0.5})
		}
	}
	return stepRecord(b, mem, steps)
}

// BenchmarkRows merges step rows into trajectory rows: rows/sec are
// merged rows, tokens/sec their prompt and response tokens.
func BenchmarkRows(b *testing.B) {
	mem := memory.NewGoAllocator()
	rec := benchSteps(b, mem, 128)
	defer rec.Release()
	b.SetBytes(recordBytes(rec))
	b.ReportAllocs()
	b.ResetTimer()
	var st Stats
	for range b.N {
		out, s, err := Rows(mem, rec)
		if err != nil {
			b.Fatal(err)
		}
		out.Release()
		st = s
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(st.Rows)*float64(b.N)/sec, "rows/sec")
	b.ReportMetric(float64(st.Steps)*float64(b.N)/sec, "steps/sec")
	b.ReportMetric(float64(st.PromptTokens+st.ActionTokens+st.ObservationTokens)*float64(b.N)/sec, "tokens/sec")
}

// BenchmarkTokens counts the tokens of the merged rows without building
// them (what a token budget pays per group).
func BenchmarkTokens(b *testing.B) {
	mem := memory.NewGoAllocator()
	rec := benchSteps(b, mem, 128)
	defer rec.Release()
	b.SetBytes(recordBytes(rec))
	b.ReportAllocs()
	b.ResetTimer()
	var n int64
	for range b.N {
		var err error
		if n, err = Tokens([]arrow.RecordBatch{rec}); err != nil {
			b.Fatal(err)
		}
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(rec.NumRows())*float64(b.N)/sec, "steps/sec")
	b.ReportMetric(float64(n)*float64(b.N)/sec, "tokens/sec")
}

func recordBytes(rec arrow.RecordBatch) int64 {
	var n int64
	for _, c := range rec.Columns() {
		for _, buf := range c.Data().Buffers() {
			if buf != nil {
				n += int64(buf.Len())
			}
		}
		for _, ch := range c.Data().Children() {
			for _, buf := range ch.Buffers() {
				if buf != nil {
					n += int64(buf.Len())
				}
			}
		}
	}
	return n
}
