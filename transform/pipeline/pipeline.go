// Package pipeline runs ingest end to end, exactly once: source → decode
// (ingest) → assemble and compute advantages (transform) → encode and
// commit shards (connectors/sink) to a store.Store, with the dead letters
// and the settled positions that let a restart, a rebalance or a crash
// lose no record and double none.
//
// Run reads a file or stdin to its end; RunKafka follows a consumer group
// generation after generation. Both take two contexts: ctx cancels at once
// (a second signal), soft stops reading and commits what is assembled
// (the first).
package pipeline

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"golang.org/x/sync/errgroup"

	"github.com/rllm-pipe/rllm-pipe/advantage"
	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/sink"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// Config is a validated ingest configuration.
type Config struct {
	// Assembly: see transform.Config.
	GroupSize, MinGroupSize int
	GroupTimeout            time.Duration
	MaxOpenGroups           int
	// Advantages: the estimator, its label in the shards, on-policy
	// distillation (nil: off) and the filters that mark rows.
	Estimator advantage.Estimator
	Label     string
	Distill   *advantage.Distill
	Filters   []transform.Filter
	// Shards: see sink.Config.
	ShardSize     int64
	FlushInterval time.Duration
	Parquet       parquet.Options
	// Decoders is the number of decoding goroutines; Encoders the shards
	// of one partition encoded at once.
	Decoders, Encoders int
	// Observer, if set, sees the pipeline's progress (metrics).
	Observer Observer
	Log      *slog.Logger
}

// Observer sees a pipeline's progress. Calls come from the pipeline's
// goroutines; implementations synchronise.
type Observer interface {
	// Progress reports the assembler's counters and open groups.
	Progress(c transform.Counters, open int)
	// Committed reports a committed shard: its rows and how long the
	// commit (footer, upload, manifest) took.
	Committed(rows int64, took time.Duration)
	// Ended reports that one run of the stages ended (a generation or
	// the input).
	Ended()
	// Lag reports a function that gives the records behind the ends of
	// the partitions read (Kafka only).
	Lag(func() int64)
}

// Result is what a run counted.
type Result struct {
	transform.Counters
	transform.BatchCounters
	sink.Totals
}

// Add adds r's counts to res.
func (res *Result) Add(r Result) {
	res.Counters.Add(r.Counters)
	res.NoTeacher += r.NoTeacher
	if len(r.Filtered) > 0 && res.Filtered == nil {
		res.Filtered = map[string]int64{}
	}
	for k, v := range r.Filtered {
		res.Filtered[k] += v
	}
	res.Shards += r.Shards
	res.Rows += r.Rows
	res.Bytes += r.Bytes
}

// Pipeline writes to one store as one writer; its shards are numbered
// across the runs of its stages (Kafka generations).
type Pipeline struct {
	cfg   Config
	store store.Store
	dl    store.DeadLetters
	seq   atomic.Int64
	res   Result
}

// New returns a pipeline writing to st, with dead letters to dl (the
// store's own when nil).
func New(cfg Config, st store.Store, dl store.DeadLetters) *Pipeline {
	if dl == nil {
		dl = st.DeadLetters()
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Observer == nil {
		cfg.Observer = nopObserver{}
	}
	return &Pipeline{cfg: cfg, store: st, dl: dl}
}

// Result returns what the runs so far counted.
func (p *Pipeline) Result() Result { return p.res }

// Run ingests src, a file or stdin, to its end or a soft stop: it claims
// the source's stream (fencing earlier writers of it), skips the positions
// an earlier run settled, and removes its unlisted objects at the end.
func (p *Pipeline) Run(ctx, soft context.Context, src ingest.Source, stream string) error {
	streams := slices.DeleteFunc([]string{stream}, func(s string) bool { return s == "" }) // stdin
	if err := p.store.Claim(ctx, streams, 0); err != nil {
		return err
	}
	err := p.stages(ctx, soft, src)
	if err == nil {
		err = p.store.Sweep(ctx)
	}
	return err
}

// stages runs source → decode → assemble → sink until the source ends or
// stops.
func (p *Pipeline) stages(ctx, soft context.Context, src ingest.Source) error {
	cfg := p.cfg
	mem := memory.DefaultAllocator
	batcher := transform.NewBatcher(mem, transform.BatchConfig{Estimator: cfg.Estimator, Label: cfg.Label, Distill: cfg.Distill, Filters: cfg.Filters})
	defer batcher.Release()
	po := cfg.Parquet
	po.Allocator = mem
	sk := sink.New(p.store, sink.Config{
		Settler:       p.dl,
		ShardSize:     cfg.ShardSize,
		FlushInterval: cfg.FlushInterval,
		RunID:         p.store.Writer(),
		Seq:           &p.seq,
		OnCommit:      cfg.Observer.Committed,
		Parquet:       po,
		Lanes:         max(cfg.Encoders, 1),
	})
	settled := p.store.Settled()

	tick := time.Second
	if cfg.FlushInterval > 0 && cfg.FlushInterval/2 < tick {
		tick = max(cfg.FlushInterval/2, 10*time.Millisecond)
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
		err := ingest.DecodeStage(srcCtx, src, max(cfg.Decoders, 1), decoded)
		if err != nil && soft.Err() != nil && gctx.Err() == nil {
			return nil // a soft stop, not a failure
		}
		return err
	})
	g.Go(func() error {
		var err error
		counters, err = transform.Stage(gctx, decoded, batches, p.dl, batcher, transform.StageConfig{
			Assembler: transform.Config{
				GroupSize:     cfg.GroupSize,
				MinGroupSize:  cfg.MinGroupSize,
				Timeout:       cfg.GroupTimeout,
				MaxOpenGroups: cfg.MaxOpenGroups,
				Settled:       settled.Contains,
			},
			Tick:    tick,
			Stopped: func() bool { return soft.Err() != nil },
			Observe: cfg.Observer.Progress,
		})
		return err
	})
	g.Go(func() error { return sink.Run(gctx, batches, sk, tick) })
	err := g.Wait()
	cfg.Observer.Ended()
	bc := batcher.Counters
	bc.Filtered = maps.Clone(bc.Filtered)
	p.res.Add(Result{Counters: counters, BatchCounters: bc, Totals: sk.Totals})
	return err
}

type nopObserver struct{}

func (nopObserver) Progress(transform.Counters, int) {}
func (nopObserver) Committed(int64, time.Duration)   {}
func (nopObserver) Ended()                           {}
func (nopObserver) Lag(func() int64)                 {}
