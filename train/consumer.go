package train

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Shards is the committed data a consumer reads: the manifest, followed
// as it grows, and the shard files.
type Shards interface {
	// Committed returns the committed shard entries in manifest order.
	Committed(ctx context.Context) ([]schemas.ShardEntry, error)
	// ReadShard opens a committed shard (all columns when none named).
	ReadShard(ctx context.Context, e schemas.ShardEntry, columns []string, mem memory.Allocator) (*parquet.Reader, error)
}

// ConsumerConfig says what a trainer accepts and how it shares the stream.
type ConsumerConfig struct {
	Config
	// Name is the member's stable name in the group; a restart under the
	// same name takes its own unfinished shards back at once, another name
	// waits for their leases to expire.
	Name string
	// Log, when set, is the group's log as this process's other members
	// of the group share it (OpenGroupLog on the obj given to
	// NewConsumer, which then reads its log there): one replay for all
	// of them, and their events share records. A record shared with
	// others is made without its caller's cancellation, so Ack, Close
	// and renewals can outlast their context while the store is retried
	// (within the store's retry bound).
	Log *GroupLog
	// CountedIDs numbers the batches 1, 2, ... instead of from a random
	// start: for a member alone in a private group (a peek, whose output
	// is the same at every run); members of a shared group must not.
	CountedIDs bool
	// LeaseTimeout is how long a shard stays with a member that stopped
	// renewing (crashed), as watched by the member taking it over;
	// renewals happen every third of it. Default 30s.
	LeaseTimeout time.Duration
	// MaxInflight bounds the batches delivered and not yet acknowledged;
	// Next waits for acknowledgements beyond it. Default 4.
	MaxInflight int
	// Follow keeps waiting for new shards; without it Next returns io.EOF
	// once every committed shard is done (acknowledged or skipped by the
	// group, including shards other members held and abandoned).
	Follow bool
	// Poll is how often the manifest and the group's log are re-read when
	// there is nothing to deliver. Default 1s.
	Poll time.Duration
	// MaxVersionLead caps the policy version staleness is judged against
	// at the newest group version committed (the largest policy version of
	// the manifest's entries and of the groups this member read) plus this
	// lead: a member reporting a version far ahead of the data (2^53, in
	// range) cannot pass every group over as stale, which settles them
	// for the whole consumer group unread; it can pass over only groups
	// more than MaxStaleness - lead versions behind the newest. A trainer
	// genuinely further ahead than the lead still never gets a group
	// staler than its bound at its own version: such a group (stale for
	// it, within the bound at the cap) is declined, not skipped — left
	// unsettled, its shard released for the other members once read
	// (Stats.DeclinedStale). The member leases that shard again when a
	// newer group version is committed (the cap moves: judged again), or
	// after a third of LeaseTimeout no other member took it, and then
	// judges at its own version: a group nobody else wants is settled.
	// 0: DefaultMaxVersionLead; negative: no cap.
	MaxVersionLead int64
	// VersionsPerBatch is how far the trainer's policy version advances
	// with each batch it acknowledges (its optimizer steps per batch).
	// Staleness is judged at the version a batch will be trained with:
	// the trainer's version now plus this for every batch delivered ahead
	// of it and not yet acknowledged, so prefetching (MaxInflight > 1)
	// never hands out rows that are staler than MaxStaleness by the time
	// they are trained. A trainer that advances less often is judged
	// conservatively (groups a version or so within the bound may be
	// skipped). 0: DefaultVersionsPerBatch; NoVersionAdvance: judged at
	// the version now (a trainer whose version never moves).
	VersionsPerBatch int64
}

// DefaultVersionsPerBatch is the default ConsumerConfig.VersionsPerBatch:
// one optimizer step, one version, per batch (rllm_pipe's PaddedBatches'
// default versions_per_step).
const DefaultVersionsPerBatch = 1

// NoVersionAdvance is ConsumerConfig.VersionsPerBatch for a trainer
// whose version does not move with its acknowledgements.
const NoVersionAdvance = -1

// DefaultMaxVersionLead is the default ConsumerConfig.MaxVersionLead: a
// trainer one version ahead of the newest rollouts, as when it waits for
// the rollouts of the policy it just published.
const DefaultMaxVersionLead = 1

// Delivery is a batch handed to a trainer, to acknowledge by ID.
type Delivery struct {
	ID uint64
	Batch
}

// AckResult says what an acknowledgement settled.
type AckResult struct {
	Groups int `json:"groups"` // acknowledged now
	Lost   int `json:"lost"`   // refused: the shard went to another member
}

// Stats are a consumer's tallies.
type Stats struct {
	Counters
	Member        string `json:"member"`
	PolicyVersion int64  `json:"policy_version"`
	Inflight      int    `json:"inflight_batches"`
	GroupsAcked   int64  `json:"groups_acked"`
	GroupsLost    int64  `json:"groups_lost"`
	ShardsLeased  int64  `json:"shards_leased"`
	Takeovers     int64  `json:"shards_taken_over"`
	// DeclinedStale counts groups left unsettled for other members: stale
	// at the member's own version, within the bound at the capped one
	// (ConsumerConfig.MaxVersionLead).
	DeclinedStale int64 `json:"declined_stale"`
	// StaleByVersion counts the groups skipped as stale by their policy
	// version (the newest staleByVersionKeep versions).
	StaleByVersion map[int64]int64 `json:"skipped_stale_by_version,omitempty"`
	// Freshness of the groups delivered (see Freshness).
	Freshness Freshness `json:"freshness"`
}

