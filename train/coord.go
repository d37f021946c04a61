package train

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Objects is a folder of small objects in the shard store, each created
// at most once: the consumer group's log lives there (a store.Journal),
// so coordination needs no server beyond the store.
type Objects = store.Objects

// GroupDir is the folder of a consumer group's log under the store root.
func GroupDir(group string) string { return GroupsDir + "/" + group }

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// CheckName rejects consumer-group and member names that are not safe as
// one path element: letters, digits, '.', '_' and '-', at most 64.
func CheckName(kind, name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("train: %s %q: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit", kind, name)
	}
	return nil
}

// ErrLeaseLost is an acknowledgement refused because the member no longer
// holds the shard: its lease expired and another member took the shard
// over (the groups are delivered again there).
var ErrLeaseLost = errors.New("train: lease lost: another consumer took the shard over")

// event is one entry of a consumer group's log. The log is a sequence of
// objects <seq>.json created at most once each; a member appends by
// creating the next number, so every member that appends has read every
// event before its own, and the state replayed from the log is the same
// for everyone.
//
// Leases involve no wall clock: a holder renews by appending, which moves
// its shards' LeaseSeq; a member may take over another's shard only by
// naming the LeaseSeq it saw (Expect) after watching it stay the same for
// the lease timeout on its own monotonic clock. Replay checks that the
// holder has not renewed since, so clocks that disagree cannot take a live
// member's shard, and a dead member's shards move on one timeout after
// its last renewal was seen.
type event struct {
	Seq    int64     `json:"seq"`
	Nonce  string    `json:"nonce"`
	Member string    `json:"member"`
	Time   time.Time `json:"time"` // for people reading the log; no rule uses it
	// Lease takes or renews shards; Expect holds, for a shard taken from
	// another member, the LeaseSeq the taker saw unchanged.
	Lease  []string         `json:"lease,omitempty"`
	Expect map[string]int64 `json:"expect,omitempty"`
	// Ack and Skip settle groups of shards the member holds: delivered and
	// acknowledged, or passed over (stale, emptied by filters).
	Ack  []marks `json:"ack,omitempty"`
	Skip []marks `json:"skip,omitempty"`
	// Totals gives the number of groups of shards read to the end.
	Totals map[string]int32 `json:"totals,omitempty"`
	// Release gives shards up.
	Release []string `json:"release,omitempty"`
	// Batch, with Ack, is the audit of the acknowledged batch: its id,
	// the policy version at acknowledgement and the groups the Ack
	// settles, in batch order (absent in logs written before it).
	Batch *ackBatch `json:"batch,omitempty"`
	// Fold drops the states of done shards at the front of the manifest
	// (groupState.Low).
	Fold *foldEvent `json:"fold,omitempty"`
}

// foldEvent names the manifest's shards From, From+1, ... (Paths, in
// manifest order), every one done, to be folded into the low watermark;
// Version is the newest policy version among them.
type foldEvent struct {
	From    int64    `json:"from"`
	Paths   []string `json:"paths"`
	Version int64    `json:"version"`
}

// ackBatch is the audit an acknowledgement carries.
type ackBatch struct {
	ID            uint64          `json:"id"`
	PolicyVersion int64           `json:"policy_version"`
	Groups        []ConsumedGroup `json:"groups"`
}

// marks are group ordinals of one shard. Skips of stale groups carry
// their policy versions (Versions[i] is Groups[i]'s), for the audit.
type marks struct {
	Shard    string  `json:"shard"`
	Groups   []int32 `json:"groups"`
	Versions []int64 `json:"stale_versions,omitempty"`
}

// shardState is what the log says of one shard.
type shardState struct {
	Holder   string `json:"holder,omitempty"`
	LeaseSeq int64  `json:"lease_seq,omitempty"` // the holder's last lease or renewal
	Total    int32  `json:"total,omitempty"`
	// Counted: Total is known (the shard was read to the end).
	Counted bool           `json:"counted,omitempty"`
	Acked   map[int32]bool `json:"acked,omitempty"`
	Skips   map[int32]bool `json:"skipped,omitempty"`
	NAcked  int32          `json:"n_acked"`
	NSkip   int32          `json:"n_skipped"`
	Done    bool           `json:"done,omitempty"`
}

