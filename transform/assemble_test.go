package transform

import (
	"fmt"
	"reflect"

	"sort"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"

	"github.com/rllm-pipe/rllm-pipe/ingest"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func step(task, traj string, idx int, extra ...string) string {
	s := fmt.Sprintf(`{"type":"step","step_id":"%s#%d","task_id":"%s","trajectory_id":"%s","step_index":%d,"policy_version":%d,"prompt_ids":[1,2],"response_ids":[3],"response_logprobs":[-0.5]`,
		traj, idx, task, traj, idx, idx+1)
	for _, e := range extra {
		s += "," + e
	}
	return s + "}"
}

func traj(task, id string, reward float64, n int, extra ...string) string {
	s := fmt.Sprintf(`{"type":"trajectory","trajectory_id":"%s","task_id":"%s","reward":%g,"num_steps":%d`, id, task, reward, n)
	for _, e := range extra {
		s += "," + e
	}
	return s + "}"
}

type harness struct {
	t       *testing.T
	a       *Assembler
	d       ingest.Decoder
	line    int64
	groups  []*Group
	dead    []schemas.DeadLetter
	dropped []schemas.Source
}

func newHarness(t *testing.T, cfg Config) *harness {
	return &harness{t: t, a: NewAssembler(cfg)}
}

func (h *harness) add(now time.Time, lines ...string) {
	h.t.Helper()
	for _, l := range lines {
		h.line++
		it := ingest.Item{Source: schemas.Source{File: "in", Line: h.line}, Raw: []byte(l)}
		rec, err := h.d.Decode([]byte(l))
		if err != nil {
			h.t.Fatalf("test line does not decode: %v: %s", err, l)
		}
		it.Rec = rec
		h.a.Add(&it, now)
	}
	h.take()
}

func (h *harness) take() {
	o := h.a.Take()
	h.groups = append(h.groups, o.Groups...)
	h.dead = append(h.dead, o.Dead...)
	h.dropped = append(h.dropped, o.Dropped...)
}

// summary renders emitted groups as "key:traj,traj|..." for comparison.
func (h *harness) summary() string {
	var parts []string
	for _, g := range h.groups {
		var ts []string
		for _, t := range g.Trajectories {
			var idx []string
			for _, s := range t.Steps {
				idx = append(idx, fmt.Sprint(s.StepIndex))
			}
			ts = append(ts, t.TrajectoryID+"["+strings.Join(idx, "")+"]")
		}
		p := ""
		if g.Partial() {
			p = "~"
		}
		parts = append(parts, fmt.Sprintf("%s%s@v%d:%s", g.Key, p, g.Version, strings.Join(ts, ",")))
	}
	return strings.Join(parts, " | ")
}

func (h *harness) reasons() string {
	var r []string
	for _, d := range h.dead {
		r = append(r, fmt.Sprintf("%d:%s", d.Source.Line, d.Reason))
	}
	sort.Strings(r)
	return strings.Join(r, " ")
}

func TestAssembleOutOfOrder(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 2})
	h.add(t0,
		traj("A", "a1", 1, 2),
		step("B", "b1", 0),
		step("A", "a1", 1),
		step("A", "a2", 0),
		traj("B", "b1", 0, 1),
		step("A", "a1", 0),
	)
	if got := h.summary(); got != "" {
		t.Fatalf("nothing is complete yet, got %s", got)
	}
	h.add(t0, traj("A", "a2", 0, 1))
	if got, want := h.summary(), "A@v1:a1[01],a2[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	h.add(t0, step("B", "b2", 0), traj("B", "b2", 1, 1))
	if got, want := h.summary(), "A@v1:a1[01],a2[0] | B@v1:b1[0],b2[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if len(h.dead) != 0 || h.a.OpenGroups() != 0 {
		t.Fatalf("dead %s, open %d", h.reasons(), h.a.OpenGroups())
	}
	if c := h.a.Counters; c.GroupsEmitted != 2 || c.StepsEmitted != 5 || c.TrajectoriesEmitted != 4 {
		t.Fatalf("counters %+v", c)
	}
}

