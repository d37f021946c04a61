package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeRun: the README's first command, `make run`, works as the
// Makefile writes it (build, gen, ingest, summary), on a small input in a
// temporary folder: it exits 0, commits shards, writes the run's counts
// outside the store and prints the summary.
func TestMakeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary with make")
	}
	mk, err := exec.LookPath("make")
	if err != nil {
		t.Skip("no make on PATH")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go on PATH")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	data, work := filepath.Join(dir, "data"), filepath.Join(dir, "work")
	cmd := exec.Command(mk, "-C", repo, "run", "GO="+goBin, "BIN="+filepath.Join(dir, "rllm-pipe"),
		"DATA="+data, "WORK="+work, "GROUPS=20")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("make run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "shards") {
		t.Errorf("make run printed no summary:\n%s", out.String())
	}
	var stats map[string]any
	if b, err := os.ReadFile(filepath.Join(work, "ingest-stats.json")); err != nil || json.Unmarshal(b, &stats) != nil {
		t.Errorf("the run's counts: %v", err)
	}
	manifest, err := os.ReadFile(filepath.Join(data, "_manifest", "shards.jsonl"))
	if err != nil || !bytes.Contains(manifest, []byte(`"path":"policy=`)) {
		t.Errorf("no committed shard in %s (%v)", data, err)
	}
}
