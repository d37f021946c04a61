package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/train"
)

// replayOpts are the flags of `rllm-pipe replay`.
type replayOpts struct {
	from, group, as string
	layout          string
	includeFiltered bool
	conn            connFlags
}

// replaySummary is replay's one line of output.
type replaySummary struct {
	From    string `json:"from"`
	As      string `json:"as"`
	Batches int    `json:"batches"`
	Groups  int    `json:"groups"`
	// Layout and IncludeFiltered are the row settings the replay delivers
	// with; Original the ones G's members joined with (none recorded for
	// a group consumed before they were).
	Layout          string              `json:"layout"`
	IncludeFiltered bool                `json:"include_filtered"`
	Original        []train.RowSettings `json:"original"`
}

func newReplayCmd(soft context.Context) *cobra.Command {
	var o replayOpts
	cmd := &cobra.Command{
		Use:   "replay --from URL --consumer-group G --to NEW",
		Short: "Create a consumer group that receives exactly another group's batches",
		Long: `replay reads what consumer group G acknowledged (its audit: every batch, in
the order of acknowledgement, with its groups in batch order; the same rows
as the "consumed" view of sql) and creates consumer group NEW as a replay
of it. Members of NEW (consume or serve with --consumer-group NEW) then
receive exactly those batches, in the same order and composition, and
acknowledge them like any group: several members share them (each takes
the next batch in order, and none takes a batch while another member holds
an earlier one unacknowledged), a member that leaves holding a batch gives
it back to the front of the order, a restart under the same --name resumes
with the batch it held, and a batch held by a member that never comes back
goes to another member after the lease timeout (the group waits for it).
--max-tokens and --max-staleness do not apply to a replay (they shaped the
original). The rows are those of the original: every member records its
--layout and --include-filtered in its group's folder, the replay takes
them (or those given to replay, to deliver the same groups as other rows),
and a member of NEW joining with other ones is refused. A group consumed
with several settings, or before they were recorded, needs them given.
--batch-estimator (re-train with another estimator) applies as the members
of NEW set it.

Running replay again with the same G and NEW is harmless; NEW must not
exist otherwise. It prints one JSON line: the batches and groups planned.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runReplay(soft, o, cmd)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	f.StringVar(&o.group, "consumer-group", "", "the consumer group to replay")
	f.StringVar(&o.as, "to", "", "the new consumer group")
	cli.Rename(f, "as", "to")
	f.StringVar(&o.layout, "layout", "", "rows of the replay: steps or trajectories (default: the original's)")
	f.BoolVar(&o.includeFiltered, "include-filtered", false, "deliver rows a filter marked (default: as the original)")
	o.conn.register(f)
	return cmd
}

// replayRows decides the row settings of the replay: those given, else
// the one set the original's members recorded.
func replayRows(o replayOpts, cmd *cobra.Command, original []train.RowSettings) (train.RowSettings, error) {
	flags := cmd.Flags()
	var rows train.RowSettings
	switch {
	case len(original) == 1:
		rows = original[0]
	case flags.Changed("layout") && flags.Changed("include-filtered"):
	case len(original) == 0:
		return rows, usageErrorf("consumer group %s recorded no --layout/--include-filtered (consumed before they were recorded): give both to replay", o.group)
	default:
		return rows, usageErrorf("consumer group %s was consumed with several row settings (%v): give --layout and --include-filtered to replay", o.group, original)
	}
	if flags.Changed("layout") {
		l, err := train.ParseLayout(o.layout)
		if err != nil {
			return rows, usageErrorf("--layout: %v", err)
		}
		rows.Layout = l.String()
	}
	if flags.Changed("include-filtered") {
		rows.IncludeFiltered = o.includeFiltered
	}
	return rows, nil
}

func runReplay(ctx context.Context, o replayOpts, cmd *cobra.Command) error {
	if o.from == "" || o.group == "" || o.as == "" {
		return usageErrorf("--from, --consumer-group and --to are required")
	}
	if err := train.CheckName("--consumer-group", o.group); err != nil {
		return usageErrorf("%v", err)
	}
	if err := train.CheckName("--to", o.as); err != nil {
		return usageErrorf("%v", err)
	}
	if o.group == o.as {
		return usageErrorf("--to must name another consumer group than --consumer-group")
	}
	st, err := openShardStore(ctx, o.from, o.conn)
	if err != nil {
		return err
	}
	defer st.Close()
	src, err := st.Objects(train.GroupDir(o.group))
	if err != nil {
		return err
	}
	batches, err := train.ReadConsumed(ctx, src)
	if err != nil {
		return fmt.Errorf("consumer group %s: %w", o.group, err)
	}
	if len(batches) == 0 {
		return usageErrorf("consumer group %s has acknowledged no batch in %s: nothing to replay", o.group, st.Name())
	}
	original, err := train.ReadRowSettings(ctx, src)
	if err != nil {
		return fmt.Errorf("consumer group %s: %w", o.group, err)
	}
	rows, err := replayRows(o, cmd, original)
	if err != nil {
		return err
	}
	dst, err := st.Objects(train.GroupDir(o.as))
	if err != nil {
		return err
	}
	if err := train.CreateReplay(ctx, dst, train.ReplayPlan{From: o.group, Rows: &rows, Batches: batches}); err != nil {
		if errors.Is(err, train.ErrReplayExists) {
			return usageErrorf("--as %s: %v", o.as, err)
		}
		return err
	}
	sum := replaySummary{From: o.group, As: o.as, Batches: len(batches), Layout: rows.Layout, IncludeFiltered: rows.IncludeFiltered, Original: original}
	if sum.Original == nil {
		sum.Original = []train.RowSettings{}
	}
	for _, b := range batches {
		sum.Groups += len(b.Groups)
	}
	return json.NewEncoder(cmd.OutOrStdout()).Encode(sum)
}
