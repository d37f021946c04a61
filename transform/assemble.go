package transform

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/schemas/prefix"
)

// Config sets the assembler's rules. Zero values take the defaults noted.
type Config struct {
	// GroupSize is the number of complete trajectories that completes a
	// group, unless a trajectory record of the group sets group_size.
	GroupSize int
	// MinGroupSize is the least number of complete trajectories a group
	// needs to be emitted (as partial) at a timeout or the end of input.
	// Default 2.
	MinGroupSize int
	// Timeout closes a group this long after its first record arrived.
	// Zero means never (groups close when full or at the end of input).
	Timeout time.Duration
	// MaxOpenGroups bounds the groups held in memory; opening one more
	// closes the oldest as if it had timed out. Default 65536.
	MaxOpenGroups int
	// MaxClosedGroups and MaxClosedRecords bound the memory of closed
	// groups and of the ids written in them, which tells a producer retry
	// (dropped) from a late or conflicting record (dead-lettered). Each
	// remembered record costs about 40 bytes. Defaults 65536 and 2M.
	MaxClosedGroups  int
	MaxClosedRecords int
	// Settled, if set, reports records whose fate an earlier run already
	// committed (written, dead-lettered or dropped): they are skipped and
	// counted, never processed again.
	Settled func(schemas.Source) bool
}

func (c Config) withDefaults() Config {
	if c.GroupSize <= 0 {
		c.GroupSize = 8
	}
	if c.MinGroupSize <= 0 {
		c.MinGroupSize = 2
	}
	if c.MaxOpenGroups <= 0 {
		c.MaxOpenGroups = 65536
	}
	if c.MaxClosedGroups <= 0 {
		c.MaxClosedGroups = 65536
	}
	if c.MaxClosedRecords <= 0 {
		c.MaxClosedRecords = 2 << 20
	}
	return c
}

// Counters are the assembler's tallies. Dead letters are counted by
// whoever writes them, by reason.
type Counters struct {
	Records             int64 `json:"records_read"`
	Blank               int64 `json:"blank_lines"`
	Duplicates          int64 `json:"duplicates_dropped"`
	Repaired            int64 `json:"utf8_repaired"`
	SkippedCommitted    int64 `json:"skipped_committed"` // records settled by an earlier run
	GroupsEmitted       int64 `json:"groups_written"`
	PartialGroups       int64 `json:"partial_groups"`
	TrajectoriesEmitted int64 `json:"trajectories_written"`
	StepsEmitted        int64 `json:"steps_written"`
	TimedOut            int64 `json:"groups_timed_out"`
	Evicted             int64 `json:"groups_evicted"`
	// Failed counts trajectories dead-lettered as rejected_step: their
	// groups closed without waiting for them.
	Failed int64 `json:"trajectories_failed"`
}

// Add adds o's counts to c (the counters of several runs of the stages).
func (c *Counters) Add(o Counters) {
	c.Records += o.Records
	c.Blank += o.Blank
	c.Duplicates += o.Duplicates
	c.Repaired += o.Repaired
	c.SkippedCommitted += o.SkippedCommitted
	c.GroupsEmitted += o.GroupsEmitted
	c.PartialGroups += o.PartialGroups
	c.TrajectoriesEmitted += o.TrajectoriesEmitted
	c.StepsEmitted += o.StepsEmitted
	c.TimedOut += o.TimedOut
	c.Evicted += o.Evicted
	c.Failed += o.Failed
}

// Step is a buffered step with its lineage.
type Step struct {
	*schemas.Step
	Raw    []byte        // the record as received, or nil when Ref reads it
	Ref    ingest.RawRef // where the record lies in its input (a file, a Kafka partition)
	Source schemas.Source
	hash   uint64
	// msgTail, when set, stands for the step's whole messages (then nil):
	// its parent's messages without their closing bracket, then msgTail
	// (deltaOnArrival).
	msgTail []byte
	// promptApart and msgsApart: deltaOnArrival compared the step's
	// prompt (messages) with its predecessor's and found that they do not
	// extend them. prev is the predecessor it is held as a delta of; wire,
	// that it arrived as a wire delta (never linked by deltaOnArrival).
	promptApart, msgsApart bool
	prev                   *Step
	wire                   bool
	// spans locate the prompt, response and messages values in Raw;
	// pieces, when set, stand for Raw (then nil): see keepRawAsDelta.
	spans   ingest.Spans
	pieces  []rawPiece
	rawFrom *Step
	rawLen  int
}