func TestAssembleRetriesConflictsLate(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 2})
	h.add(t0,
		step("A", "a1", 0),
		step("A", "a1", 0), // retry while open
		traj("A", "a1", 1, 1),
		traj("A", "a1", 1, 1),                 // retry of a trajectory
		traj("A", "a1", 0.5, 1),               // same id, other content
		step("A", "a1", 0, `"model":"other"`), // same step_id, other content
		step("A", "a2", 0),
		traj("A", "a2", 0, 1), // completes A
		step("A", "a2", 0),    // retry after close: dropped
		traj("A", "a2", 0, 1), // retry after close: dropped
		step("A", "a3", 0),    // a new trajectory for a closed group: late
		traj("A", "a2", 9, 1), // changed record under an id the closed group wrote: conflict
		step("A", "a2", 0, `"model":"other"`),
	)
	if got, want := h.summary(), "A@v1:a1[0],a2[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if got, want := h.reasons(), "11:late 12:duplicate_conflict 13:duplicate_conflict 5:duplicate_conflict 6:duplicate_conflict"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	if h.a.Counters.Duplicates != 4 || len(h.dropped) != 4 || h.dropped[0].Line != 2 || h.dropped[3].Line != 10 {
		t.Fatalf("duplicates %d, dropped %v", h.a.Counters.Duplicates, h.dropped)
	}
}

func TestAssembleIDReusedAfterClose(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 1, MaxClosedGroups: 2})
	h.add(t0,
		step("A", "a1", 0), traj("A", "a1", 1, 1), // group A written
		step("B", "a1", 0),    // 3: same step_id a1#0, other task: conflict
		traj("B", "a1", 1, 1), // 4: same trajectory_id, other task: conflict
		step("C", "c1", 0), traj("C", "c1", 1, 1),
		step("D", "d1", 0), traj("D", "d1", 1, 1), // A is forgotten now (2 remembered)
		step("A", "a1", 0), // 9: A forgotten: taken as new
	)
	if got, want := h.reasons(), "3:duplicate_conflict 4:duplicate_conflict"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	if h.a.OpenGroups() != 1 {
		t.Fatalf("open groups %d", h.a.OpenGroups())
	}
}

func TestAssembleInheritsGroupFromNamingRecords(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 2})
	h.add(t0,
		// Steps name the role, the trajectory record does not: it inherits.
		step("T", "x1", 0, `"role":"solver"`), traj("T", "x1", 1, 1),
		traj("T", "x2", 0, 1, `"role":"solver"`), step("T", "x2", 0),
	)
	if got, want := h.summary(), "T:solver@v1:x1[0],x2[0]"; got != want {
		t.Fatalf("got %s, want %s (dead %s)", got, want, h.reasons())
	}
	// Two records that name different roles disagree; so does a record
	// that names a role after the first records named none (they were
	// taken for the group task_id).
	h.add(t0, step("U", "u1", 0, `"role":"a"`), traj("U", "u1", 1, 1, `"role":"b"`),
		step("V", "v1", 0), traj("V", "v1", 1, 1, `"role":"b"`))
	if got, want := h.reasons(), "6:inconsistent 8:inconsistent"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	if h.a.OpenGroups() != 2 {
		t.Fatalf("open groups %d", h.a.OpenGroups())
	}
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	bt := NewBatcher(mem, BatchConfig{Estimator: mustGRPO()})
	defer bt.Release()
	b, err := bt.Build(h.groups)
	if err != nil {
		t.Fatal(err)
	}
	defer b[0].Record.Release()
	roles := b[0].Record.Column(schemas.ColRole).(*array.String)
	if roles.Value(0) != "solver" || roles.Value(1) != "solver" {
		t.Fatalf("roles %q %q", roles.Value(0), roles.Value(1))
	}
}