// Consumer is one member of a consumer group over committed shards. Next
// is called from one goroutine; Ack, SetPolicyVersion and Stats from any.
//
// Work is shared by shard: a member leases shards (in manifest order) in
// the group's log, reads them group by group, and settles every group by
// acknowledgement or skip; a shard whose groups are all settled is done.
// A member renews its leases while it lives; a crashed member's shards go
// to whoever leases them after the timeout, and their settled groups are
// not delivered again. An acknowledgement is accepted only while the
// member holds the shard, so every group is acknowledged exactly once
// across the group; a batch whose acknowledgement was refused was (or
// will be) delivered to another member.
type Consumer struct {
	cfg    ConsumerConfig
	shards Shards
	coord  *coordinator
	mem    memory.Allocator
	policy atomic.Int64
	newest atomic.Int64 // the newest group version committed (MinInt64: none seen)
	// Stale skips not logged yet, and when they last were (noteStale).
	staleUnlogged int64
	staleLogged   time.Time

	// replay, for a group created by CreateReplay, is the plan Next
	// follows instead of the manifest (shards then lists its batches).
	replay *replayState

	// Next's own state (one goroutine).
	// heldGroup is a group fresh now that would be stale by the time the
	// batches ahead of it are trained: it waits for their
	// acknowledgements, then is judged again (Next).
	heldGroup *group
	form      *former
	// queued are the parts of the step being delivered not handed out
	// yet; step numbers the steps (StepPart.Step).
	queued  []queuedPart
	step    uint64
	cur     *shardReader
	curDone map[int32]bool // groups of cur settled before it was leased
	// entries are the manifest's shards from the base-th on: from the
	// group's low watermark when the member started (Shards that can
	// follow; else from the first), less those dropped behind it since.
	entries  []schemas.ShardEntry
	base     int64
	lastPoll time.Time
	// first is the index in entries before which every shard is done: a
	// lease scans from it, so consuming N shards costs O(N), not O(N²).
	first int

	// declined are the shards of which this member left groups
	// unsettled (ConsumerConfig.MaxVersionLead). Next's goroutine only,
	// and a lease's build (which runs while Next waits for its record).
	declined map[string]*declinedShard

	// watch is, per shard another member holds, the LeaseSeq seen and
	// when it was first seen (monotonic): a takeover waits until it has
	// stayed the same for the lease timeout. Next's goroutine only, and
	// a lease's build (which runs while Next waits for its record, maybe
	// on another member's goroutine: see coordinator.appendLanded).
	watch map[string]leaseWatch

	mu       sync.Mutex
	stats    Stats
	ages     ageHist // of the groups delivered (Stats.Freshness), under mu
	inflight map[uint64][]marks
	stepOf   map[uint64]uint64     // the inflight batches' steps
	stepRefs map[uint64]int        // per step in flight, its batches in flight
	audit    map[uint64]auditBatch // the inflight batches' groups, in order
	done     map[uint64]AckResult  // recent acknowledgements, for repeats
	doneIDs  []uint64              // their order, oldest first
	nextID   uint64
	held     map[string]bool      // leased and not lost
	read     map[string]bool      // held and read to the end in this run
	skips    map[skipKey]skipNote // settled by skipping, not yet in the log
	totals   map[string]int32
	acked    chan struct{} // signalled on every acknowledgement

	stop    chan struct{}
	stopped chan struct{}
}

// declinedShard is a shard some of whose groups the member declined.
type declinedShard struct {
	groups int  // declined in the current read
	read   bool // read to the end: released once no batch in flight holds it
	// released: given up at this time, when the newest committed group
	// version was newest; leased again when that moves or after
	// declineWait.
	released time.Time
	newest   int64
	// own: leased again after declineWait, nobody else having taken it:
	// its groups are judged at the member's own version.
	own bool
}

// declineWait is how long a declined shard waits for another member.
func (c *Consumer) declineWait() time.Duration { return c.cfg.LeaseTimeout / 3 }

type leaseWatch struct {
	seq   int64
	since time.Time
}

// skipKey is a group passed over.
type skipKey struct {
	shard   string
	ordinal int32
}

// skipNote says why: stale (with the group's version) or not (emptied
// by filters).
type skipNote struct {
	stale   bool
	version int64
}