// Trajectory is a trajectory of an emitted group: its record and its
// steps in step_index order.
type Trajectory struct {
	*schemas.Trajectory
	Raw    []byte        // as Step's
	Ref    ingest.RawRef // as Step's
	Source schemas.Source
	Steps  []*Step

	hash   uint64
	taskID string // from its first record, for consistency checks
	key    string
	g      *group
	// failed: its record says a step was rejected at capture; it and its
	// steps are dead-lettered (rejected_step), and so are steps of it
	// arriving later, while its group is open.
	failed bool

	// tip is the step of t that arrived last when it came whole (not as
	// a wire delta), with its whole prompt, messages and record: the step
	// after it, arriving next, is compared with them without rebuilding
	// them (deltaOnArrival).
	tip       *Step
	tipPrompt []int32
	tipMsgs   []byte
	tipRaw    []byte // the tip's record as received (nil: its input reads it again)
}

func (t *Trajectory) complete() bool {
	return t.Trajectory != nil && int64(len(t.Steps)) == t.NumSteps
}

// Group is an emitted group: only complete trajectories, in the order
// their first record arrived.
type Group struct {
	Key string
	// Expected is the group size that was asked for; len(Trajectories)
	// is smaller when the group was emitted partial.
	Expected     int
	Trajectories []*Trajectory
	// Version is the minimum policy version over the group's steps.
	Version int64
}

// Partial reports whether the group was emitted with fewer trajectories
// than expected.
func (g *Group) Partial() bool { return len(g.Trajectories) < g.Expected }

// rawBytes is the size of the group's records as received.
func (g *Group) rawBytes() int {
	n := 0
	for _, t := range g.Trajectories {
		for _, s := range t.Steps {
			n += len(s.Raw) + s.rawLen + s.Ref.Len
		}
	}
	return n
}

// Rows is the number of steps in the group.
func (g *Group) Rows() int {
	n := 0
	for _, t := range g.Trajectories {
		n += len(t.Steps)
	}
	return n
}

type group struct {
	key      string
	size     int
	sizeSet  bool // size came from a trajectory record
	trajs    []*Trajectory
	complete int
	failed   int // trajectories that can never complete (rejected_step)
	opened   time.Time
	elem     *list.Element
}

// closedGroup is what is remembered of a closed group: the ids written in
// it (their content hashes live in Assembler.written).
type closedGroup struct {
	ids []uint64
}

// Assembler groups records. It is not safe for concurrent use. Emitted
// groups and dead letters accumulate until taken with Take.
type Assembler struct {
	cfg     Config
	groups  map[string]*group
	order   *list.List // open groups, oldest first
	trajs   map[string]*Trajectory
	steps   map[string]*Step // open steps by step_id
	closed  map[string]*closedGroup
	closedQ []string
	written map[uint64]uint64 // id hash → content hash of records written, for remembered groups
	// settled remembers the records skipped as settled by an earlier run
	// (id hash → content hash, the first of each id; settledQ, oldest
	// first, bounds them at SettledMemory): a copy of one whose group is
	// not open is a producer retry whose drop the earlier run did not get
	// to checkpoint (see addStep).
	settled  map[uint64]uint64
	settledQ []uint64

	out      []*Group
	dead     []schemas.DeadLetter
	rereads  []reread
	dropped  []schemas.Source
	Counters Counters
}

// NewAssembler returns an assembler with cfg (defaults applied).
func NewAssembler(cfg Config) *Assembler {
	return &Assembler{
		cfg:     cfg.withDefaults(),
		groups:  map[string]*group{},
		order:   list.New(),
		trajs:   map[string]*Trajectory{},
		steps:   map[string]*Step{},
		closed:  map[string]*closedGroup{},
		written: map[uint64]uint64{},
		settled: map[uint64]uint64{},
	}
}

// SettledMemory bounds the settled records an Assembler remembers. A
// producer retry comes soon after its original; an earlier run reached at
// most a few checkpoints beyond the point a restart resumes from.
const SettledMemory = 1 << 18

