package ingest

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest/synth"
)

// benchLines are realistic wire lines for BenchmarkDecode: the shape of
// the ingest benchmark (cmd/ingestbench; issue 7) — 8 rollouts per group,
// 1-4 steps, ~512-token prompts, ~256-token responses, chat messages —
// 100 groups, about 2,900 lines and 27 MB, steps and trajectories mixed.
var benchLines = sync.OnceValues(func() ([][]byte, error) {
	var buf bytes.Buffer
	_, err := synth.Generate(context.Background(), &buf, synth.Config{
		Groups: 100, GroupSize: 8, MinSteps: 1, MaxSteps: 4,
		PromptLen: 512, ResponseLen: 256, Messages: true, Seed: 1,
	})
	if err != nil {
		return nil, err
	}
	// Lines without their newline, as the line source hands them over.
	return bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n")), nil
})

// BenchmarkDecode measures the decoder alone, on one goroutine: one
// operation decodes every line of benchLines once. It reports MB/s of
// input, newlines included (b.SetBytes), and records/s. For a profile:
//
//	go test -run '^$' -bench Decode -cpuprofile cpu.out ./ingest/
//	go tool pprof -top ingest.test cpu.out
func BenchmarkDecode(b *testing.B) {
	lines, err := benchLines()
	if err != nil {
		b.Fatal(err)
	}
	var size int64
	var d Decoder
	for i, l := range lines {
		size += int64(len(l)) + 1
		if _, err := d.Decode(l); err != nil {
			b.Fatalf("line %d does not decode: %v", i+1, err)
		}
	}
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			if _, err := d.Decode(l); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N)*float64(len(lines))/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkLists measures the list fast paths alone on the arrays of
// benchLines (without messages: token ids and logprobs as the generator
// writes them), reporting elements per second.
func BenchmarkLists(b *testing.B) {
	// Each array runs on to the end of its line, as in a record (the block
	// paths look ahead); SetBytes counts the arrays' own bytes.
	var ints, floats [][]byte
	var intBytes, floatBytes int
	var buf bytes.Buffer
	if _, err := synth.Generate(context.Background(), &buf, synth.Config{
		Groups: 20, GroupSize: 8, MinSteps: 1, MaxSteps: 4, PromptLen: 512, ResponseLen: 256, Seed: 1,
	}); err != nil {
		b.Fatal(err)
	}
	for _, l := range bytes.Split(buf.Bytes(), []byte("\n")) {
		for _, f := range []string{`"prompt_ids":`, `"response_ids":`, `"response_logprobs":`} {
			if i := bytes.Index(l, []byte(f)); i >= 0 {
				a := l[i+len(f):]
				n := bytes.IndexByte(a, ']') + 1
				if f == `"response_logprobs":` {
					floats, floatBytes = append(floats, a), floatBytes+n
				} else {
					ints, intBytes = append(ints, a), intBytes+n
				}
			}
		}
	}
	run := func(b *testing.B, arrays [][]byte, size int, parse func(*lexer) int) {
		var n int
		b.SetBytes(int64(size))
		for b.Loop() {
			for _, a := range arrays {
				lx := lexer{buf: a}
				n += parse(&lx)
			}
		}
		b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "elements/s")
	}
	for _, blocks := range []bool{true, false} {
		name := "ints/words" // the baseline: one number after the other
		if blocks {
			name = "ints/blocks"
		}
		b.Run(name, func(b *testing.B) {
			defer func(on bool) { blockInts = on }(blockInts)
			blockInts = blocks
			var dst []int32
			run(b, ints, intBytes, func(lx *lexer) int {
				var ok bool
				if dst, ok = lx.fastInts(dst[:0]); !ok {
					b.Fatal("fast path refused")
				}
				return len(dst)
			})
		})
	}
	b.Run("floats", func(b *testing.B) {
		var dst []float32
		run(b, floats, floatBytes, func(lx *lexer) int {
			var ok bool
			if dst, ok = lx.fastFloats(dst[:0]); !ok {
				b.Fatal("fast path refused")
			}
			return len(dst)
		})
	})
}
