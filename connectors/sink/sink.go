// Package sink rolls Arrow batches into Parquet shards and commits them to
// a Store: open shards per partition (group policy version), cut when they
// reach the shard size or the flush interval, so quiet streams still land.
// Each committed shard carries its manifest entry in its footer too.
//
// Encoding (Parquet pages, zstd) is the costliest step of ingest, so each
// open shard encodes on its own goroutine, and a partition has Lanes open
// shards that batches take in turn: one partition still uses every core.
//
// A shard's commit (its last row group, footer, upload, manifest append)
// runs on a goroutine of its own too, up to MaxCommits at once, so that
// uploading one shard to an object store overlaps building the next, and
// the shards closed together at the end upload together. A failed commit
// is reported by the next Write, Tick, Wait or Close.
package sink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/transform"
)

// Store creates pending shards at clean relative paths, and appends
// manifest entries that carry no shard (checkpoints): the part of
// store.Store the sink uses.
type Store interface {
	Create(ctx context.Context, rel string) (store.Pending, error)
	Append(ctx context.Context, e schemas.ShardEntry) error
}

// Settler makes dead letters and dropped records durable and hands over
// the positions they settle, with the dead-letter file's durable state;
// the sink calls it right before appending the entry that carries them,
// so that an entry never settles a record whose dead letter could still
// be lost.
type Settler interface {
	Checkpoint(ctx context.Context) (schemas.Settled, *schemas.DeadLetterState, error)
}

// Config tunes the sink. Zero values take the defaults noted.
type Config struct {
	// ShardSize cuts a shard once its estimated size reaches it. Default
	// 256 MiB.
	ShardSize int64
	// FlushInterval commits a shard this long after its first row, however
	// small. Default 30 s.
	FlushInterval time.Duration
	// MaxOpenShards bounds the shards open at once; opening one more
	// commits the oldest. Default 4 × Lanes, and at least MaxPartitions.
	MaxOpenShards int
	// MaxPartitions bounds the partitions (policy versions) open at once:
	// beyond it, a batch of a version not open joins the open partition
	// of the nearest version below its own (else the lowest open one), so
	// that a burst of versions makes a few shards, not one per version.
	// A shard then holds several versions; its entry's PolicyVersion is
	// the smallest. Default DefaultMaxPartitions; MaxOpenShards is raised
	// to it when lower, so that every partition can have a shard open.
	MaxPartitions int
	// Lanes is the number of shards open at once for one partition, each
	// encoded on its own goroutine; batches take them in turn. The lanes
	// are shared among the partitions being written (see Sink.lanes).
	// Default 1.
	Lanes int
	// RunID names this run's shards.
	RunID   string
	Parquet parquet.Options
	// Settler, if set, is checkpointed on every Tick and at Close, and
	// what it settles appended at once.
	Settler Settler
	// Seq, if set, numbers shards across the sinks of one run (one sink
	// per Kafka generation), so that shard names never repeat.
	Seq *atomic.Int64
	// OnCommit, if set, is called after every committed shard with its
	// rows and how long the commit (footer, upload, manifest) took. It is
	// called from the commit's goroutine.
	OnCommit func(rows int64, took time.Duration)
	// MaxCommits bounds the shard commits in flight at once; one more
	// waits for a slot (backpressure on Write). Default 4.
	MaxCommits int
}

// DefaultMaxPartitions is the default Config.MaxPartitions: more versions
// than trainers keep in flight at once.
const DefaultMaxPartitions = 16

// Totals are the sink's tallies.
type Totals struct {
	Shards int64 `json:"shards_committed"`
	Rows   int64 `json:"rows_committed"`
	Groups int64 `json:"groups_committed"`
	Bytes  int64 `json:"bytes_committed"`
}

// Sink is not safe for concurrent use; Run drives it from one goroutine.
// Totals is complete once Wait, Close or Abort returned.
type Sink struct {
	cfg    Config
	store  Store
	open   map[lane]*shard
	turn   map[int64]int   // the lane of each partition's next batch
	last   map[int64]int64 // the write number of each partition's last batch
	writes int64
	Totals Totals

	// Commits in flight: slots bounds them, inflight counts them.
	slots    chan struct{}
	inflight sync.WaitGroup
	mu       sync.Mutex // guards Totals (while commits run) and failed
	failed   error      // the first failed commit
}

