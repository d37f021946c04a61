package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/export"
)

func newExportCmd(soft context.Context) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write SFT or distillation datasets from committed shards",
		Long: `export writes SFT or distillation datasets from the committed shards of an
ingest output. No output (--to, --requests, --stats-json) may write into
the store it reads: the output root itself, its reserved folders (every
folder of the root whose name starts with _: _manifest, _dlq, _tmp,
_groups, ...) and its shards are refused (exit 2), after relative paths and
symbolic links are resolved.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newExportSFTCmd(soft), newExportDistillCmd(soft))
	return cmd
}

type exportOpts struct {
	from, to  string
	statsJSON string
	quiet     bool
	conn      connFlags
}

func (o *exportOpts) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "committed shards: an ingest output root (path, file:///path) or s3://bucket/prefix")
	f.StringVar(&o.to, "to", "", "the dataset file (not inside the --from root's reserved _ folders, nor over a shard)")
	f.StringVar(&o.statsJSON, "stats-json", "", "also write the export's counts as JSON to this file")
	f.BoolVar(&o.quiet, "quiet", false, "no progress bar or summary on stderr")
	o.conn.register(f)
}

func newExportSFTCmd(soft context.Context) *cobra.Command {
	var (
		o         exportOpts
		minReward float64
		cfg       export.SFTConfig
	)
	cmd := &cobra.Command{
		Use:   "sft --from URL --to FILE.{parquet,jsonl}",
		Short: "Supervised fine-tuning rows in TRL's formats from the chosen trajectories",
		Long: `export sft writes one row per conversation of every chosen trajectory, built
from the messages of its steps: {"messages": [...]} or, with --format
prompt-completion, {"prompt": [...], "completion": [...]} (the completion is
the final run of assistant messages), with a "tools" column when the
conversation called tools (the tools a step's metadata declared, else schemas
inferred from the calls). Trajectories with rows a filter marked are left out
unless --include-filtered; --min-reward keeps rewards at or above a floor;
--best-of-n K keeps the K best trajectories of each task (ties: the smaller
trajectory_id); --dedupe drops repeated conversations. The output type
follows the file's extension (.parquet, .jsonl).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := firstErr(floatIn("min-reward", minReward, -math.MaxFloat64, math.MaxFloat64), intIn("best-of-n", cfg.BestOfN, 0, 1<<30)); err != nil {
				return err
			}
			if cmd.Flags().Changed("min-reward") {
				cfg.MinReward = &minReward
			}
			if cfg.Format != export.FormatMessages && cfg.Format != export.FormatPromptCompletion {
				return usageErrorf("--format: %s or %s", export.FormatMessages, export.FormatPromptCompletion)
			}
			ext := strings.ToLower(filepath.Ext(o.to))
			if ext != ".parquet" && ext != ".jsonl" {
				return usageErrorf("--to %q: name a .parquet or .jsonl file", o.to)
			}
			src, err := openShardStore(store.WithRetryStop(cmd.Context(), soft.Done()), o.from, o.conn)
			if err != nil {
				return err
			}
			if err := checkOutputs(cmd.Context(), src, o.to, o.statsJSON); err != nil {
				return err
			}
			bar := newProgress(cmd.ErrOrStderr(), "export sft", -1, true, o.quiet)
			cfg.Progress = bar.update
			var st export.SFTStats
			err = writeAtomically(o.to, func(w io.Writer) error {
				var rows export.Rows
				if ext == ".parquet" {
					pr, err := export.NewParquetRows(w, []string{"messages", "prompt", "completion", "tools", "task_id", "trajectory_id", "reward"})
					if err != nil {
						return err
					}
					rows = pr
				} else {
					rows = export.NewJSONLines(w)
				}
				st, err = export.SFT(soft, src, cfg, rows)
				if err != nil {
					return err
				}
				return rows.Close()
			})
			bar.finish()
			if err != nil {
				return err
			}
			if !o.quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "export sft: %d rows (%d with tools) from %d of %d trajectories in %d shards; left out: %d filtered, %d under --min-reward, %d beyond --best-of-n, %d without messages, %d duplicates, %d without a completion\n",
					st.Rows, st.RowsWithTools, st.Chosen, st.Trajectories, st.Shards, st.SkippedFiltered, st.SkippedReward, st.SkippedBestOfN, st.NoMessages, st.Duplicates, st.NoCompletion)
			}
			return writeJSONFile(o.statsJSON, st)
		},
	}
	o.register(cmd)
	f := cmd.Flags()
	f.Float64Var(&minReward, "min-reward", 0, "keep trajectories whose reward is at least this")
	f.IntVar(&cfg.BestOfN, "best-of-n", 0, "keep the N best trajectories of each task by reward (0: all)")
	f.StringVar(&cfg.Format, "format", export.FormatMessages, "row format: messages or prompt-completion")
	f.BoolVar(&cfg.IncludeFiltered, "include-filtered", false, "keep trajectories with rows a filter marked")
	f.BoolVar(&cfg.Dedupe, "dedupe", false, "drop rows whose conversation and tools repeat an earlier row")
	f.BoolVar(&cfg.WithIDs, "with-ids", false, "add task_id, trajectory_id and reward columns")
	return cmd
}

