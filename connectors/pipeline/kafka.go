package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/kafka"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Group is a membership of a Kafka consumer group, as RunKafka uses it.
type Group interface {
	// Next blocks until the member is given its next assignment.
	Next(ctx context.Context) (Generation, error)
	// Close leaves the group.
	Close() error
}

// Generation is one assignment of partitions to this member; it ends on
// a rebalance.
type Generation interface {
	// ID orders generations: later ones have larger IDs.
	ID() int64
	// Streams names the assigned partitions as exactly-once streams.
	Streams() []string
	// Source reads the partitions, each from its first offset that
	// settled does not contain; it ends with an error wrapping
	// kafka.ErrGenerationEnded on a rebalance.
	Source(ctx context.Context, settled schemas.Settled) (ingest.Source, error)
	// Commit records the resume offsets implied by settled in Kafka: a
	// hint for tools, never trusted by ingest.
	Commit(settled schemas.Settled) error
}

// JoinKafka returns the function that joins the consumer group of cfg.
func JoinKafka(cfg kafka.Config) func() (Group, error) {
	return func() (Group, error) {
		c, err := kafka.NewConsumer(cfg)
		if err != nil {
			return nil, err
		}
		return kafkaGroup{c}, nil
	}
}

type kafkaGroup struct{ c *kafka.Consumer }

func (k kafkaGroup) Close() error { return k.c.Close() }

func (k kafkaGroup) Next(ctx context.Context) (Generation, error) {
	g, err := k.c.Next(ctx)
	if err != nil {
		return nil, err
	}
	return &kafkaGeneration{g: g}, nil
}

type kafkaGeneration struct {
	g      *kafka.Generation
	firsts map[int]int64
}

func (k *kafkaGeneration) ID() int64         { return k.g.ID() }
func (k *kafkaGeneration) Streams() []string { return k.g.Streams() }

func (k *kafkaGeneration) Source(ctx context.Context, settled schemas.Settled) (ingest.Source, error) {
	firsts, err := k.g.FirstOffsets(ctx)
	if err != nil {
		return nil, err
	}
	k.firsts = firsts
	start := k.g.Resume(settled, firsts)
	for p, off := range start {
		start[p] = max(firsts[p], off-RetryLookback)
	}
	return k.g.Source(start), nil
}

// RetryLookback is how many settled offsets before its first unsettled one
// a partition is read again from (skipped, as settled). The Assembler
// remembers them, so that a producer retry just after them whose drop an
// earlier run did not get to checkpoint is dropped again, instead of
// opening a group of its own that nothing completes (until
// --group-timeout). Retries land within a few batches of their original.
const RetryLookback = 1024

func (k *kafkaGeneration) Commit(settled schemas.Settled) error {
	return k.g.CommitOffsets(k.g.Resume(settled, k.firsts))
}

// ErrStoppedInOutage is RunKafka's error when a soft stop came while the
// broker was unreachable: nothing is lost (what was committed is whole),
// but the run stopped before finishing.
var ErrStoppedInOutage = errors.New("kafka: stopped while the broker was unreachable")

// ErrStoppedUncommitted is RunKafka's error when the store failed what a
// soft stop commits: records read and not committed are read again by
// the partitions' next owner (exit 3, as for ErrStoppedInOutage).
var ErrStoppedUncommitted = errors.New("stopped with records read but not committed (the next run reads them again)")