func (s *shardState) settled(o int32) bool { return s.Done || s.Acked[o] || s.Skips[o] }

func (s *shardState) finish() {
	if s.Counted && s.NAcked+s.NSkip >= s.Total {
		s.Done, s.Holder, s.Acked, s.Skips = true, "", nil, nil
	}
}

// memberName is the stable part of a member id (name/incarnation).
func memberName(id string) string {
	if i := strings.LastIndexByte(id, '/'); i >= 0 {
		return id[:i]
	}
	return id
}

// free reports whether member may lease s without a takeover: a shard not
// done that nobody holds, or that member or an earlier incarnation of the
// same name holds (a restarted consumer takes its own shards back at once).
func (s *shardState) free(member string) bool {
	return !s.Done && (s.Holder == "" || memberName(s.Holder) == memberName(member))
}

// leasable reports whether member may lease s, taking it over from
// another member if expect (ok) is the holder's LeaseSeq: the holder has
// not renewed since the taker began to watch.
func (s *shardState) leasable(member string, expect int64, ok bool) bool {
	return s.free(member) || (!s.Done && ok && s.LeaseSeq == expect)
}

// groupState is the replayed log.
type groupState struct {
	Next   int64                  `json:"next"` // the next sequence number
	Shards map[string]*shardState `json:"shards"`
	// Low is the low watermark: the manifest's first Low shards are done
	// and their states folded away (a month of shards would otherwise
	// sit in every snapshot), and a member reads the manifest from there.
	// LowPath is the last of them, which a member checks against the
	// manifest it reads; LowVersion is their newest policy version, and
	// LowAcked and LowSkipped count their groups.
	Low        int64  `json:"low,omitempty"`
	LowPath    string `json:"low_path,omitempty"`
	LowVersion int64  `json:"low_version,omitempty"`
	LowAcked   int64  `json:"low_acked,omitempty"`
	LowSkipped int64  `json:"low_skipped,omitempty"`
	// Members are the members seen, by stable name (a restart under the
	// same name replaces the incarnation), so the map stays as small as
	// the set of names.
	Members map[string]*memberState `json:"members,omitempty"`
	// StaleByVersion counts the groups skipped as stale by their policy
	// version (the newest staleByVersionKeep versions); StaleSkipped all
	// of them.
	StaleByVersion map[int64]int64 `json:"stale_by_version,omitempty"`
	StaleSkipped   int64           `json:"stale_skipped,omitempty"`
}

// memberState is what the log says of one member name.
type memberState struct {
	ID      string `json:"id"` // the latest incarnation seen
	LastSeq int64  `json:"last_seq"`
	Batches int64  `json:"batches"` // acknowledgements with an audit
	// StaleSkipped counts the groups it skipped as stale.
	StaleSkipped int64     `json:"stale_skipped,omitempty"`
	Policy       int64     `json:"policy_version"`
	Stale        int64     `json:"staleness"` // the largest of the last acknowledged batch
	LastAck      time.Time `json:"last_ack,omitzero"`
	LastSeen     time.Time `json:"last_seen,omitzero"`
}

// member is the state of member id's name, created when new.
func (st *groupState) member(id string) *memberState {
	if st.Members == nil {
		st.Members = map[string]*memberState{}
	}
	name := memberName(id)
	m := st.Members[name]
	if m == nil {
		m = &memberState{}
		st.Members[name] = m
	}
	return m
}

// noteStale counts a group of policy version v that member id skipped as
// stale.
func (st *groupState) noteStale(id string, v int64) {
	st.member(id).StaleSkipped++
	st.StaleSkipped++
	if st.StaleByVersion == nil {
		st.StaleByVersion = map[int64]int64{}
	}
	st.StaleByVersion[v]++
	trimVersions(st.StaleByVersion, staleByVersionKeep)
}

