package compact

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// shards returns n committed entries of size bytes each; old lists the
// ones of an older schema version.
func shards(sizes []int64, old ...int) []schemas.ShardEntry {
	out := make([]schemas.ShardEntry, len(sizes))
	for i, b := range sizes {
		out[i] = schemas.ShardEntry{Path: fmt.Sprintf("policy=0/part-w-%06d.parquet", i), Bytes: b, SchemaVersion: schemas.SchemaVersion}
	}
	for _, i := range old {
		out[i].SchemaVersion = "3"
	}
	return out
}

func repeat(b int64, n int) []int64 {
	s := make([]int64, n)
	for i := range s {
		s[i] = b
	}
	return s
}

func TestPlanRanges(t *testing.T) {
	cfg := Config{TargetBytes: 100, MinShards: 3, MaxShards: 5}
	cfg.defaults() // SmallBytes 25
	type span struct{ first, end int }
	cases := []struct {
		name  string
		sizes []int64
		old   []int
		from  int
		twice [][2]int // entry a lists the path of entry b
		plan  []span
		upto  int
	}{
		{"too few: wait", repeat(1, 2), nil, 0, nil, nil, 0},
		{"max shards a file, the rest waits", repeat(1, 12), nil, 0, nil, []span{{0, 5}, {5, 10}}, 10},
		{"target size closes a file", repeat(20, 8), nil, 0, nil, []span{{0, 5}}, 5},
		{"a large shard closes a run and is left alone", []int64{1, 1, 1, 1, 50, 1, 1, 1}, nil, 0, nil, []span{{0, 4}}, 5},
		{"a short run before a large shard is left alone", []int64{1, 1, 50, 1, 1, 1, 1, 1, 1}, nil, 0, nil, []span{{3, 8}}, 8},
		{"an older schema version is left alone", repeat(1, 9), []int{4}, 0, nil, []span{{0, 4}}, 5},
		{"from the last record on", repeat(1, 12), nil, 7, nil, []span{{7, 12}}, 12},
		{"a shard listed twice is never merged", repeat(1, 10), nil, 0, [][2]int{{6, 1}}, []span{{0, 5}}, 7},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			committed := shards(c.sizes, c.old...)
			for _, tw := range c.twice {
				committed[tw[0]].Path = committed[tw[1]].Path
			}
			plan, upto := planRanges(committed, c.from, cfg)
			var got []span
			for _, g := range plan {
				got = append(got, span{g.First, g.End})
				if g.FirstPath != committed[g.First].Path || g.LastPath != committed[g.End-1].Path {
					t.Errorf("range %v names %s..%s", g, g.FirstPath, g.LastPath)
				}
			}
			if !reflect.DeepEqual(got, c.plan) || upto != c.upto {
				t.Fatalf("plan %v upto %d, want %v upto %d", got, upto, c.plan, c.upto)
			}
		})
	}
}

func TestValid(t *testing.T) {
	committed := shards(repeat(1, 10))
	r := func(first, end int) Range {
		return Range{First: first, End: end, FirstPath: committed[first].Path, LastPath: committed[end-1].Path, File: fmt.Sprintf("w-%d-%d.parquet", first, end), SchemaVersion: schemas.SchemaVersion}
	}
	bad := r(4, 6)
	bad.LastPath = "policy=0/other.parquet"
	beyond := Range{First: 8, End: 12, FirstPath: committed[8].Path, File: "w-8-12.parquet"}
	path := r(6, 8)
	path.File = "../x.parquet"
	version := r(6, 8)
	version.SchemaVersion = "3"
	rec := &Record{Ranges: []Range{r(0, 2), r(1, 3), r(2, 4), bad, path, version, beyond}}
	ok, warnings := rec.Valid(committed)
	if len(ok) != 2 || ok[0].First != 0 || ok[1].First != 2 {
		t.Fatalf("valid ranges %+v, want 0-2 and 2-4", ok)
	}
	if len(warnings) != 5 {
		t.Fatalf("warnings %q, want one for each of the 5 others", warnings)
	}
	for i, want := range []string{"overlapping", "does not match", "not a plain Parquet file name", "another schema version", "beyond"} {
		if !strings.Contains(warnings[i], want) {
			t.Errorf("warning %d %q, want %q in it", i, warnings[i], want)
		}
	}
	var none *Record
	if ok, w := none.Valid(committed); ok != nil || w != nil {
		t.Fatal("no record: nothing")
	}
}

func TestFileEnd(t *testing.T) {
	for name, want := range map[string]int{
		"compact-20261202T100221Z-ee1b0af9-14-21.parquet": 21,
		"w-0-7.parquet":            7,
		"w-7-7.parquet":            -1,
		"w-x-7.parquet":            -1,
		"-0-7.parquet":             -1,
		"0-7.parquet":              -1,
		"w-0-7.json":               -1,
		"record-000000000001.json": -1,
	} {
		end, ok := fileEnd(name)
		if (want < 0) == ok || (ok && end != want) {
			t.Errorf("fileEnd(%q) = %d, %t; want %d", name, end, ok, want)
		}
	}
}
