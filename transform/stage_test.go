package transform

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Batches are cut by rows or, sooner for long rows, by the bytes of the
// records as received: ten one-step groups whose step lines are each L
// bytes long, sent one input batch at a time, come out in batches of
// BatchBytes/L rows (rounded up) when that is below BatchRows, and of
// BatchRows rows otherwise.
func TestStageCutsBatchesByBytes(t *testing.T) {
	pad := `"metadata":{"pad":"` + strings.Repeat("p", 1000) + `"}`
	var inputs []ingest.Batch
	var stepLen int
	var d ingest.Decoder
	for g := range 10 {
		task, id := fmt.Sprintf("T%d", g), fmt.Sprintf("T%d/r0", g)
		var items []ingest.Item
		for i, l := range []string{step(task, id, 0, pad), traj(task, id, 1, 1)} {
			rec, err := d.Decode([]byte(l))
			if err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				stepLen = len(l) // the same for every group: ids of one width
			}
			items = append(items, ingest.Item{Source: schemas.Source{File: "f", Line: int64(2*g + i + 1)}, Raw: []byte(l), Rec: rec})
		}
		inputs = append(inputs, ingest.Batch{Items: items})
	}
	tests := []struct {
		name                  string
		batchRows, batchBytes int
		want                  []int // rows of each batch
	}{
		{"bytes first", 100, 3 * stepLen, []int{3, 3, 3, 1}},
		{"bytes between two rows", 100, 2*stepLen + 1, []int{3, 3, 3, 1}},
		{"rows first", 4, 100 * stepLen, []int{4, 4, 2}},
		{"more than the input", 100, 1 << 40, []int{10}},
		{"default: far above these", 100, 0, []int{10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bt, _ := testBatcher(t)
			in := make(chan ingest.Batch, len(inputs))
			for _, b := range inputs {
				in <- b
			}
			close(in)
			out := make(chan Batch, 16)
			if _, err := Stage(context.Background(), in, out, &memDL{}, bt, StageConfig{
				Assembler: Config{GroupSize: 1}, BatchRows: tt.batchRows, BatchBytes: tt.batchBytes,
			}); err != nil {
				t.Fatal(err)
			}
			var got []int
			for b := range out {
				got = append(got, int(b.Record.NumRows()))
				b.Record.Release()
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("batches of %v rows (step lines of %d bytes), want %v", got, stepLen, tt.want)
			}
		})
	}
}
