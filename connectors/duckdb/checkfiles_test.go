package duckdb

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// TestCheckFiles: a folder of many shards is listed once rather than each
// file looked up, with the same answers: a missing shard fails, naming
// the first one missing in manifest order; a symbolic link to a shard
// passes and one to nothing fails; a folder that cannot be listed falls
// back to looking each file up.
func TestCheckFiles(t *testing.T) {
	root := t.TempDir()
	var shards []shardFile
	add := func(rel string, make bool) {
		file := filepath.Join(root, filepath.FromSlash(rel))
		if make {
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		shards = append(shards, shardFile{entry: schemas.ShardEntry{Path: rel}, file: file})
	}
	for i := range 2 * listAt {
		add(fmt.Sprintf("policy=0/part-%03d.parquet", i), true)
	}
	add("policy=1/part-000.parquet", true) // a folder of one: looked up
	target := filepath.Join(t.TempDir(), "elsewhere.parquet")
	if err := os.WriteFile(target, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := func(rel, to string) {
		if err := os.Symlink(to, filepath.Join(root, filepath.FromSlash(rel))); err != nil {
			t.Fatal(err)
		}
		shards = append(shards, shardFile{entry: schemas.ShardEntry{Path: rel}, file: filepath.Join(root, filepath.FromSlash(rel))})
	}
	link("policy=0/linked.parquet", target)
	if err := checkFiles(shards); err != nil {
		t.Fatalf("every shard is there: %v", err)
	}

	cases := []struct {
		name  string
		build func() []shardFile
		want  string // the shard the error names
	}{
		{"missing in a listed folder", func() []shardFile {
			s := append([]shardFile(nil), shards...)
			s = append(s[:5], append([]shardFile{{entry: schemas.ShardEntry{Path: "policy=0/gone-b.parquet"}, file: filepath.Join(root, "policy=0", "gone-b.parquet")},
				{entry: schemas.ShardEntry{Path: "policy=0/gone-a.parquet"}, file: filepath.Join(root, "policy=0", "gone-a.parquet")}}, s[5:]...)...)
			return s
		}, "policy=0/gone-b.parquet"},
		{"missing in a folder of few", func() []shardFile {
			return append(append([]shardFile(nil), shards...), shardFile{entry: schemas.ShardEntry{Path: "policy=1/gone.parquet"}, file: filepath.Join(root, "policy=1", "gone.parquet")})
		}, "policy=1/gone.parquet"},
		{"link to nothing in a listed folder", func() []shardFile {
			rel := "policy=0/dangling.parquet"
			file := filepath.Join(root, filepath.FromSlash(rel))
			if err := os.Symlink(filepath.Join(root, "nothing"), file); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(file) })
			return append(append([]shardFile(nil), shards...), shardFile{entry: schemas.ShardEntry{Path: rel}, file: file})
		}, "policy=0/dangling.parquet"},
		{"missing folder", func() []shardFile {
			var s []shardFile
			for i := range listAt {
				rel := fmt.Sprintf("policy=9/part-%03d.parquet", i)
				s = append(s, shardFile{entry: schemas.ShardEntry{Path: rel}, file: filepath.Join(root, filepath.FromSlash(rel))})
			}
			return s
		}, "policy=9/part-000.parquet"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := checkFiles(c.build())
			if err == nil || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "committed shard "+c.want+":") {
				t.Fatalf("err = %v, want the shard %s not found", err, c.want)
			}
		})
	}
}