// rememberSettled notes a record skipped as settled, so that a copy of it
// met later is recognised (settledCopy).
func (a *Assembler) rememberSettled(it *ingest.Item) {
	if it.Err != nil {
		return
	}
	var id, content uint64
	switch it.Rec.Type {
	case schemas.TypeStep:
		id, content = idHash('s', it.Rec.Step.StepID), stepHash(it.Rec.Step)
	case schemas.TypeTrajectory:
		id, content = idHash('t', it.Rec.Trajectory.TrajectoryID), trajHash(it.Rec.Trajectory)
	default:
		return
	}
	if _, ok := a.settled[id]; ok {
		return // the first copy of an id is the one that counted
	}
	a.settled[id] = content
	a.settledQ = append(a.settledQ, id)
	if len(a.settledQ) > SettledMemory {
		delete(a.settled, a.settledQ[0])
		a.settledQ = a.settledQ[1:]
	}
}

// settledCopy reports whether a record (kind, id, content) is an exact copy
// of a record an earlier run settled.
func (a *Assembler) settledCopy(kind byte, id string, content uint64) bool {
	c, ok := a.settled[idHash(kind, id)]
	return ok && c == content
}

// OpenGroups is the number of groups held in memory.
func (a *Assembler) OpenGroups() int { return len(a.groups) }

// Output is what the assembler produced since the last Take: emitted
// groups, dead letters, and the positions of records dropped as producer
// retries (settled without a trace in the output).
type Output struct {
	Groups  []*Group
	Dead    []schemas.DeadLetter // see ReadRecords
	Dropped []schemas.Source
	rereads []reread
}

// reread is a dead letter whose record its input must read again.
type reread struct {
	dead int // index in Output.Dead
	ref  ingest.RawRef
}

// Take returns the output since the last call; the caller owns it.
func (a *Assembler) Take() Output {
	o := Output{Groups: a.out, Dead: a.dead, Dropped: a.dropped, rereads: a.rereads}
	a.out, a.dead, a.dropped, a.rereads = nil, nil, nil, nil
	return o
}

// ReadRecords reads again, from their inputs, the records of the dead
// letters whose records were held by reference (a file's line, a Kafka
// record): all of one input in one call, so that a Kafka partition serves
// many in one fetch instead of a fetch each. A record its input
// no longer holds leaves its letter without it, saying why; an error
// (ctx ended) leaves the letters unfinished, and they must not be written.
func (o *Output) ReadRecords(ctx context.Context) error {
	if len(o.rereads) == 0 {
		return nil
	}
	byFrom := map[ingest.Rereader][]reread{}
	var order []ingest.Rereader
	for _, r := range o.rereads {
		if byFrom[r.ref.From] == nil {
			order = append(order, r.ref.From)
		}
		byFrom[r.ref.From] = append(byFrom[r.ref.From], r)
	}
	for _, from := range order {
		rs := byFrom[from]
		refs := make([]ingest.RawRef, len(rs))
		for i, r := range rs {
			refs[i] = r.ref
		}
		recs, errs, err := from.Reread(ctx, refs)
		if err != nil {
			return fmt.Errorf("reading dead-lettered records again: %w", err)
		}
		for i, r := range rs {
			d := &o.Dead[r.dead]
			if errs[i] != nil {
				d.Error += "; the record could not be read again: " + errs[i].Error()
				continue
			}
			d.Record = recs[i]
		}
	}
	o.rereads = nil
	return nil
}

// drop counts a producer retry and records its position as settled.
func (a *Assembler) drop(it *ingest.Item) {
	a.Counters.Duplicates++
	a.dropped = append(a.dropped, it.Source)
}

// held is the bytes of it to keep while its group is open: none when
// its input can read it again.
func held(it *ingest.Item) []byte {
	if it.Ref.Valid() {
		return nil
	}
	return it.Raw
}

func (a *Assembler) reject(it *ingest.Item, reason schemas.Reason, format string, args ...any) {
	a.deadLetter(reason, fmt.Sprintf(format, args...), it.Source, it.Raw, it.Ref)
}

// deadLetter adds a dead letter carrying the record: raw, or, when raw
// is nil, read again through ref by Output.ReadRecords.
func (a *Assembler) deadLetter(reason schemas.Reason, msg string, src schemas.Source, raw []byte, ref ingest.RawRef) {
	if raw == nil && ref.Valid() {
		a.rereads = append(a.rereads, reread{dead: len(a.dead), ref: ref})
	}
	a.dead = append(a.dead, schemas.DeadLetter{Reason: reason, Error: msg, Source: src, Record: raw})
}