func TestAssembleStepConflicts(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 1})
	h.add(t0,
		step("A", "a1", 5), // 1: out of range once num_steps=2 arrives
		step("A", "a1", 0), // 2
		strings.Replace(step("A", "a1", 0), `"a1#0"`, `"x"`, 1), // 3: same position, other step_id
		step("B", "a1", 1),    // 4: other task for the same trajectory
		traj("A", "a1", 1, 2), // 5
		step("A", "a1", 3),    // 6: out of range
		step("A", "a1", 1),    // 7: completes
	)
	if got, want := h.summary(), "A@v1:a1[01]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if got, want := h.reasons(), "1:step_out_of_range 3:duplicate_conflict 4:inconsistent 6:step_out_of_range"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
}

func TestAssembleGroupSizeOverride(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 6})
	h.add(t0,
		step("A", "a1", 0), traj("A", "a1", 1, 1),
		step("A", "a2", 0), traj("A", "a2", 0, 1, `"group_size":3`),
		traj("A", "a3", 0, 1, `"group_size":4`), // disagrees
		step("A", "a3", 0), traj("A", "a3", 0.5, 1),
	)
	if got, want := h.summary(), "A@v1:a1[0],a2[0],a3[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if got, want := h.reasons(), "5:inconsistent"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	if h.groups[0].Expected != 3 {
		t.Fatalf("expected size %d", h.groups[0].Expected)
	}
	// A lone trajectory with group_size 1 is a full group of one.
	h2 := newHarness(t, Config{GroupSize: 6})
	h2.add(t0, traj("S", "s1", 0.5, 1, `"group_size":1`), step("S", "s1", 0))
	if got, want := h2.summary(), "S@v1:s1[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}

func TestAssembleEndOfInput(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 4, MinGroupSize: 2})
	h.add(t0,
		// A: 2 complete + 1 incomplete: emitted partial.
		step("A", "a1", 0), traj("A", "a1", 1, 1),
		step("A", "a2", 0), traj("A", "a2", 0, 1),
		step("A", "a3", 0), traj("A", "a3", 0, 2), // 6: needs 2 steps
		// B: 1 complete + a trajectory with no record: below minimum.
		step("B", "b1", 0), traj("B", "b1", 1, 1),
		step("B", "b2", 0),
	)
	h.a.Flush()
	h.take()
	if got, want := h.summary(), "A~@v1:a1[0],a2[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if got, want := h.reasons(), "5:incomplete_trajectory 6:incomplete_trajectory 7:incomplete_group 8:incomplete_group 9:incomplete_group"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	if h.groups[0].Expected != 4 || !h.groups[0].Partial() || h.a.Counters.PartialGroups != 1 {
		t.Fatalf("partial group not marked: %+v", h.groups[0])
	}
	// Records for either closed group are now late.
	h.add(t0, step("B", "b2", 0, `"model":"x"`), step("A", "a4", 0))
	h.dead = h.dead[5:]
	if got, want := h.reasons(), "10:late 11:late"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
}

func TestAssembleTimeoutAndEviction(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 3, Timeout: time.Minute, MaxOpenGroups: 2})
	h.add(t0, step("A", "a1", 0), traj("A", "a1", 1, 1), step("A", "a2", 0), traj("A", "a2", 0, 1))
	h.add(t0.Add(30*time.Second), step("B", "b1", 0))
	h.a.Expire(t0.Add(59 * time.Second))
	h.take()
	if len(h.groups) != 0 {
		t.Fatal("expired too early")
	}
	h.a.Expire(t0.Add(61 * time.Second))
	h.take()
	if got, want := h.summary(), "A~@v1:a1[0],a2[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if h.a.Counters.TimedOut != 1 || h.a.OpenGroups() != 1 {
		t.Fatalf("counters %+v open %d", h.a.Counters, h.a.OpenGroups())
	}
	// B is open; C and D arrive with a cap of 2 open groups: B is evicted.
	h.add(t0.Add(62*time.Second), step("C", "c1", 0), step("D", "d1", 0))
	if got, want := h.reasons(), "5:incomplete_group"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	if h.a.Counters.Evicted != 1 || h.a.OpenGroups() != 2 {
		t.Fatalf("counters %+v open %d", h.a.Counters, h.a.OpenGroups())
	}
}

