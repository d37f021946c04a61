package train

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/connectors/parquet"
	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// ReplayPlan is what a replay group delivers: the batches another group
// acknowledged, in the order it acknowledged them, each with the same
// groups in the same order.
type ReplayPlan struct {
	// From is the consumer group replayed.
	From string `json:"from"`
	// Rows, when set, are the row settings the replay delivers with
	// (the original's, unless the replay was made to change them): a
	// member joining with others is refused (ErrReplayRows). Plans made
	// before row settings were recorded have none and check nothing.
	Rows    *RowSettings `json:"rows,omitempty"`
	Batches []Consumed   `json:"batches"`
}

// RowSettings are the consumer settings that decide a batch's rows
// beyond its groups: the layout, and whether rows a filter marked are
// delivered. The same groups under other settings are other bytes, so a
// replay delivers with the settings its plan records.
type RowSettings struct {
	Layout          string `json:"layout"` // Layout.String()
	IncludeFiltered bool   `json:"include_filtered"`
}

func (s RowSettings) String() string {
	return fmt.Sprintf("--layout %s --include-filtered=%t", s.Layout, s.IncludeFiltered)
}

func rowSettingsOf(cfg *Config) RowSettings {
	return RowSettings{Layout: cfg.Layout.String(), IncludeFiltered: cfg.IncludeFiltered}
}

// ErrReplayRows is a member joining a replay group with other row
// settings than its plan's.
var ErrReplayRows = errors.New("train: the replay delivers other rows")

// rowsPrefix names the objects in a consumer group's folder that record
// the row settings its members joined with, one per distinct settings
// (rows-<layout>[-filtered].json): each member creates its own at join,
// so a group consumed with one setting has one, and a replay defaults to
// it. Not numbered, so the log and its audit never see them.
const rowsPrefix = "rows-"

func (s RowSettings) objectName() string {
	name := rowsPrefix + s.Layout
	if s.IncludeFiltered {
		name += "-filtered"
	}
	return name + ".json"
}

// recordRows notes s in the group's folder (once per distinct settings).
func recordRows(ctx context.Context, obj Objects, s RowSettings) error {
	data, err := json.Marshal(&s)
	if err != nil {
		return fmt.Errorf("train: encode row settings: %w", err)
	}
	if err := obj.Create(ctx, s.objectName(), data); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("train: record row settings: %w", err)
	}
	return nil
}