// Add takes one decoded record at time now.
func (a *Assembler) Add(it *ingest.Item, now time.Time) {
	a.Counters.Records++
	if a.cfg.Settled != nil && a.cfg.Settled(it.Source) {
		a.Counters.SkippedCommitted++
		a.rememberSettled(it)
		return
	}
	if it.Err != nil {
		a.dead = append(a.dead, schemas.DeadLetter{
			Reason: it.Err.Reason,
			Error:  it.Err.Error(),
			Source: it.Source,
			Record: it.Raw,
			// A too_large record carries only its head.
			Truncated: it.Size > 0,
			Size:      it.Size,
		})
		return
	}
	a.Counters.Repaired += int64(min(it.Rec.Repaired, 1))
	switch it.Rec.Type {
	case schemas.TypeStep:
		a.addStep(it, now)
	case schemas.TypeTrajectory:
		a.addTrajectory(it, now)
	}
}

// closedCheck handles a record whose id was already written or whose group
// is already closed: a retry of a written record is dropped; a different
// record under a written id is a conflict (whichever group it names);
// anything else for a closed group is late. It reports whether the record was consumed.
func (a *Assembler) closedCheck(it *ingest.Item, key string, kind byte, id string, content uint64) bool {
	if c, ok := a.written[idHash(kind, id)]; ok {
		if c == content {
			a.drop(it)
			return true
		}
		what := "step_id"
		if kind == 't' {
			what = "trajectory_id"
		}
		a.reject(it, schemas.ReasonDuplicateConflict, "%s %q was already written with different content", what, id)
		return true
	}
	if a.closed[key] == nil {
		return false
	}
	msg := fmt.Sprintf("group %q was already closed when this record arrived", key)
	if s := it.Rec.Step; it.Rec.Type == schemas.TypeStep && s != nil && s.ParentStepID != "" {
		msg += fmt.Sprintf("; it is a prompt delta of parent_step_id %q", s.ParentStepID)
	}
	a.reject(it, schemas.ReasonLate, "%s", msg)
	return true
}

// missingParent names the parent of s when s is a prompt delta whose
// parent_step_id is not among t's steps: the step that never came (or
// came too late) is what kept t incomplete.
func missingParent(t *Trajectory, s *Step) string {
	if s.ParentStepID == "" {
		return ""
	}
	for _, o := range t.Steps {
		if o.StepID == s.ParentStepID {
			return ""
		}
	}
	return fmt.Sprintf("; step %q is a prompt delta of parent_step_id %q, which never arrived", s.StepID, s.ParentStepID)
}

func (a *Assembler) addStep(it *ingest.Item, now time.Time) {
	s := it.Rec.Step
	h := stepHash(s)
	t := a.trajs[s.TrajectoryID]
	key := a.effectiveKey(t, s.TaskID, s.GroupID, s.Role)
	if a.closedCheck(it, key, 's', s.StepID, h) {
		return
	}
	if prev := a.steps[s.StepID]; prev != nil {
		if prev.hash == h {
			a.drop(it)
			return
		}
		a.reject(it, schemas.ReasonDuplicateConflict, "step_id %q was already received (%s) with different content", s.StepID, prev.Source)
		return
	}
	if t != nil {
		if !a.compatible(t, s.TaskID, explicit(s.GroupID, s.Role), key) {
			a.reject(it, schemas.ReasonInconsistent, "trajectory %q belongs to task %q, group %q; this step says task %q, group %q", s.TrajectoryID, t.taskID, t.key, s.TaskID, key)
			return
		}
		if t.failed {
			a.reject(it, schemas.ReasonRejectedStep, "%s", failedMsg(t))
			return
		}
		if t.Trajectory != nil && s.StepIndex >= t.NumSteps {
			a.reject(it, schemas.ReasonStepOutOfRange, "step_index %d is out of range: trajectory %q has num_steps %d", s.StepIndex, s.TrajectoryID, t.NumSteps)
			return
		}
		for _, o := range t.Steps {
			if o.StepIndex == s.StepIndex {
				a.reject(it, schemas.ReasonDuplicateConflict, "trajectory %q already has step_index %d (step_id %q)", s.TrajectoryID, s.StepIndex, o.StepID)
				return
			}
		}
	} else {
		// A copy of a record an earlier run settled, with nothing of its
		// trajectory open: a producer retry of a record written before
		// the restart (an earlier run dropped it, and stopped before that
		// drop was checkpointed). Held, it would open a group of its own
		// that nothing completes.
		if a.settledCopy('s', s.StepID, h) {
			a.drop(it)
			return
		}
		t = a.newTrajectory(s.TrajectoryID, s.TaskID, key, now)
	}
	st := &Step{Step: s, Raw: held(it), Ref: it.Ref, Source: it.Source, hash: h, spans: it.Rec.Spans}
	deltaOnArrival(t, st)
	t.Steps = append(t.Steps, st)
	a.steps[s.StepID] = st
	a.progress(t)
}