// noteMember records e's member.
func (st *groupState) noteMember(e *event) {
	if e.Member == "" {
		return
	}
	m := st.member(e.Member)
	m.ID, m.LastSeq, m.LastSeen = e.Member, e.Seq, e.Time
	if b := e.Batch; b != nil && len(b.Groups) > 0 {
		m.Batches++
		m.Policy, m.LastAck, m.Stale = b.PolicyVersion, e.Time, 0
		for _, g := range b.Groups {
			m.Stale = max(m.Stale, b.PolicyVersion-g.GroupVersion)
		}
	}
}

func (st *groupState) shard(p string) *shardState {
	s := st.Shards[p]
	if s == nil {
		s = &shardState{}
		st.Shards[p] = s
	}
	return s
}

// fold applies f when it names the shards from the watermark on, each
// once and each done; anything else is ignored (the appender checked
// against the same state, so it never is).
func (st *groupState) fold(f *foldEvent) {
	if f == nil || f.From != st.Low || len(f.Paths) == 0 {
		return
	}
	seen := make(map[string]bool, len(f.Paths))
	for _, p := range f.Paths {
		if s := st.Shards[p]; s == nil || !s.Done || seen[p] {
			return
		}
		seen[p] = true
	}
	for _, p := range f.Paths {
		s := st.Shards[p]
		st.LowAcked += int64(s.NAcked)
		st.LowSkipped += int64(s.NSkip)
		delete(st.Shards, p)
	}
	st.Low += int64(len(f.Paths))
	st.LowPath = f.Paths[len(f.Paths)-1]
	st.LowVersion = max(st.LowVersion, f.Version)
}

// apply replays e; the rules are those the appender checked. Only a
// lease makes a shard known: an acknowledgement, skip, total or release
// of a shard without a state (folded, or never leased) is ignored, as
// one by a member that does not hold the shard is.
func (st *groupState) apply(e *event) {
	st.fold(e.Fold)
	for _, p := range e.Lease {
		s := st.shard(p)
		expect, ok := e.Expect[p]
		if s.leasable(e.Member, expect, ok) {
			s.Holder, s.LeaseSeq = e.Member, e.Seq
		}
	}
	settle := func(ms []marks, acked bool) {
		for _, m := range ms {
			s := st.Shards[m.Shard]
			if s == nil || s.Holder != e.Member || s.Done {
				continue
			}
			for i, o := range m.Groups {
				if s.settled(o) {
					continue
				}
				if !acked && i < len(m.Versions) {
					st.noteStale(e.Member, m.Versions[i])
				}
				if acked {
					if s.Acked == nil {
						s.Acked = map[int32]bool{}
					}
					s.Acked[o] = true
					s.NAcked++
				} else {
					if s.Skips == nil {
						s.Skips = map[int32]bool{}
					}
					s.Skips[o] = true
					s.NSkip++
				}
			}
		}
	}
	settle(e.Ack, true)
	settle(e.Skip, false)
	for p, n := range e.Totals {
		if s := st.Shards[p]; s != nil && s.Holder == e.Member && !s.Done {
			s.Total, s.Counted = n, true
		}
	}
	for _, p := range e.Release {
		if s := st.Shards[p]; s != nil && s.Holder == e.Member {
			s.Holder = ""
		}
	}
	for _, p := range touched(e) {
		if s := st.Shards[p]; s != nil {
			s.finish()
		}
	}
	st.noteMember(e)
	st.Next = e.Seq + 1
}

func touched(e *event) []string {
	out := append([]string(nil), e.Lease...)
	for _, m := range e.Ack {
		out = append(out, m.Shard)
	}
	for _, m := range e.Skip {
		out = append(out, m.Shard)
	}
	for p := range e.Totals {
		out = append(out, p)
	}
	return out
}