// ReadRowSettings returns the distinct row settings the members of the
// consumer group whose log folder is obj joined with, sorted by object
// name; none for a group whose members all predate the record.
func ReadRowSettings(ctx context.Context, obj Objects) ([]RowSettings, error) {
	names, err := obj.List(ctx, rowsPrefix)
	if err != nil {
		return nil, fmt.Errorf("train: list row settings: %w", err)
	}
	var out []RowSettings
	for _, n := range names {
		if !strings.HasPrefix(n, rowsPrefix) || !strings.HasSuffix(n, ".json") {
			continue
		}
		data, err := obj.Get(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("train: row settings %s: %w", n, err)
		}
		var s RowSettings
		if err := json.Unmarshal(data, &s); err != nil {
			return nil, fmt.Errorf("train: row settings %s: %w", n, err)
		}
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// replayObject is the plan's object in the replay group's folder.
const replayObject = "replay.json"

// replayPrefix names a plan batch in the replay group's log, where it is
// leased and settled like a shard (group ordinals: places in the batch).
// Shard paths never start with "_".
const replayPrefix = "_replay/"

func replayShard(i int) string { return fmt.Sprintf("%s%08d", replayPrefix, i) }

// ErrReplayExists is a replay group that exists with another plan, or a
// group that already has a log.
var ErrReplayExists = errors.New("train: the consumer group exists")

// CreateReplay makes the consumer group whose (empty) log folder is obj
// a replay of plan: its members (NewConsumer) receive exactly plan's
// batches, shared and acknowledged like shards, in plan order: a member
// is not given a batch while another member holds an earlier one (a
// member that leaves gives its batches back; a crashed member's go to
// another after the lease timeout), so members take turns rather than
// work in parallel. Creating the same plan
// again is not an error; another plan, or a group with a log, is.
func CreateReplay(ctx context.Context, obj Objects, plan ReplayPlan) error {
	data, err := json.Marshal(&plan)
	if err != nil {
		return fmt.Errorf("train: encode replay plan: %w", err)
	}
	names, err := obj.List(ctx, "")
	if err != nil {
		return fmt.Errorf("train: list the replay group: %w", err)
	}
	for _, n := range names {
		if _, ok := store.ParseNumbered(n, ""); ok {
			if has, _ := obj.Get(ctx, replayObject); !bytes.Equal(has, data) {
				return fmt.Errorf("%w: it has a log (%s)", ErrReplayExists, n)
			}
		}
	}
	err = obj.Create(ctx, replayObject, data)
	if errors.Is(err, fs.ErrExist) {
		has, gerr := obj.Get(ctx, replayObject)
		if gerr != nil {
			return fmt.Errorf("train: read the replay plan: %w", gerr)
		}
		if !bytes.Equal(has, data) {
			return fmt.Errorf("%w with another replay plan", ErrReplayExists)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("train: create the replay plan: %w", err)
	}
	return nil
}

// replayState is a replaying consumer's own state (Next's goroutine).
type replayState struct {
	plan    ReplayPlan
	source  Shards                        // the real shards
	entries map[string]schemas.ShardEntry // committed shards by path
	rd      *shardReader                  // the shard read last, at its next group
}

// planShards lists a plan's batches as the shards of the replay group's
// log, so that leases, takeovers and settling work as for shards.
type planShards struct{ n int }

func (p planShards) Committed(context.Context) ([]schemas.ShardEntry, error) {
	out := make([]schemas.ShardEntry, p.n)
	for i := range out {
		out[i] = schemas.ShardEntry{Path: replayShard(i)}
	}
	return out, nil
}

func (planShards) ReadShard(context.Context, schemas.ShardEntry, []string, memory.Allocator) (*parquet.Reader, error) {
	return nil, errors.New("train: a replay batch is not a shard")
}

// loadReplay switches c to replay mode when its group has a plan, and
// refuses to join a replay with other row settings than the plan's.
// Joining any other group records c's row settings in its folder, for
// a replay of it to default to.
func (c *Consumer) loadReplay(ctx context.Context, obj Objects) error {
	mine := rowSettingsOf(&c.cfg.Config)
	data, err := obj.Get(ctx, replayObject)
	if errors.Is(err, fs.ErrNotExist) {
		return recordRows(ctx, obj, mine)
	}
	if err != nil {
		return fmt.Errorf("train: read the replay plan: %w", err)
	}
	var plan ReplayPlan
	if err := json.Unmarshal(data, &plan); err != nil {
		return fmt.Errorf("train: replay plan: %w", err)
	}
	if plan.Rows != nil && *plan.Rows != mine {
		return fmt.Errorf("%w: the group replays %s with %s; this member has %s (join with the plan's settings, or make another replay with rllm-pipe replay --layout/--include-filtered)",
			ErrReplayRows, plan.From, *plan.Rows, mine)
	}
	c.replay = &replayState{plan: plan, source: c.shards}
	c.shards = planShards{n: len(plan.Batches)}
	return nil
}

// nextReplayed delivers the plan's next batch not yet settled: whole,
// with the groups of the original in their order, whatever the budget or
// the staleness bound (they decided the original).
func (c *Consumer) nextReplayed(ctx context.Context) (*Delivery, error) {
	for {
		if err := c.waitInflight(ctx); err != nil {
			return nil, err
		}
		e, settled, err := c.leaseNext(ctx)
		if err != nil {
			return nil, err
		}
		if e == nil {
			if err := c.flushMarks(ctx); err != nil {
				return nil, err
			}
			if c.allDone() {
				return nil, io.EOF
			}
			if err := c.wait(ctx, c.cfg.Poll); err != nil {
				return nil, err
			}
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(e.Path, replayPrefix))
		if err != nil || i < 0 || i >= len(c.replay.plan.Batches) {
			return nil, fmt.Errorf("train: replay: bad batch %q", e.Path)
		}
		planned := c.replay.plan.Batches[i]
		c.mu.Lock()
		c.totals[e.Path] = int32(len(planned.Groups))
		c.read[e.Path] = true
		c.mu.Unlock()
		if len(settled) > 0 {
			continue // acknowledged before (a batch is settled whole)
		}
		d, err := c.deliverPlanned(ctx, e.Path, planned)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
}

// deliverPlanned reads the planned groups and forms their batch.
func (c *Consumer) deliverPlanned(ctx context.Context, shard string, planned Consumed) (*Delivery, error) {
	f := &former{cfg: &c.cfg.Config, mem: c.mem, counters: &c.stats.Counters}
	defer f.discard()
	a := auditBatch{}
	for j, pg := range planned.Groups {
		g, err := c.replayGroup(ctx, pg)
		if err != nil {
			return nil, err
		}
		f.add(g)
		a.groups = append(a.groups, ConsumedGroup{Shard: g.shard, Ordinal: g.ordinal, GroupID: g.key, GroupVersion: g.version, Trajectories: countTrajectories(g), Steps: g.rows})
		a.keys = append(a.keys, skipKey{shard, int32(j)})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	bs, parts, err := f.take(false, 0)
	for _, p := range parts {
		releaseGroups(p)
	}
	if err != nil || len(bs) == 0 {
		return nil, fmt.Errorf("train: replay batch %s: %w", shard, err)
	}
	b := bs[0]
	c.step++
	b.StepPart.Step = c.step
	ords := make([]int32, len(planned.Groups))
	for j := range ords {
		ords[j] = int32(j)
	}
	c.nextID++
	c.inflight[c.nextID] = []marks{{Shard: shard, Groups: ords}}
	c.inflightStep(c.nextID, c.step)
	c.audit[c.nextID] = a
	return &Delivery{ID: c.nextID, Batch: *b}, nil
}

// replayGroup reads the group pg names from its shard, checking that it
// is still the group acknowledged.
func (c *Consumer) replayGroup(ctx context.Context, pg ConsumedGroup) (*group, error) {
	r := c.replay
	if r.rd == nil || r.rd.path != pg.Shard || r.rd.ordinal > pg.Ordinal {
		if r.rd != nil {
			_ = r.rd.close()
			r.rd = nil
		}
		e, ok := r.entries[pg.Shard]
		if !ok {
			entries, err := r.source.Committed(ctx)
			if err != nil {
				return nil, err
			}
			r.entries = make(map[string]schemas.ShardEntry, len(entries))
			for _, e := range entries {
				r.entries[e.Path] = e
			}
			if e, ok = r.entries[pg.Shard]; !ok {
				return nil, fmt.Errorf("train: replay: shard %s is not committed", pg.Shard)
			}
		}
		rd, err := r.source.ReadShard(ctx, e, c.cfg.shardColumns(), c.mem)
		if err != nil {
			return nil, fmt.Errorf("train: replay: shard %s: %w", pg.Shard, err)
		}
		r.rd = newShardReader(pg.Shard, rd, &c.cfg.Config)
	}
	for {
		g, err := r.rd.next()
		if err != nil {
			return nil, fmt.Errorf("train: replay: shard %s: %w", pg.Shard, err)
		}
		if g == nil {
			return nil, fmt.Errorf("train: replay: shard %s has no group %d", pg.Shard, pg.Ordinal)
		}
		if g.ordinal < pg.Ordinal {
			g.release()
			continue
		}
		switch {
		case g.key != pg.GroupID:
			g.release()
			return nil, fmt.Errorf("train: replay: group %d of %s is %q, acknowledged as %q", pg.Ordinal, pg.Shard, g.key, pg.GroupID)
		case g.rows != pg.Steps:
			g.release()
			return nil, fmt.Errorf("train: replay: group %q has %d step rows here, %d were acknowledged (consumed with other --include-filtered?)", pg.GroupID, g.rows, pg.Steps)
		}
		return g, nil
	}
}

// closeReplay releases the replay's reader.
func (c *Consumer) closeReplay() {
	if c.replay != nil && c.replay.rd != nil {
		_ = c.replay.rd.close()
		c.replay.rd = nil
	}
}