// deltaOnArrival keeps a whole step and the step before it (the previous
// step_index) as a producer sending deltas would have sent the later one
// when its prompt extends the earlier's: its prompt as the tokens after
// the earlier's prompt and response (compared token by token) with
// parent_step_id naming the earlier, its messages as the bytes after the
// earlier's messages less their closing bracket, its record as received
// as its differences from the earlier's (keepRawAsDelta). Whichever of
// the two arrives second makes the link, so a trajectory waiting for its
// group holds about one whole prompt and its other steps' new tokens:
// memory follows the distinct tokens, not the turns squared. The stored
// rows are those the Batcher would have cut from the whole steps; a step
// that does not extend the one before stays whole. A step sent as a wire
// delta is never linked (its parent is validated once its trajectory is
// complete).
func deltaOnArrival(t *Trajectory, st *Step) {
	s := st.Step
	if s.ParentStepID != "" || s.PromptIDs == nil {
		st.wire = true
		return
	}
	whole, msgs, raw := s.PromptIDs, s.Messages, st.Raw
	for _, o := range t.Steps {
		if o.wire {
			continue
		}
		switch o.StepIndex {
		case s.StepIndex - 1:
			if o == t.tip {
				link(o, st, t.tipPrompt, t.tipMsgs, t.tipRaw)
			} else {
				link(o, st, wholePrompt(o), wholeMessages(o), o.Raw) // nil when o's is held as pieces
			}
		case s.StepIndex + 1:
			link(st, o, whole, msgs, raw)
		}
	}
	t.tip, t.tipPrompt, t.tipMsgs, t.tipRaw = st, whole, msgs, raw
}

// link keeps n, a whole step, as a delta of p, the step before it, where
// n extends p: pWhole and pMsgs are p's whole prompt and messages, pRaw
// its record as received (nil: not at hand, n's record is then kept
// whole).
func link(p, n *Step, pWhole []int32, pMsgs, pRaw []byte) {
	s := n.Step
	whole, msgs := s.PromptIDs, s.Messages
	if n.Raw != nil && pRaw != nil {
		keepRawAsDelta(n, p, pRaw)
	}
	if q := prefix.Extends(whole, pWhole, p.ResponseIDs); q > 0 {
		d := make([]int32, len(whole)-q) // not nil: an empty delta is a list
		copy(d, whole[q:])
		s.PromptIDs, s.PromptDeltaIDs, s.ParentStepID, n.prev = nil, d, p.StepID, p
	} else {
		n.promptApart = true
	}
	if msgs != nil && prefix.MessagesExtend(msgs, pMsgs) {
		n.msgTail = bytes.Clone(msgs[len(pMsgs)-1:])
		s.Messages, s.ParentStepID, n.prev = nil, p.StepID, p
	} else {
		n.msgsApart = true
	}
}

// wholePrompt returns s's whole prompt, rebuilt (not kept) when s is held
// as a delta.
func wholePrompt(s *Step) []int32 {
	if s.PromptIDs != nil {
		return s.PromptIDs
	}
	var chain []*Step // s and the deltas before it, latest first
	x := s
	for x.PromptIDs == nil {
		chain = append(chain, x)
		x = x.prev
	}
	n := len(x.PromptIDs)
	for _, c := range chain {
		n += len(c.prev.ResponseIDs) + len(c.PromptDeltaIDs)
	}
	out := append(make([]int32, 0, n), x.PromptIDs...)
	for i := len(chain) - 1; i >= 0; i-- {
		c := chain[i]
		out = append(append(out, c.prev.ResponseIDs...), c.PromptDeltaIDs...)
	}
	return out
}