// lane names an open shard: its partition and lane.
type lane struct {
	version int64
	n       int
}

type shard struct {
	rel     string
	lane    lane
	p       store.Pending
	w       *parquet.Writer
	opened  time.Time
	minVer  int64 // the smallest group version written
	groups  []string
	rows    int64
	sources map[string]*schemas.SourceRange
	settled schemas.Settled

	// The encoder goroutine takes records from work, writes them with w,
	// and reports the first error on done when work is closed.
	work    chan arrow.RecordBatch
	done    chan error
	size    atomic.Int64 // w.Size() after the last record encoded
	encoded atomic.Int64 // Arrow bytes of the records encoded
	queued  atomic.Int64 // Arrow bytes of the records waiting
	err     atomic.Pointer[error]
	doneErr error // what done reported
}

// encode writes the records from work until it is closed. After an error
// it releases what still comes without writing it.
func (sh *shard) encode(work <-chan arrow.RecordBatch) {
	var first error
	for rec := range work {
		n := parquet.RecordBytes(rec)
		if first == nil {
			if err := sh.w.Write(rec); err != nil {
				first = fmt.Errorf("shard %s: %w", sh.rel, err)
				sh.err.Store(&first)
			}
			sh.size.Store(sh.w.Size())
			sh.encoded.Add(n)
		}
		sh.queued.Add(-n)
		rec.Release()
	}
	// The last row group is encoded here too, so that shards closed
	// together (the end of the input) compress theirs at once.
	if first == nil {
		if err := sh.w.Flush(); err != nil {
			first = fmt.Errorf("shard %s: %w", sh.rel, err)
		}
		sh.size.Store(sh.w.Size())
	}
	sh.done <- first
}

// estimate is the shard's size so far: what is encoded, plus the records
// waiting at the compression ratio seen (at face value before any).
func (sh *shard) estimate() int64 {
	size, enc, q := sh.size.Load(), sh.encoded.Load(), sh.queued.Load()
	if enc > 0 {
		return size + q*size/enc
	}
	return size + q
}

// stop closes the encoder's input: it encodes what is queued, then the
// last row group, and reports on done.
func (sh *shard) stop() {
	if sh.work != nil {
		close(sh.work)
		sh.work = nil
	}
}

// finish stops the encoder and returns its error once it is done.
func (sh *shard) finish() error {
	sh.stop()
	if sh.done != nil {
		sh.doneErr = <-sh.done
		sh.done = nil
	}
	return sh.doneErr
}

// New returns a sink writing to store.
func New(store Store, cfg Config) *Sink {
	if cfg.ShardSize <= 0 {
		cfg.ShardSize = 256 << 20
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 30 * time.Second
	}
	if cfg.Lanes <= 0 {
		cfg.Lanes = 1
	}
	if cfg.MaxOpenShards <= 0 {
		cfg.MaxOpenShards = 4 * cfg.Lanes
	}
	if cfg.MaxPartitions <= 0 {
		cfg.MaxPartitions = DefaultMaxPartitions
	}
	// Room for a shard of every partition: with fewer open shards than
	// partitions, opening one commits another (the oldest), so the
	// partitions are never all open at once and a version beyond them
	// would never share one (a shard per version). A partition's further
	// lanes share the rest.
	cfg.MaxOpenShards = max(cfg.MaxOpenShards, cfg.MaxPartitions)
	if cfg.RunID == "" {
		cfg.RunID = "run"
	}
	if cfg.Seq == nil {
		cfg.Seq = new(atomic.Int64)
	}
	if cfg.MaxCommits <= 0 {
		cfg.MaxCommits = 4
	}
	return &Sink{cfg: cfg, store: store, open: map[lane]*shard{}, turn: map[int64]int{}, last: map[int64]int64{},
		slots: make(chan struct{}, cfg.MaxCommits)}
}

// failure returns the first failed commit's error, if any.
func (s *Sink) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

func (s *Sink) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed == nil {
		s.failed = err
	}
}

// Wait blocks until the commits in flight are done and returns the first
// failure among all commits so far.
func (s *Sink) Wait() error {
	s.inflight.Wait()
	return s.failure()
}

