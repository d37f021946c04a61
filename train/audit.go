package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// The audit of a consumer group is what it acknowledged, batch by batch:
// every acknowledgement event carries its batch (id, policy version, the
// groups it settled in batch order). Events are compacted away behind
// snapshots, so before a member writes a snapshot it copies the audits of
// the events since the last copy into an append-only segment,
// audit-<last seq>.json, next to the log; a snapshot (and so a
// compaction) happens only after its segment exists. The snapshot itself
// stays as small as the group's shard state: the audit grows with the
// run, a snapshot rewritten every SnapshotEvery events must not.

// ConsumedGroup is one group of an acknowledged batch.
type ConsumedGroup = schemas.ConsumedGroup

// Consumed is one acknowledged batch of a consumer group.
type Consumed = schemas.ConsumedBatch

// auditSegment is the audit of the events (From-1, To].
type auditSegment struct {
	From    int64      `json:"from"`
	To      int64      `json:"to"`
	Batches []Consumed `json:"batches"`
}

const auditPrefix = "audit-"

func auditName(to int64) string { return fmt.Sprintf("%s%020d.json", auditPrefix, to) }

// consumedOf is the audit e carries, if any.
func consumedOf(e *event) (Consumed, bool) {
	if e.Batch == nil || len(e.Batch.Groups) == 0 {
		return Consumed{}, false
	}
	return Consumed{Seq: e.Seq, Member: e.Member, Time: e.Time, BatchID: e.Batch.ID, PolicyVersion: e.Batch.PolicyVersion, Groups: e.Batch.Groups}, true
}

// listLog splits the folder's names into the last audit segment's end
// (-1 when none), the segments, and the event numbers present, sorted.
func listLog(ctx context.Context, obj Objects) (last int64, segs []int64, events []int64, err error) {
	names, err := obj.List(ctx, "")
	if err != nil {
		return 0, nil, nil, fmt.Errorf("train: list consumer-group log: %w", err)
	}
	last = -1
	for _, n := range names {
		if to, ok := store.ParseNumbered(n, auditPrefix); ok {
			segs = append(segs, to)
			last = max(last, to)
		} else if seq, ok := store.ParseNumbered(n, ""); ok {
			events = append(events, seq)
		}
	}
	return last, segs, events, nil
}

// writeAudit writes the segment of the events after the last segment up
// to and including to (nothing when the last segment reaches it).
func writeAudit(ctx context.Context, obj Objects, log *store.Journal, to int64) error {
	last, _, events, err := listLog(ctx, obj)
	if err != nil {
		return err
	}
	if last >= to {
		return nil
	}
	seg := auditSegment{From: last + 1, To: to, Batches: []Consumed{}}
	for _, seq := range events {
		if seq <= last || seq > to {
			continue
		}
		data, err := log.Read(ctx, seq)
		if err != nil {
			return fmt.Errorf("train: audit: event %d: %w", seq, err)
		}
		es, err := decodeEvents(data, seq)
		if err != nil {
			return fmt.Errorf("train: audit: event %d: %w", seq, err)
		}
		for i := range es {
			if b, ok := consumedOf(&es[i]); ok {
				seg.Batches = append(seg.Batches, b)
			}
		}
	}
	data, err := json.Marshal(&seg)
	if err != nil {
		return fmt.Errorf("train: audit: encode: %w", err)
	}
	if err := obj.Create(ctx, auditName(to), data); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("train: audit: %w", err)
	}
	return nil
}

// ReadConsumed returns every batch the consumer group whose log is obj
// acknowledged, in the order of acknowledgement: the audit segments, then
// the events after the last of them. A compaction racing the read makes
// it start again.
func ReadConsumed(ctx context.Context, obj Objects) ([]Consumed, error) {
	log := store.NewJournal(obj)
	for attempt := 0; ; attempt++ {
		out, retry, err := readConsumed(ctx, obj, log)
		if err != nil || !retry {
			return out, err
		}
		if attempt >= 10 {
			return nil, fmt.Errorf("train: audit: the log kept being compacted while read")
		}
	}
}

func readConsumed(ctx context.Context, obj Objects, log *store.Journal) ([]Consumed, bool, error) {
	last, segs, events, err := listLog(ctx, obj)
	if err != nil {
		return nil, false, err
	}
	// By record: the batches a record acknowledged, in its order.
	by := map[int64][]Consumed{}
	for _, to := range segs {
		data, err := obj.Get(ctx, auditName(to))
		if err != nil {
			return nil, false, fmt.Errorf("train: audit segment %d: %w", to, err)
		}
		var seg auditSegment
		if err := json.Unmarshal(data, &seg); err != nil {
			return nil, false, fmt.Errorf("train: audit segment %d: %w", to, err)
		}
		// Two snapshots at once may write segments that overlap: a
		// record's batches are taken from one segment only.
		mine := map[int64][]Consumed{}
		for _, b := range seg.Batches {
			mine[b.Seq] = append(mine[b.Seq], b)
		}
		for seq, bs := range mine {
			if _, ok := by[seq]; !ok {
				by[seq] = bs
			}
		}
	}
	// Events at or below the last segment are in it (those still there
	// are waiting for the next compaction, or landed in a compacted hole
	// and were never part of the log).
	for _, seq := range events {
		if seq <= last {
			continue
		}
		data, err := log.Read(ctx, seq)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, true, nil // compacted since the listing: its segment exists now
		}
		if err != nil {
			return nil, false, fmt.Errorf("train: audit: event %d: %w", seq, err)
		}
		es, err := decodeEvents(data, seq)
		if err != nil {
			return nil, false, fmt.Errorf("train: audit: event %d: %w", seq, err)
		}
		var bs []Consumed
		for i := range es {
			if b, ok := consumedOf(&es[i]); ok {
				bs = append(bs, b)
			}
		}
		if bs != nil {
			by[seq] = bs
		}
	}
	seqs := make([]int64, 0, len(by))
	for seq := range by {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	var out []Consumed
	for _, seq := range seqs {
		out = append(out, by[seq]...)
	}
	return out, false, nil
}