func TestAssembleSettledAndRoles(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 1, Settled: func(s schemas.Source) bool { return s.Line <= 2 }})
	h.add(t0,
		step("A", "a1", 0), traj("A", "a1", 1, 1),
		step("T", "t1", 0, `"role":"judge"`), traj("T", "t1", 1, 1, `"role":"judge"`),
		step("T", "t2", 0, `"group_id":"custom"`), traj("T", "t2", 1, 1, `"group_id":"custom"`),
	)
	if got, want := h.summary(), "T:judge@v1:t1[0] | custom@v1:t2[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if h.a.Counters.SkippedCommitted != 2 || len(h.dead) != 0 {
		t.Fatalf("skipped %d dead %s", h.a.Counters.SkippedCommitted, h.reasons())
	}
}

// TestAssembleCopyOfSettledRecord: after a restart, a producer retry of a
// record an earlier run wrote (its original skipped as settled, its own
// drop lost with the earlier run) is dropped, not held as the first record
// of a group that nothing completes; a record under the same id with other
// content is not mistaken for one.
func TestAssembleCopyOfSettledRecord(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 1, Settled: func(s schemas.Source) bool { return s.Line <= 2 }})
	h.add(t0,
		step("A", "a1", 0), traj("A", "a1", 1, 1), // written by the earlier run
		step("A", "a1", 0), traj("A", "a1", 1, 1), // their retries, read again
	)
	if len(h.dropped) != 2 || h.dropped[0].Line != 3 || h.dropped[1].Line != 4 {
		t.Fatalf("dropped %+v, want lines 3 and 4", h.dropped)
	}
	if h.a.OpenGroups() != 0 || len(h.groups) != 0 || len(h.dead) != 0 || h.a.Counters.Duplicates != 2 {
		t.Fatalf("open %d, emitted %d, dead %s, counters %+v", h.a.OpenGroups(), len(h.groups), h.reasons(), h.a.Counters)
	}
	// Same id, other content: not a copy (held, as without a restart).
	h.add(t0, step("A", "a1", 0, `"reward":0.5`))
	if len(h.dropped) != 2 || h.a.OpenGroups() != 1 {
		t.Fatalf("a record with other content was dropped (dropped %d, open %d)", len(h.dropped), h.a.OpenGroups())
	}
}

func TestAssembleDecodeErrorsPassThrough(t *testing.T) {
	a := NewAssembler(Config{})
	it := ingest.Item{Source: schemas.Source{File: "f", Line: 3}, Raw: []byte("{"), Err: schemas.Rejectf(schemas.ReasonMalformedJSON, "", "bad")}
	a.Add(&it, t0)
	dead := a.Take().Dead
	if len(dead) != 1 || dead[0].Reason != schemas.ReasonMalformedJSON || string(dead[0].Record) != "{" || dead[0].Source.Line != 3 {
		t.Fatalf("%+v", dead)
	}
}

// Counters.Add sums every field: a counter added later and forgotten there
// would vanish from the totals of multi-generation runs.
func TestCountersAddEveryField(t *testing.T) {
	var a, b Counters
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(&b).Elem()
	for i := range va.NumField() {
		va.Field(i).SetInt(int64(i + 1))
		vb.Field(i).SetInt(int64(100 * (i + 1)))
	}
	a.Add(b)
	for i := range va.NumField() {
		if got := va.Field(i).Int(); got != int64(101*(i+1)) {
			t.Errorf("%s: %d, want %d", va.Type().Field(i).Name, got, 101*(i+1))
		}
	}
}