// Write hands b to an open shard of its partition (the lanes in turn) and
// releases b.Record once encoded.
func (s *Sink) Write(ctx context.Context, b transform.Batch, now time.Time) error {
	if err := s.failure(); err != nil {
		b.Record.Release()
		return err
	}
	part := s.partition(b.Version)
	n := s.lanes(part)
	for ln, sh := range s.open {
		if ln.version == part && ln.n >= n { // a lane this partition no longer takes
			if err := s.commit(ctx, sh); err != nil {
				b.Record.Release()
				return err
			}
		}
	}
	ln := lane{part, s.turn[part] % n}
	s.turn[part] = (ln.n + 1) % n
	sh := s.open[ln]
	if sh == nil && len(s.open) >= s.cfg.MaxOpenShards {
		// No room for another shard. A partition that has one open takes
		// it rather than have another partition's committed for a lane:
		// that would close partitions one after the other and let every
		// new version open one of its own (a shard per version).
		if sh = s.anyLane(part); sh == nil {
			if err := s.commit(ctx, s.evictable()); err != nil {
				b.Record.Release()
				return err
			}
		}
	}
	if sh == nil {
		var err error
		if sh, err = s.create(ctx, ln, now); err != nil {
			b.Record.Release()
			return err
		}
	}
	if perr := sh.err.Load(); perr != nil {
		b.Record.Release()
		return *perr
	}
	sh.rows += b.Record.NumRows()
	sh.minVer = min(sh.minVer, b.Version)
	sh.groups = append(sh.groups, b.Groups...)
	sh.settled.Union(b.Settled)
	files := b.Record.Column(schemas.ColSourceFile).(*array.String)
	lines := b.Record.Column(schemas.ColSourceLine).(*array.Int64).Int64Values()
	for i, line := range lines {
		if files.IsNull(i) {
			continue // Kafka lineage: the settled offsets say it all
		}
		f := files.Value(i)
		r := sh.sources[f]
		if r == nil {
			r = &schemas.SourceRange{File: f, FirstLine: line, LastLine: line}
			sh.sources[f] = r
		}
		r.FirstLine = min(r.FirstLine, line)
		r.LastLine = max(r.LastLine, line)
	}
	sh.queued.Add(parquet.RecordBytes(b.Record))
	select {
	case sh.work <- b.Record: // the encoder releases it
	case <-ctx.Done():
		b.Record.Release()
		return ctx.Err()
	}
	if sh.estimate() >= s.cfg.ShardSize {
		return s.commit(ctx, sh)
	}
	return nil
}

// partition is the partition a batch of version v goes to: its own, while
// fewer than MaxPartitions are open or its own is open; beyond that the
// open one nearest below v, else the lowest open one.
func (s *Sink) partition(v int64) int64 {
	open := map[int64]bool{}
	for ln := range s.open {
		if ln.version == v {
			return v
		}
		open[ln.version] = true
	}
	if len(open) < s.cfg.MaxPartitions {
		return v
	}
	below, found := int64(0), false
	lowest := int64(math.MaxInt64)
	for o := range open {
		if o < v && (!found || o > below) {
			below, found = o, true
		}
		lowest = min(lowest, o)
	}
	if found {
		return below
	}
	return lowest
}

// lanes notes a batch for partition v and returns how many lanes v takes
// batches on now: Lanes shared by the partitions written in the last
// recentWrites batches, at least one each. Lanes are for using every core
// on few partitions; with as many partitions as cores the partitions'
// shards already encode in parallel, and extra lanes only multiply open
// shards (their buffers, smaller row groups; docs/performance.md#choices-behind-the-defaults has the
// figures).
func (s *Sink) lanes(v int64) int {
	s.writes++
	s.last[v] = s.writes
	if s.cfg.Lanes == 1 {
		return 1
	}
	active := 0
	for ver, w := range s.last {
		if s.writes-w >= recentWrites {
			delete(s.last, ver)
			continue
		}
		active++
	}
	return max(1, s.cfg.Lanes/active)
}

// recentWrites is how many batches back a partition still counts as
// being written, for sharing the lanes.
const recentWrites = 32

