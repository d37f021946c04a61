// Command rllm-pipe is the data backbone between RL rollout workers and
// trainers: it ingests Step and Trajectory records, assembles complete
// groups, computes advantages and commits Parquet shards.
//
// This package is cobra wiring only; it is the one package that imports
// every stage.
package main

import (
	"context"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
)

// The exit codes, and the error that carries one (cmd/internal/cli).
const (
	exitOK      = cli.ExitOK
	exitFailure = cli.ExitFailure
	exitUsage   = cli.ExitUsage
	exitStopped = cli.ExitStopped
)

type exitError = cli.ExitError

var usageErrorf = cli.UsageErrorf

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit code. The first
// SIGINT or SIGTERM asks for a soft stop (stop reading, commit what is
// assembled); a second one cancels at once.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return cli.Run(ctx, "rllm-pipe", newRoot, args, stdout, stderr)
}

// globals are the flags every command takes (--quiet, --log-format).
var globals cli.Globals

// progressTo is w, or nil (no progress shown) with --quiet.
func progressTo(w io.Writer) io.Writer {
	if globals.Quiet {
		return nil
	}
	return w
}

func newRoot(soft context.Context) *cobra.Command {
	root := &cobra.Command{
		Use:   "rllm-pipe",
		Short: "Data backbone between RL rollout workers and trainers",
		Long: `rllm-pipe records agents' LLM calls (gateway), assembles complete groups of
trajectories with their advantages (ingest), commits them exactly once as
Parquet shards to a folder or S3, and serves them to trainers in
token-budget batches (serve, consume), to SQL (sql, report, ui), to
datasets (export) and to Iceberg tables (iceberg).

Every flag can also be set in the environment as RLLM_PIPE_<FLAG>
(RLLM_PIPE_GROUP_SIZE for --group-size); a flag given wins.`,
		Example: `  rllm-pipe gen --groups 200 --to traces.jsonl
  rllm-pipe ingest --from traces.jsonl --to data
  rllm-pipe consume --from data --max-tokens 32000 --max-batches 2
  rllm-pipe sql --from data --report reward-by-version`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cli.Setup(root, &globals)
	root.AddCommand(newIngestCmd(soft), newGenCmd(), newSummaryCmd(), newProduceCmd(), newServeCmd(soft), newConsumeCmd(soft), newExportCmd(soft), newSQLCmd(soft))
	root.AddCommand(newImportCmd())
	root.AddCommand(newGatewayCmd(soft))
	root.AddCommand(newReportCmd(soft))
	root.AddCommand(newUICmd(soft))
	root.AddCommand(newReplayCmd(soft))
	root.AddCommand(newCompactCmd(soft))
	root.AddCommand(newIcebergCmd(soft))
	root.AddCommand(newPublishVersionCmd(soft))
	addExamples(root)
	cli.RejectUnknownSubcommands(root)
	return root
}
