package storetest

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// StepCounts reads every committed shard of r and counts each step id:
// the exactly-once check of tests that run a pipeline into a store.
func StepCounts(t testing.TB, r store.Reader) map[string]int {
	t.Helper()
	ctx := context.Background()
	es, err := r.Committed(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range es {
		rd, err := r.ReadShard(ctx, e, []string{"step_id"}, memory.DefaultAllocator)
		if err != nil {
			t.Fatal(err)
		}
		for {
			rec, err := rd.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			ids := rec.Column(0).(*array.String)
			for i := range ids.Len() {
				out[ids.Value(i)]++
			}
			// rec belongs to rd until the next call (not released here).
		}
		rd.Close()
	}
	return out
}
