package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/merge"
)

// consumeLine is one batch in consume's JSON-lines output.
type consumeLine struct {
	BatchID   uint64   `json:"batch_id"`
	Groups    []string `json:"groups"`
	Rows      int64    `json:"rows"`
	Tokens    int64    `json:"tokens"`
	Oversized bool     `json:"oversized"`
	// Step places the batch in its trainer step (a step --max-tokens
	// split comes as several batches).
	Step train.StepPart `json:"step"`
	// With --layout trajectories: the merge's tallies.
	Layout string       `json:"layout,omitempty"`
	Merge  *merge.Stats `json:"merge,omitempty"`
}

func newConsumeCmd(soft context.Context) *cobra.Command {
	var (
		o          trainOpts
		format     string
		out        string
		maxBatches int
		noAck      bool
		statsJSON  string
	)
	cmd := &cobra.Command{
		Use:   "consume --from URL",
		Short: "Print token-budget batches; with --consumer-group, acknowledge them",
		Long: `consume prints the batches a trainer would get (--format jsonl: one
summary line per batch; --format arrow: the batches as an Arrow IPC
stream). Without --consumer-group it peeks: the batches of a private group
kept in memory, so nothing is acknowledged or written to the store and
every run prints the same. With --consumer-group NAME it is one member of
that group for shell use, and acknowledges each batch once written (as
serve's trainers do); with --no-ack too, it starts where the group is but
writes nothing to it. Without --follow it stops when every committed shard
is done.`,
		Example: `  # the first two batches of at most 32k tokens, read only
  rllm-pipe consume --from data --max-tokens 32000 --max-batches 2

  # consume as member "a" of the group "sft-run", acknowledging
  rllm-pipe consume --from data --consumer-group sft-run --name a --max-tokens 32000

  # batches as an Arrow IPC stream, for pyarrow.ipc.open_stream
  rllm-pipe consume --from data --format arrow --to batches.arrow`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			if format != "jsonl" && format != "arrow" {
				return usageErrorf("--format: jsonl or arrow")
			}
			if err := intIn("max-batches", maxBatches, 0, math.MaxInt32); err != nil {
				return err
			}
			if _, err := o.config("x"); err != nil {
				return err
			}
			o.readOnly = noAck
			// Before anything is opened: --out is truncated when created.
			if err := checkOutputFiles(cmd.Context(), []string{o.from}, "to", out, "stats-json", statsJSON, "cpuprofile", o.cpuProfile); err != nil {
				return err
			}
			if o.name == "" {
				o.name = defaultMemberName()
			}
			if err := train.CheckName("--name", o.name); err != nil {
				return usageErrorf("%v", err)
			}
			stopProfile, err := startCPUProfile(o.cpuProfile)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, stopProfile()) }()
			// An unreachable store is not waited for past a first signal.
			st, err := o.openShards(store.WithRetryStop(cmd.Context(), soft.Done()))
			if err != nil {
				return err
			}
			c, err := o.join(store.WithRetryStop(cmd.Context(), soft.Done()), st, o.name, memberAsk{})
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out != "" && out != "-" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			runErr := consumeLoop(soft, c, w, format, maxBatches, true)
			// Leaving releases the member's shards: retried while the store
			// is out, but not past a signal.
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			closeErr := c.Close(store.WithRetryStop(cctx, soft.Done()))
			stats := c.Stats()
			verb := "acknowledged"
			switch {
			case o.peek():
				verb = "peeked (no --consumer-group: nothing kept)"
			case noAck:
				verb = "peeked (--no-ack: nothing written to " + o.group + ")"
			}
			if !globals.Quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "consume: %d batches, %d groups %s, %d lost, %d stale and %d empty skipped, %d filtered rows, %d oversized, %d shards taken over\n",
					stats.Batches, stats.GroupsAcked, verb, stats.GroupsLost, stats.SkippedStale, stats.SkippedEmpty, stats.SkippedFiltered, stats.Oversized, stats.Takeovers)
			}
			if statsJSON != "" {
				data, _ := json.MarshalIndent(stats, "", "  ")
				if err := os.WriteFile(statsJSON, append(data, '\n'), 0o644); err != nil {
					return err
				}
			}
			if errors.Is(runErr, context.Canceled) && soft.Err() != nil {
				runErr = nil // stopped by a signal: a clean stop
			}
			return errors.Join(runErr, closeErr)
		},
	}
	f := cmd.Flags()
	o.register(f, false, "")
	// Never from the environment: RLLM_PIPE_CONSUMER_GROUP, set for serve,
	// would turn a read-only peek into a member that acknowledges.
	cli.NoEnv(f, "consumer-group")
	f.StringVar(&o.name, "name", "", "this member's stable name in the group (default host-pid); a restart under the same name resumes its shards at once")
	f.StringVar(&format, "format", "jsonl", "output: jsonl (a line per batch) or arrow (Arrow IPC stream)")
	f.StringVar(&out, "to", "-", "write to this file instead of stdout")
	cli.Rename(f, "out", "to")
	f.IntVar(&maxBatches, "max-batches", 0, "stop after this many batches (0: no limit)")
	f.BoolVar(&noAck, "no-ack", false, "with --consumer-group: peek at what the group delivers next, as a member that writes nothing to it (its leases and acknowledgements stay in memory)")
	f.StringVar(&statsJSON, "stats-json", "", "write the member's tallies as JSON to this file at the end")
	return cmd
}

// consumeLoop writes batches to w and acknowledges each once written and
// flushed.
func consumeLoop(ctx context.Context, c *train.Consumer, w io.Writer, format string, maxBatches int, ack bool) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	var iw *ipc.Writer
	defer func() {
		if iw != nil {
			iw.Close()
		}
		bw.Flush()
	}()
	enc := json.NewEncoder(bw)
	for n := 0; maxBatches == 0 || n < maxBatches; n++ {
		d, err := c.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		line := consumeLine{BatchID: d.ID, Groups: d.Groups, Rows: d.Record.NumRows(), Tokens: d.Tokens, Oversized: d.Oversized, Merge: d.Merge, Step: d.StepPart}
		if d.Merge != nil {
			line.Layout = "trajectories"
		}
		if format == "arrow" {
			if iw == nil {
				iw = ipc.NewWriter(bw, ipc.WithSchema(d.Record.Schema()))
			}
			err = iw.Write(d.Record)
		} else {
			err = enc.Encode(line)
		}
		d.Record.Release()
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			return err
		}
		if !ack {
			continue
		}
		// Written and flushed before it is acknowledged: a crash between the
		// two delivers the batch again, never loses it.
		if _, err := c.Ack(ctx, d.ID); err != nil {
			if !errors.Is(err, train.ErrLeaseLost) {
				return err
			}
			slog.Warn("consume: acknowledgement refused; the batch goes to another member", "batch_id", d.ID, "err", err)
		}
	}
	return nil
}
