package s3

import (
	"encoding/json"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// A group commit's record reads back as its entries, and a reader older
// than group commit (one that decodes every record as one entry) fails
// on it instead of reading an empty entry and missing its shards.
func TestBatchRecord(t *testing.T) {
	entries := []schemas.ShardEntry{{Path: "policy=0/a.parquet", Seq: 7, Rows: 1}, {Path: "policy=1/b.parquet", Seq: 7, Rows: 2}}
	data, err := json.Marshal(batchRecord{Batch: entries, Gate: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRecord(data)
	if err != nil || len(got) != 2 || got[0].Path != entries[0].Path || got[1].Rows != 2 {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	var old schemas.ShardEntry
	if err := json.Unmarshal(data, &old); err == nil {
		t.Fatalf("an old reader decodes a batch record as %+v without an error", old)
	}
	one, err := json.Marshal(entries[0])
	if err != nil {
		t.Fatal(err)
	}
	if got, err := decodeRecord(one); err != nil || len(got) != 1 || got[0].Path != entries[0].Path {
		t.Fatalf("a one-entry record decoded as %+v, %v", got, err)
	}
}