// RunKafka consumes generation after generation of the consumer group
// that join joins, until a soft stop. Each generation claims its
// partitions in the manifest (fencing their previous owners), starts every
// partition at its first unsettled offset, and runs the stages until the
// next rebalance; what it had not committed by then is left to the next
// owner, and its dead letters not yet checkpointed are dropped (the next
// owner dead-letters those records again).
func (p *Pipeline) RunKafka(ctx, soft context.Context, join func() (Group, error)) error {
	group, err := join()
	if err != nil {
		return err
	}
	defer func() { group.Close() }()
	backoff := time.Second
	var failing time.Time // since when every attempt failed
	limit := p.cfg.RetryFor
	if limit <= 0 {
		limit = DefaultRetryFor
	}
	// pause waits before the next attempt; it fails the run when attempts
	// have failed for longer than the limit.
	pause := func(why error) error {
		if failing.IsZero() {
			failing = time.Now()
		}
		if time.Since(failing) >= limit {
			return fmt.Errorf("kafka: failing for %s (--retry-for): %w", limit, why)
		}
		p.cfg.Log.Warn("kafka: retrying", "err", why, "in", backoff)
		select {
		case <-soft.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
		return nil
	}
	// stopped is the end of a soft stop: clean, unless it came while the
	// broker was away (the run did not finish what it had: exit 3).
	var lastErr error
	stopped := func() error {
		if failing.IsZero() {
			return nil
		}
		return fmt.Errorf("%w (%s): %w", ErrStoppedInOutage, time.Since(failing).Round(time.Second), lastErr)
	}
	for soft.Err() == nil {
		gen, err := group.Next(soft)
		if err != nil {
			if soft.Err() != nil {
				return stopped()
			}
			lastErr = err
			if err := pause(err); err != nil { // the broker is away: wait for it
				return err
			}
			continue
		}
		err = p.generation(ctx, soft, gen)
		switch {
		case err == nil:
			backoff, failing = time.Second, time.Time{}
		case errors.Is(err, kafka.ErrGenerationEnded):
			// A rebalance: uncommitted work is the next owner's.
			p.cfg.Log.Info("kafka: generation ended; rejoining", "reason", err)
			backoff, failing = time.Second, time.Time{}
		case ctx.Err() != nil, errors.Is(err, ErrStoppedUncommitted):
			return err
		default:
			// Fenced, an outage outlasting the retries, a broker error:
			// nothing uncommitted is settled. Leave the group and join
			// again (Next would wait for the current generation to end,
			// and heartbeats keep it alive), then resume from the
			// manifest.
			group.Close()
			lastErr = err
			if err := pause(err); err != nil {
				return err
			}
			if soft.Err() != nil {
				return stopped()
			}
			if group, err = join(); err != nil {
				return err
			}
		}
	}
	return stopped()
}

// generation claims the generation's partitions, runs the stages from the
// first unsettled offsets until the generation ends, and then removes
// this writer's unlisted objects.
func (p *Pipeline) generation(ctx, soft context.Context, gen Generation) error {
	if err := p.store.Claim(store.WithRetryStop(ctx, soft.Done()), gen.Streams(), gen.ID()); err != nil {
		return err
	}
	p.dl.Reset()
	src, err := gen.Source(ctx, p.store.Settled())
	if err != nil {
		return err
	}
	p.cfg.Log.Info("kafka: generation", "id", gen.ID(), "streams", gen.Streams())
	if l, ok := src.(interface{ Lag() int64 }); ok {
		p.cfg.Observer.Lag(l.Lag)
	}
	hintCtx, stopHints := context.WithCancel(ctx)
	hints := make(chan struct{})
	go func() {
		defer close(hints)
		commitHints(hintCtx, gen, p.store.Settled)
	}()
	err = p.stages(ctx, soft, src, soft.Done())
	stopHints()
	<-hints
	// No commit of ours is in flight now: what we published without
	// listing it goes.
	if serr := p.store.Sweep(store.WithRetryStop(ctx, soft.Done())); serr != nil {
		p.cfg.Log.Warn("sweeping unlisted objects", "err", serr)
	}
	if soft.Err() != nil {
		if err != nil && !errors.Is(err, kafka.ErrGenerationEnded) && !errors.Is(err, context.Canceled) {
			// The store failed the stop's commits (an outage): nothing is
			// lost, the next owner reads those records again, but this
			// run did not finish what it had.
			return fmt.Errorf("%w: %w", ErrStoppedUncommitted, err)
		}
		return nil
	}
	return err
}

// commitHints records the resume offsets in Kafka every few seconds, after
// the manifest: tools see the group's progress; ingest never trusts them.
func commitHints(ctx context.Context, gen Generation, settled func() schemas.Settled) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = gen.Commit(settled())
		}
	}
}