// wholeMessages returns s's whole messages (nil: none), rebuilt (not
// kept) when s is held as a delta: each tail replaces the closing bracket
// of the messages before it.
func wholeMessages(s *Step) []byte {
	if s.Messages != nil || s.msgTail == nil {
		return s.Messages
	}
	var chain []*Step
	x := s
	for x.Messages == nil && x.msgTail != nil {
		chain = append(chain, x)
		x = x.prev
	}
	n := len(x.Messages)
	for _, c := range chain {
		n += len(c.msgTail) - 1
	}
	out := append(make([]byte, 0, n), x.Messages[:len(x.Messages)-1]...)
	for i := len(chain) - 1; i > 0; i-- {
		out = append(out, chain[i].msgTail[:len(chain[i].msgTail)-1]...)
	}
	return append(out, chain[0].msgTail...)
}

func (a *Assembler) addTrajectory(it *ingest.Item, now time.Time) {
	tr := it.Rec.Trajectory
	h := trajHash(tr)
	t := a.trajs[tr.TrajectoryID]
	key := a.effectiveKey(t, tr.TaskID, tr.GroupID, tr.Role)
	if a.closedCheck(it, key, 't', tr.TrajectoryID, h) {
		return
	}
	if t != nil {
		if t.Trajectory != nil {
			if t.hash == h {
				a.drop(it)
				return
			}
			a.reject(it, schemas.ReasonDuplicateConflict, "trajectory %q was already received (%s) with different content", tr.TrajectoryID, t.Source)
			return
		}
		if !a.compatible(t, tr.TaskID, explicit(tr.GroupID, tr.Role), key) {
			a.reject(it, schemas.ReasonInconsistent, "trajectory %q has steps of task %q, group %q; this record says task %q, group %q", tr.TrajectoryID, t.taskID, t.key, tr.TaskID, key)
			return
		}
	}
	if tr.GroupSize > 0 {
		if g := a.groups[key]; g != nil && g.sizeSet && int64(g.size) != tr.GroupSize {
			a.reject(it, schemas.ReasonInconsistent, "group_size %d disagrees with group_size %d of earlier records of group %q", tr.GroupSize, g.size, key)
			return
		}
	}
	if t == nil {
		if a.settledCopy('t', tr.TrajectoryID, h) { // as for steps (addStep)
			a.drop(it)
			return
		}
		t = a.newTrajectory(tr.TrajectoryID, tr.TaskID, key, now)
	}
	t.Trajectory, t.Raw, t.Ref, t.Source, t.hash = tr, held(it), it.Ref, it.Source, h
	if tr.GroupSize > 0 {
		t.g.size, t.g.sizeSet = int(tr.GroupSize), true
	}
	// Steps that arrived first may lie beyond num_steps.
	kept := t.Steps[:0]
	for _, st := range t.Steps {
		if st.StepIndex >= tr.NumSteps {
			delete(a.steps, st.StepID)
			a.deadLetter(schemas.ReasonStepOutOfRange,
				fmt.Sprintf("step_index %d is out of range: trajectory %q has num_steps %d", st.StepIndex, tr.TrajectoryID, tr.NumSteps),
				st.Source, st.record(), st.Ref)
			continue
		}
		kept = append(kept, st)
	}
	clear(t.Steps[len(kept):])
	t.Steps = kept
	if t.tip != nil && t.tip.StepIndex >= tr.NumSteps {
		t.tip, t.tipPrompt, t.tipMsgs, t.tipRaw = nil, nil, nil, nil // it left
	}
	if tr.RejectedSteps > 0 {
		a.fail(t)
	} else {
		a.progress(t)
	}
	// A smaller group_size may complete the group without a new trajectory.
	if g := t.g; g != nil && a.groups[g.key] == g && g.complete+g.failed >= g.size {
		a.close(g, a.allIn(g))
	}
}

// fail dead-letters t, whose record says steps of it were rejected at
// capture (they were dead-lettered on arrival): it can never complete, so
// its group counts it in and closes once the others are complete.
func (a *Assembler) fail(t *Trajectory) {
	t.failed = true
	t.g.failed++
	a.Counters.Failed++
	msg := failedMsg(t)
	a.deadLetter(schemas.ReasonRejectedStep, msg, t.Source, t.Raw, t.Ref)
	for _, s := range t.Steps {
		delete(a.steps, s.StepID)
		a.deadLetter(schemas.ReasonRejectedStep, msg, s.Source, s.record(), s.Ref)
	}
	clear(t.Steps)
	t.Steps = nil
	t.tip, t.tipPrompt, t.tipMsgs, t.tipRaw = nil, nil, nil, nil
}