func newExportDistillCmd(soft context.Context) *cobra.Command {
	var (
		o          exportOpts
		requests   string
		noRequests bool
		cfg        export.DistillConfig
	)
	cmd := &cobra.Command{
		Use:   "distill --from URL --to FILE.parquet",
		Short: "On-policy distillation rows: student and teacher logprobs, token advantages",
		Long: `export distill writes one Parquet row per step with teacher logprobs: ids,
prompt_ids, response_ids (the student's tokens), response_logprobs (the
student's), teacher_logprobs, advantage and token_advantages (as ingest
computed them with --kl-coef; recomputed as advantage + clip(coef·D) with
this command's --kl-* flags when a step has none or when --kl-coef is given).
With --requests FILE, the groups holding steps without teacher logprobs go
there as wire-format JSON lines (trajectory records and every step; the
steps to score lack teacher_logprobs): a teacher server fills
teacher_logprobs, one per response token, and the file goes back through
ingest into a new output.`,
		Example: `  # the scored steps, token advantages as ingest computed them
  rllm-pipe export distill --from data --to distill.parquet

  # recompute with λ = 0.5 clipped to ±1, and list what the teacher must score
  rllm-pipe export distill --from data --to distill.parquet --kl-coef 0.5 --kl-clip 1 \
    --requests to-score.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// The ranges of ingest's --kl-* flags: a NaN or infinite λ
			// would write NaN advantages.
			if err := firstErr(floatIn("kl-coef", cfg.Distill.Coef, -1e6, 1e6), floatIn("kl-clip", cfg.Distill.Clip, 0, math.MaxFloat64),
				floatIn("kl-discount", cfg.Distill.Discount, 0, 1)); err != nil {
				return err
			}
			if strings.ToLower(filepath.Ext(o.to)) != ".parquet" {
				return usageErrorf("--to %q: name a .parquet file", o.to)
			}
			cfg.Recompute = cmd.Flags().Changed("kl-coef")
			if noRequests { // deprecated: no requests file is the default
				requests = ""
			}
			src, err := openShardStore(store.WithRetryStop(cmd.Context(), soft.Done()), o.from, o.conn)
			if err != nil {
				return err
			}
			if err := checkOutputs(cmd.Context(), src, o.to, requests, o.statsJSON); err != nil {
				return err
			}
			bar := newProgress(cmd.ErrOrStderr(), "export distill", -1, true, o.quiet)
			cfg.Progress = bar.update
			var st export.DistillStats
			err = writeAtomically(o.to, func(w io.Writer) error {
				if requests == "" {
					st, err = export.Distill(soft, src, cfg, w, nil)
					return err
				}
				return writeAtomically(requests, func(rw io.Writer) error {
					st, err = export.Distill(soft, src, cfg, w, rw)
					return err
				})
			})
			bar.finish()
			if err != nil {
				return err
			}
			if !o.quiet {
				recomputed := fmt.Sprintf("%d token advantages recomputed", st.Recomputed)
				if !cfg.Recompute {
					recomputed = fmt.Sprintf("%d without token advantages: the advantage alone", st.Recomputed)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "export distill: %d of %d steps exported (%s); %d steps without teacher logprobs", st.Scored, st.Steps, recomputed, st.Unscored)
				if requests != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "; %d groups (%d steps) to score in %s", st.RequestGroups, st.RequestSteps, requests)
				} else if st.Unscored > 0 {
					fmt.Fprint(cmd.ErrOrStderr(), " (--requests FILE lists them for a teacher)")
				}
				fmt.Fprintln(cmd.ErrOrStderr())
				if !cfg.Recompute && st.Recomputed > 0 {
					fmt.Fprintln(cmd.ErrOrStderr(), "export distill: ingest ran without --kl-coef for some steps: give --kl-coef to add the teacher's term")
				}
			}
			return writeJSONFile(o.statsJSON, st)
		},
	}
	o.register(cmd)
	f := cmd.Flags()
	f.StringVar(&requests, "requests", "", "write the groups with steps to score by a teacher to this file (wire-format JSON lines; default: none)")
	f.BoolVar(&noRequests, "no-requests", false, "deprecated: no requests file is written without --requests")
	_ = f.MarkDeprecated("no-requests", "no requests file is written without --requests")
	f.Float64Var(&cfg.Distill.Coef, "kl-coef", 0, "λ of token_advantages = advantage + clip(λ·D), recomputing every step's (as ingest's --kl-coef; not given: as ingest computed them, advantage alone where it computed none)")
	f.Float64Var(&cfg.Distill.Clip, "kl-clip", 0, "clip the distillation term to [-c, c] (0: no clipping)")
	f.Float64Var(&cfg.Distill.Discount, "kl-discount", 0, "discount γ of D_t = Σ γ^(k-t) d_k (0: D_t = d_t)")
	return cmd
}

// checkOutputs refuses, as a usage error, output paths that would write
// into the store the export reads (export.CheckOutput): its reserved
// folders (_manifest, ...), the root itself, a shard.
func checkOutputs(ctx context.Context, src train.Shards, paths ...string) error {
	for _, p := range paths {
		if err := export.CheckOutput(ctx, src, p); err != nil {
			if errors.Is(err, export.ErrOutputInStore) {
				return &exitError{Code: exitUsage, Err: err}
			}
			return err
		}
	}
	return nil
}

// writeAtomically writes path through fn into a temporary file beside it,
// synced and renamed into place only when fn succeeds: a failed or
// interrupted export leaves no partial file.
func writeAtomically(path string, fn func(io.Writer) error) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	defer os.Remove(f.Name())
	if err := fn(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("publish %s: %w", path, err)
	}
	return nil
}

func writeJSONFile(path string, v any) error {
	if path == "" {
		return nil
	}
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}