// A trajectory whose record says a step was rejected at capture is
// dead-lettered with the steps of it that arrived, and its group closes
// as soon as the others are complete: no timeout. Steps of it arriving
// later are dead-lettered too.
func TestAssembleRejectedStepsCloseTheGroup(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 3, Timeout: time.Hour})
	h.add(t0,
		step("A", "a1", 0), traj("A", "a1", 1, 1), // line 1, 2
		step("A", "a2", 0), // 3: its step 1 was dead-lettered at capture
		step("A", "a3", 0), // 4
	)
	h.add(t0, traj("A", "a2", 0, 2, `"rejected_steps":1`)) // 5
	if got := h.summary(); got != "" {
		t.Fatalf("a3 is not complete yet, got %s", got)
	}
	if got, want := h.reasons(), "3:rejected_step 5:rejected_step"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	h.add(t0, traj("A", "a3", 1, 1)) // 6
	if got, want := h.summary(), "A~@v1:a1[0],a3[0]"; got != want {
		t.Fatalf("got %s, want %s (closed at once, without the failed trajectory)", got, want)
	}
	if h.a.OpenGroups() != 0 || h.a.Counters.Failed != 1 || h.a.Counters.TimedOut != 0 {
		t.Fatalf("open %d, counters %+v", h.a.OpenGroups(), h.a.Counters)
	}

	// Failures that leave fewer than MinGroupSize complete: the group is
	// dead-lettered at once; a late step of a failed trajectory while its
	// group is open is dead-lettered as rejected too.
	h = newHarness(t, Config{GroupSize: 3, Timeout: time.Hour})
	h.add(t0,
		step("B", "b1", 0), traj("B", "b1", 1, 1), // 1, 2
		traj("B", "b2", 0, 2, `"rejected_steps":1`), // 3
		step("B", "b2", 1),                          // 4
		traj("B", "b3", 0, 1, `"rejected_steps":1`), // 5
	)
	if got := h.summary(); got != "" {
		t.Fatalf("one complete trajectory of three is no group, got %s", got)
	}
	if got, want := h.reasons(), "1:incomplete_group 2:incomplete_group 3:rejected_step 4:rejected_step 5:rejected_step"; got != want {
		t.Fatalf("dead letters %s, want %s", got, want)
	}
	if h.a.OpenGroups() != 0 {
		t.Fatalf("%d groups open", h.a.OpenGroups())
	}
}

// A generation that spanned a weight update is as stale as its oldest
// token: the group's version is the smallest token version of its steps;
// token versions all equal to the step's version are stored as absent.
func TestGroupVersionIsTheOldestToken(t *testing.T) {
	h := newHarness(t, Config{GroupSize: 2})
	// a1's step: policy 1 (step()'s idx+1), its token generated at 0.
	h.add(t0,
		step("A", "a1", 0, `"token_versions":[0]`),
		traj("A", "a1", 1, 1),
		step("A", "a2", 0, `"token_versions":[1]`), // uniform: as if absent
		traj("A", "a2", 0, 1),
	)
	h.take()
	if got, want := h.summary(), "A@v0:a1[0],a2[0]"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	bt := NewBatcher(mem, BatchConfig{Estimator: mustGRPO()})
	defer bt.Release()
	batches, err := bt.Build(h.groups)
	if err != nil {
		t.Fatal(err)
	}
	rec := batches[0].Record
	defer func() {
		for _, b := range batches {
			b.Record.Release()
		}
	}()
	tv := rec.Column(schemas.ColTokenVersions).(*array.List)
	gv := rec.Column(schemas.ColGroupVersion).(*array.Int64)
	got := []string{}
	for i := range int(rec.NumRows()) {
		if tv.IsNull(i) {
			got = append(got, fmt.Sprintf("null@%d", gv.Value(i)))
			continue
		}
		s, e := tv.ValueOffsets(i)
		got = append(got, fmt.Sprintf("%v@%d", tv.ListValues().(*array.Int64).Int64Values()[s:e], gv.Value(i)))
	}
	if fmt.Sprint(got) != "[[0]@0 null@0]" {
		t.Fatalf("token_versions@group_version per row: %v", got)
	}
}