// clone is a deep copy of st (for a snapshot, or a record's working
// state): nothing the copy's apply changes reaches st.
func (st *groupState) clone() *groupState {
	c := *st
	c.Shards = make(map[string]*shardState, len(st.Shards))
	for p, s := range st.Shards {
		cs := *s
		cs.Acked, cs.Skips = maps.Clone(s.Acked), maps.Clone(s.Skips)
		c.Shards[p] = &cs
	}
	if st.Members != nil {
		c.Members = make(map[string]*memberState, len(st.Members))
		for n, m := range st.Members {
			cm := *m
			c.Members[n] = &cm
		}
	}
	c.StaleByVersion = maps.Clone(st.StaleByVersion)
	return &c
}

// SnapshotEvery is how many events separate two snapshots of the state
// (snap-<seq>.json): a member opening the log reads the latest snapshot
// and the events after it, not the whole history, and the events before
// the second latest snapshot are deleted (store.Journal).
const SnapshotEvery = 256

// groupLog is a consumer group's log as one process sees it: the state
// replayed from it, which the process's members of the group share (one
// replay, not one per member), and their appends, made by group commit:
// the events queued while a record is being made share the next record
// instead of racing for a number each. A record of one event is the
// event, as before group commit; a record of several is {"events": [...],
// "seq": "batch"}: the string where a reader older than group commit
// expects the event's number makes that reader fail on the record
// instead of misreading it (upgrade every member of a group before
// running it with this version). Each event is built against the state
// after the events before it in the record, so the replay's rules hold
// event by event; a record lands whole or not at all.
type groupLog struct {
	obj       Objects
	log       *store.Journal
	snapEvery int64

	mu sync.Mutex
	st *groupState

	queue store.Queue[eventReq]
}

// eventReq is an event waiting for its record. build gets the state as
// it landed and the record's working state (the landed one with the
// record's earlier events applied): the event is built against the
// working state, as the replay will judge it, while a build that changes
// its member's own state (a lease: the member's read position, its watch
// of others' leases, the low watermark's alignment) takes that from the
// landed state, so that it never rests on an event that may not land.
type eventReq struct {
	member string
	nonce  string
	build  func(landed, work *groupState, e *event) bool
}

// eventWaiter is an eventReq in the queue.
type eventWaiter = store.Waiter[eventReq]

// maxRecordEvents bounds the events of one record.
const maxRecordEvents = 256

// batchEvents is a record of several events.
type batchEvents struct {
	Events []event `json:"events"`
	// Gate is "batch", a string under the key where an event has its
	// number: see groupLog.
	Gate string `json:"seq"`
}

// decodeEvents returns the events of a record (one, or a group commit's
// batch), numbered seq.
func decodeEvents(data []byte, seq int64) ([]event, error) {
	var probe struct {
		Events json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return nil, err
	}
	var es []event
	if probe.Events == nil {
		var e event
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, err
		}
		es = []event{e}
	} else {
		var b batchEvents
		if err := json.Unmarshal(data, &b); err != nil {
			return nil, err
		}
		es = b.Events
	}
	for i := range es {
		es[i].Seq = seq
	}
	return es, nil
}

// encodeEvents is the record of es.
func encodeEvents(es []event) ([]byte, error) {
	if len(es) == 1 {
		return json.Marshal(&es[0])
	}
	return json.Marshal(&batchEvents{Events: es, Gate: "batch"})
}

// GroupLog is a consumer group's log shared by the members one process
// runs (ConsumerConfig.Log): they replay it once and their events share
// records.
type GroupLog struct{ gl *groupLog }

// OpenGroupLog reads the group's log in obj (its latest snapshot and the
// events after it).
func OpenGroupLog(ctx context.Context, obj Objects) (*GroupLog, error) {
	gl, err := openGroupLog(ctx, obj)
	if err != nil {
		return nil, err
	}
	return &GroupLog{gl: gl}, nil
}

func openGroupLog(ctx context.Context, obj Objects) (*groupLog, error) {
	g := &groupLog{obj: obj, log: store.NewJournal(obj), snapEvery: SnapshotEvery, st: &groupState{Shards: map[string]*shardState{}}}
	if err := g.load(ctx); err != nil {
		return nil, err
	}
	if err := g.refresh(ctx); err != nil {
		return nil, err
	}
	return g, nil
}

