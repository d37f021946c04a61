package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"sort"
	"text/tabwriter"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

func newSummaryCmd() *cobra.Command {
	var from string
	cmd := &cobra.Command{
		Use:   "summary --from DIR",
		Short: "Print groups, steps, tokens, reward and advantage by policy version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			root, err := localPath("from", from)
			if err != nil {
				return err
			}
			return summarize(cmd.Context(), root, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "output root of ingest: file:///path or a path")
	return cmd
}

type versionSummary struct {
	groups               map[string]struct{}
	partial              map[string]struct{}
	trajs, steps         int64
	promptToks, respToks int64
	rewardSum            float64
	advSum, advSq        float64
	advMin, advMax       float64
}

// summarize reads the committed shards listed in the manifest, projecting
// only the columns it reports on.
func summarize(ctx context.Context, root string, w io.Writer) error {
	all, err := local.ReadManifest(root)
	if err != nil {
		return err
	}
	var entries []schemas.ShardEntry
	for _, e := range all {
		if e.Path != "" { // checkpoints settle dead letters and list no shard
			entries = append(entries, e)
		}
	}
	if len(entries) == 0 {
		return fmt.Errorf("summary: no committed shards under %s", root)
	}
	by := map[int64]*versionSummary{}
	cols := []string{"group_id", "group_version", "step_index", "prompt_ids", "response_ids", "reward", "advantage", "partial"}
	for _, e := range entries {
		err := parquet.ReadFile(ctx, filepath.Join(root, filepath.FromSlash(e.Path)), cols, memory.DefaultAllocator, func(rec arrow.RecordBatch) error {
			gid := rec.Column(0).(*array.String)
			ver := rec.Column(1).(*array.Int64)
			idx := rec.Column(2).(*array.Int32)
			prompt := rec.Column(3).(*array.List)
			resp := rec.Column(4).(*array.List)
			rew := rec.Column(5).(*array.Float64)
			adv := rec.Column(6).(*array.Float64)
			part := rec.Column(7).(*array.Boolean)
			for i := 0; i < int(rec.NumRows()); i++ {
				v := ver.Value(i)
				s := by[v]
				if s == nil {
					s = &versionSummary{groups: map[string]struct{}{}, partial: map[string]struct{}{}, advMin: math.Inf(1), advMax: math.Inf(-1)}
					by[v] = s
				}
				g := gid.Value(i)
				s.groups[g] = struct{}{}
				if part.Value(i) {
					s.partial[g] = struct{}{}
				}
				s.steps++
				ps, pe := prompt.ValueOffsets(i)
				rs, re := resp.ValueOffsets(i)
				s.promptToks += pe - ps
				s.respToks += re - rs
				if idx.Value(i) == 0 {
					a := adv.Value(i)
					s.trajs++
					s.rewardSum += rew.Value(i)
					s.advSum += a
					s.advSq += a * a
					s.advMin = min(s.advMin, a)
					s.advMax = max(s.advMax, a)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	versions := make([]int64, 0, len(by))
	for v := range by {
		versions = append(versions, v)
	}
	sort.Slice(versions, func(i, j int) bool { return versions[i] < versions[j] })
	fmt.Fprintf(w, "%d committed shards under %s\n\n", len(entries), root)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tgroups\tpartial\ttrajectories\tsteps\tprompt tokens\tresponse tokens\tmean reward\tmean adv\tstd adv\tmin adv\tmax adv\t")
	var tot versionSummary
	tot.groups = map[string]struct{}{}
	tot.partial = map[string]struct{}{}
	for _, v := range versions {
		s := by[v]
		n := float64(s.trajs)
		mean := s.advSum / n
		std := math.Sqrt(max(s.advSq/n-mean*mean, 0))
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.4f\t%.2e\t%.4f\t%.4f\t%.4f\t\n",
			v, len(s.groups), len(s.partial), s.trajs, s.steps, s.promptToks, s.respToks, s.rewardSum/n, mean, std, s.advMin, s.advMax)
		tot.trajs += s.trajs
		tot.steps += s.steps
		tot.promptToks += s.promptToks
		tot.respToks += s.respToks
		tot.rewardSum += s.rewardSum
		for g := range s.groups {
			tot.groups[g] = struct{}{}
		}
		for g := range s.partial {
			tot.partial[g] = struct{}{}
		}
	}
	fmt.Fprintf(tw, "all\t%d\t%d\t%d\t%d\t%d\t%d\t%.4f\t\t\t\t\t\n", len(tot.groups), len(tot.partial), tot.trajs, tot.steps, tot.promptToks, tot.respToks, tot.rewardSum/float64(tot.trajs))
	return tw.Flush()
}
