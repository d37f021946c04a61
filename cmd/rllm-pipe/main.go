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

func newRoot(soft context.Context) *cobra.Command {
	root := &cobra.Command{
		Use:           "rllm-pipe",
		Short:         "Data backbone between RL rollout workers and trainers",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return cli.ApplyEnv(cmd.Flags())
		},
	}
	root.AddCommand(newIngestCmd(soft), newGenCmd(), newSummaryCmd(), newProduceCmd(), newServeCmd(soft), newConsumeCmd(soft), newExportCmd(soft), newSQLCmd(soft))
	root.AddCommand(newImportCmd())
	root.AddCommand(newGatewayCmd(soft))
	root.AddCommand(newReportCmd(soft))
	root.AddCommand(newUICmd(soft))
	root.AddCommand(newReplayCmd(soft))
	root.AddCommand(newCompactCmd(soft))
	root.AddCommand(newIcebergCmd(soft))
	root.AddCommand(newPublishVersionCmd(soft))
	return root
}