// coordinator is one member's handle on its group's log.
type coordinator struct {
	*groupLog
	member string
}

// newMemberID returns name/incarnation: the incarnation tells two runs of
// one name apart, so a dead run's late acknowledgement is refused.
func newMemberID(name string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return name + "/" + hex.EncodeToString(b[:])
}

// openCoordinator reads the latest snapshot and the events after it, for
// a member alone in its process.
func openCoordinator(ctx context.Context, obj Objects, member string) (*coordinator, error) {
	g, err := openGroupLog(ctx, obj)
	if err != nil {
		return nil, err
	}
	return &coordinator{groupLog: g, member: member}, nil
}

// load starts from the latest snapshot, if any (and if it is ahead of
// the state held).
func (g *groupLog) load(ctx context.Context) error {
	data, seq, ok, err := g.log.Latest(ctx)
	if err != nil {
		return fmt.Errorf("train: consumer-group log: %w", err)
	}
	if !ok {
		return nil
	}
	var st groupState
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("train: snapshot %d: %w", seq, err)
	}
	if st.Shards == nil {
		st.Shards = map[string]*shardState{}
	}
	g.mu.Lock()
	if st.Next > g.st.Next {
		g.st = &st
	}
	g.mu.Unlock()
	return nil
}

// refresh applies the records appended since the last read; a reader
// that fell behind a compaction reloads from the latest snapshot.
func (g *groupLog) refresh(ctx context.Context) error {
	for {
		g.mu.Lock()
		next := g.st.Next
		g.mu.Unlock()
		data, behind, err := g.log.Next(ctx, next)
		if err != nil {
			return fmt.Errorf("train: read consumer-group event %d: %w", next, err)
		}
		if behind {
			if err := g.load(ctx); err != nil {
				return err
			}
			g.mu.Lock()
			moved := g.st.Next > next
			g.mu.Unlock()
			if !moved { // a damaged log: reloading again would loop for ever
				return fmt.Errorf("train: consumer-group event %d was compacted away and no snapshot goes beyond it", next)
			}
			continue
		}
		if data == nil {
			return nil
		}
		es, err := decodeEvents(data, next)
		if err != nil {
			return fmt.Errorf("train: consumer-group event %d: %w", next, err)
		}
		g.mu.Lock()
		if g.st.Next == next {
			for i := range es {
				g.st.apply(&es[i])
			}
			g.st.Next = next + 1
		}
		g.mu.Unlock()
	}
}

// append builds an event against the current state and appends it, in
// the next record: re-reading the log and building again when another
// process got there first. build returns false when there is nothing to
// append. A caller whose context ends stops waiting only once its
// event's fate is known when its event shares a record with others'.
func (c *coordinator) append(ctx context.Context, build func(st *groupState, e *event) bool) error {
	return c.appendLanded(ctx, func(_, work *groupState, e *event) bool { return build(work, e) })
}

// appendLanded is append for an event whose build also reads the state
// as it landed (eventReq).
func (c *coordinator) appendLanded(ctx context.Context, build func(landed, work *groupState, e *event) bool) error {
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	g := c.groupLog
	req := eventReq{member: c.member, nonce: hex.EncodeToString(nb[:]), build: build}
	take := func(q []*eventWaiter) int { return min(len(q), maxRecordEvents) }
	return g.queue.Do(ctx, req, take, func(ctx context.Context, batch []*eventWaiter) func() {
		if snap := g.appendRecord(ctx, batch); snap != nil {
			return func() { g.snapshot(ctx, snap) } // after the hand-off: the next record need not wait
		}
		return nil
	})
}