// NewConsumer joins the consumer group whose log is obj.
func NewConsumer(ctx context.Context, shards Shards, obj Objects, cfg ConsumerConfig) (*Consumer, error) {
	if err := CheckName("consumer name", cfg.Name); err != nil {
		return nil, err
	}
	if err := CheckBatchGroups(cfg.BatchGroups, cfg.GroupMultiple); err != nil {
		return nil, fmt.Errorf("train: %w", err)
	}
	if cfg.LeaseTimeout <= 0 {
		cfg.LeaseTimeout = 30 * time.Second
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 4
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	switch {
	case cfg.VersionsPerBatch == 0:
		cfg.VersionsPerBatch = DefaultVersionsPerBatch
	case cfg.VersionsPerBatch < 0:
		cfg.VersionsPerBatch = 0
	}
	if cfg.MaxVersionLead == 0 {
		cfg.MaxVersionLead = DefaultMaxVersionLead
	}
	mem := cfg.Allocator
	if mem == nil {
		mem = memory.DefaultAllocator
	}
	member := newMemberID(cfg.Name)
	var coord *coordinator
	if cfg.Log != nil {
		// The process's other members of the group share its replay and
		// its records.
		if err := cfg.Log.gl.refresh(ctx); err != nil {
			return nil, err
		}
		coord = &coordinator{groupLog: cfg.Log.gl, member: member}
	} else {
		var err error
		if coord, err = openCoordinator(ctx, obj, member); err != nil {
			return nil, err
		}
	}
	c := &Consumer{
		cfg: cfg, shards: shards, coord: coord, mem: mem, watch: map[string]leaseWatch{}, declined: map[string]*declinedShard{},
		inflight: map[uint64][]marks{}, stepOf: map[uint64]uint64{}, stepRefs: map[uint64]int{}, audit: map[uint64]auditBatch{}, done: map[uint64]AckResult{}, held: map[string]bool{}, read: map[string]bool{},
		skips: map[skipKey]skipNote{}, totals: map[string]int32{},
		acked: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{}),
		// Batch ids start at random, so that an acknowledgement meant for an
		// earlier run under the same name can never settle a batch of this one.
		nextID: randomID(),
	}
	if cfg.CountedIDs {
		c.nextID = 0
	}
	c.stats.Member = member
	c.policy.Store(cfg.PolicyVersion)
	c.newest.Store(math.MinInt64)
	c.form = &former{cfg: &c.cfg.Config, mem: mem, counters: &c.stats.Counters}
	if err := c.loadReplay(ctx, obj); err != nil {
		return nil, err
	}
	coord.view(func(st *groupState) {
		if st.Low > 0 {
			c.sawVersion(st.LowVersion)
		}
	})
	go c.renew()
	return c, nil
}

// SetPolicyVersion sets the trainer's current policy version: staleness
// is judged against it from the next group on (capped: see
// ConsumerConfig.MaxVersionLead).
func (c *Consumer) SetPolicyVersion(v int64) { c.policy.Store(v) }

// judged is the policy version staleness is judged against: the trainer's,
// at most MaxVersionLead ahead of the newest group version committed.
func (c *Consumer) judged() int64 {
	p, n := c.policy.Load(), c.newest.Load()
	if c.cfg.MaxVersionLead < 0 || n == math.MinInt64 {
		return p
	}
	limit := n + c.cfg.MaxVersionLead
	if limit < n { // overflow
		return p
	}
	return min(p, limit)
}

// trainedAt is the policy version the batch formed now will be trained
// with, as judged: the judged version plus VersionsPerBatch for each batch
// delivered and not yet acknowledged (ConsumerConfig.VersionsPerBatch).
// c.mu held.
func (c *Consumer) trainedAt() int64 { return c.ahead(c.judged()) }

// ownTrainedAt is trainedAt from the trainer's own version (uncapped).
// c.mu held.
func (c *Consumer) ownTrainedAt() int64 { return c.ahead(c.policy.Load()) }

func (c *Consumer) ahead(v int64) int64 {
	ahead := int64(c.stepsInflight()) * c.cfg.VersionsPerBatch
	return min(v, MaxPolicyVersion) + min(ahead, MaxPolicyVersion) // both ≤ 2^53: no overflow
}

// settleAt is the version a group of shard is skipped as stale at: the
// capped trainedAt, or the member's own for a shard it declined and
// nobody else took. c.mu held.
func (c *Consumer) settleAt(shard string) int64 {
	if d := c.declined[shard]; d != nil && d.own {
		return c.ownTrainedAt()
	}
	return c.trainedAt()
}

// sawVersion notes a committed group version.
func (c *Consumer) sawVersion(v int64) {
	for {
		n := c.newest.Load()
		if v <= n || c.newest.CompareAndSwap(n, v) {
			return
		}
	}
}

// noteStale logs, at most every staleLogEvery, how many groups the member
// passed over as stale since the last such line (they are settled for the
// whole group unread, so they must not go unnoticed). c.mu held.
func (c *Consumer) noteStale(n int64) {
	c.staleUnlogged += n
	if c.staleUnlogged == 0 || time.Since(c.staleLogged) < staleLogEvery {
		return
	}
	slog.Warn("train: groups skipped as stale (settled for the whole group, unread)", "member", c.stats.Member,
		"groups", c.staleUnlogged, "skipped_stale_total", c.stats.SkippedStale, "policy_version", c.policy.Load(),
		"judged_at", c.trainedAt(), "max_staleness", c.cfg.MaxStaleness)
	c.staleUnlogged, c.staleLogged = 0, time.Now()
}

// staleLogEvery is how often a member logs its stale skips at most.
const staleLogEvery = 10 * time.Second

// Stats returns the consumer's tallies.
func (c *Consumer) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.PolicyVersion = c.policy.Load()
	s.Inflight = len(c.inflight)
	s.Freshness = c.ages.summary()
	s.StaleByVersion = maps.Clone(c.stats.StaleByVersion)
	return s
}

