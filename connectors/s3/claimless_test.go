package s3

import (
	"bytes"
	"context"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// A writer that claims no stream (ingest from stdin) is alive as long as
// it runs: another writer starting meanwhile must not take its upload,
// whose entry is about to be appended, for an orphan.
func TestIntegrationClaimlessWriterKeepsItsUploads(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	stdin := open(t, cfg, "stdin-1")
	if err := stdin.Claim(ctx, nil, 0); err != nil {
		t.Fatal(err)
	}
	rel := "policy=0/part-stdin-1-000001.parquet"
	// Uploaded; the append comes next.
	if err := stdin.putIfAbsent(ctx, stdin.key(rel), bytes.NewReader([]byte("x")), 1, ""); err != nil {
		t.Fatal(err)
	}
	other := open(t, cfg, "w-2")
	if err := other.Claim(ctx, []string{"f"}, 0); err != nil {
		t.Fatal(err)
	}
	if err := stdin.Append(ctx, schemas.ShardEntry{Path: rel, Rows: 1}); err != nil {
		t.Fatal(err)
	}
	r, err := OpenReader(ctx, cfg, "reader")
	if err != nil {
		t.Fatal(err)
	}
	es, _ := r.Committed(ctx)
	if len(es) != 1 {
		t.Fatalf("committed %v", es)
	}
	if _, missing, err := r.get(ctx, r.key(rel)); err != nil || missing {
		t.Fatalf("the committed shard of the stdin writer: missing %v, %v", missing, err)
	}
}

// A writer that first claimed no stream and then real ones (a Kafka
// worker given partitions in a later generation) gives its own stream up:
// once its partitions are taken over after its death, its orphans go.
func TestIntegrationOwnStreamGivenUpWithRealClaims(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	w := open(t, cfg, "worker-1")
	if err := w.Claim(ctx, nil, 1); err != nil {
		t.Fatal(err)
	}
	if err := w.Claim(ctx, []string{"topic/0"}, 2); err != nil {
		t.Fatal(err)
	}
	orphan := w.key("policy=0/part-worker-1-000001.parquet")
	if err := w.putIfAbsent(ctx, orphan, bytes.NewReader([]byte("x")), 1, ""); err != nil {
		t.Fatal(err)
	}
	// worker-1 dies; topic/0 moves on.
	heir := open(t, cfg, "heir-1")
	if err := heir.Claim(ctx, []string{"topic/0"}, 3); err != nil {
		t.Fatal(err)
	}
	if _, missing, err := heir.get(ctx, orphan); err != nil || !missing {
		t.Fatalf("the dead worker's orphan: missing %v, %v; want it removed", missing, err)
	}
}
