package train

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// writeShards commits n groups of two one-step trajectories (8 tokens a
// group) with group versions g%4, rewards (g%3, 0), and marks trajectory
// t1 of every fifth group as truncated; it returns the shard paths.
func writeShards(t *testing.T, n int) []string {
	t.Helper()
	root := t.TempDir()
	return writeShardsTo(t, root, 0, n)
}

// writeShardsTo commits groups first..first+n-1 under root (appending to
// its manifest) and returns all shard paths there.
func writeShardsTo(t *testing.T, root string, first, n int) []string {
	t.Helper()
	st, err := local.Open(root, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var paths []string
	for _, rel := range writeShardsInto(t, st, first, n) {
		paths = append(paths, filepath.Join(root, rel))
	}
	return paths
}

// writeShardsInto commits groups first..first+n-1 (as writeShardsTo) into
// st and returns the paths of every shard st lists.
func writeShardsInto(t *testing.T, st store.Store, first, n int) []string {
	t.Helper()
	a := transform.NewAssembler(transform.Config{GroupSize: 2})
	var d ingest.Decoder
	line := int64(0)
	for g := first; g < first+n; g++ {
		for tr := 0; tr < 2; tr++ {
			finish := "stop"
			if g%5 == 0 && tr == 1 {
				finish = "length"
			}
			reward := 0
			if tr == 0 {
				reward = g % 3
			}
			for _, l := range []string{
				fmt.Sprintf(`{"type":"step","step_id":"g%d-t%d","task_id":"g%d","trajectory_id":"g%d-t%d","step_index":0,"policy_version":%d,"prompt_ids":[1,2,3],"response_ids":[4],"response_logprobs":[-1],"finish_reason":%q}`, g, tr, g, g, tr, g%4, finish),
				fmt.Sprintf(`{"type":"trajectory","trajectory_id":"g%d-t%d","task_id":"g%d","reward":%d,"num_steps":1}`, g, tr, g, reward),
			} {
				line++
				rec, err := d.Decode([]byte(l))
				if err != nil {
					t.Fatal(err)
				}
				a.Add(&ingest.Item{Source: schemas.Source{File: "in", Line: line}, Raw: []byte(l), Rec: rec}, time.Now())
			}
		}
	}
	filters, _ := transform.ParseFilters("truncated")
	est, _ := advantage.New("grpo", advantage.Options{})
	bt := transform.NewBatcher(memory.DefaultAllocator, transform.BatchConfig{Estimator: est, Filters: filters})
	defer bt.Release()
	batches, err := bt.Build(a.Take().Groups)
	if err != nil {
		t.Fatal(err)
	}
	sk := sink.New(st, sink.Config{RunID: fmt.Sprintf("r%d", first), ShardSize: 2 << 10}) // small shards: groups straddle reader batches and files
	for _, b := range batches {
		if err := sk.Write(context.Background(), b, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := sk.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range committedEntries(t, st) {
		if e.Path != "" {
			paths = append(paths, e.Path)
		}
	}
	return paths
}

func TestReaderBatchesWholeGroupsWithinBudget(t *testing.T) {
	paths := writeShards(t, 200)
	if len(paths) < 3 {
		t.Fatalf("want several shards, got %d", len(paths))
	}
	for _, tc := range []struct {
		name       string
		cfg        Config
		groups     int64
		stale      int64
		filtered   int64
		rowsPerGrp int
	}{
		{"budget 20 tokens", Config{MaxStaleness: -1, MaxTokens: 20, IncludeFiltered: true}, 200, 0, 0, 2},
		{"staleness 1 at version 3", Config{PolicyVersion: 3, MaxStaleness: 1, MaxTokens: 64, IncludeFiltered: true}, 100, 100, 0, 2},
		{"filtered rows skipped", Config{MaxStaleness: -1, MaxTokens: 64}, 200, 0, 40, 0},
		{"budget below a group", Config{MaxStaleness: -1, MaxTokens: 5, IncludeFiltered: true}, 200, 0, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
			defer mem.AssertSize(t, 0)
			tc.cfg.Allocator = mem
			r := NewReader(tc.cfg)
			seen := map[string]int{}
			err := r.ReadShards(context.Background(), paths, func(b Batch) error {
				defer b.Record.Release()
				if tc.cfg.MaxTokens > 0 && b.Tokens > tc.cfg.MaxTokens && !(b.Oversized && len(b.Groups) == 1) {
					t.Errorf("batch of %d tokens over the budget %d (%d groups)", b.Tokens, tc.cfg.MaxTokens, len(b.Groups))
				}
				gid := b.Record.Column(schemas.ColGroupID).(*array.String)
				ver := b.Record.Column(schemas.ColGroupVersion).(*array.Int64)
				rows := map[string]int{}
				for i := 0; i < int(b.Record.NumRows()); i++ {
					rows[gid.Value(i)]++
					if tc.cfg.MaxStaleness >= 0 && tc.cfg.PolicyVersion-ver.Value(i) > tc.cfg.MaxStaleness {
						t.Errorf("stale row of %s (version %d)", gid.Value(i), ver.Value(i))
					}
				}
				for _, g := range b.Groups {
					seen[g]++
					if tc.rowsPerGrp > 0 && rows[g] != tc.rowsPerGrp {
						t.Errorf("group %s split: %d rows in the batch", g, rows[g])
					}
				}
				if len(rows) != len(b.Groups) {
					t.Errorf("batch lists %d groups, holds %d", len(b.Groups), len(rows))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			for g, n := range seen {
				if n != 1 {
					t.Errorf("group %s delivered %d times", g, n)
				}
			}
			c := r.Counters
			if int64(len(seen)) != tc.groups || c.Groups != tc.groups || c.SkippedStale != tc.stale || c.SkippedFiltered != tc.filtered {
				t.Errorf("groups %d (counted %d), stale %d, filtered %d; want %d, %d, %d", len(seen), c.Groups, c.SkippedStale, c.SkippedFiltered, tc.groups, tc.stale, tc.filtered)
			}
			if tc.cfg.MaxTokens == 5 && c.Oversized != c.Batches {
				t.Errorf("every batch is one oversized group: %d of %d", c.Oversized, c.Batches)
			}
		})
	}
}

func TestReaderAppliesBatchEstimator(t *testing.T) {
	paths := writeShards(t, 30)
	est, err := advantage.NewBatch("batch_std", advantage.Options{Compat: advantage.TRL})
	if err != nil {
		t.Fatal(err)
	}
	r := NewReader(Config{MaxStaleness: -1, MaxTokens: 1 << 20, IncludeFiltered: true, Batch: est})
	batches := 0
	err = r.ReadShards(context.Background(), paths, func(b Batch) error {
		defer b.Record.Release()
		batches++
		// Independent computation: (r − group mean)/(sample std of all
		// rewards in the batch + 1e-4), one trajectory per row here.
		rew := b.Record.Column(schemas.ColReward).(*array.Float64).Float64Values()
		adv := b.Record.Column(schemas.ColAdvantage).(*array.Float64).Float64Values()
		gid := b.Record.Column(schemas.ColGroupID).(*array.String)
		mean := 0.0
		for _, v := range rew {
			mean += v / float64(len(rew))
		}
		ss := 0.0
		for _, v := range rew {
			ss += (v - mean) * (v - mean)
		}
		std := math.Sqrt(ss / float64(len(rew)-1))
		for i := 0; i < len(rew); i += 2 {
			if gid.Value(i) != gid.Value(i+1) {
				t.Fatalf("rows %d,%d not one group", i, i+1)
			}
			gm := (rew[i] + rew[i+1]) / 2
			for _, k := range []int{i, i + 1} {
				want := (rew[k] - gm) / (std + 1e-4)
				if math.Abs(adv[k]-want) > 1e-9 {
					t.Fatalf("row %d: advantage %v, want %v", k, adv[k], want)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if batches != 1 {
		t.Fatalf("%d batches, want 1", batches)
	}
}

func committedEntries(t testing.TB, st store.Reader) []schemas.ShardEntry {
	t.Helper()
	e, err := st.Committed(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return e
}