func failedMsg(t *Trajectory) string {
	return fmt.Sprintf("trajectory %q: %d of its %d steps were rejected at capture (rejected_steps), so it cannot be trained on", t.TrajectoryID, t.RejectedSteps, t.NumSteps)
}

// allIn is why a group whose trajectories are all complete or failed
// closes.
func (a *Assembler) allIn(g *group) string {
	if g.failed == 0 {
		return "full"
	}
	return fmt.Sprintf("every trajectory in, %d of them failed (rejected_step)", g.failed)
}

// explicit reports whether a record names its group (group_id or role).
func explicit(groupID, role string) bool { return groupID != "" || role != "" }

// effectiveKey is the group of a record: a record that names neither
// group_id nor role belongs to the group of its trajectory when that is
// already known (from a record that named it).
func (a *Assembler) effectiveKey(t *Trajectory, taskID, groupID, role string) string {
	if t != nil && !explicit(groupID, role) && t.taskID == taskID {
		return t.key
	}
	return schemas.GroupKey(groupID, taskID, role)
}

// compatible reports whether a record (task, whether it names its group,
// its key) can belong to the known trajectory t: same task, and the same
// group unless the record names none (then it inherits t's).
func (a *Assembler) compatible(t *Trajectory, taskID string, named bool, key string) bool {
	if t.taskID != taskID {
		return false
	}
	return !named || t.key == key
}

func (a *Assembler) newTrajectory(id, taskID, key string, now time.Time) *Trajectory {
	g := a.openGroup(key, now)
	t := &Trajectory{taskID: taskID, key: key, g: g}
	g.trajs = append(g.trajs, t)
	a.trajs[id] = t
	return t
}

// openGroup returns the open group key, opening it (and closing the
// oldest group at the cap) when needed.
func (a *Assembler) openGroup(key string, now time.Time) *group {
	if g := a.groups[key]; g != nil {
		return g
	}
	if len(a.groups) >= a.cfg.MaxOpenGroups {
		oldest := a.order.Front().Value.(*group)
		a.Counters.Evicted++
		a.close(oldest, "evicted: --max-open-groups reached")
	}
	g := &group{key: key, size: a.cfg.GroupSize, opened: now}
	g.elem = a.order.PushBack(g)
	a.groups[key] = g
	return g
}

// progress checks whether t just became complete and, if so, whether its
// group is full.
func (a *Assembler) progress(t *Trajectory) {
	if !t.complete() || !a.parentsValid(t) {
		return
	}
	g := t.g
	g.complete++
	if g.complete+g.failed >= g.size {
		a.close(g, a.allIn(g))
	}
}

// parentsValid checks, once t has all its steps, that every step sent as
// a prompt delta names an earlier step of t as its parent. A step that
// does not is dead-lettered (invalid_parent) and leaves t, which is then
// incomplete again: a corrected resend of the step completes it.
func (a *Assembler) parentsValid(t *Trajectory) bool {
	var index map[string]int64
	ok := true
	for i := 0; i < len(t.Steps); i++ {
		s := t.Steps[i]
		if s.ParentStepID == "" {
			continue
		}
		if index == nil {
			index = make(map[string]int64, len(t.Steps))
			for _, o := range t.Steps {
				index[o.StepID] = o.StepIndex
			}
		}
		if pi, found := index[s.ParentStepID]; found && pi < s.StepIndex {
			continue
		}
		a.deadLetter(schemas.ReasonInvalidParent, fmt.Sprintf("parent_step_id %q is not an earlier step of trajectory %q (step_index %d)", s.ParentStepID, t.TrajectoryID, s.StepIndex), s.Source, s.record(), s.Ref)
		delete(a.steps, s.StepID)
		t.Steps = slices.Delete(t.Steps, i, i+1)
		i--
		ok = false
	}
	return ok
}

// Expire closes groups opened at least Timeout before now.
func (a *Assembler) Expire(now time.Time) {
	if a.cfg.Timeout <= 0 {
		return
	}
	for e := a.order.Front(); e != nil; e = a.order.Front() {
		g := e.Value.(*group)
		if now.Sub(g.opened) < a.cfg.Timeout {
			return
		}
		a.Counters.TimedOut++
		a.close(g, fmt.Sprintf("timed out after %s", a.cfg.Timeout))
	}
}

