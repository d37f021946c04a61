package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
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
	decoders, encoders       int
	maxRecord                string
	zstdLevel                int
	compact                  bool
	quiet                    bool
	metricsAddr              string
	logFormat                string
	cpuProfile               string
	memoryLimit              string
	conn                     connFlags
}

// connFlags are the connection settings that may come from flags; secrets
// come only from the environment (a flag would show in the process list).
type connFlags struct {
	kafkaTLS  bool
	kafkaSASL string
	kafkaUser string
	s3Region  string
	s3Endpt   string
}

func (c *connFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&c.kafkaTLS, "kafka-tls", false, "connect to Kafka over TLS")
	f.StringVar(&c.kafkaSASL, "kafka-sasl-mechanism", "", "Kafka SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (password from RLLM_KAFKA_SASL_PASSWORD)")
	f.StringVar(&c.kafkaUser, "kafka-sasl-username", "", "Kafka SASL user name")
	f.StringVar(&c.s3Endpt, "s3-endpoint", "", "S3 endpoint URL (default AWS_ENDPOINT_URL; keys from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
	f.StringVar(&c.s3Region, "s3-region", "", "S3 region (default AWS_REGION, else us-east-1)")
}

func (c *connFlags) kafka(cfg kafka.Config) kafka.Config {
	if c.kafkaTLS {
		cfg.TLS = true
	}
	if c.kafkaSASL != "" {
		cfg.SASL = c.kafkaSASL
	}
	if c.kafkaUser != "" {
		cfg.User = c.kafkaUser
	}
	return cfg
}

