package pipeline_test

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline/pipelinetest"
	"github.com/rllm-pipe/rllm-pipe/connectors/recordlog"
	"github.com/rllm-pipe/rllm-pipe/connectors/store/storetest"
)

// TestFeedExactlyOnceAcrossRestarts: records written through a Feed are
// committed; a group still open at Close stays in the log and is
// completed after a restart; nothing is committed twice; settled segments
// are removed.
func TestFeedExactlyOnceAcrossRestarts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root := t.TempDir()
	wal := filepath.Join(root, "_gateway", "wal.jsonl")
	lo := recordlog.Options{MaxFileBytes: recordlog.HeaderSize + 8<<10}
	start := func(writer string) (*pipeline.Feed, *recordlog.Log, func()) {
		st, err := local.Open(root, writer)
		if err != nil {
			t.Fatal(err)
		}
		l, err := recordlog.Open(wal, lo)
		if err != nil {
			t.Fatal(err)
		}
		f, err := pipeline.New(pipelinetest.Config(t), st, nil).Feed(ctx, l, pipeline.FeedOptions{PruneEvery: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return f, l, func() { st.Close() }
	}
	write := func(f *pipeline.Feed, from, to int) {
		var wg sync.WaitGroup
		for g := from; g < to; g++ {
			wg.Go(func() {
				for _, ln := range pipelinetest.GroupLines(g) {
					if err := f.Write(ctx, [][]byte{[]byte(ln)}); err != nil {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
	}
	f, l, closeStore := start("run-1")
	write(f, 0, 30)
	open := pipelinetest.GroupLines(1000)
	for _, ln := range open[:2] { // one trajectory of two: the group stays open
		if err := f.Write(ctx, [][]byte{[]byte(ln)}); err != nil {
			t.Fatal(err)
		}
	}
	segs := len(l.Segments())
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	closeStore()
	if segs < 3 {
		t.Fatalf("%d segments: the test wants rotation", segs)
	}
	counts := committedSteps(t, root)
	if len(counts) != 60 || counts["g1000-t0"] != 0 {
		t.Fatalf("first run committed %d steps (open group: %d), want 60 and 0", len(counts), counts["g1000-t0"])
	}

	f, l, closeStore = start("run-2")
	for _, ln := range open[2:] {
		if err := f.Write(ctx, [][]byte{[]byte(ln)}); err != nil {
			t.Fatal(err)
		}
	}
	write(f, 30, 35)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	closeStore()
	counts = committedSteps(t, root)
	if len(counts) != 72 {
		t.Fatalf("after the restart %d steps committed, want 72", len(counts))
	}
	for id, n := range counts {
		if n != 1 {
			t.Errorf("step %s committed %d times", id, n)
		}
	}
	if left := len(l.Segments()); left >= segs {
		t.Errorf("%d segments left of %d: settled ones were not removed", left, segs)
	}
}

func committedSteps(t *testing.T, root string) map[string]int {
	t.Helper()
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	return storetest.StepCounts(t, r)
}
