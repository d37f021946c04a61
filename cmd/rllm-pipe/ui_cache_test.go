package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb/report"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
)

// countingReader is a store read through OpenRemote (it hides the local
// root), counting the shard downloads.
type countingReader struct {
	store.Reader
	mu     sync.Mutex
	shards int
}

func (c *countingReader) Get(ctx context.Context, rel string) ([]byte, error) {
	if strings.HasSuffix(rel, ".parquet") {
		c.mu.Lock()
		c.shards++
		c.mu.Unlock()
	}
	return c.Reader.Get(ctx, rel)
}

func (c *countingReader) downloads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.shards
	c.shards = 0
	return n
}

// TestOpenRemoteKeepsDownloadedShards: with a download folder kept across
// openings (as the live view keeps one over S3), a second opening
// downloads no shard, a copy of the wrong size is downloaded again, and
// the views read the same rows each time.
func TestOpenRemoteKeepsDownloadedShards(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "in.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "30", "--group-size", "4", "--policy-versions", "3",
		"--seed", "4", "--prompt-len", "30", "--response-len", "10", "--quiet"); r.code != 0 {
		t.Fatalf("gen: %s", r.stderr)
	}
	from := filepath.Join(work, "out")
	if r := e2eRun(t, bin, work, "ingest", "--from", in, "--to", from, "--group-size", "4", "--quiet"); r.code != 0 {
		t.Fatalf("ingest: %s", r.stderr)
	}
	lr, err := local.OpenReader(from)
	if err != nil {
		t.Fatal(err)
	}
	defer lr.Close()
	r := &countingReader{Reader: lr}
	ctx := context.Background()
	committed, err := lr.Committed(ctx)
	if err != nil || len(committed) < 2 {
		t.Fatalf("%d shards (%v): the test needs several", len(committed), err)
	}
	cache := filepath.Join(work, "cache")
	open := func() string {
		t.Helper()
		db, err := duckdb.OpenRemote(ctx, r, duckdb.Options{DownloadDir: cache})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		tb, err := report.RunTable(ctx, db, "count", "SELECT count(*), sum(prompt_tokens) FROM stored_steps")
		if err != nil {
			t.Fatal(err)
		}
		return report.FormatCell(tb.Rows[0][0]) + "/" + report.FormatCell(tb.Rows[0][1])
	}
	first := open()
	if n := r.downloads(); n != len(committed) {
		t.Errorf("first opening downloaded %d shards, want %d", n, len(committed))
	}
	if again := open(); again != first {
		t.Errorf("second opening reads %s, first %s", again, first)
	}
	if n := r.downloads(); n != 0 {
		t.Errorf("second opening downloaded %d shards, want none", n)
	}
	// A copy cut short (a crash mid-write by an older version) is fetched again.
	if err := os.Truncate(filepath.Join(cache, "shards", filepath.FromSlash(committed[0].Path)), 10); err != nil {
		t.Fatal(err)
	}
	if again := open(); again != first {
		t.Errorf("third opening reads %s, first %s", again, first)
	}
	if n := r.downloads(); n != 1 {
		t.Errorf("third opening downloaded %d shards, want the 1 cut short", n)
	}
}