// anyLane returns an open shard of partition v (the lowest lane), or nil.
func (s *Sink) anyLane(v int64) *shard {
	var o *shard
	for ln, sh := range s.open {
		if ln.version == v && (o == nil || ln.n < o.lane.n) {
			o = sh
		}
	}
	return o
}

// evictable is the shard to commit to make room for another: the oldest
// extra lane of a partition (one that has another lane open), else the
// oldest shard.
func (s *Sink) evictable() *shard {
	lanes := map[int64]int{}
	for ln := range s.open {
		lanes[ln.version]++
	}
	var o, extra *shard
	for ln, sh := range s.open {
		if o == nil || sh.opened.Before(o.opened) {
			o = sh
		}
		if lanes[ln.version] > 1 && (extra == nil || sh.opened.Before(extra.opened)) {
			extra = sh
		}
	}
	if extra != nil {
		return extra
	}
	return o
}

func (s *Sink) create(ctx context.Context, ln lane, now time.Time) (*shard, error) {
	seq := s.cfg.Seq.Add(1)
	// The path is built from numbers and the run id only: record ids never
	// reach the file system.
	rel := schemas.PartitionKey + "=" + strconv.FormatInt(ln.version, 10) + "/part-" + s.cfg.RunID + "-" + fmt.Sprintf("%06d", seq) + ".parquet"
	p, err := s.store.Create(ctx, rel)
	if err != nil {
		return nil, fmt.Errorf("create shard: %w", err)
	}
	w, err := parquet.NewWriter(p, schemas.StepSchema, s.cfg.Parquet, map[string]string{schemas.FooterSchemaKey: schemas.SchemaVersion})
	if err != nil {
		p.Abort()
		return nil, err
	}
	sh := &shard{rel: rel, lane: ln, p: p, w: w, opened: now, minVer: ln.version, sources: map[string]*schemas.SourceRange{}, settled: schemas.Settled{},
		work: make(chan arrow.RecordBatch, 2), done: make(chan error, 1)}
	go sh.encode(sh.work)
	s.open[ln] = sh
	return sh, nil
}

// commit closes sh to batches and commits it on a goroutine of its own
// once a slot is free (it blocks until then). Its error, if any, is
// reported by a later call (failure).
func (s *Sink) commit(ctx context.Context, sh *shard) error {
	began := time.Now()
	delete(s.open, sh.lane)
	sh.stop() // the encoder finishes the shard while we wait for a slot
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		_ = sh.finish()
		sh.p.Abort()
		return ctx.Err()
	}
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		defer func() { <-s.slots }()
		if err := s.commitShard(ctx, sh, began); err != nil {
			s.fail(err)
		}
	}()
	return nil
}

// commitShard waits for sh's encoder, writes its footer and commits it.
// Its entry settles the shard's own positions only: dead letters are
// settled by the checkpoints of Tick and Close, on the sink's goroutine,
// each appended right after it is taken (a checkpoint whose entry was
// never appended leaves its letters in the dead-letter file, where the
// next owner of the stream writes them again).
func (s *Sink) commitShard(ctx context.Context, sh *shard, began time.Time) error {
	if err := sh.finish(); err != nil {
		sh.p.Abort()
		return err
	}
	e := schemas.ShardEntry{
		Path:          sh.rel,
		Rows:          sh.rows,
		Groups:        len(sh.groups),
		PolicyVersion: sh.minVer,
		GroupKeys:     sh.groups,
		RunID:         s.cfg.RunID,
		SchemaVersion: schemas.SchemaVersion,
		CommittedAt:   time.Now().UTC(),
	}
	for _, r := range sh.sources {
		e.Sources = append(e.Sources, *r)
	}
	sort.Slice(e.Sources, func(i, j int) bool { return e.Sources[i].File < e.Sources[j].File })
	if err := settle(ctx, nil, &e, sh.settled); err != nil {
		sh.p.Abort()
		return err
	}
	footer, err := json.Marshal(e)
	if err != nil {
		sh.p.Abort()
		return fmt.Errorf("encode footer entry: %w", err)
	}
	if err := sh.w.AddMetadata(schemas.FooterEntryKey, string(footer)); err != nil {
		sh.p.Abort()
		return fmt.Errorf("shard %s: %w", sh.rel, err)
	}
	if err := sh.w.Close(); err != nil {
		sh.p.Abort()
		return fmt.Errorf("shard %s: %w", sh.rel, err)
	}
	if err := sh.p.Commit(ctx, e); err != nil {
		return fmt.Errorf("commit shard %s: %w", sh.rel, err)
	}
	s.mu.Lock()
	s.Totals.Shards++
	s.Totals.Rows += sh.rows
	s.Totals.Groups += int64(len(sh.groups))
	s.Totals.Bytes += sh.w.Written()
	s.mu.Unlock()
	if s.cfg.OnCommit != nil {
		s.cfg.OnCommit(sh.rows, time.Since(began))
	}
	return nil
}

