// Package traintest writes committed shards for the tests of the packages
// that read them (train/flight, train/loop): real Parquet in a local
// store's manifest, as ingest would leave them, in a few lines.
package traintest

import (
	"context"
	"fmt"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// GroupID is the id of the ith group WriteShards writes (counting across
// shards from 0).
func GroupID(i int) string { return fmt.Sprintf("g%03d", i) }

// WriteShards commits shards shards of n one-row groups each under root
// (GroupID(0), GroupID(1), ... across them), every row with tokens prompt
// tokens; appended to whatever root's manifest already lists, continuing
// the group ids from first.
func WriteShards(t testing.TB, root string, shards, n, tokens int) {
	t.Helper()
	WriteShardsFrom(t, root, 0, shards, n, tokens)
}

// WriteShardsFrom is WriteShards with group ids starting at GroupID(first).
func WriteShardsFrom(t testing.TB, root string, first, shards, n, tokens int) {
	t.Helper()
	writeShards(t, root, first, shards, n, tokens, func(int) int64 { return 0 })
}

// WriteVersionedShards commits one shard of n one-row groups per version
// of versions, the groups of the ith at versions[i] (group ids across
// them as WriteShards'), every row with tokens prompt tokens.
func WriteVersionedShards(t testing.TB, root string, versions []int64, n, tokens int) {
	t.Helper()
	WriteVersionedShardsFrom(t, root, 0, versions, n, tokens)
}

// WriteVersionedShardsFrom is WriteVersionedShards with the group ids
// (and shard names) starting at first.
func WriteVersionedShardsFrom(t testing.TB, root string, first int, versions []int64, n, tokens int) {
	t.Helper()
	writeShards(t, root, first, len(versions), n, tokens, func(s int) int64 { return versions[s] })
}

func writeShards(t testing.TB, root string, first, shards, n, tokens int, version func(shard int) int64) {
	t.Helper()
	st, err := local.Open(root, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b := array.NewRecordBuilder(memory.DefaultAllocator, schemas.StepSchema)
	defer b.Release()
	for s := 0; s < shards; s++ {
		var keys []string
		for i := 0; i < n; i++ {
			keys = append(keys, GroupID(first+s*n+i))
			for f := 0; f < b.Schema().NumFields(); f++ {
				switch fb := b.Field(f).(type) {
				case *array.StringBuilder:
					if f == schemas.ColGroupID {
						fb.Append(keys[i])
					} else {
						fb.AppendNull()
					}
				case *array.Int64Builder:
					if f == schemas.ColGroupVersion || f == schemas.ColPolicyVersion {
						fb.Append(version(s))
					} else {
						fb.AppendEmptyValue()
					}
				case *array.ListBuilder:
					fb.Append(true)
					if vb, ok := fb.ValueBuilder().(*array.Int32Builder); ok && b.Schema().Field(f).Name == "prompt_ids" {
						vb.AppendValues(make([]int32, tokens), nil)
					}
				default:
					fb.AppendEmptyValue()
				}
			}
		}
		rec := b.NewRecordBatch()
		p, err := st.Create(context.Background(), fmt.Sprintf("part-%d.parquet", first+s*n))
		if err != nil {
			t.Fatal(err)
		}
		w, err := parquet.NewWriter(p, rec.Schema(), parquet.Options{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(rec); err != nil {
			t.Fatal(err)
		}
		rec.Release()
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := p.Commit(context.Background(), schemas.ShardEntry{Rows: int64(n), Groups: n, GroupKeys: keys, PolicyVersion: version(s)}); err != nil {
			t.Fatal(err)
		}
	}
}
