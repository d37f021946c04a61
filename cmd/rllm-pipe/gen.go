package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/ingest/synth"
)

func newGenCmd() *cobra.Command {
	var (
		cfg    synth.Config
		out    string
		turns  string
		tokens string
		quiet  bool
	)
	cmd := &cobra.Command{
		Use:   "gen [--to FILE]",
		Short: "Write realistic synthetic traces (wire-format JSON lines) for demos and benchmarks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkGen(&cfg, turns); err != nil {
				return err
			}
			var err error
			if cfg.Tokens, err = synth.ParseTokenModel(tokens); err != nil {
				return usageErrorf("--tokens: %q: want random or text", tokens)
			}
			var w io.Writer = cmd.OutOrStdout()
			var f *os.File
			if out != "" && out != "-" {
				path, err := localPath("to", out)
				if err != nil {
					return err
				}
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					return fmt.Errorf("gen: %w", err)
				}
				if f, err = os.Create(path); err != nil {
					return fmt.Errorf("gen: %w", err)
				}
				defer f.Close()
				w = f
			}
			cw := &countingWriter{w: w}
			bw := bufio.NewWriterSize(cw, 1<<20)
			stop := newProgress(cmd.ErrOrStderr(), "gen", -1, true, quiet).follow(cw.n.Load)
			sum, err := synth.Generate(cmd.Context(), bw, cfg)
			stop()
			if err != nil {
				return fmt.Errorf("gen: %w", err)
			}
			if err := bw.Flush(); err != nil {
				return fmt.Errorf("gen: %w", err)
			}
			if f != nil {
				if err := f.Close(); err != nil {
					return fmt.Errorf("gen: %w", err)
				}
			}
			if !quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "gen: %d groups, %d trajectories, %d steps, %d records (%d duplicates), %.1f MiB\n",
					sum.Groups, sum.Trajectories, sum.Steps, sum.Records, sum.Duplicates, float64(sum.Bytes)/(1<<20))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "to", "-", "output file (- for stdout)")
	cli.Rename(f, "out", "to")
	f.IntVar(&cfg.Groups, "groups", 100, "number of groups (tasks)")
	f.IntVar(&cfg.GroupSize, "group-size", 8, "trajectories per group")
	f.IntVar(&cfg.MinSteps, "min-steps", 1, "fewest steps per trajectory")
	f.IntVar(&cfg.MaxSteps, "max-steps", 4, "most steps per trajectory")
	f.StringVar(&turns, "turns", "", "multi-turn agents: A..B calls per trajectory (or N), each prompt the whole conversation so far (sets --min-steps and --max-steps)")
	f.IntVar(&cfg.ObservationLen, "observation-len", 0, "mean tokens of a tool observation, heavy-tailed like file contents and test output (0: short, 8-127)")
	f.Float64Var(&cfg.Resets, "resets", 0, "probability that a turn starts from a summarised context instead of the whole conversation")
	f.Float64Var(&cfg.ParallelTools, "parallel-tools", 0, "probability that an action makes 2-3 tool calls at once")
	f.BoolVar(&cfg.WireDeltas, "wire-deltas", false, "send a prompt that extends the previous step's as parent_step_id + prompt_delta_ids (the new tokens only)")
	f.IntVar(&cfg.PromptLen, "prompt-len", 512, "mean prompt tokens of a first step")
	f.IntVar(&cfg.ResponseLen, "response-len", 256, "mean response tokens")
	f.IntVar(&cfg.Vocab, "vocab", 151936, "vocabulary size")
	f.StringVar(&tokens, "tokens", "random", "token ids: random (independent, skewed to small ids: nothing for a compressor to find) or text (like a tokenizer's output of text: Zipfian words of 1-3 tokens that recur, one system prompt for the run, observations that sometimes repeat an earlier one)")
	f.IntVar(&cfg.PolicyVersions, "policy-versions", 4, "policy versions spanned by the run")
	f.IntVar(&cfg.Interleave, "interleave", 16, "groups in flight at once")
	f.Float64Var(&cfg.Shuffle, "shuffle", 0.3, "fraction of records displaced out of order (negative: none)")
	f.BoolVar(&cfg.Teacher, "teacher", false, "add teacher logprobs to every step")
	f.BoolVar(&cfg.TokenVersions, "token-versions", false, "add per-token policy versions to some steps")
	f.BoolVar(&cfg.Messages, "messages", true, "add the chat messages of each call")
	f.StringSliceVar(&cfg.Roles, "roles", nil, "multi-agent roles (one group per task and role)")
	f.Float64Var(&cfg.Duplicates, "duplicates", 0, "fraction of records sent twice (producer retries)")
	f.Uint64Var(&cfg.Seed, "seed", 1, "random seed")
	f.BoolVar(&quiet, "quiet", false, "no summary on stderr")
	return cmd
}

// checkGen validates gen's numbers and applies --turns.
func checkGen(cfg *synth.Config, turns string) error {
	if turns != "" {
		lo, hi, ok := strings.Cut(turns, "..")
		if !ok {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 1 || b < a {
			return usageErrorf("--turns: %q is not A..B with 1 <= A <= B, or N", turns)
		}
		cfg.MinSteps, cfg.MaxSteps = a, b
	}
	return firstErr(
		intIn("groups", cfg.Groups, 1, 1<<30), intIn("group-size", cfg.GroupSize, 1, 1<<16),
		intIn("min-steps", cfg.MinSteps, 1, 10_000), intIn("max-steps", cfg.MaxSteps, cfg.MinSteps, 10_000),
		intIn("prompt-len", cfg.PromptLen, 1, 1<<20), intIn("response-len", cfg.ResponseLen, 1, 1<<20),
		intIn("observation-len", cfg.ObservationLen, 0, 1<<20), intIn("vocab", cfg.Vocab, 256, 1<<24),
		intIn("policy-versions", cfg.PolicyVersions, 1, 1<<20), intIn("interleave", cfg.Interleave, 1, 1<<20),
		floatIn("shuffle", cfg.Shuffle, -1, 1), floatIn("duplicates", cfg.Duplicates, 0, 1),
		floatIn("resets", cfg.Resets, 0, 1), floatIn("parallel-tools", cfg.ParallelTools, 0, 1),
	)
}
