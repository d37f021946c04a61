package train

import (
	"context"
	"os"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/ingest/synth"
)

// BenchmarkReadTrajectories is the serving side's read path for
// --layout trajectories: committed shards (prefix-delta storage) read
// into merged trajectory batches of ~512 trajectories, on agent runs
// shaped like examples/bench_padded.py's (12 to 22 turns, 1,024-token
// first prompts, 200-token observations, 300-token actions, 2% context
// resets). path=deltas merges the stored deltas of a batch's groups as
// they are; path=expand rebuilds every prompt and joins the groups first
// (the path with a batch estimator, and the only one before). rows/sec
// are merged rows, tokens/sec their prompt and response tokens.
func BenchmarkReadTrajectories(b *testing.B) {
	groups := 16
	if testing.Short() {
		groups = 4
	}
	cfg := synth.Config{Groups: groups, GroupSize: 16, MinSteps: 12, MaxSteps: 22, PromptLen: 1024, ResponseLen: 300,
		ObservationLen: 200, Resets: 0.02, Shuffle: -1, Seed: 5}
	paths := writeGenerated(b, cfg, nil)
	var size int64
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil {
			size += fi.Size()
		}
	}
	for _, path := range []string{"deltas", "expand"} {
		b.Run("path="+path, func(b *testing.B) {
			mem := memory.NewGoAllocator()
			c := Config{MaxStaleness: -1, MaxTokens: 4_200_000, Layout: LayoutTrajectories, Allocator: mem, expand: path == "expand"}
			b.SetBytes(size)
			b.ReportAllocs()
			var rows, tokens int64
			for b.Loop() {
				r := NewReader(c)
				err := r.ReadShards(context.Background(), paths, func(bt Batch) error {
					rows += bt.Record.NumRows()
					tokens += bt.Tokens
					bt.Record.Release()
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			secs := b.Elapsed().Seconds()
			b.ReportMetric(float64(rows)/secs, "rows/sec")
			b.ReportMetric(float64(tokens)/secs, "tokens/sec")
		})
	}
}
