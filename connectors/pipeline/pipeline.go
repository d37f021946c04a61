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
	"errors"
	"fmt"
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
	// FullPrompts stores every prompt and message list whole instead of
	// as a delta of the step before (transform.BatchConfig).
	FullPrompts bool
	// Shards: see sink.Config.
	MaxPartitions int
	ShardSize     int64
	FlushInterval time.Duration
	Parquet       parquet.Options
	// Decoders is the number of decoding goroutines; Encoders the shards
	// of one partition encoded at once.
	Decoders, Encoders int
	// Spill, when set, is the file where a run over stdin writes the
	// records it read but whose fate it could not commit (a commit gave up
	// during a store outage, a second signal), as they were read: such an
	// input cannot be read again. Until the run ends, what stdin gives is
	// copied to segments beside it (see spool). With a spill file the
	// store's retries end at the first signal, as for any other input;
	// without one they go on after it for up to RetryFor.
	Spill string
	// RetryFor bounds how long RunKafka retries a broker or store that
	// keeps failing before it returns the error (0: DefaultRetryFor).
	RetryFor time.Duration
	// Observer, if set, sees the pipeline's progress (metrics).
	Observer Observer
	Log      *slog.Logger
}

// DefaultRetryFor is how long RunKafka retries by default.
const DefaultRetryFor = 15 * time.Minute

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
	// Drained: a soft stop ended an input that cannot be read again
	// (stdin) where it was, and every record read was written: open
	// groups closed as at the end of the input.
	Drained bool `json:"stdin_drained,omitempty"`
	// Spilled records of stdin were read but never committed; they are in
	// SpillFile, as they were read (Config.Spill).
	Spilled   int64  `json:"spilled_records,omitempty"`
	SpillFile string `json:"spill_file,omitempty"`
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
	res.Groups += r.Groups
	res.Bytes += r.Bytes
	res.Drained = res.Drained || r.Drained
	res.Spilled += r.Spilled
	if r.SpillFile != "" {
		res.SpillFile = r.SpillFile
	}
}

// Stopper is a source that can end early where it is (ingest.LineSource
// of stdin): Read hands out what was read, then io.EOF.
type Stopper interface{ Stop() }

// Pipeline writes to one store as one writer; its shards are numbered
// across the runs of its stages (Kafka generations).
type Pipeline struct {
	cfg   Config
	store store.Store
	dl    store.DeadLetters
	seq   atomic.Int64
	res   Result
	spool *spool // of stdin, while a run over it lasts
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
//
// A soft stop of a file leaves its open groups to the next run, which
// reads them again. stdin (stream "") cannot be read again: a soft stop
// ends it where it is (src must be a Stopper), and every record read is
// written, open groups as partial groups or dead letters, as at its end.
func (p *Pipeline) Run(ctx, soft context.Context, src ingest.Source, stream string) error {
	streams := slices.DeleteFunc([]string{stream}, func(s string) bool { return s == "" }) // stdin
	if err := p.store.Claim(store.WithRetryStop(ctx, soft.Done()), streams, 0); err != nil {
		return err
	}
	var err error
	if st, ok := src.(Stopper); ok && stream == "" {
		err = p.drainStages(ctx, soft, src, st)
	} else {
		err = p.stages(ctx, soft, src, soft.Done())
	}
	if err == nil {
		// A stop during an outage ends the sweep's retries too.
		err = p.store.Sweep(store.WithRetryStop(ctx, soft.Done()))
	}
	return err
}

// drainStages runs the stages over a source that a soft stop ends rather
// than cancels, so that nothing read is dropped: what is read is written,
// or, when its commit fails, kept in the spill file (Config.Spill).
func (p *Pipeline) drainStages(ctx, soft context.Context, src ingest.Source, st Stopper) error {
	stop := context.AfterFunc(soft, st.Stop)
	defer stop()
	if p.cfg.Spill == "" {
		// Retries go on after the stop (for at most the store's bound):
		// what was read from stdin exists nowhere else. A second signal
		// ends them.
		err := p.stages(ctx, context.Background(), src, nil)
		if soft.Err() != nil && err == nil {
			p.res.Drained = true
		}
		return err
	}
	sp, err := newSpool(p.cfg.Spill, "stdin:"+p.store.Writer())
	if err != nil {
		return err
	}
	p.spool = sp
	defer func() { p.spool = nil }()
	// The first signal ends the store's retries too: what a commit could
	// not write goes to the spill file.
	err = p.stages(ctx, context.Background(), spoolSource{src, sp}, soft.Done())
	n, serr := sp.finish()
	p.res.Spilled += n
	if n > 0 {
		p.res.SpillFile = p.cfg.Spill
		p.cfg.Log.Error("records read from stdin were not written; they are saved in the spill file, as they were read: ingest it to write them",
			"records", n, "spill", p.cfg.Spill)
		if err == nil {
			err = fmt.Errorf("%d records read were not written (kept in %s)", n, p.cfg.Spill)
		}
	}
	if serr != nil {
		err = errors.Join(err, serr)
	}
	if soft.Err() != nil && err == nil {
		p.res.Drained = true
	}
	return err
}

// stages runs source → decode → assemble → sink until the source ends or
// a soft stop cancels reading (open groups are then left unwritten, to
// be read again). retryStop, when closed, ends the store's retries of a
// commit while an outage lasts (nil: never).
func (p *Pipeline) stages(ctx, soft context.Context, src ingest.Source, retryStop <-chan struct{}) error {
	ctx = store.WithRetryStop(ctx, retryStop)
	cfg := p.cfg
	mem := memory.DefaultAllocator
	batcher := transform.NewBatcher(mem, transform.BatchConfig{Estimator: cfg.Estimator, Label: cfg.Label, Distill: cfg.Distill, Filters: cfg.Filters, FullPrompts: cfg.FullPrompts})
	defer batcher.Release()
	po := cfg.Parquet
	po.Allocator = mem
	var out sink.Store = p.store
	if p.spool != nil {
		out = settleStore{p.store, p.spool}
	}
	sk := sink.New(out, sink.Config{
		Settler:       p.dl,
		ShardSize:     cfg.ShardSize,
		FlushInterval: cfg.FlushInterval,
		RunID:         p.store.Writer(),
		Seq:           &p.seq,
		OnCommit:      cfg.Observer.Committed,
		Parquet:       po,
		Lanes:         max(cfg.Encoders, 1),
		MaxPartitions: cfg.MaxPartitions,
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