// Flush closes every open group, oldest first: the end of a finite input.
func (a *Assembler) Flush() {
	for e := a.order.Front(); e != nil; e = a.order.Front() {
		a.close(e.Value.(*group), "end of input")
	}
}

// close emits g (whole, or partial when it has at least MinGroupSize
// complete trajectories) and dead-letters the rest, then forgets it.
func (a *Assembler) close(g *group, why string) {
	full := g.complete >= g.size
	emit := full || g.complete >= a.cfg.MinGroupSize
	var out *Group
	if emit {
		out = &Group{Key: g.key, Expected: g.size, Trajectories: make([]*Trajectory, 0, g.complete)}
	}
	cg := &closedGroup{}
	for _, t := range g.trajs {
		t.tip, t.tipPrompt, t.tipMsgs, t.tipRaw = nil, nil, nil, nil // the last whole prompt: no longer needed
		delete(a.trajs, a.trajID(t))
		if t.failed { // dead-lettered already
			continue
		}
		for _, s := range t.Steps {
			delete(a.steps, s.StepID)
		}
		if emit && t.complete() {
			slices.SortFunc(t.Steps, func(x, y *Step) int { return int(x.StepIndex - y.StepIndex) })
			out.Trajectories = append(out.Trajectories, t)
			id := idHash('t', t.TrajectoryID)
			cg.ids = append(cg.ids, id)
			a.written[id] = t.hash
			for _, s := range t.Steps {
				id := idHash('s', s.StepID)
				cg.ids = append(cg.ids, id)
				a.written[id] = s.hash
			}
			continue
		}
		reason := schemas.ReasonIncompleteTrajectory
		msg := a.incompleteMsg(t, g, why)
		if !emit {
			reason = schemas.ReasonIncompleteGroup
			msg = fmt.Sprintf("group %q closed (%s) with %d complete trajectories, fewer than the minimum %d (expected %d); %s",
				g.key, why, g.complete, a.cfg.MinGroupSize, g.size, a.trajState(t))
		}
		if t.Trajectory != nil {
			a.deadLetter(reason, msg, t.Source, t.Raw, t.Ref)
		}
		for _, s := range t.Steps {
			a.deadLetter(reason, msg+missingParent(t, s), s.Source, s.record(), s.Ref)
		}
	}
	a.order.Remove(g.elem)
	delete(a.groups, g.key)
	a.remember(g.key, cg)
	if !emit {
		return
	}
	out.Version = -1
	for _, t := range out.Trajectories {
		for _, s := range t.Steps {
			if v := s.OldestVersion(); out.Version < 0 || v < out.Version {
				out.Version = v
			}
		}
		a.Counters.StepsEmitted += int64(len(t.Steps))
	}
	a.Counters.GroupsEmitted++
	a.Counters.TrajectoriesEmitted += int64(len(out.Trajectories))
	if out.Partial() {
		a.Counters.PartialGroups++
	}
	a.out = append(a.out, out)
}

// trajID returns the id under which t is indexed.
func (a *Assembler) trajID(t *Trajectory) string {
	if t.Trajectory != nil {
		return t.TrajectoryID
	}
	return t.Steps[0].TrajectoryID
}

func (a *Assembler) trajState(t *Trajectory) string {
	if t.Trajectory == nil {
		return fmt.Sprintf("trajectory %q had %d steps and no trajectory record", a.trajID(t), len(t.Steps))
	}
	return fmt.Sprintf("trajectory %q had %d of %d steps", t.TrajectoryID, len(t.Steps), t.NumSteps)
}

func (a *Assembler) incompleteMsg(t *Trajectory, g *group, why string) string {
	return fmt.Sprintf("%s when group %q was emitted (%s) with %d of %d trajectories", a.trajState(t), g.key, why, g.complete, g.size)
}

func (a *Assembler) remember(key string, cg *closedGroup) {
	a.closed[key] = cg
	a.closedQ = append(a.closedQ, key)
	for len(a.closedQ) > a.cfg.MaxClosedGroups || len(a.written) > a.cfg.MaxClosedRecords {
		// A key is reopened only after it was forgotten, so it appears in
		// the queue at most once.
		old := a.closed[a.closedQ[0]]
		for _, id := range old.ids {
			delete(a.written, id)
		}
		delete(a.closed, a.closedQ[0])
		a.closedQ[0] = ""
		a.closedQ = a.closedQ[1:]
	}
}
