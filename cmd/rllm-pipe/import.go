package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/ingest/rllmdata"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
)

func newImportCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Turn other frameworks' data into wire-format JSON lines (for ingest --from)",
	}
	cmd.AddCommand(newImportRLLMCmd())
	return cmd
}

type importOpts struct {
	from, to, dlq, rewards string
	policyVersion          int64
	groupSize              int64
	quiet                  bool
}

func newImportRLLMCmd() *cobra.Command {
	var o importOpts
	cmd := &cobra.Command{
		Use:   "rllm --from PATH --to FILE|-",
		Short: "rLLM's gateway trace store or eval episodes as wire-format JSON lines",
		Long: `Reads what rLLM leaves on disk and writes wire-format JSON lines that
` + "`rllm-pipe ingest --from`" + ` reads:

  rllm-pipe import rllm --from ~/.rllm/gateway_traces.db --rewards rewards.jsonl --to - |
    rllm-pipe ingest --from - --to ./data

PATH is the model gateway's SQLite trace store (one step per captured
call; sessions {task_id}:{rollout_idx} are trajectories, scored by
--rewards: JSON lines {"session_id":..., "reward":..., "is_correct":...,
"termination_reason":..., "signals":{...}}), or an ` + "`rllm eval`" + ` run
directory (its episodes/episode_*.json), a folder of episode JSON files,
or one such file. Records the pipeline would reject (a null logprob entry,
fewer logprobs than tokens, no policy version, no reward) are not written:
they are dead letters, counted by reason in the summary on stderr and
written to --dlq when given. The input is only read.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := o.check(cmd)
			if err != nil {
				return err
			}
			return runImportRLLM(cmd.Context(), o, opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "the gateway's SQLite trace store, an rllm eval run directory, a folder of episode JSON files, or one")
	f.StringVar(&o.to, "to", "-", "output file of wire-format JSON lines (- for stdout)")
	f.StringVar(&o.dlq, "dlq", "", "write dead letters (JSON lines: reason, error, source, record) to this file")
	f.StringVar(&o.rewards, "rewards", "", "JSON lines of outcomes by session_id, episode_id, trajectory_id or id (for traces, which have none, and null rewards)")
	f.Int64Var(&o.policyVersion, "policy-version", 0, "policy version of steps whose data has none (without it such steps are dead letters)")
	f.Int64Var(&o.groupSize, "group-size", 0, "group_size written on every trajectory record (0: leave it to ingest's --group-size)")
	f.BoolVar(&o.quiet, "quiet", false, "no summary")
	return cmd
}

// check validates the flags and builds the import options.
func (o *importOpts) check(cmd *cobra.Command) (rllmdata.Options, error) {
	var opts rllmdata.Options
	if o.from == "" {
		return opts, usageErrorf("--from is required")
	}
	from, err := localPath("from", o.from)
	if err != nil {
		return opts, err
	}
	if from == "-" {
		return opts, usageErrorf("--from must be a file or directory, not stdin")
	}
	o.from = from
	if o.to, err = localPath("to", o.to); err != nil {
		return opts, err
	}
	if o.dlq != "" {
		if o.dlq, err = localPath("dlq", o.dlq); err != nil {
			return opts, err
		}
		if o.dlq == "-" {
			return opts, usageErrorf("--dlq must be a file (stdout carries the records)")
		}
	}
	if cmd.Flags().Changed("policy-version") {
		if err := train.CheckPolicyVersion(o.policyVersion); err != nil {
			return opts, usageErrorf("--policy-version: %v", err)
		}
		opts.PolicyVersion, opts.HasPolicyVersion = o.policyVersion, true
	}
	if o.groupSize < 0 || o.groupSize > 1<<31-1 {
		return opts, usageErrorf("--group-size %d: want 0 (unset) to 2147483647", o.groupSize)
	}
	opts.GroupSize = o.groupSize
	if o.rewards != "" {
		path, err := localPath("rewards", o.rewards)
		if err != nil {
			return opts, err
		}
		f, err := os.Open(path)
		if err != nil {
			return opts, usageErrorf("--rewards: %v", err)
		}
		defer f.Close()
		if opts.Rewards, err = rllmdata.ReadRewards(f); err != nil {
			return opts, usageErrorf("--rewards %s: %v", o.rewards, err)
		}
	}
	return opts, nil
}

// importSink writes records and dead letters as JSON lines.
type importSink struct {
	out, dlq *bufio.Writer
	first    []string // the first dead letters' errors, for the summary
}

func (s *importSink) Record(_ string, line []byte) error {
	if _, err := s.out.Write(line); err != nil {
		return err
	}
	return s.out.WriteByte('\n')
}

func (s *importSink) DeadLetter(d schemas.DeadLetter) error {
	if len(s.first) < 5 {
		s.first = append(s.first, string(d.Reason)+": "+d.Error)
	}
	if s.dlq == nil {
		return nil
	}
	b, err := json.Marshal(d.Line())
	if err != nil {
		return err
	}
	if _, err := s.dlq.Write(b); err != nil {
		return err
	}
	return s.dlq.WriteByte('\n')
}

// createOutput opens path for writing ("-": w).
func createOutput(path string, w io.Writer) (*bufio.Writer, func() error, error) {
	if path == "-" {
		return bufio.NewWriterSize(w, 1<<20), func() error { return nil }, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, nil, err
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, err
	}
	return bufio.NewWriterSize(f, 1<<20), f.Close, nil
}

func runImportRLLM(ctx context.Context, o importOpts, opts rllmdata.Options, stdout, stderr io.Writer) error {
	kind, err := importKind(o.from)
	if err != nil {
		return usageErrorf("--from: %v", err)
	}
	out, closeOut, err := createOutput(o.to, stdout)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	sink := &importSink{out: out}
	closeDLQ := func() error { return nil }
	if o.dlq != "" {
		if sink.dlq, closeDLQ, err = createOutput(o.dlq, stdout); err != nil {
			return errors.Join(fmt.Errorf("import: %w", err), closeOut())
		}
	}
	var sum rllmdata.Summary
	if kind == "traces" {
		sum, err = rllmdata.ImportTraces(ctx, o.from, opts, sink)
	} else {
		sum, err = rllmdata.ImportEpisodes(ctx, o.from, opts, sink)
	}
	flushErr := out.Flush()
	if sink.dlq != nil {
		flushErr = errors.Join(flushErr, sink.dlq.Flush(), closeDLQ())
	}
	flushErr = errors.Join(flushErr, closeOut())
	if err != nil {
		return fmt.Errorf("import rllm: %w", err)
	}
	if flushErr != nil {
		return fmt.Errorf("import rllm: %w", flushErr)
	}
	if !o.quiet {
		printImportSummary(stderr, kind, sum, sink, o.dlq)
	}
	return nil
}

// importKind tells a SQLite trace store from episode JSON.
func importKind(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if fi.IsDir() {
		return "episodes", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	head := make([]byte, 16)
	n, _ := io.ReadFull(f, head)
	if bytes.Equal(head[:n], []byte("SQLite format 3\x00")) {
		return "traces", nil
	}
	return "episodes", nil
}

func printImportSummary(w io.Writer, kind string, sum rllmdata.Summary, sink *importSink, dlq string) {
	unit := "sessions"
	if kind == "episodes" {
		unit = "episode files"
	}
	fmt.Fprintf(w, "import rllm: %d %s read: %d steps and %d trajectories written, %d dead letters",
		sum.Sources, unit, sum.Steps, sum.Trajectories, sum.Dead())
	if d := sum.Dead(); d > 0 {
		var parts []string
		for _, r := range slices.Sorted(maps.Keys(sum.DeadLetters)) {
			parts = append(parts, fmt.Sprintf("%s %d", r, sum.DeadLetters[r]))
		}
		fmt.Fprintf(w, " (%s)", strings.Join(parts, ", "))
	}
	fmt.Fprintln(w)
	if sum.Unscored > 0 {
		fmt.Fprintf(w, "import rllm: %d trajectories have no reward (give them with --rewards)\n", sum.Unscored)
	}
	if sum.UnusedRewards > 0 {
		fmt.Fprintf(w, "import rllm: %d --rewards entries matched nothing\n", sum.UnusedRewards)
	}
	if len(sink.first) > 0 {
		for _, e := range sink.first {
			fmt.Fprintf(w, "import rllm: dead letter: %s\n", e)
		}
		if dlq == "" {
			fmt.Fprintln(w, "import rllm: give --dlq FILE to keep every dead letter (the input is unchanged)")
		}
	}
}
