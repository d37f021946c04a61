// Command rllm-pipe is the data backbone between RL rollout workers and
// trainers: it ingests Step and Trajectory records, assembles complete
// groups, computes advantages and commits Parquet shards.
//
// This package is cobra wiring only; it is the one package that imports
// every stage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rllm-pipe/rllm-pipe/connectors/duckdb"
)

// Exit codes: 0 also after a clean stop (the first signal: everything
// read was committed, or is left to a rerun that reads it again).
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
	// exitStopped: a signal stopped the command before it could finish
	// cleanly (a second signal, or a first one while a store or broker was
	// unreachable): what was committed is whole, a rerun resumes the rest.
	exitStopped = 3
)

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// abortGrace is how long a second signal waits for the command to end
// before the process exits anyway (long enough for an aborted stdin run
// to write its spill file).
const abortGrace = time.Minute

// run executes the command line args and returns the exit code. The first
// SIGINT or SIGTERM asks for a soft stop (stop reading, commit what is
// assembled); a second one cancels at once.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	hard, cancelHard := context.WithCancel(ctx)
	defer cancelHard()
	soft, cancelSoft := context.WithCancel(hard)
	defer cancelSoft()
	returned := make(chan struct{})
	defer close(returned)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		select {
		case <-sigs:
		case <-hard.Done():
			return
		}
		fmt.Fprintln(stderr, "rllm-pipe: stopping cleanly: finishing what is in hand (signal again to abort)")
		cancelSoft()
		select {
		case <-sigs:
			fmt.Fprintln(stderr, "rllm-pipe: aborting")
			cancelHard()
		case <-hard.Done():
			return
		}
		// Every command ends soon after the abort; one that does not (a
		// call blocked where nothing interrupts it) is not waited for:
		// what was committed is whole wherever a run stops.
		select {
		case <-time.After(abortGrace):
			fmt.Fprintf(stderr, "rllm-pipe: still running %s after the abort; exiting\n", abortGrace)
			os.Exit(exitStopped)
		case <-returned:
		}
	}()

	root := newRoot(soft)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(hard)
	if err == nil {
		return exitOK
	}
	// An error may quote data (a record id in a DuckDB error, a path):
	// control characters are escaped, so none reaches the terminal.
	fmt.Fprintf(stderr, "rllm-pipe: %s\n", duckdb.TerminalSafe(err.Error()))
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	if soft.Err() != nil {
		fmt.Fprintln(stderr, "rllm-pipe: stopped before finishing: what was committed is whole; run again to resume")
		return exitStopped
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") ||
		strings.Contains(err.Error(), "flag needs an argument") || strings.Contains(err.Error(), "invalid argument") ||
		strings.Contains(err.Error(), "required flag") {
		return exitUsage
	}
	return exitFailure
}

func newRoot(soft context.Context) *cobra.Command {
	root := &cobra.Command{
		Use:           "rllm-pipe",
		Short:         "Data backbone between RL rollout workers and trainers",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd.Flags())
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

// applyEnv sets every flag not given on the command line from its RLLM_*
// variable (--group-size from RLLM_GROUP_SIZE): flag beats env beats
// default.
func applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed {
			return
		}
		name := "RLLM_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = usageErrorf("%s: %v", name, serr)
			}
		}
	})
	return err
}