// settle fills e's settled positions: the shard's own (may be nil) and
// those settler (may be nil) made durable since its last checkpoint.
func settle(ctx context.Context, settler Settler, e *schemas.ShardEntry, own schemas.Settled) error {
	st := schemas.Settled{}
	st.Union(own)
	if settler != nil {
		more, dl, err := settler.Checkpoint(ctx)
		if err != nil {
			return fmt.Errorf("checkpoint dead letters: %w", err)
		}
		st.Union(more)
		e.DeadLetters = dl
	}
	if len(st) > 0 {
		e.Settled = st
	}
	return nil
}

// checkpoint appends a manifest entry without a shard when dead letters or
// dropped records await settling.
func (s *Sink) checkpoint(ctx context.Context) error {
	if s.cfg.Settler == nil {
		return nil
	}
	e := schemas.ShardEntry{RunID: s.cfg.RunID, SchemaVersion: schemas.SchemaVersion, CommittedAt: time.Now().UTC()}
	if err := settle(ctx, s.cfg.Settler, &e, nil); err != nil {
		return err
	}
	if len(e.Settled) == 0 {
		return nil
	}
	if err := s.store.Append(ctx, e); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return nil
}

// Tick commits shards that have been open for the flush interval, then
// settles pending dead letters.
func (s *Sink) Tick(ctx context.Context, now time.Time) error {
	if err := s.failure(); err != nil {
		return err
	}
	for _, sh := range s.sorted() {
		if now.Sub(sh.opened) >= s.cfg.FlushInterval {
			if err := s.commit(ctx, sh); err != nil {
				return err
			}
		}
	}
	return s.checkpoint(ctx)
}

func (s *Sink) sorted() []*shard {
	out := make([]*shard, 0, len(s.open))
	for _, sh := range s.open {
		out = append(out, sh)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].lane.version != out[j].lane.version {
			return out[i].lane.version < out[j].lane.version
		}
		return out[i].lane.n < out[j].lane.n
	})
	return out
}

// Close commits every open shard (MaxCommits at once), waits for every
// commit, and settles what remains.
func (s *Sink) Close(ctx context.Context) error {
	if err := s.failure(); err != nil {
		return err // Run aborts the open shards
	}
	shards := s.sorted()
	for _, sh := range shards {
		sh.stop() // every encoder finishes its shard at once
	}
	for _, sh := range shards {
		if err := s.commit(ctx, sh); err != nil {
			return err
		}
	}
	if err := s.Wait(); err != nil {
		return err
	}
	return s.checkpoint(ctx)
}

// Abort waits for the commits in flight (ctx ended, they fail fast), then
// discards every open shard (a hard stop: their groups were never
// committed and will be assembled again from the source).
func (s *Sink) Abort() error {
	s.inflight.Wait()
	var errs []error
	for ln, sh := range s.open {
		delete(s.open, ln)
		_ = sh.finish() // the shard is discarded: its encoding error does not matter
		errs = append(errs, sh.p.Abort())
	}
	return errors.Join(errs...)
}

// Run writes the batches from in until it is closed, then commits every
// open shard. It commits shards by age on each tick. When ctx is done it
// aborts open shards and returns ctx's error.
func Run(ctx context.Context, in <-chan transform.Batch, s *Sink, tick time.Duration) (err error) {
	defer func() {
		if err != nil {
			err = errors.Join(err, s.Abort())
		}
	}()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case b, ok := <-in:
			if !ok {
				return s.Close(ctx)
			}
			if err := s.Write(ctx, b, time.Now()); err != nil {
				return err
			}
		case now := <-t.C:
			if err := s.Tick(ctx, now); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
