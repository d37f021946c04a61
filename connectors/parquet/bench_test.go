package parquet

import (
	"bytes"
	"context"
	"testing"

	"github.com/klauspost/compress/huff0"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/ingest/synth"
)

// BenchmarkPageModes compresses 1 MiB PLAIN pages of generated token ids
// (the ingest benchmark's shape: groups of 8 sharing a prompt) with the
// zstd encoder (literals raw, the default, or entropy-coded: Compact), as
// Huffman-only literal blocks, and as DELTA_BINARY_PACKED in raw blocks,
// reporting MB/s and the compressed/raw ratio: the modes compressPage
// chooses between.
//
//	go test -run '^$' -bench PageModes ./connectors/parquet/
func BenchmarkPageModes(b *testing.B) {
	var buf bytes.Buffer
	if _, err := synth.Generate(context.Background(), &buf, synth.Config{
		Groups: 60, GroupSize: 8, MinSteps: 1, MaxSteps: 4, PromptLen: 512, ResponseLen: 256, Seed: 1,
	}); err != nil {
		b.Fatal(err)
	}
	var prompts, responses []int32
	var d ingest.Decoder
	for _, l := range bytes.Split(bytes.TrimSuffix(buf.Bytes(), []byte("\n")), []byte("\n")) {
		rec, err := d.Decode(l)
		if err != nil {
			b.Fatal(err)
		}
		if rec.Step != nil {
			prompts = append(prompts, rec.Step.PromptIDs...)
			responses = append(responses, rec.Step.ResponseIDs...)
		}
	}
	codec, err := pageCodec()
	if err != nil {
		b.Fatal(err)
	}
	for _, col := range []struct {
		name string
		ids  []int32
	}{{"prompt_ids", prompts}, {"response_ids", responses}} {
		page := appendPlain(nil, col.ids)
		if len(page) < 1<<20 {
			b.Fatalf("%s: %d bytes, want a 1 MiB page", col.name, len(page))
		}
		page = page[:1<<20]
		for _, mode := range []string{"zstd", "zstd-compact", "literals", "delta"} {
			b.Run(col.name+"/"+mode, func(b *testing.B) {
				var out, d []byte
				var s huff0.Scratch
				b.SetBytes(int64(len(page)))
				for b.Loop() {
					switch mode {
					case "zstd": // the writer's default: literals raw
						out = codec.encode(out, page, 1, true)
					case "zstd-compact":
						out = codec.EncodeLevel(out[:0], page, 1)
					case "literals":
						out = appendLiteralsZstd(out[:0], page, &s)
					default:
						d = appendDeltaInt32(d[:0], page)
						out = appendStoredZstd(out[:0], d)
					}
				}
				b.ReportMetric(float64(len(out))/float64(len(page)), "ratio")
			})
		}
	}
}
