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
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

type ingestOpts struct {
	from, to, dlq, statsJSON string
	groupSize, minGroupSize  int
	groupTimeout             time.Duration
	maxOpenGroups            int
	shardSize                string
	flushInterval            time.Duration
	estimator                string
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
	f.StringVar(&o.estimator, "estimator", "grpo", "advantage estimator: grpo (rLLM convention)")
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
	transform.Counters
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
	var est advantage.Estimator
	switch o.estimator {
	case "grpo":
		est = advantage.RLLMGRPO
	default:
		return usageErrorf("--estimator %q: unknown (have: grpo)", o.estimator)
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

	committed := map[string]bool{}
	for _, e := range store.Entries() {
		for _, k := range e.GroupKeys {
			committed[k] = true
		}
	}

	mem := memory.DefaultAllocator
	batcher := transform.NewBatcher(mem, est)
	defer batcher.Release()
	sk := sink.New(sink.StoreFunc(func(ctx context.Context, rel string) (sink.Pending, error) {
		return store.Create(ctx, rel)
	}), sink.Config{
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
				Committed:     func(k string) bool { return committed[k] },
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
	fmt.Fprintf(w, "  dropped:    %d duplicates (producer retries), %d records of groups already committed\n", c.Duplicates, c.SkippedCommitted)
	fmt.Fprintf(w, "  repaired:   %d records with invalid UTF-8\n", c.Repaired)
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