// Next returns the next batch: whole groups, within the token budget
// (a group alone over it is its own batch, flagged Oversized). The
// receiver releases Record and acknowledges the ID. Next returns io.EOF
// when not following and every committed shard is done.
func (c *Consumer) Next(ctx context.Context) (*Delivery, error) {
	if c.replay != nil {
		return c.nextReplayed(ctx)
	}
	for {
		if len(c.queued) > 0 {
			// The rest of a step: it trains with the parts delivered.
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.nextQueued(), nil
		}
		if err := c.waitInflight(ctx); err != nil {
			return nil, err
		}
		g, err := c.heldGroup, error(nil)
		if c.heldGroup = nil; g == nil {
			g, err = c.nextGroup(ctx)
		}
		if err != nil {
			return nil, err
		}
		if g == nil {
			// Nothing more to read now: hand over what is pending (a
			// batch of BatchGroups short only at the end of the input or
			// after BatchWait).
			if d, err := c.deliver(!c.cfg.Follow); d != nil || err != nil {
				return d, err
			}
			if err := c.flushMarks(ctx); err != nil {
				return nil, err
			}
			if !c.cfg.Follow && c.allDone() {
				return nil, io.EOF
			}
			if err := c.wait(ctx, c.cfg.Poll); err != nil {
				return nil, err
			}
			continue
		}
		c.sawVersion(g.version)
		c.mu.Lock()
		if len(c.inflight) > 0 && !c.form.stale(g, c.judged()) && c.form.stale(g, c.ownTrainedAt()) {
			// Fresh now, stale once the batches ahead are trained: not
			// skipped (another member, or this one later, may train it in
			// bound) but held until they are acknowledged, then judged at
			// the version trained on. The pending groups go first.
			c.heldGroup = g
			c.mu.Unlock()
			if d, err := c.deliver(false); d != nil || err != nil {
				return d, err
			}
			if err := c.waitDrained(ctx); err != nil {
				return nil, err
			}
			continue
		}
		before := c.stats.SkippedStale
		if c.form.passOver(g, c.settleAt(g.shard)) {
			c.skip(g, c.stats.SkippedStale > before)
			c.mu.Unlock()
			continue
		}
		if c.form.stale(g, c.ownTrainedAt()) {
			c.decline(g)
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		if !c.form.fits(g) {
			d, err := c.deliver(false)
			c.form.add(g)
			if d != nil || err != nil {
				return d, err
			}
			continue // every pending group had gone stale
		}
		c.form.add(g)
		if c.form.full() {
			if d, err := c.deliver(false); d != nil || err != nil {
				return d, err
			}
		}
	}
}

// deliver forms a batch of the pending groups (nil when none, or when
// they are fewer than BatchGroups and short is false and BatchWait has not
// passed).
func (c *Consumer) deliver(short bool) (*Delivery, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// The bound holds at delivery: the trainer may have moved on since
	// these groups were admitted.
	for _, g := range c.form.dropStale(c.ownTrainedAt()) {
		if c.form.stale(g, c.settleAt(g.shard)) {
			c.stats.SkippedStale++
			c.skip(g, true)
		} else {
			c.decline(g)
		}
	}
	if !c.form.ready(short) {
		return nil, nil
	}
	carry, isShort := c.form.cut()
	if isShort {
		c.stats.ShortBatches++
	}
	bs, parts, err := c.form.take(true, carry)
	defer func() {
		for _, p := range parts {
			releaseGroups(p)
		}
	}()
	if err != nil || len(bs) == 0 {
		return nil, err
	}
	c.step++
	for i, b := range bs {
		b.StepPart.Step = c.step
		c.queued = append(c.queued, queuedPart{b: b, marks: marksOf(parts[i]), audit: consumedGroups(parts[i])})
	}
	return c.nextQueued(), nil
}

// queuedPart is a batch formed and not yet delivered: the parts of a step
// after the first (StepPart).
type queuedPart struct {
	b     *Batch
	marks []marks
	audit auditBatch
}

// nextQueued delivers the first queued part. c.mu held.
func (c *Consumer) nextQueued() *Delivery {
	q := c.queued[0]
	c.queued[0] = queuedPart{}
	c.queued = c.queued[1:]
	c.nextID++
	c.inflight[c.nextID] = q.marks
	c.audit[c.nextID] = q.audit
	c.inflightStep(c.nextID, q.b.StepPart.Step)
	for _, age := range q.b.Ages(time.Now()) {
		if age >= 0 {
			c.ages.add(age)
		}
	}
	return &Delivery{ID: c.nextID, Batch: *q.b}
}

// discardQueued releases the parts formed and not delivered (their groups
// go back unsettled).
func (c *Consumer) discardQueued() {
	for _, q := range c.queued {
		q.b.Record.Release()
	}
	c.queued = nil
}

// stepsInflight counts the steps of the batches delivered and not yet
// acknowledged (the parts of one step train together). c.mu held.
func (c *Consumer) stepsInflight() int { return len(c.stepRefs) }

// inflightStep notes delivered batch id, of step. c.mu held.
func (c *Consumer) inflightStep(id, step uint64) {
	c.stepOf[id] = step
	c.stepRefs[step]++
}

// settledStep forgets batch id's step once acknowledged. c.mu held.
func (c *Consumer) settledStep(id uint64) {
	step, ok := c.stepOf[id]
	if !ok {
		return
	}
	delete(c.stepOf, id)
	if c.stepRefs[step]--; c.stepRefs[step] <= 0 {
		delete(c.stepRefs, step)
	}
}

// marksOf are groups' ordinals by shard, shards in first-seen order.
func marksOf(groups []*group) []marks {
	by := map[string][]int32{}
	var order []string
	for _, g := range groups {
		if by[g.shard] == nil {
			order = append(order, g.shard)
		}
		by[g.shard] = append(by[g.shard], g.ordinal)
	}
	ms := make([]marks, 0, len(order))
	for _, s := range order {
		ms = append(ms, marks{Shard: s, Groups: by[s]})
	}
	return ms
}

// skip settles g unread (stale: as stale). c.mu held.
func (c *Consumer) skip(g *group, stale bool) {
	note := skipNote{}
	if stale {
		note = skipNote{stale: true, version: g.version}
		c.noteStale(1)
		if c.stats.StaleByVersion == nil {
			c.stats.StaleByVersion = map[int64]int64{}
		}
		c.stats.StaleByVersion[g.version]++
		trimVersions(c.stats.StaleByVersion, staleByVersionKeep)
	}
	c.skips[skipKey{g.shard, g.ordinal}] = note
	g.release()
}

// decline leaves g unsettled for other members (ConsumerConfig.MaxVersionLead).
// c.mu held.
func (c *Consumer) decline(g *group) {
	d := c.declined[g.shard]
	if d == nil {
		d = &declinedShard{}
		c.declined[g.shard] = d
	}
	d.groups++
	// A group dropped at delivery may be of a shard read to the end.
	d.read = d.read || c.read[g.shard]
	c.stats.DeclinedStale++
	g.release()
}

// staleByVersionKeep is how many policy versions stale counts are kept for.
const staleByVersionKeep = 256

// trimVersions drops the lowest versions of m beyond keep.
func trimVersions(m map[int64]int64, keep int) {
	if len(m) <= keep {
		return
	}
	vs := make([]int64, 0, len(m))
	for v := range m {
		vs = append(vs, v)
	}
	slices.Sort(vs)
	for _, v := range vs[:len(vs)-keep] {
		delete(m, v)
	}
}

// Ack acknowledges a delivered batch. Groups of shards the member lost
// are refused (AckResult.Lost, and ErrLeaseLost). Acknowledging a batch
// again returns the first answer.
func (c *Consumer) Ack(ctx context.Context, id uint64) (AckResult, error) {
	c.mu.Lock()
	ms, ok := c.inflight[id]
	groups := c.audit[id]
	prev, repeat := c.done[id]
	c.mu.Unlock()
	if repeat {
		return prev, ackErr(prev)
	}
	if !ok {
		return AckResult{}, fmt.Errorf("train: batch %d is not awaiting acknowledgement", id)
	}
	var res AckResult
	skips, totals := c.pendingMarks()
	policy := c.policy.Load() // the trainer's own, as it reported it
	err := c.coord.append(ctx, func(st *groupState, e *event) bool {
		res = AckResult{}
		e.Ack = e.Ack[:0]
		e.Batch = nil
		if g := accepted(st, c.coord.member, groups); len(g) > 0 {
			e.Batch = &ackBatch{ID: id, PolicyVersion: policy, Groups: g}
		}
		for _, m := range ms {
			s := st.Shards[m.Shard]
			if s != nil && s.Holder == c.coord.member && !s.Done {
				e.Ack = append(e.Ack, m)
				for _, o := range m.Groups {
					if !s.settled(o) {
						res.Groups++
					}
				}
			} else {
				res.Lost += len(m.Groups)
			}
		}
		e.Skip, e.Totals = skips, totals
		return true
	})
	if err != nil {
		return AckResult{}, err
	}
	c.mu.Lock()
	c.clearMarks(skips, totals)
	delete(c.inflight, id)
	c.settledStep(id)
	delete(c.audit, id)
	c.done[id] = res
	c.doneIDs = append(c.doneIDs, id)
	if len(c.doneIDs) > 4096 {
		delete(c.done, c.doneIDs[0])
		c.doneIDs = c.doneIDs[1:]
	}
	c.stats.GroupsAcked += int64(res.Groups)
	c.stats.GroupsLost += int64(res.Lost)
	c.mu.Unlock()
	select {
	case c.acked <- struct{}{}:
	default:
	}
	return res, ackErr(res)
}

func ackErr(res AckResult) error {
	if res.Lost > 0 {
		return fmt.Errorf("%w (%d of the batch's groups)", ErrLeaseLost, res.Lost)
	}
	return nil
}

// pendingMarks returns the skips and totals not yet in the log.
func (c *Consumer) pendingMarks() ([]marks, map[string]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// One marks per shard and reason; stale ones carry their versions.
	type key struct {
		shard string
		stale bool
	}
	by := map[key][]skipKey{}
	for k, n := range c.skips {
		by[key{k.shard, n.stale}] = append(by[key{k.shard, n.stale}], k)
	}
	skips := make([]marks, 0, len(by))
	for k, ks := range by {
		sort.Slice(ks, func(i, j int) bool { return ks[i].ordinal < ks[j].ordinal })
		m := marks{Shard: k.shard, Groups: make([]int32, len(ks))}
		if k.stale {
			m.Versions = make([]int64, len(ks))
		}
		for i, sk := range ks {
			m.Groups[i] = sk.ordinal
			if k.stale {
				m.Versions[i] = c.skips[sk].version
			}
		}
		skips = append(skips, m)
	}
	sort.Slice(skips, func(i, j int) bool {
		if skips[i].Shard != skips[j].Shard {
			return skips[i].Shard < skips[j].Shard
		}
		return skips[i].Versions == nil
	})
	totals := make(map[string]int32, len(c.totals))
	for k, v := range c.totals {
		totals[k] = v
	}
	return skips, totals
}

// clearMarks forgets exactly the marks that reached the log (others may
// have been added meanwhile). Callers hold c.mu.
func (c *Consumer) clearMarks(skips []marks, totals map[string]int32) {
	for _, m := range skips {
		for _, o := range m.Groups {
			delete(c.skips, skipKey{m.Shard, o})
		}
	}
	for k, v := range totals {
		if c.totals[k] == v {
			delete(c.totals, k)
		}
	}
}

// flushMarks appends pending skips and totals.
func (c *Consumer) flushMarks(ctx context.Context) error {
	skips, totals := c.pendingMarks()
	if len(skips) == 0 && len(totals) == 0 {
		return nil
	}
	err := c.coord.append(ctx, func(_ *groupState, e *event) bool {
		e.Skip, e.Totals = skips, totals
		return true
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.clearMarks(skips, totals)
	c.mu.Unlock()
	c.refreshHeld()
	return nil
}

// nextGroup returns the next unsettled group of a leased shard, leasing
// the next shard when the current one is read; nil when none is
// available now.
func (c *Consumer) nextGroup(ctx context.Context) (*group, error) {
	for {
		if c.cur != nil {
			c.mu.Lock()
			lost := !c.held[c.cur.path]
			c.mu.Unlock()
			if lost {
				c.closeCur()
				continue
			}
			g, err := c.cur.next()
			if err != nil {
				c.closeCur()
				return nil, err
			}
			if g != nil {
				if c.curDone[g.ordinal] {
					g.release()
					continue
				}
				return g, nil
			}
			c.mu.Lock()
			c.totals[c.cur.path] = c.cur.groups()
			c.read[c.cur.path] = true
			c.mu.Unlock()
			if d := c.declined[c.cur.path]; d != nil && d.groups > 0 {
				d.read = true
			} else {
				delete(c.declined, c.cur.path)
			}
			c.closeCur()
			continue
		}
		if err := c.releaseDeclined(ctx); err != nil {
			return nil, err
		}
		e, settled, err := c.leaseNext(ctx)
		if err != nil || e == nil {
			return nil, err
		}
		rd, err := c.shards.ReadShard(ctx, *e, c.cfg.shardColumns(), c.mem)
		if err != nil {
			return nil, fmt.Errorf("train: shard %s: %w", e.Path, err)
		}
		c.cur, c.curDone = newShardReader(e.Path, rd, &c.cfg.Config), settled
	}
}

// releaseDeclined gives up the shards read to the end with groups
// declined (ConsumerConfig.MaxVersionLead) once no batch in flight holds
// any of their groups: other members may take them at once.
func (c *Consumer) releaseDeclined(ctx context.Context) error {
	if len(c.declined) == 0 {
		return nil // the common case: nothing declined, nothing to scan
	}
	var paths []string
	c.mu.Lock()
	busy := map[string]bool{}
	for _, ms := range c.inflight {
		for _, m := range ms {
			busy[m.Shard] = true
		}
	}
	for _, q := range c.queued {
		for _, m := range q.marks {
			busy[m.Shard] = true
		}
	}
	c.mu.Unlock()
	for p, d := range c.declined {
		if d.read && !busy[p] && !c.form.holds(p) && (c.heldGroup == nil || c.heldGroup.shard != p) {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil
	}
	sort.Strings(paths)
	skips, totals := c.pendingMarks()
	err := c.coord.append(ctx, func(_ *groupState, e *event) bool {
		e.Skip, e.Totals, e.Release = skips, totals, paths
		return true
	})
	if err != nil {
		return err
	}
	now, newest := time.Now(), c.newest.Load()
	c.mu.Lock()
	c.clearMarks(skips, totals)
	for _, p := range paths {
		delete(c.held, p)
		delete(c.read, p)
		d := c.declined[p]
		slog.Info("train: released a shard with groups stale at this member's version for the others", "shard", p,
			"member", c.coord.member, "groups", d.groups, "policy_version", c.policy.Load(), "newest_committed", newest)
		*d = declinedShard{released: now, newest: newest}
	}
	c.mu.Unlock()
	return nil
}

// declinedWaits reports whether the member leaves shard p, which it
// declined, to the others for now.
func (c *Consumer) declinedWaits(p string, now time.Time) bool {
	d := c.declined[p]
	return d != nil && !d.released.IsZero() && c.newest.Load() <= d.newest && now.Sub(d.released) < c.declineWait()
}

func (c *Consumer) closeCur() {
	if c.cur != nil {
		_ = c.cur.close()
		c.cur, c.curDone = nil, nil
	}
}

// follower is Shards that can return only the entries after those held
// (store.Reader does).
type follower interface {
	CommittedFrom(ctx context.Context, n int) ([]schemas.ShardEntry, error)
}

// follow re-reads the manifest: only its new entries when the shards can
// say which (a poll stays flat in the length of the run; the first one
// starts at the group's low watermark), else all.
func (c *Consumer) follow(ctx context.Context) error {
	var more []schemas.ShardEntry
	if f, ok := c.shards.(follower); ok {
		if c.entries == nil {
			if err := c.followFromLow(ctx, f); err != nil {
				return err
			}
		}
		var err error
		if more, err = f.CommittedFrom(ctx, int(c.base)+len(c.entries)); err != nil {
			return err
		}
		c.entries = append(c.entries, more...)
		if c.entries == nil {
			c.entries = []schemas.ShardEntry{} // read, and empty
		}
	} else {
		entries, err := c.shards.Committed(ctx)
		if err != nil {
			return err
		}
		if len(entries) < c.first {
			c.first = 0 // not the manifest read before (it only grows)
		}
		more, c.entries = entries, entries
	}
	c.lastPoll = time.Now()
	for _, e := range more {
		c.sawVersion(e.PolicyVersion)
	}
	return nil
}

// followFromLow starts a follower's manifest at the group's low
// watermark, checking that the manifest's shard before it is the one the
// group folded last.
func (c *Consumer) followFromLow(ctx context.Context, f follower) error {
	var low int64
	var lowPath string
	c.coord.view(func(st *groupState) { low, lowPath = st.Low, st.LowPath })
	c.base = low
	if low == 0 {
		return nil
	}
	last, err := f.CommittedFrom(ctx, int(low)-1)
	if err != nil {
		return err
	}
	if len(last) == 0 || last[0].Path != lowPath {
		return fmt.Errorf("train: the consumer group's log has folded %d shards up to %s, which the manifest does not list there: a group of another output root?", low, lowPath)
	}
	return nil
}

// foldEvery is how many done shards past the low watermark a member lets
// pile up before it folds them (foldMax at most in one event); variables
// for tests.
var foldEvery, foldMax = 256, 4096

// alignLow moves first past the shards the group folded, checking that
// the last one folded is the manifest's shard there, and drops the folded
// entries from memory when there are many. It returns the index the scan
// starts from: entries below it are done.
func (c *Consumer) alignLow(st *groupState) (int, error) {
	low := st.Low - c.base
	if low > 0 && low <= int64(len(c.entries)) && c.entries[low-1].Path != st.LowPath {
		return 0, fmt.Errorf("train: the consumer group's log has folded shards up to %s, where the manifest lists %s", st.LowPath, c.entries[low-1].Path)
	}
	if low > int64(len(c.entries)) {
		low = int64(len(c.entries)) // folded beyond what this member has read
	}
	low = max(low, 0)
	c.first = max(c.first, int(low))
	if _, ok := c.shards.(follower); ok && low >= int64(foldMax) {
		// Folded shards are done for every member: forget them.
		c.entries = slices.Clone(c.entries[low:])
		c.base += low
		c.first -= int(low)
	}
	return c.first, nil
}

// foldNext returns the fold this member may append: the shards from the
// watermark to first, when at least foldEvery are done there.
func (c *Consumer) foldNext(st *groupState) *foldEvent {
	if c.replay != nil {
		return nil
	}
	from := int(st.Low - c.base)
	if from < 0 || c.first-from < foldEvery {
		return nil
	}
	f := &foldEvent{From: st.Low}
	for _, e := range c.entries[from:min(c.first, from+foldMax)] {
		if s := st.Shards[e.Path]; s == nil || !s.Done {
			return nil
		}
		f.Paths = append(f.Paths, e.Path)
		f.Version = max(f.Version, e.PolicyVersion)
	}
	return f
}

// leaseNext re-reads the manifest (at most every Poll) and leases the
// first shard the member may take; it returns the shard and its groups
// already settled, or nil when none can be leased now.
func (c *Consumer) leaseNext(ctx context.Context) (*schemas.ShardEntry, map[int32]bool, error) {
	if time.Since(c.lastPoll) >= c.cfg.Poll || c.entries == nil {
		if err := c.follow(ctx); err != nil {
			return nil, nil, err
		}
	}
	var (
		picked   *schemas.ShardEntry
		settled  map[int32]bool
		previous string
		now      = time.Now()
	)
	skips, totals := c.pendingMarks()
	c.mu.Lock()
	read := make(map[string]bool, len(c.read))
	for k := range c.read {
		read[k] = true
	}
	c.mu.Unlock()
	var lowErr error
	// The shard is picked on the record's working state (as the replay
	// will judge the lease); what the build changes of this member's own
	// state (c.first, c.watch, the watermark's alignment) and the fold
	// rest on the state as it landed.
	err := c.coord.appendLanded(ctx, func(landed, st *groupState, e *event) bool {
		picked, previous, e.Expect, e.Fold = nil, "", nil, nil
		start, err := c.alignLow(landed)
		if err != nil {
			lowErr = err
			return false
		}
		for i := start; i < len(c.entries); i++ {
			p := c.entries[i].Path
			s, sl := st.Shards[p], landed.Shards[p]
			if i == c.first && sl != nil && sl.Done {
				c.first++ // done stays done
				continue
			}
			if read[p] || c.declinedWaits(p, now) {
				continue
			}
			if s == nil || s.free(c.coord.member) {
				picked = &c.entries[i]
				if s != nil {
					previous = s.Holder
				}
				break
			}
			if s.Done || sl == nil {
				continue // done, or leased by an event of this record
			}
			// Held by another member: take it over once its lease has not
			// moved for the timeout, as watched from here.
			w, seen := c.watch[p]
			if !seen || w.seq != sl.LeaseSeq {
				c.watch[p] = leaseWatch{seq: sl.LeaseSeq, since: now}
			} else if now.Sub(w.since) >= c.cfg.LeaseTimeout {
				picked, previous = &c.entries[i], sl.Holder
				e.Expect = map[string]int64{p: sl.LeaseSeq}
				break
			}
			if c.replay != nil {
				// A replay delivers the plan's batches in order: nothing
				// after a batch another member holds, which comes back to
				// the front if that member leaves without acknowledging it.
				break
			}
		}
		e.Fold = c.foldNext(landed)
		if picked == nil {
			return e.Fold != nil
		}
		e.Lease = []string{picked.Path}
		e.Skip, e.Totals = skips, totals
		return true
	})
	if err == nil {
		err = lowErr
	}
	if err != nil || picked == nil {
		return nil, nil, err
	}
	var ok bool
	c.coord.view(func(st *groupState) {
		s := st.Shards[picked.Path]
		if ok = s != nil && s.Holder == c.coord.member; ok {
			settled = make(map[int32]bool, len(s.Acked)+len(s.Skips))
			for o := range s.Acked {
				settled[o] = true
			}
			for o := range s.Skips {
				settled[o] = true
			}
		}
	})
	delete(c.watch, picked.Path)
	if d := c.declined[picked.Path]; d != nil && ok {
		// Leased again: judged again, at the member's own version when
		// nobody else took it in declineWait.
		*d = declinedShard{own: c.newest.Load() <= d.newest}
	}
	c.mu.Lock()
	c.clearMarks(skips, totals)
	if ok {
		c.held[picked.Path] = true
		c.stats.ShardsLeased++
		if previous != "" && memberName(previous) != memberName(c.coord.member) {
			c.stats.Takeovers++
			slog.Info("train: took over a shard", "shard", picked.Path, "from", previous)
		}
	}
	c.mu.Unlock()
	if !ok {
		return nil, nil, nil
	}
	return picked, settled, nil
}

// allDone reports whether every committed shard is done.
func (c *Consumer) allDone() bool {
	done := true
	c.coord.view(func(st *groupState) {
		for _, e := range c.entries[c.first:] {
			if s := st.Shards[e.Path]; s == nil || !s.Done {
				done = false
				return
			}
		}
	})
	return done
}

// waitInflight blocks while MaxInflight batches await acknowledgement.
func (c *Consumer) waitInflight(ctx context.Context) error {
	for {
		c.mu.Lock()
		n := c.stepsInflight()
		c.mu.Unlock()
		if n < c.cfg.MaxInflight {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.acked:
		}
	}
}

// waitDrained blocks until every delivered batch is acknowledged.
func (c *Consumer) waitDrained(ctx context.Context) error {
	for {
		c.mu.Lock()
		n := len(c.inflight)
		c.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.acked:
		}
	}
}

// wait sleeps d, or until an acknowledgement or cancellation.
func (c *Consumer) wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	case <-c.acked:
	}
	return c.coord.refresh(ctx)
}

// renew extends the member's leases every third of the timeout and
// notices shards taken over by others.
func (c *Consumer) renew() {
	defer close(c.stopped)
	t := time.NewTicker(c.cfg.LeaseTimeout / 3)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.LeaseTimeout/3)
		err := c.coord.append(ctx, func(st *groupState, e *event) bool {
			e.Lease = e.Lease[:0]
			for p, s := range st.Shards {
				if s.Holder == c.coord.member && !s.Done {
					e.Lease = append(e.Lease, p)
				}
			}
			sort.Strings(e.Lease)
			return len(e.Lease) > 0
		})
		cancel()
		if err != nil {
			slog.Warn("train: lease renewal failed", "member", c.coord.member, "err", err)
			continue
		}
		c.refreshHeld()
	}
}

