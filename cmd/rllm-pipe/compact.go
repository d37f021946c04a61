package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors"
	"github.com/rllm-pipe/rllm-pipe/connectors/compact"
)

type compactOpts struct {
	to        string
	target    string
	minShards int
	maxShards int
	every     time.Duration
	quiet     bool
	conn      connFlags
}

func newCompactCmd(soft context.Context) *cobra.Command {
	var o compactOpts
	cmd := &cobra.Command{
		Use:   "compact --from URL",
		Short: "Merge small committed shards into larger files for sql, report and ui",
		Long: `compact merges runs of small committed shards into files of about
--target-size, which sql, report and ui then read instead of the shards: a
long run's thousands of commits become a few files to open. The manifest and
the shards are not touched (consumer groups, exports and ingest read them as
before), so it can run at any time, beside a running ingest too; what it adds
lives in the root's _compact folder. Each run continues where the last one
stopped; a run of shards still shorter than --min-shards waits for more.
With --every it runs again at that interval until stopped (SIGINT, SIGTERM),
which is how a long run keeps its views quick to open.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCompact(soft, cmd, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.to, "from", "", "the shard root to compact: a path, file:///path or s3://bucket/prefix")
	cli.Rename(f, "to", "from")
	f.StringVar(&o.target, "target-size", "64MiB", "size of a merged file; shards of a quarter of it or more are left alone")
	f.IntVar(&o.minShards, "min-shards", 16, "fewest shards merged into one file")
	f.IntVar(&o.maxShards, "max-shards", 1024, "most shards merged into one file")
	f.DurationVar(&o.every, "every", 0, "run again at this interval until stopped (0: once)")
	f.BoolVar(&o.quiet, "quiet", false, "no summary on stderr")
	o.conn.register(f)
	return cmd
}

// maxTarget bounds --target-size: a merged file is built in memory.
const maxTarget = 256 << 20

func runCompact(soft context.Context, cmd *cobra.Command, o compactOpts) error {
	target, err := parseBytes(o.target)
	if err != nil || target <= 0 || target > maxTarget {
		return usageErrorf("--target-size %q: a size up to %s (64MiB, 256MiB, ...)", o.target, formatBytes(maxTarget))
	}
	if o.minShards < 2 || o.maxShards < o.minShards {
		return usageErrorf("--min-shards must be at least 2 and --max-shards at least --min-shards")
	}
	if o.every < 0 {
		return usageErrorf("--every %s: not negative", o.every)
	}
	if err := o.conn.check(); err != nil {
		return err
	}
	root, err := connectors.ParseRoot(o.to, o.conn.options())
	if err != nil {
		return usageErrorf("--from: %v", err)
	}
	ctx := cmd.Context()
	writer := "compact-" + newRunID()
	r, err := connectors.OpenReader(ctx, root, writer)
	if err != nil {
		return err
	}
	defer r.Close()
	cfg := compact.Config{Writer: writer, TargetBytes: target, MinShards: o.minShards, MaxShards: o.maxShards}
	return compact.Every(ctx, r, cfg, o.every, soft.Done(), func(st compact.Stats, took time.Duration, err error) {
		switch {
		case err != nil:
			fmt.Fprintf(cmd.ErrOrStderr(), "compact: %v; again in %s\n", err, o.every)
		case !o.quiet:
			printCompact(cmd.ErrOrStderr(), st, took)
		}
	})
}

func printCompact(w io.Writer, st compact.Stats, took time.Duration) {
	switch {
	case st.Record == nil:
		fmt.Fprintf(w, "compact: nothing to merge")
	case st.Files == 0:
		fmt.Fprintf(w, "compact: nothing to merge (looked up to shard %d)", st.Record.Upto)
	default:
		fmt.Fprintf(w, "compact: %d shards (%d rows) merged into %d files (%.1f MB) in %.1fs; %d merged files in all",
			st.Shards, st.Rows, st.Files, float64(st.Bytes)/1e6, took.Seconds(), len(st.Record.Ranges))
	}
	if st.Removed > 0 {
		fmt.Fprintf(w, "; %d leftover files removed", st.Removed)
	}
	fmt.Fprintln(w)
	for _, why := range st.Skipped {
		fmt.Fprintf(w, "compact: left alone (read from the shards): %s\n", why)
	}
}
