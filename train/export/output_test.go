package export

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
)

// TestCheckOutput: an export may not write into the store it reads, by a
// plain, relative or symlinked path; anywhere else it may.
func TestCheckOutput(t *testing.T) {
	tmp := t.TempDir()
	root := filepath.Join(tmp, "out")
	for _, d := range []string{"_manifest", "_dlq", "policy=1"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{
		"_manifest/shards.jsonl":  `{"path":"policy=1/a.parquet","rows":1,"bytes":4,"groups":1,"policy_version":1,"group_keys":["g"],"run_id":"r","schema_version":"1","committed_at":"2026-01-01T00:00:00Z"}` + "\n",
		"policy=1/a.parquet":      "PAR1",
		"policy=1/orphan.parquet": "PAR1",
		"_dlq/run.jsonl":          "",
	} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		"link":   root,
		"sneaky": filepath.Join(root, "_manifest"),
		"up":     filepath.Join(root, "policy=1"),
		"dangle": filepath.Join(root, "_manifest", "new.jsonl"),
		"rel":    "out/_dlq",
	} {
		if err := os.Symlink(target, filepath.Join(tmp, link)); err != nil {
			t.Fatal(err)
		}
	}
	src, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	t.Chdir(root)
	ctx := context.Background()
	for _, c := range []struct {
		path    string
		refused bool
	}{
		{filepath.Join(root, "_manifest", "shards.jsonl"), true},
		{filepath.Join(root, "_manifest", "new.jsonl"), true},
		{filepath.Join(root, "_dlq", "run.jsonl"), true},
		{filepath.Join(root, "_tmp", "x.parquet"), true},
		{filepath.Join(root, "_groups", "g", "x.jsonl"), true},
		{filepath.Join(root, "_new", "x.jsonl"), true},
		{root, true},
		{root + "/", true},
		{filepath.Join(root, "policy=1", "a.parquet"), true},
		{filepath.Join(root, "policy=1", "orphan.parquet"), true},
		{root + "/policy=1/../_manifest/shards.jsonl", true},
		{"_manifest/shards.jsonl", true},
		{"./policy=1/../_dlq/x.jsonl", true},
		{"policy=1/a.parquet", true},
		{".", true},
		{filepath.Join(tmp, "link", "_manifest", "shards.jsonl"), true},
		{filepath.Join(tmp, "link"), true},
		{filepath.Join(tmp, "sneaky", "shards.jsonl"), true},
		{tmp + "/up/../_manifest/shards.jsonl", true}, // .. after a link: the parent of its target
		{filepath.Join(tmp, "dangle"), true},
		{filepath.Join(tmp, "rel", "x.jsonl"), true},
		{"../link/_manifest/shards.jsonl", true},

		{"", false},
		{filepath.Join(tmp, "sft.jsonl"), false},
		{filepath.Join(tmp, "_manifest", "x.jsonl"), false},
		{filepath.Join(root, "sft.jsonl"), false},
		{filepath.Join(root, "policy=1", "sft.jsonl"), false},
		{"../sft.parquet", false},
		{tmp + "/link/../sft.jsonl", false},
	} {
		err := CheckOutput(ctx, src, c.path)
		switch {
		case c.refused && !errors.Is(err, ErrOutputInStore):
			t.Errorf("CheckOutput(%s): %v, want refused", c.path, err)
		case !c.refused && err != nil:
			t.Errorf("CheckOutput(%s): %v, want allowed", c.path, err)
		}
	}
}
