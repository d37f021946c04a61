package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

type ingestOpts struct {
	from, to, dlq, statsJSON string
	groupSize, minGroupSize  int
	groupTimeout             time.Duration
	maxOpenGroups            int
	shardSize                string
	flushInterval            time.Duration
	estimator, compat        string
	noStd                    bool
	klCoef, klClip, klDisc   float64
	filter                   string
	decoders                 int
	maxRecord                string
	zstdLevel                int
	quiet                    bool
}

func newIngestCmd(soft context.Context) *cobra.Command {
	var o ingestOpts
	cmd := &cobra.Command{
		Use:   "ingest --from URL --to URL",
		Short: "Assemble groups from Step/Trajectory records, compute advantages, commit Parquet shards",
		Long: `ingest reads wire-format JSON lines (file:///path, a plain path, or - for
stdin), assembles complete groups, computes advantages and commits zstd
Parquet shards under --to, with a manifest. Bad records go to the dead-letter
output with a reason; they never make ingest fail. Re-running over the same
input skips groups already committed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runIngest(cmd.Context(), soft, o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.from, "from", "", "input: file:///path, a path, or - for stdin (env RLLM_FROM)")
	f.StringVar(&o.to, "to", "", "output root: file:///path or a path (env RLLM_TO)")
	f.StringVar(&o.dlq, "dlq", "", "dead-letter output file (default <to>/_dlq/<run>.jsonl)")
	f.StringVar(&o.statsJSON, "stats-json", "", "also write the run's summary as JSON to this file")
	f.IntVar(&o.groupSize, "group-size", 8, "trajectories per group (a trajectory record's group_size overrides it)")
	f.IntVar(&o.minGroupSize, "min-group-size", 2, "least complete trajectories to emit a group partial at timeout or end of input")
	f.DurationVar(&o.groupTimeout, "group-timeout", 10*time.Minute, "close a group this long after its first record (0: never)")
	f.IntVar(&o.maxOpenGroups, "max-open-groups", 65536, "groups held in memory at most; one more closes the oldest")
	f.StringVar(&o.shardSize, "shard-size", "256MiB", "cut a shard at about this size")
	f.DurationVar(&o.flushInterval, "flush-interval", 30*time.Second, "commit a shard at most this long after its first row")
	f.StringVar(&o.estimator, "estimator", "grpo", "advantage estimator: "+strings.Join(advantage.Names(), ", "))
	f.StringVar(&o.compat, "compat", "rllm", "numerical conventions: rllm (population std, eps 1e-6), verl (sample std, eps 1e-6), trl (sample std, eps 1e-4, a group of one gets 0)")
	f.BoolVar(&o.noStd, "no-std", false, "grpo without the division by std (Dr. GRPO): r - mean")
	f.Float64Var(&o.klCoef, "kl-coef", 0, "on-policy distillation: token_advantages = advantage + clip(coef * D_t) for steps with teacher_logprobs (0: off)")
	f.Float64Var(&o.klClip, "kl-clip", 0, "clip the distillation term to [-c, c] (0: no clipping)")
	f.Float64Var(&o.klDisc, "kl-discount", 0, "discount of the future sum D_t = sum_k gamma^(k-t) d_k within a step (0: D_t = d_t)")
	f.StringVar(&o.filter, "filter", "", "mark (never drop) rows: zero-variance, truncated, termination=ERROR|TIMEOUT, comma-separated")
	f.IntVar(&o.decoders, "decoders", runtime.NumCPU(), "decoder goroutines")
	f.StringVar(&o.maxRecord, "max-record-bytes", "64MiB", "records larger than this are dead-lettered as too_large")
	f.IntVar(&o.zstdLevel, "zstd-level", 1, "zstd compression level of shards")
	f.BoolVar(&o.quiet, "quiet", false, "no summary on stderr")
	return cmd
}

// ingestStats is the run summary, printed on stderr and written by
// --stats-json.
type ingestStats struct {
	RunID          string  `json:"run_id"`
	Output         string  `json:"output"`
	DeadLetterFile string  `json:"dead_letter_file,omitempty"`
	Stopped        bool    `json:"stopped_early"`
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	InputBytes     int64   `json:"input_bytes,omitempty"`
	Estimator      string  `json:"estimator"`
	transform.Counters
	transform.BatchCounters
	sink.Totals
	DeadLetters      map[string]int64 `json:"dead_letters"`
	DeadLettersTotal int64            `json:"dead_letters_total"`
}

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

func runIngest(ctx, soft context.Context, o ingestOpts, stderr io.Writer) error {
	start := time.Now()
	from, err := localPath("from", o.from)
	if err != nil {
		return err
	}
	to, err := localPath("to", o.to)
	if err != nil {
		return err
	}
	shardSize, err := parseBytes(o.shardSize)
	if err != nil {
		return usageErrorf("--shard-size: %v", err)
	}
	maxRecord, err := parseBytes(o.maxRecord)
	if err != nil {
		return usageErrorf("--max-record-bytes: %v", err)
	}
	if o.groupSize < 1 || o.minGroupSize < 1 {
		return usageErrorf("--group-size and --min-group-size must be >= 1")
	}
	compat, err := advantage.CompatByName(o.compat)
	if err != nil {
		return usageErrorf("--compat: %v", err)
	}
	est, err := advantage.New(o.estimator, advantage.Options{Compat: compat, NoStd: o.noStd})
	if err != nil {
		return usageErrorf("--estimator: %v", err)
	}
	if o.noStd && o.estimator != "grpo" && o.estimator != "grpo_passk" {
		return usageErrorf("--no-std applies to grpo and grpo_passk only")
	}
	filters, err := transform.ParseFilters(o.filter)
	if err != nil {
		return usageErrorf("--filter: %v", err)
	}
	var distill *advantage.Distill
	if o.klCoef != 0 {
		if o.klClip < 0 || o.klDisc < 0 || o.klDisc > 1 {
			return usageErrorf("--kl-clip must be >= 0 and --kl-discount in [0, 1]")
		}
		distill = &advantage.Distill{Coef: o.klCoef, Clip: o.klClip, Discount: o.klDisc}
	} else if o.klClip != 0 || o.klDisc != 0 {
		return usageErrorf("--kl-clip and --kl-discount need --kl-coef")
	}
	label := est.Name() + "/" + compat.Name
	if o.noStd {
		label += "/no-std"
	}

	src, err := ingest.OpenFile(from, int(maxRecord))
	if err != nil {
		return err
	}
	defer src.Close()
	var inputBytes int64
	if from != "-" {
		if st, err := os.Stat(from); err == nil {
			inputBytes = st.Size()
		}
	}
	store, err := local.Open(to)
	if err != nil {
		return err
	}
	defer store.Close()
	runID := newRunID()
	dlqPath := local.DeadLetterPath(store.Root(), runID)
	if o.dlq != "" {
		if dlqPath, err = localPath("dlq", o.dlq); err != nil {
			return err
		}
	}
	dl := local.NewDeadLetterFile(dlqPath)
	defer dl.Close()

	settled := store.Settled()

	mem := memory.DefaultAllocator
	batcher := transform.NewBatcher(mem, transform.BatchConfig{Estimator: est, Label: label, Distill: distill, Filters: filters})
	defer batcher.Release()
	sk := sink.New(localStore{store}, sink.Config{
		Settler:       deadLetterSettler{dl, store},
		ShardSize:     shardSize,
		FlushInterval: o.flushInterval,
		RunID:         runID,
		Parquet:       parquet.Options{ZstdLevel: o.zstdLevel, Allocator: mem},
	})

	tick := time.Second
	if o.flushInterval > 0 && o.flushInterval/2 < tick {
		tick = max(o.flushInterval/2, 10*time.Millisecond)
	}
	g, gctx := errgroup.WithContext(ctx)
	// Reading stops on a soft stop too; everything after it drains.
	srcCtx, cancelSrc := context.WithCancel(gctx)
	defer cancelSrc()
	stopSoft := context.AfterFunc(soft, cancelSrc)
	defer stopSoft()

	decoded := make(chan ingest.Batch, 4)
	batches := make(chan transform.Batch, 2)
	var counters transform.Counters
	g.Go(func() error {
		err := ingest.DecodeStage(srcCtx, src, o.decoders, decoded)
		if err != nil && soft.Err() != nil && gctx.Err() == nil {
			return nil // a soft stop, not a failure
		}
		return err
	})
	g.Go(func() error {
		var err error
		counters, err = transform.Stage(gctx, decoded, batches, dl, batcher, transform.StageConfig{
			Assembler: transform.Config{
				GroupSize:     o.groupSize,
				MinGroupSize:  o.minGroupSize,
				Timeout:       o.groupTimeout,
				MaxOpenGroups: o.maxOpenGroups,
				Settled:       settled.Contains,
			},
			Tick:    tick,
			Stopped: func() bool { return soft.Err() != nil },
		})
		return err
	})
	g.Go(func() error { return sink.Run(gctx, batches, sk, tick) })
	runErr := g.Wait()
	if err := dl.Close(); err != nil {
		runErr = errors.Join(runErr, err)
	}

	st := ingestStats{
		RunID:          runID,
		Output:         store.Root(),
		Stopped:        soft.Err() != nil,
		ElapsedSeconds: time.Since(start).Seconds(),
		InputBytes:     inputBytes,
		Counters:       counters,
		DeadLetters:    map[string]int64{},
	}
	st.Totals = sk.Totals
	st.BatchCounters = batcher.Counters
	st.Estimator = label
	for r, n := range dl.Counts() {
		st.DeadLetters[string(r)] = n
		st.DeadLettersTotal += n
	}
	if st.DeadLettersTotal > 0 {
		st.DeadLetterFile = dlqPath
	}
	if !o.quiet {
		printIngestSummary(stderr, st)
	}
	if o.statsJSON != "" {
		if err := writeStatsJSON(o.statsJSON, st); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	if runErr != nil {
		return fmt.Errorf("ingest: %w", runErr)
	}
	return nil
}

func writeStatsJSON(path string, st ingestStats) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil && filepath.Dir(path) != "." {
		return fmt.Errorf("stats json: %w", err)
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func printIngestSummary(w io.Writer, st ingestStats) {
	sc := st.Totals
	c := st.Counters
	mb := float64(st.InputBytes) / (1 << 20)
	fmt.Fprintf(w, "ingest %s: %d records read", st.RunID, c.Records)
	if st.InputBytes > 0 && st.ElapsedSeconds > 0 {
		fmt.Fprintf(w, " (%.1f MiB in %.2fs, %.1f MiB/s)", mb, st.ElapsedSeconds, mb/st.ElapsedSeconds)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "  written:    %d steps, %d trajectories, %d groups (%d partial) in %d shards, %.1f MiB\n",
		c.StepsEmitted, c.TrajectoriesEmitted, c.GroupsEmitted, c.PartialGroups, sc.Shards, float64(sc.Bytes)/(1<<20))
	fmt.Fprintf(w, "  dropped:    %d duplicates (producer retries)\n", c.Duplicates)
	if c.SkippedCommitted > 0 {
		fmt.Fprintf(w, "  skipped:    %d records settled by an earlier run over this input\n", c.SkippedCommitted)
	}
	fmt.Fprintf(w, "  repaired:   %d records with invalid UTF-8\n", c.Repaired)
	fmt.Fprintf(w, "  advantage:  %s", st.Estimator)
	if st.NoTeacher > 0 {
		fmt.Fprintf(w, "; %d steps without teacher logprobs (token_advantages null)", st.NoTeacher)
	}
	fmt.Fprintln(w)
	if len(st.Filtered) > 0 {
		fmt.Fprintf(w, "  marked by filters (trajectories):")
		keys := make([]string, 0, len(st.Filtered))
		for k := range st.Filtered {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, " %s %d;", k, st.Filtered[k])
		}
		fmt.Fprintln(w)
	}
	if c.TimedOut > 0 || c.Evicted > 0 {
		fmt.Fprintf(w, "  closed early: %d groups timed out, %d evicted at --max-open-groups\n", c.TimedOut, c.Evicted)
	}
	fmt.Fprintf(w, "  dead letters: %d", st.DeadLettersTotal)
	if st.DeadLettersTotal > 0 {
		fmt.Fprintf(w, " in %s", st.DeadLetterFile)
	}
	fmt.Fprintln(w)
	reasons := make([]string, 0, len(st.DeadLetters))
	for r := range st.DeadLetters {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		fmt.Fprintf(w, "    %-22s %d\n", r, st.DeadLetters[r])
	}
	if st.Stopped {
		fmt.Fprintln(w, "  stopped early by a signal: groups still open were not written; run again to resume")
	}
	fmt.Fprintf(w, "  output:     %s\n", st.Output)
}

// localStore adapts local.Store to sink.Store.
type localStore struct{ *local.Store }

func (s localStore) Create(ctx context.Context, rel string) (sink.Pending, error) {
	return s.Store.Create(ctx, rel)
}

// deadLetterSettler adapts the dead-letter file to sink.Settler.
type deadLetterSettler struct {
	dl    *local.DeadLetterFile
	store *local.Store
}

func (d deadLetterSettler) Checkpoint(context.Context) (schemas.Settled, *schemas.DeadLetterState, error) {
	settled, size, err := d.dl.Checkpoint()
	if err != nil || size == 0 {
		return settled, nil, err
	}
	return settled, &schemas.DeadLetterState{File: d.store.Rel(d.dl.Path()), Bytes: size}, nil
}