// ListGroups returns the consumer groups in consumers, the folder
// GroupsDir of an output root (names that are not valid group names are
// left out).
func ListGroups(ctx context.Context, consumers Objects) ([]string, error) {
	names, err := consumers.List(ctx, "")
	if err != nil {
		return nil, fmt.Errorf("train: list consumer groups: %w", err)
	}
	var out []string
	for _, n := range names {
		n, _, _ = strings.Cut(n, "/") // a folder, or an object in one (listings differ by store)
		if CheckName("", n) == nil && (len(out) == 0 || out[len(out)-1] != n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// GroupsDir is the folder of every consumer group's log (GroupDir(g) is
// GroupsDir + "/" + g).
const GroupsDir = store.ConsumersDir

// countTrajectories counts the trajectories of a group's rows (the rows
// of a trajectory are contiguous), leaving out rows a filter marked when
// the group still holds them.
func countTrajectories(g *group) int32 {
	var (
		n    int32
		prev string
		seen bool
	)
	for _, p := range g.parts {
		idx := p.Schema().FieldIndices("trajectory_id")
		if len(idx) == 0 {
			continue
		}
		col, ok := p.Column(idx[0]).(*array.String)
		if !ok {
			continue
		}
		var marked *array.String
		if fi := p.Schema().FieldIndices("filter_reason"); g.marked && len(fi) > 0 {
			marked, _ = p.Column(fi[0]).(*array.String)
		}
		for i := 0; i < col.Len(); i++ {
			if marked != nil && marked.IsValid(i) {
				continue
			}
			if v := col.Value(i); !seen || v != prev {
				n++
				prev, seen = v, true
			}
		}
	}
	return n
}

// auditBatch is an inflight batch's audit: its groups, in batch order,
// and where each is settled in the log (its shard and ordinal; in a
// replay, the plan's batch and the group's place in it).
type auditBatch struct {
	groups []ConsumedGroup
	keys   []skipKey
}

// consumedGroups is the audit of a delivered batch's groups.
func consumedGroups(groups []*group) auditBatch {
	a := auditBatch{groups: make([]ConsumedGroup, len(groups)), keys: make([]skipKey, len(groups))}
	for i, g := range groups {
		a.groups[i] = ConsumedGroup{Shard: g.shard, Ordinal: g.ordinal, GroupID: g.key, GroupVersion: g.version, Trajectories: countTrajectories(g), Steps: g.rows}
		a.keys[i] = skipKey{g.shard, g.ordinal}
	}
	return a
}

// accepted are the groups an acknowledgement by member settles in st:
// those of shards it holds, not settled before.
func accepted(st *groupState, member string, a auditBatch) []ConsumedGroup {
	out := make([]ConsumedGroup, 0, len(a.groups))
	for i, g := range a.groups {
		k := a.keys[i]
		if s := st.Shards[k.shard]; s != nil && s.Holder == member && !s.Done && !s.settled(k.ordinal) {
			out = append(out, g)
		}
	}
	return out
}

// ConsumerLogs reads the consumer groups' logs of an output root: the
// consumed view of the SQL layer takes it (connectors/duckdb's
// ConsumerGroups), injected by the commands.
type ConsumerLogs struct{}

// Groups lists the consumer groups of r (ListGroups).
func (ConsumerLogs) Groups(ctx context.Context, r store.Reader) ([]string, error) {
	obj, err := r.Objects(GroupsDir)
	if err != nil {
		return nil, fmt.Errorf("train: consumer groups: %w", err)
	}
	return ListGroups(ctx, obj)
}

// StaleSkips returns the groups group skipped as stale, by policy
// version (GroupProgress).
func (ConsumerLogs) StaleSkips(ctx context.Context, r store.Reader, group string) ([]VersionCount, error) {
	obj, err := r.Objects(GroupDir(group))
	if err != nil {
		return nil, fmt.Errorf("train: consumer group %s: %w", group, err)
	}
	p, err := GroupProgress(ctx, obj)
	return p.StaleByVersion, err
}

// Consumed returns what group acknowledged (ReadConsumed).
func (ConsumerLogs) Consumed(ctx context.Context, r store.Reader, group string) ([]Consumed, error) {
	obj, err := r.Objects(GroupDir(group))
	if err != nil {
		return nil, fmt.Errorf("train: consumer group %s: %w", group, err)
	}
	return ReadConsumed(ctx, obj)
}