// appendRecord appends the events of reqs as one record and sends each
// its outcome; it returns the state to snapshot when the record's number
// calls for one.
func (g *groupLog) appendRecord(ctx context.Context, reqs []*eventWaiter) *groupState {
	finish := func(rs []*eventWaiter, err error) {
		for _, r := range rs {
			r.Finish(err)
		}
	}
	for attempt := 0; len(reqs) > 0; attempt++ {
		if attempt > 1000 {
			finish(reqs, errors.New("train: consumer-group log: too much contention"))
			return nil
		}
		if err := g.refresh(ctx); err != nil {
			finish(reqs, err)
			return nil
		}
		// Each event is built against the state after the ones before it
		// in the record: a copy when there are several.
		now := time.Now().UTC()
		g.mu.Lock()
		seq := g.st.Next
		work := g.st
		if len(reqs) > 1 {
			work = g.st.clone()
		}
		var es []event
		var in, idle []*eventWaiter
		for _, r := range reqs {
			e := event{Nonce: r.Item.nonce, Member: r.Item.member, Time: now, Seq: seq}
			if !r.Item.build(g.st, work, &e) {
				idle = append(idle, r)
				continue
			}
			if len(reqs) > 1 {
				work.apply(&e)
			}
			es = append(es, e)
			in = append(in, r)
		}
		g.mu.Unlock()
		finish(idle, nil) // nothing to append
		reqs = in
		if len(es) == 0 {
			return nil
		}
		data, err := encodeEvents(es)
		if err != nil {
			finish(reqs, fmt.Errorf("train: encode event: %w", err))
			return nil
		}
		err = g.log.Append(ctx, seq, data)
		if errors.Is(err, store.ErrStale) {
			// Behind a compaction: reload and build the events again
			// against the state that includes whatever landed.
			if err := g.load(ctx); err != nil {
				finish(reqs, err)
				return nil
			}
			continue
		}
		if err == nil {
			g.mu.Lock()
			if g.st.Next == seq {
				for i := range es {
					g.st.apply(&es[i])
				}
				g.st.Next = seq + 1
			}
			var snap *groupState
			if seq%g.snapEvery == 0 && seq > 0 {
				snap = g.st.clone()
			}
			g.mu.Unlock()
			finish(reqs, nil)
			return snap
		}
		if !errors.Is(err, fs.ErrExist) {
			finish(reqs, fmt.Errorf("train: append consumer-group event %d: %w", seq, err))
			return nil
		}
		// Lost the race, or an earlier attempt landed and its answer was
		// lost: the nonces tell which events are in the record there.
		if landed, gerr := g.log.Read(ctx, seq); gerr == nil {
			if got, derr := decodeEvents(landed, seq); derr == nil {
				ours := map[string]bool{}
				for _, e := range got {
					ours[e.Nonce] = true
				}
				var rest, done []*eventWaiter
				for _, r := range reqs {
					if ours[r.Item.nonce] {
						done = append(done, r)
					} else {
						rest = append(rest, r)
					}
				}
				if len(done) > 0 {
					err := g.refresh(ctx)
					finish(done, err)
				}
				reqs = rest
			}
		}
	}
	return nil
}

// snapshot writes the state after st.Next-1 and compacts the log; a
// failure only costs readers time (the next snapshot tries again), so it
// is logged, not returned.
func (g *groupLog) snapshot(ctx context.Context, st *groupState) {
	// The audit of the events the compaction may delete goes first into
	// its own append-only segment: no segment, no snapshot (and so no
	// compaction).
	if err := writeAudit(ctx, g.obj, g.log, st.Next-1); err != nil {
		slog.Warn("train: consumer-group audit segment", "err", err)
		return
	}
	data, err := json.Marshal(st)
	if err == nil {
		err = g.log.Snapshot(ctx, st.Next-1, data)
	}
	if err != nil {
		slog.Warn("train: consumer-group snapshot", "err", err)
	}
}

// view runs fn on the current state under the lock.
func (g *groupLog) view(fn func(st *groupState)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	fn(g.st)
}

// Progress is a consumer group's position, from its log.
type Progress struct {
	Shards      int   `json:"shards"`      // shards the log knows of
	Done        int   `json:"shards_done"` // every group acknowledged or skipped
	Leased      int   `json:"shards_leased"`
	GroupsAcked int64 `json:"groups_acked"`
	GroupsSkip  int64 `json:"groups_skipped"`
	// GroupsStale counts the skipped groups that were stale (the rest
	// were emptied by filters); StaleByVersion splits them by policy
	// version (the newest 256 versions), in version order.
	GroupsStale    int64          `json:"groups_skipped_stale"`
	StaleByVersion []VersionCount `json:"skipped_stale_by_version,omitempty"`
	Events         int64          `json:"events"` // records of the log (a record may hold several events)
	// Members are every member name the log has seen, by name, with the
	// shards it holds now (live leases) and its last acknowledgement.
	Members []MemberProgress `json:"members"`
}