func (c *connFlags) s3(cfg s3.Config) s3.Config {
	if c.s3Endpt != "" {
		cfg.Endpoint = c.s3Endpt
	}
	if c.s3Region != "" {
		cfg.Region = c.s3Region
	}
	return cfg
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
	f.StringVar(&o.from, "from", "", "input: file:///path, a path, - for stdin, or kafka://host:port[,host:port]/topic?group=NAME (env RLLM_FROM)")
	f.StringVar(&o.to, "to", "", "output root: file:///path, a path, or s3://bucket/prefix (env RLLM_TO)")
	f.StringVar(&o.dlq, "dlq", "", "dead-letter output: a file, or kafka://host:port/topic (default <to>/_dlq/)")
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
	f.IntVar(&o.encoders, "encoders", runtime.NumCPU(), "shards of one partition encoded at once (each on its own goroutine)")
	f.StringVar(&o.maxRecord, "max-record-bytes", "64MiB", "records larger than this are dead-lettered as too_large")
	f.IntVar(&o.zstdLevel, "zstd-level", 1, "zstd compression level of shards")
	f.BoolVar(&o.compact, "compact", false, "entropy-code the literals of zstd pages: shards about 11% smaller for 7-10% more ingest CPU")
	f.BoolVar(&o.quiet, "quiet", false, "no summary on stderr")
	f.StringVar(&o.metricsAddr, "metrics-addr", "", "serve Prometheus metrics on this address (host:port), at /metrics")
	f.StringVar(&o.logFormat, "log-format", "text", "structured log format on stderr: text or json")
	o.conn.register(f)
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	f.StringVar(&o.memoryLimit, "memory-limit", "380MiB", "soft memory limit of the Go heap (the GC works harder near it; GOMEMLIMIT wins; off to disable); the binary and the mapped input add about 60 MiB of RSS")
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

// plan is the validated configuration of one ingest.
type plan struct {
	o         ingestOpts
	shardSize int64
	maxRecord int64
	est       advantage.Estimator
	label     string
	distill   *advantage.Distill
	filters   []transform.Filter
	runID     string
	shardSeq  atomic.Int64 // shard numbers across the generations of the run
	m         *metrics
	log       *slog.Logger
}

func newPlan(o ingestOpts) (*plan, error) {
	p := &plan{o: o, runID: newRunID(), m: &metrics{}}
	var err error
	if p.shardSize, err = parseBytes(o.shardSize); err != nil {
		return nil, usageErrorf("--shard-size: %v", err)
	}
	if p.maxRecord, err = parseBytes(o.maxRecord); err != nil {
		return nil, usageErrorf("--max-record-bytes: %v", err)
	}
	if o.groupSize < 1 || o.minGroupSize < 1 {
		return nil, usageErrorf("--group-size and --min-group-size must be >= 1")
	}
	compat, err := advantage.CompatByName(o.compat)
	if err != nil {
		return nil, usageErrorf("--compat: %v", err)
	}
	if p.est, err = advantage.New(o.estimator, advantage.Options{Compat: compat, NoStd: o.noStd}); err != nil {
		return nil, usageErrorf("--estimator: %v", err)
	}
	if o.noStd && o.estimator != "grpo" && o.estimator != "grpo_passk" {
		return nil, usageErrorf("--no-std applies to grpo and grpo_passk only")
	}
	if p.filters, err = transform.ParseFilters(o.filter); err != nil {
		return nil, usageErrorf("--filter: %v", err)
	}
	if o.klCoef != 0 {
		if o.klClip < 0 || o.klDisc < 0 || o.klDisc > 1 {
			return nil, usageErrorf("--kl-clip must be >= 0 and --kl-discount in [0, 1]")
		}
		p.distill = &advantage.Distill{Coef: o.klCoef, Clip: o.klClip, Discount: o.klDisc}
	} else if o.klClip != 0 || o.klDisc != 0 {
		return nil, usageErrorf("--kl-clip and --kl-discount need --kl-coef")
	}
	p.label = p.est.Name() + "/" + compat.Name
	if o.noStd {
		p.label += "/no-std"
	}
	return p, nil
}

func runIngest(ctx, soft context.Context, o ingestOpts, stderr io.Writer) error {
	start := time.Now()
	p, err := newPlan(o)
	if err != nil {
		return err
	}
	if o.memoryLimit != "off" && os.Getenv("GOMEMLIMIT") == "" {
		limit, err := parseBytes(o.memoryLimit)
		if err != nil {
			return usageErrorf("--memory-limit: %v", err)
		}
		debug.SetMemoryLimit(limit)
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if o.from == "" {
		return usageErrorf("--from is required")
	}
	var h slog.Handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
	if o.logFormat == "json" {
		h = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	if o.quiet {
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	p.log = slog.New(h).With("run", p.runID)
	slog.SetDefault(p.log)
	out, err := openOutput(ctx, o, p.runID)
	if err != nil {
		return err
	}
	defer out.close()
	p.m.deadLetter = out.counts
	if o.metricsAddr != "" {
		stop, err := serveMetrics(ctx, o.metricsAddr, p.m)
		if err != nil {
			return err
		}
		defer stop()
	}

	st := ingestStats{RunID: p.runID, Output: out.name, Estimator: p.label, DeadLetters: map[string]int64{}}
	var runErr error
	if strings.HasPrefix(o.from, "kafka://") {
		runErr = runKafka(ctx, soft, p, out, &st, stderr)
	} else {
		runErr = runFile(ctx, soft, p, out, &st)
	}
	if err := out.closeDLQ(); err != nil {
		runErr = errors.Join(runErr, err)
	}
	st.Stopped = soft.Err() != nil
	st.ElapsedSeconds = time.Since(start).Seconds()
	for r, n := range out.counts() {
		st.DeadLetters[string(r)] = n
		st.DeadLettersTotal += n
	}
	if st.DeadLettersTotal > 0 {
		st.DeadLetterFile = out.dlqName
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

// runFile ingests a file or stdin to its end (or a stop).
func runFile(ctx, soft context.Context, p *plan, out *output, st *ingestStats) error {
	from, err := localPath("from", p.o.from)
	if err != nil {
		return err
	}
	src, err := ingest.OpenFile(from, int(p.maxRecord))
	if err != nil {
		return err
	}
	defer src.Close()
	if from != "-" {
		if info, err := os.Stat(from); err == nil {
			st.InputBytes = info.Size()
		}
	}
	if err := out.claim(ctx, []string{src.Stream()}, 0); err != nil {
		return err
	}
	res, err := runPipeline(ctx, soft, p, src, out)
	st.add(res)
	if err == nil {
		err = out.sweep(ctx)
	}
	return err
}

// runKafka consumes generation after generation of the consumer group until
// a stop. Each generation claims its partitions in the manifest (fencing
// their previous owners), starts every partition at its first unsettled
// offset, and runs the pipeline until the next rebalance; what it had not
// committed by then is left to the next owner.
func runKafka(ctx, soft context.Context, p *plan, out *output, st *ingestStats, stderr io.Writer) error {
	cfg, err := kafka.ParseURL(p.o.from)
	if err != nil {
		return usageErrorf("--from: %v", err)
	}
	cfg = p.o.conn.kafka(cfg)
	consumer, err := kafka.NewConsumer(cfg)
	if err != nil {
		return err
	}
	defer func() { consumer.Close() }()
	backoff := time.Second
	pause := func(why error) {
		p.log.Warn("kafka: retrying", "err", why, "in", backoff)
		select {
		case <-soft.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
	// rejoin leaves the group and joins again: the way to give up a
	// generation that failed without a rebalance (Next would wait for the
	// current one to end, and heartbeats keep it alive).
	rejoin := func(why error) error {
		consumer.Close()
		pause(why)
		c, err := kafka.NewConsumer(cfg)
		if err != nil {
			return err
		}
		consumer = c
		return nil
	}
	for soft.Err() == nil {
		gen, err := consumer.Next(soft)
		if err != nil {
			if soft.Err() != nil {
				return nil
			}
			pause(err) // the broker is away: wait for it
			continue
		}
		if err := runGeneration(ctx, soft, p, out, st, cfg, gen); err != nil {
			switch {
			case errors.Is(err, kafka.ErrGenerationEnded):
				// A rebalance: uncommitted work is the next owner's.
				p.log.Info("kafka: generation ended; rejoining", "reason", err)
				backoff = time.Second
			case ctx.Err() != nil:
				return err
			default:
				// Fenced, an outage outlasting the retries, a broker error:
				// nothing uncommitted is settled; rejoin and resume from the
				// manifest.
				if err := rejoin(err); err != nil {
					return err
				}
			}
			continue
		}
		backoff = time.Second
	}
	return nil
}

// runGeneration claims the generation's partitions (fencing their previous
// owners), starts each at its first unsettled offset and runs the pipeline
// until the generation ends; it then removes this writer's unlisted
// objects.
func runGeneration(ctx, soft context.Context, p *plan, out *output, st *ingestStats, cfg kafka.Config, gen *kafka.Generation) error {
	if err := out.claim(ctx, gen.Streams(), gen.ID()); err != nil {
		return err
	}
	firsts, err := gen.FirstOffsets(ctx)
	if err != nil {
		return err
	}
	settled := out.settled()
	start := map[int]int64{}
	for _, part := range gen.Partitions {
		start[part] = kafka.ResumeOffset(settled[kafka.Stream(cfg.Topic, part)], firsts[part])
	}
	p.log.Info("kafka: generation", "id", gen.ID(), "topic", cfg.Topic, "partitions", gen.Partitions, "resume", start)
	out.resetDLQ()
	hintCtx, stopHints := context.WithCancel(ctx)
	go commitHints(hintCtx, gen, cfg.Topic, firsts, out)
	src := gen.Source(start)
	if l, ok := src.(interface{ Lag() int64 }); ok {
		p.m.mu.Lock()
		p.m.lag = l.Lag
		p.m.mu.Unlock()
	}
	res, err := runPipeline(ctx, soft, p, src, out)
	stopHints()
	st.add(res)
	// No commit of ours is in flight now: what we uploaded without
	// listing it goes.
	if serr := out.sweep(ctx); serr != nil {
		p.log.Warn("sweeping unlisted objects", "err", serr)
	}
	if soft.Err() != nil {
		return nil
	}
	return err
}

// commitHints records the resume offsets in Kafka every few seconds, after
// the manifest: tools see the group's progress; ingest never trusts them.
func commitHints(ctx context.Context, gen *kafka.Generation, topic string, firsts map[int]int64, out *output) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			settled := out.settled()
			offs := map[int]int64{}
			for _, part := range gen.Partitions {
				offs[part] = kafka.ResumeOffset(settled[kafka.Stream(topic, part)], firsts[part])
			}
			_ = gen.CommitOffsets(offs)
		}
	}
}

// pipelineResult is what one run of the stages counted.
type pipelineResult struct {
	counters transform.Counters
	batch    transform.BatchCounters
	totals   sink.Totals
}

func (st *ingestStats) add(r pipelineResult) {
	c := &st.Counters
	c.Records += r.counters.Records
	c.Blank += r.counters.Blank
	c.Duplicates += r.counters.Duplicates
	c.Repaired += r.counters.Repaired
	c.SkippedCommitted += r.counters.SkippedCommitted
	c.GroupsEmitted += r.counters.GroupsEmitted
	c.PartialGroups += r.counters.PartialGroups
	c.TrajectoriesEmitted += r.counters.TrajectoriesEmitted
	c.StepsEmitted += r.counters.StepsEmitted
	c.TimedOut += r.counters.TimedOut
	c.Evicted += r.counters.Evicted
	st.NoTeacher += r.batch.NoTeacher
	if st.Filtered == nil {
		st.Filtered = map[string]int64{}
	}
	for k, v := range r.batch.Filtered {
		st.Filtered[k] += v
	}
	st.Shards += r.totals.Shards
	st.Rows += r.totals.Rows
	st.Bytes += r.totals.Bytes
}

// runPipeline runs source → decode → assemble → sink until the source ends
// or stops.
func runPipeline(ctx, soft context.Context, p *plan, src ingest.Source, out *output) (pipelineResult, error) {
	var res pipelineResult
	mem := memory.DefaultAllocator
	batcher := transform.NewBatcher(mem, transform.BatchConfig{Estimator: p.est, Label: p.label, Distill: p.distill, Filters: p.filters})
	defer batcher.Release()
	sk := sink.New(out.store, sink.Config{
		Settler:       out.settler,
		ShardSize:     p.shardSize,
		FlushInterval: p.o.flushInterval,
		RunID:         p.runID,
		Seq:           &p.shardSeq,
		OnCommit:      p.m.commit,
		Parquet:       parquet.Options{ZstdLevel: p.o.zstdLevel, Compact: p.o.compact, Allocator: mem},
		Lanes:         max(p.o.encoders, 1),
	})
	settled := out.settled()

	tick := time.Second
	if p.o.flushInterval > 0 && p.o.flushInterval/2 < tick {
		tick = max(p.o.flushInterval/2, 10*time.Millisecond)
	}
	g, gctx := errgroup.WithContext(ctx)
	// Reading stops on a soft stop too; everything after it drains.
	srcCtx, cancelSrc := context.WithCancel(gctx)
	defer cancelSrc()
	stopSoft := context.AfterFunc(soft, cancelSrc)
	defer stopSoft()

	decoded := make(chan ingest.Batch, 4)
	batches := make(chan transform.Batch, 2)
	g.Go(func() error {
		err := ingest.DecodeStage(srcCtx, src, p.o.decoders, decoded)
		if err != nil && soft.Err() != nil && gctx.Err() == nil {
			return nil // a soft stop, not a failure
		}
		return err
	})
	g.Go(func() error {
		var err error
		res.counters, err = transform.Stage(gctx, decoded, batches, out.dl, batcher, transform.StageConfig{
			Assembler: transform.Config{
				GroupSize:     p.o.groupSize,
				MinGroupSize:  p.o.minGroupSize,
				Timeout:       p.o.groupTimeout,
				MaxOpenGroups: p.o.maxOpenGroups,
				Settled:       settled.Contains,
			},
			Tick:    tick,
			Stopped: func() bool { return soft.Err() != nil },
			Observe: p.m.observe,
		})
		return err
	})
	g.Go(func() error { return sink.Run(gctx, batches, sk, tick) })
	err := g.Wait()
	p.m.endPipeline()
	res.totals = sk.Totals
	res.batch = batcher.Counters
	return res, err
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

// output is where an ingest writes: a local directory or an S3 prefix,
// with its dead-letter writer and exactly-once bookkeeping.
type output struct {
	name     string // for the summary
	dlqName  string
	store    sink.Store
	dl       transform.DeadLetters
	settler  sink.Settler
	counts   func() map[schemas.Reason]int64
	settled  func() schemas.Settled
	claim    func(ctx context.Context, streams []string, generation int64) error
	sweep    func(ctx context.Context) error // remove this writer's unlisted objects
	resetDLQ func()
	closeDLQ func() error
	close    func() error
}

func openOutput(ctx context.Context, o ingestOpts, runID string) (*output, error) {
	out, err := openStore(ctx, o, runID)
	if err != nil || !strings.HasPrefix(o.dlq, "kafka://") {
		return out, err
	}
	// Dead letters to a Kafka topic, whatever the output.
	cfg, err := kafka.ParseURL(o.dlq)
	if err != nil {
		out.close()
		return nil, usageErrorf("--dlq: %v", err)
	}
	dl, err := kafka.NewDeadLetters(ctx, o.conn.kafka(cfg))
	if err != nil {
		out.close()
		return nil, err
	}
	out.dl, out.settler, out.counts = dl, dl, dl.Counts
	out.dlqName = cfg.String()
	out.resetDLQ, out.closeDLQ = dl.Reset, dl.Close
	return out, nil
}

func openStore(ctx context.Context, o ingestOpts, runID string) (*output, error) {
	if strings.HasPrefix(o.to, "s3://") {
		cfg, err := s3.ParseURL(o.to)
		if err != nil {
			return nil, usageErrorf("--to: %v", err)
		}
		cfg = o.conn.s3(cfg)
		if size, _ := parseBytes(o.shardSize); size > 4<<30 {
			return nil, usageErrorf("--shard-size: at most 4GiB on S3 (a shard is one create-only PUT)")
		}
		if o.dlq != "" && !strings.HasPrefix(o.dlq, "kafka://") {
			return nil, usageErrorf("--dlq: with an s3:// output, dead letters are objects under <prefix>/_dlq/ or a kafka:// topic")
		}
		st, err := s3.Open(ctx, cfg, runID)
		if err != nil {
			return nil, err
		}
		out := &output{
			name:     "s3://" + cfg.Bucket + "/" + cfg.Prefix,
			dlqName:  "s3://" + cfg.Bucket + "/" + st.Key("_dlq/"),
			store:    s3Store{st},
			settled:  st.Settled,
			close:    func() error { return nil },
			closeDLQ: func() error { return nil },
		}
		var mu sync.Mutex // the metrics handler reads counts during a reset
		counts := map[schemas.Reason]int64{}
		var cur *s3.DeadLetters
		out.resetDLQ = func() {
			mu.Lock()
			defer mu.Unlock()
			if cur != nil {
				for k, v := range cur.Counts() {
					counts[k] += v
				}
			}
			cur = s3.NewDeadLetters(st)
			out.dl, out.settler = cur, cur
		}
		out.resetDLQ()
		out.counts = func() map[schemas.Reason]int64 {
			mu.Lock()
			defer mu.Unlock()
			m := map[schemas.Reason]int64{}
			for k, v := range counts {
				m[k] = v
			}
			for k, v := range cur.Counts() {
				m[k] += v
			}
			return m
		}
		out.sweep = func(ctx context.Context) error {
			_, err := st.RemoveOwnOrphans(ctx)
			return err
		}
		out.claim = func(ctx context.Context, streams []string, generation int64) error {
			streams = slices.DeleteFunc(streams, func(s string) bool { return s == "" }) // stdin
			if err := st.Claim(ctx, streams, generation); err != nil {
				return err
			}
			_, err := st.RemoveOrphans(ctx)
			return err
		}
		return out, nil
	}
	to, err := localPath("to", o.to)
	if err != nil {
		return nil, err
	}
	st, err := local.Open(to)
	if err != nil {
		return nil, err
	}
	dlqPath := local.DeadLetterPath(st.Root(), runID)
	if o.dlq != "" && !strings.HasPrefix(o.dlq, "kafka://") {
		if dlqPath, err = localPath("dlq", o.dlq); err != nil {
			st.Close()
			return nil, err
		}
	}
	dl := local.NewDeadLetterFile(dlqPath)
	return &output{
		name:     st.Root(),
		dlqName:  dlqPath,
		store:    localStore{st},
		dl:       dl,
		settler:  deadLetterSettler{dl, st},
		counts:   dl.Counts,
		settled:  st.Settled,
		claim:    func(context.Context, []string, int64) error { return nil }, // one writer per directory
		sweep:    func(context.Context) error { return nil },
		resetDLQ: func() {},
		closeDLQ: dl.Close,
		close:    st.Close,
	}, nil
}

// s3Store adapts s3.Store to sink.Store.
type s3Store struct{ *s3.Store }

func (s s3Store) Create(ctx context.Context, rel string) (sink.Pending, error) {
	return s.Store.Create(ctx, rel)
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