// refreshHeld drops shards that are done or that another member took.
func (c *Consumer) refreshHeld() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.coord.view(func(st *groupState) {
		for p := range c.held {
			s := st.Shards[p]
			if s == nil || s.Holder != c.coord.member {
				if s == nil || !s.Done {
					slog.Warn("train: lost a shard's lease", "shard", p, "member", c.coord.member)
				}
				delete(c.held, p)
				delete(c.read, p) // read it again if it comes back
			}
		}
	})
}

// Close stops renewing and releases the member's shards: batches not
// acknowledged go to other members at once. Pending skips are recorded
// first.
func (c *Consumer) Close(ctx context.Context) error {
	close(c.stop)
	<-c.stopped
	c.releaseHeld()
	c.closeCur()
	c.closeReplay()
	c.form.discard()
	c.discardQueued()
	skips, totals := c.pendingMarks()
	return c.coord.append(ctx, func(st *groupState, e *event) bool {
		for p, s := range st.Shards {
			if s.Holder == c.coord.member {
				e.Release = append(e.Release, p)
			}
		}
		sort.Strings(e.Release)
		e.Skip, e.Totals = skips, totals
		return len(e.Release) > 0 || len(skips) > 0 || len(totals) > 0
	})
}

// releaseHeld drops the held group (its shard goes back unsettled).
func (c *Consumer) releaseHeld() {
	if c.heldGroup != nil {
		c.heldGroup.release()
		c.heldGroup = nil
	}
}

// abandon stops renewing without releasing anything, as a crash would
// (tests).
func (c *Consumer) abandon() {
	close(c.stop)
	<-c.stopped
	c.releaseHeld()
	c.closeCur()
	c.closeReplay()
	c.form.discard()
	c.discardQueued()
}

// randomID is a random start for batch ids, below 2^53 so that every
// JSON reader keeps it exact.
func randomID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 12
}