// VersionCount is a number of groups of one policy version.
type VersionCount = schemas.VersionCount

// MemberProgress is one member of a consumer group, from its log.
type MemberProgress struct {
	Name string `json:"name"`
	// ID is its latest incarnation (name/random).
	ID string `json:"id"`
	// Leased is how many shards it holds now (0: gone or idle).
	Leased int `json:"shards_leased"`
	// Batches counts its acknowledgements that carry an audit.
	Batches int64 `json:"batches_acked"`
	// SkippedStale counts the groups it skipped as stale.
	SkippedStale int64 `json:"groups_skipped_stale"`
	// PolicyVersion is the policy version of its last acknowledgement,
	// Staleness the largest policy version − group version in that batch.
	PolicyVersion int64     `json:"policy_version"`
	Staleness     int64     `json:"staleness"`
	LastAck       time.Time `json:"last_ack,omitzero"`
	LastSeen      time.Time `json:"last_seen,omitzero"`
}

// GroupProgress replays a consumer group's log and counts what the group
// has consumed.
func GroupProgress(ctx context.Context, obj Objects) (Progress, error) {
	var w GroupWatch
	return w.Progress(ctx, obj)
}

// GroupWatch reads a consumer group's progress again and again, each time
// only the events appended since (a follower polling the log). The zero
// value is ready; not safe for concurrent use.
type GroupWatch struct {
	c *coordinator
}

// Progress is the group's progress now, from the log in obj (the same obj
// at every call).
func (w *GroupWatch) Progress(ctx context.Context, obj Objects) (Progress, error) {
	if w.c == nil {
		c, err := openCoordinator(ctx, obj, "")
		if err != nil {
			return Progress{}, err
		}
		w.c = c
	} else if err := w.c.refresh(ctx); err != nil {
		return Progress{}, err
	}
	return progressOf(w.c), nil
}

func progressOf(c *coordinator) Progress {
	var p Progress
	c.view(func(st *groupState) {
		p.Events = st.Next
		p.Shards, p.Done = int(st.Low), int(st.Low)
		p.GroupsAcked, p.GroupsSkip = st.LowAcked, st.LowSkipped
		keys := make([]string, 0, len(st.Shards))
		for k := range st.Shards {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			s := st.Shards[k]
			p.Shards++
			if s.Done {
				p.Done++
			} else if s.Holder != "" {
				p.Leased++
			}
			p.GroupsAcked += int64(s.NAcked)
			p.GroupsSkip += int64(s.NSkip)
		}
		leased := map[string]int{}
		for _, s := range st.Shards {
			if s.Holder != "" && !s.Done {
				leased[memberName(s.Holder)]++
			}
		}
		p.Members = make([]MemberProgress, 0, len(st.Members))
		for name, m := range st.Members {
			p.Members = append(p.Members, MemberProgress{
				Name: name, ID: m.ID, Leased: leased[name], Batches: m.Batches, SkippedStale: m.StaleSkipped,
				PolicyVersion: m.Policy, Staleness: m.Stale, LastAck: m.LastAck, LastSeen: m.LastSeen,
			})
		}
		sort.Slice(p.Members, func(i, j int) bool { return p.Members[i].Name < p.Members[j].Name })
		p.GroupsStale = st.StaleSkipped
		for v, n := range st.StaleByVersion {
			p.StaleByVersion = append(p.StaleByVersion, VersionCount{Version: v, Groups: n})
		}
		sort.Slice(p.StaleByVersion, func(i, j int) bool { return p.StaleByVersion[i].Version < p.StaleByVersion[j].Version })
	})
	return p
}
