package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/cmd/internal/cli"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline"
	"github.com/rllm-pipe/rllm-pipe/connectors/pipeline/metrics"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

type ingestOpts struct {
	from, to, dlq, statsJSON string
	spill                    string
	groupSize, minGroupSize  int
	groupTimeout             time.Duration
	maxOpenGroups            int
	maxPartitions            int
	shardSize                string
	flushInterval            time.Duration
	estimator, compat        string
	noStd                    bool
	klCoef, klClip, klDisc   float64
	filter                   string
	decoders, encoders       int
	maxRecord                string
	zstdLevel                int
	compact                  bool
	fullPrompts              bool
	quiet                    bool
	metricsAddr              string
	metricsTokenFile         string
	logFormat                string
	cpuProfile               string
	memoryLimit              string
	iceberg                  icebergTarget
	icebergEvery             time.Duration
	conn                     connFlags
}

func newIngestCmd(soft context.Context) *cobra.Command {
	var o ingestOpts
	cmd := &cobra.Command{
		Use:   "ingest --from URL --to URL",
		Short: "Assemble groups, compute advantages, commit Parquet shards exactly once",
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
	f.StringVar(&o.from, "from", "", "input: file:///path, a path, - for stdin, or kafka://host:port[,host:port]/topic?group=NAME")
	f.StringVar(&o.to, "to", "", "output root: file:///path, a path, or s3://bucket/prefix")
	f.StringVar(&o.dlq, "dlq", "", "dead-letter output: a file, or kafka://host:port/topic (default <to>/_dlq/)")
	f.StringVar(&o.statsJSON, "stats-json", "", "also write the run's summary as JSON to this file")
	f.StringVar(&o.iceberg.catalog, "iceberg-catalog", "", "also keep an Iceberg steps table in step with the commits (as iceberg sync --follow does): a SQLite catalog file or a REST catalog URL")
	f.StringVar(&o.iceberg.name, "iceberg-catalog-name", "", "with --iceberg-catalog, the catalog's name, as readers configure it (default: iceberg sync's, rllm)")
	f.StringVar(&o.iceberg.namespace, "iceberg-namespace", "", "with --iceberg-catalog, the tables' namespace (default: iceberg sync's, rllm)")
	f.StringVar(&o.iceberg.warehouse, "iceberg-warehouse", "", "with --iceberg-catalog, where new tables keep their metadata (default: the output root's _iceberg folder)")
	f.DurationVar(&o.icebergEvery, "iceberg-every", 10*time.Second, "with --iceberg-catalog, how often the table catches up with the commits (and once more at the end)")
	f.StringVar(&o.spill, "spill", "", "with --from -: where records read from stdin but never committed (a store outage, a second signal) are saved, as they were read, for a later ingest of that file; a copy of stdin is kept in hidden segments beside it until the run ends (default ./rllm-pipe-unwritten-<run>.jsonl)")
	f.IntVar(&o.groupSize, "group-size", 8, "trajectories per group (a trajectory record's group_size overrides it)")
	f.IntVar(&o.minGroupSize, "min-group-size", 2, "least complete trajectories to emit a group partial at timeout or end of input")
	f.DurationVar(&o.groupTimeout, "group-timeout", 10*time.Minute, "close a group this long after its first record (0: never)")
	f.IntVar(&o.maxOpenGroups, "max-open-groups", 65536, "groups held in memory at most; one more closes the oldest")
	f.IntVar(&o.maxPartitions, "max-partitions", sink.DefaultMaxPartitions, "policy versions written to shards of their own at once (each keeps a shard open); beyond it a version shares the shard of the nearest version below (a burst of versions makes a few shards, not one each)")
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
	f.IntVar(&o.encoders, "encoders", runtime.NumCPU(), "shards of one partition encoded at once (each on its own goroutine)")
	f.StringVar(&o.maxRecord, "max-record-bytes", "64MiB", "records larger than this are dead-lettered as too_large")
	f.IntVar(&o.zstdLevel, "zstd-level", 1, "zstd compression level of shards")
	f.BoolVar(&o.fullPrompts, "full-prompts", false, "store every prompt and message list whole, not as the delta of the step before (the layout before schema 4)")
	f.BoolVar(&o.compact, "compact", false, "entropy-code the literals of zstd pages: shards about 11% smaller for 7-10% more ingest CPU")
	f.BoolVar(&o.quiet, "quiet", false, "no summary on stderr")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (host:port), at /metrics; beyond loopback only with a token")
	f.StringVar(&o.metricsTokenFile, "metrics-token-file", "", "file holding the bearer token /metrics requires (default: $RLLM_PIPE_METRICS_TOKEN; none: loopback only)")
	f.StringVar(&o.logFormat, "log-format", "text", "structured log format on stderr: text or json")
	o.conn.register(f)
	o.conn.registerKafka(f)
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	f.StringVar(&o.memoryLimit, "memory-limit", "380MiB", "soft memory limit of the Go heap (the GC works harder near it; GOMEMLIMIT wins; off to disable); the binary and the mapped input add about 60 MiB of RSS")
	return cmd
}

func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// plan is the validated configuration of one ingest.
type plan struct {
	cfg          pipeline.Config
	maxRecord    int64
	label        string
	runID        string
	metricsToken string
}

func newPlan(o ingestOpts) (*plan, error) {
	p := &plan{runID: newRunID()}
	c := &p.cfg
	var err error
	if o.metricsAddr != "" {
		if p.metricsToken, err = metricsToken(o.metricsAddr, o.metricsTokenFile); err != nil {
			return nil, err
		}
	}
	if c.ShardSize, err = bytesIn("shard-size", o.shardSize, 4<<10, 64<<30); err != nil {
		return nil, err
	}
	if p.maxRecord, err = bytesIn("max-record-bytes", o.maxRecord, 1<<10, 1<<30); err != nil {
		return nil, err
	}
	if err := firstErr(
		intIn("group-size", o.groupSize, 1, 1<<20), intIn("min-group-size", o.minGroupSize, 1, 1<<20),
		durationIn("group-timeout", o.groupTimeout, 0, 365*24*time.Hour),
		intIn("max-open-groups", o.maxOpenGroups, 1, 1<<26), intIn("max-partitions", o.maxPartitions, 1, 4096),
		durationIn("flush-interval", o.flushInterval, time.Millisecond, 365*24*time.Hour),
		intIn("decoders", o.decoders, 1, 1024), intIn("encoders", o.encoders, 1, 1024), intIn("zstd-level", o.zstdLevel, 1, 22),
		floatIn("kl-coef", o.klCoef, -1e6, 1e6), floatIn("kl-clip", o.klClip, 0, math.MaxFloat64), floatIn("kl-discount", o.klDisc, 0, 1),
		o.conn.check(),
	); err != nil {
		return nil, err
	}
	compat, err := advantage.CompatByName(o.compat)
	if err != nil {
		return nil, usageErrorf("--compat: %v", err)
	}
	if c.Estimator, err = advantage.New(o.estimator, advantage.Options{Compat: compat, NoStd: o.noStd}); err != nil {
		return nil, usageErrorf("--estimator: %v", err)
	}
	if o.noStd && o.estimator != "grpo" && o.estimator != "grpo_passk" {
		return nil, usageErrorf("--no-std applies to grpo and grpo_passk only")
	}
	if c.Filters, err = transform.ParseFilters(o.filter); err != nil {
		return nil, usageErrorf("--filter: %v", err)
	}
	if o.klCoef != 0 {
		c.Distill = &advantage.Distill{Coef: o.klCoef, Clip: o.klClip, Discount: o.klDisc}
	} else if o.klClip != 0 || o.klDisc != 0 {
		return nil, usageErrorf("--kl-clip and --kl-discount need --kl-coef")
	}
	p.label = c.Estimator.Name() + "/" + compat.Name
	if o.noStd {
		p.label += "/no-std"
	}
	c.Label = p.label
	c.GroupSize, c.MinGroupSize = o.groupSize, o.minGroupSize
	c.GroupTimeout, c.MaxOpenGroups, c.MaxPartitions = o.groupTimeout, o.maxOpenGroups, o.maxPartitions
	c.RetryFor = o.conn.RetryFor
	c.FlushInterval = o.flushInterval
	c.Parquet = parquet.Options{ZstdLevel: o.zstdLevel, Compact: o.compact}
	c.Decoders, c.Encoders = o.decoders, o.encoders
	c.FullPrompts = o.fullPrompts
	return p, nil
}

func runIngest(ctx, soft context.Context, o ingestOpts, stderr io.Writer) (err error) {
	start := time.Now()
	p, err := newPlan(o)
	if err != nil {
		return err
	}
	if o.from == "-" {
		p.cfg.Spill = o.spill
		if p.cfg.Spill == "" {
			p.cfg.Spill = "rllm-pipe-unwritten-" + p.runID + ".jsonl"
		}
	}
	dlqFile := o.dlq
	if strings.HasPrefix(dlqFile, "kafka://") {
		dlqFile = ""
	}
	if err := checkOutputFiles(ctx, []string{o.to, o.from}, "stats-json", o.statsJSON, "dlq", dlqFile, "cpuprofile", o.cpuProfile, "spill", p.cfg.Spill); err != nil {
		return err
	}
	if o.memoryLimit != "off" {
		// Below 64 MiB the GC would run without pause for nothing.
		limit, err := bytesIn("memory-limit", o.memoryLimit, 64<<20, 1<<40)
		if err != nil {
			return err
		}
		if os.Getenv("GOMEMLIMIT") == "" {
			debug.SetMemoryLimit(limit)
		}
	}
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopProfile()) }()
	if o.from == "" {
		return usageErrorf("--from is required")
	}
	if o.spill != "" && o.from != "-" {
		return usageErrorf("--spill applies to --from - only (any other input can be read again)")
	}
	log, err := cli.Logger(stderr, o.logFormat, o.quiet)
	if err != nil {
		return err
	}
	p.cfg.Log = log.With("run", p.runID)
	slog.SetDefault(p.cfg.Log)
	// An unreachable store is not waited for past a first signal.
	st, dl, err := openOutput(store.WithRetryStop(ctx, soft.Done()), o, p.runID)
	if err != nil {
		return err
	}
	defer st.Close()
	m := metrics.New(dl.Counts)
	p.cfg.Observer = m
	if o.metricsAddr != "" {
		stop, err := metrics.Serve(ctx, o.metricsAddr, p.metricsToken, m)
		if err != nil {
			return err
		}
		defer stop()
	}

	stats := ingestStats{RunID: p.runID, Output: st.Name(), Estimator: p.label, DeadLetters: map[string]int64{}, Stdin: o.from == "-"}
	var ice *icebergFollower
	if o.iceberg.catalog != "" {
		if o.icebergEvery <= 0 {
			return usageErrorf("--iceberg-every %s: positive", o.icebergEvery)
		}
		run, err := startIceberg(ctx, o.to, o.conn, o.iceberg, o.icebergEvery, p.cfg.Log)
		var ue *exitError
		switch {
		case errors.As(err, &ue):
			return err
		case err != nil:
			// The catalog is down: the run goes on, the table catches up
			// at the next sync.
			stats.IcebergError = err.Error()
			p.cfg.Log.Warn("iceberg: the catalog cannot be opened; the run goes on without the table", "err", err)
		default:
			ice = run
			defer ice.halt()
		}
	}
	pl := pipeline.New(p.cfg, st, dl)
	var runErr error
	if strings.HasPrefix(o.from, "kafka://") {
		cfg, err := kafka.ParseURL(o.from)
		if err != nil {
			return usageErrorf("--from: %v", err)
		}
		stop := newProgress(stderr, "ingest", -1, false, o.quiet).follow(m.RecordsRead)
		runErr = pl.RunKafka(ctx, soft, pipeline.JoinKafka(o.conn.kafka(cfg)))
		stop()
	} else {
		runErr = runFile(ctx, soft, pl, o.from, p.maxRecord, &stats, func(total int64) *progress {
			return newProgress(stderr, "ingest", total, true, o.quiet)
		})
	}
	if err := dl.Close(); err != nil {
		runErr = errors.Join(runErr, err)
	}
	if ice != nil {
		res, err := ice.finish(ctx)
		stats.Iceberg = &res
		if err != nil {
			// The shards are committed: the table catches up at the next
			// sync (iceberg sync, or this ingest run again).
			stats.IcebergError = err.Error()
			p.cfg.Log.Warn("iceberg: the table is behind the commits", "err", err)
		}
	}
	stats.Result = pl.Result()
	stats.Stopped = soft.Err() != nil
	stats.ElapsedSeconds = time.Since(start).Seconds()
	for r, n := range dl.Counts() {
		stats.DeadLetters[string(r)] = n
		stats.DeadLettersTotal += n
	}
	if stats.DeadLettersTotal > 0 {
		stats.DeadLetterFile = dl.Name()
	}
	if !o.quiet {
		printIngestSummary(stderr, stats)
	}
	if o.statsJSON != "" {
		if err := writeStatsJSON(o.statsJSON, stats); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	if stats.Spilled > 0 {
		// stdin cannot be read again: a rerun resumes from the spill file.
		code := exitFailure
		if stats.Stopped {
			code = exitStopped
		}
		return &exitError{Code: code, Err: fmt.Errorf("ingest: %w\n%d records read from stdin were not written: they are saved in %s, as they were read; ingest that file (--from %s) to write them",
			runErr, stats.Spilled, stats.SpillFile, stats.SpillFile)}
	}
	if runErr != nil {
		return fmt.Errorf("ingest: %w", runErr)
	}
	return nil
}
