package gateway

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeTrainer is a trainer whose state the test sets.
type fakeTrainer struct {
	mu   sync.Mutex
	st   TrainerState
	keys []string // committed since the last poll
}

func (f *fakeTrainer) State(context.Context) (TrainerState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.st
	st.CommittedKeys, f.keys = f.keys, nil
	return st, nil
}

func (f *fakeTrainer) set(fn func(st *TrainerState, keys *[]string)) {
	f.mu.Lock()
	fn(&f.st, &f.keys)
	f.mu.Unlock()
}

func (e *env) call(sid string) (int, http.Header) {
	e.t.Helper()
	resp := e.req("POST", "/sessions/"+sid+"/v1/chat/completions", string(e.fx["vllm_chat"].Request), "X-Fixture", "vllm_chat")
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// callAsync makes a chat call of session sid in the background; its
// status arrives on the channel (0: the request failed).
func (e *env) callAsync(sid string) <-chan int {
	status := make(chan int, 1)
	go func() {
		resp, err := http.Post(e.srv.URL+"/sessions/"+sid+"/v1/chat/completions", "application/json", strings.NewReader(string(e.fx["vllm_chat"].Request)))
		if err != nil {
			status <- 0
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	return status
}

// eventually fails t unless cond holds within 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
	}
}

// The gateway stamps calls with the version the trainer published, within
// a poll, and never lowers the version: neither for an older publication
// nor below one pushed to /admin/weight_version.
func TestFollowsThePublishedVersion(t *testing.T) {
	tr := &fakeTrainer{st: TrainerState{Version: -1}}
	e := newEnv(t, func(c *Config) { c.Trainer, c.TrainerPoll, c.WeightVersion = tr, 5*time.Millisecond, 2 })
	time.Sleep(50 * time.Millisecond)
	if v := e.gw.WeightVersion(); v != 2 {
		t.Fatalf("nothing published: version %d, want the configured 2", v)
	}
	tr.set(func(st *TrainerState, _ *[]string) { st.Version = 7 })
	eventually(t, "version 7 followed", func() bool { return e.gw.WeightVersion() == 7 })
	if code, _ := e.call("a:0"); code != 200 {
		t.Fatalf("call: %d", code)
	}
	e.finish("a:0", 1)
	if st := steps(decodeAll(t, e.out.records())); len(st) != 1 || st[0].rec.Step.PolicyVersion != 7 {
		t.Fatalf("the call was not stamped with the published version 7")
	}
	tr.set(func(st *TrainerState, _ *[]string) { st.Version = 5 })
	time.Sleep(50 * time.Millisecond)
	if v := e.gw.WeightVersion(); v != 7 {
		t.Fatalf("an older publication moved the version back to %d", v)
	}
	e.mustJSON("POST", "/admin/weight_version", `{"weight_version":20}`, 200, nil)
	tr.set(func(st *TrainerState, _ *[]string) { st.Version = 9 })
	time.Sleep(50 * time.Millisecond)
	if v := e.gw.WeightVersion(); v != 20 {
		t.Fatalf("a publication below the pushed version 20 set %d", v)
	}
}

// Pacing admits new groups while the pipe holds fewer than (max
// off-policy + 1) x groups per step; a group's other sessions and an
// admitted session's later calls are never held; a held call is admitted
// as soon as the trainer consumes, or refused with 429 and Retry-After.
func TestPacing(t *testing.T) {
	tr := &fakeTrainer{st: TrainerState{Version: -1}}
	e := newEnv(t, func(c *Config) {
		c.Trainer, c.TrainerPoll = tr, 5*time.Millisecond
		c.Pacing = Pacing{MaxOffPolicy: 1, GroupsPerStep: 1, Wait: 300 * time.Millisecond}
	})
	for _, sid := range []string{"a:0", "a:1", "b:0", "b:0", "a:0"} { // budget 2 groups: a and b
		if code, _ := e.call(sid); code != 200 {
			t.Fatalf("%s: %d, want 200", sid, code)
		}
	}
	start := time.Now()
	code, hdr := e.call("c:0")
	if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("a third group: %d (Retry-After %q) after %s, want 429 with Retry-After after waiting 300ms", code, hdr.Get("Retry-After"), time.Since(start))
	}
	// Group a finishes: still in flight until it is seen committed, then
	// in the backlog until the trainer consumes it.
	e.finish("a:0", 1)
	e.finish("a:1", 0)
	tr.set(func(st *TrainerState, keys *[]string) { st.Committed, *keys = 1, []string{"a"} })
	time.Sleep(30 * time.Millisecond)
	held := e.callAsync("c:0")
	eventually(t, "the call held", func() bool { return e.gw.pacer.waiting.Load() == 1 })
	tr.set(func(st *TrainerState, _ *[]string) { st.Consumed = 1 })
	if code := <-held; code != 200 {
		t.Fatalf("the held call once the trainer consumed: %d, want 200", code)
	}
	_, body := e.do("GET", "/metrics", "")
	for _, want := range []string{"rllm_gateway_pace_refused_total 1", "rllm_gateway_pace_held_total 2", "rllm_gateway_pace_in_flight_groups 2", "rllm_gateway_pace_budget_groups 2"} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// A session whose first call was refused or failed leaves nothing in
// flight; nor does a session deleted before it finished.
func TestPacingReleasesWhatEnds(t *testing.T) {
	tr := &fakeTrainer{st: TrainerState{Version: -1}}
	e := newEnv(t, func(c *Config) {
		c.Trainer, c.TrainerPoll = tr, 5*time.Millisecond
		c.Pacing = Pacing{MaxOffPolicy: 0, GroupsPerStep: 1, Wait: 100 * time.Millisecond}
	})
	e.backend.FailNext(1, 500)
	if code, _ := e.call("a:0"); code != 500 {
		t.Fatalf("failing call: %d", code)
	}
	if code, _ := e.call("b:0"); code != 200 {
		t.Fatalf("after a failed first call: %d, want 200 (nothing left in flight)", code)
	}
	e.mustJSON("DELETE", "/sessions/b:0", "", 200, nil)
	if code, _ := e.call("c:0"); code != 200 {
		t.Fatalf("after a deleted session: %d, want 200", code)
	}
}

// Calls held for 30 s by a consumer group that consumed nothing are
// warned of (once a minute): most likely the trainer's group is another.
func TestPacingWarnsOfAGroupThatConsumesNothing(t *testing.T) {
	p := newPacer(Pacing{GroupsPerStep: 1})
	now := time.Now()
	p.update(TrainerState{Version: -1, Committed: 5}, now)
	if p.starved(now) {
		t.Fatal("warned with no call waiting")
	}
	p.waiting.Add(1)
	if p.starved(now) || p.starved(now.Add(29*time.Second)) {
		t.Fatal("warned before calls waited 30 s")
	}
	if !p.starved(now.Add(31*time.Second)) || p.starved(now.Add(40*time.Second)) {
		t.Fatal("want one warning after 30 s, then none within the minute")
	}
	p.update(TrainerState{Version: -1, Committed: 5, Consumed: 1}, now)
	if p.starved(now.Add(200 * time.Second)) {
		t.Fatal("warned once the group consumed")
	}
}

// Concurrent first calls of one session count it once: its finish frees
// its group.
func TestPacingCountsASessionOnce(t *testing.T) {
	p := newPacer(Pacing{GroupsPerStep: 1, Wait: 5 * time.Second})
	p.update(TrainerState{Version: -1, Committed: 1}, time.Now()) // full: the calls wait together
	sess := newSession("a:0", "x", time.Now(), nil, nil, identity{}, 0)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if !p.admit(context.Background(), sess) {
				t.Error("refused")
			}
		})
	}
	eventually(t, "8 calls waiting", func() bool { return p.waiting.Load() == 8 })
	p.update(TrainerState{Version: -1, Committed: 1, Consumed: 1}, time.Now())
	wg.Wait()
	p.finished(sess)
	p.update(TrainerState{Version: -1, CommittedKeys: []string{"a"}, Committed: 1, Consumed: 1}, time.Now())
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.open) != 0 || len(p.awaiting) != 0 {
		t.Fatalf("after its finish and commit: open %v, awaiting %v", p.open, p.awaiting)
	}
}

// Closing the gateway ends the calls waiting for room at once (503): its
// shutdown does not wait out the pacing's wait.
func TestPacingEndsWaitsOnClose(t *testing.T) {
	tr := &fakeTrainer{st: TrainerState{Version: -1, Committed: 1}} // full
	e := newEnv(t, func(c *Config) {
		c.Trainer, c.TrainerPoll = tr, 5*time.Millisecond
		c.Pacing = Pacing{GroupsPerStep: 1, Wait: time.Minute}
	})
	held := e.callAsync("a:0")
	eventually(t, "the call held", func() bool { return e.gw.pacer.waiting.Load() == 1 })
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.gw.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if code := <-held; code != http.StatusServiceUnavailable || time.Since(start) > 5*time.Second {
		t.Fatalf("the held call: %d after %s; want 503 at once", code, time.Since(start))
	}
}

// While the trainer is ahead of the version stamped on new calls (it
// acknowledged a step whose weights are not published yet), a group
// admitted now would be trained that much later: the room shrinks by a
// step's groups per version ahead, and none is left beyond MaxOffPolicy.
func TestPacingRoomShrinksWhileTheTrainerIsAhead(t *testing.T) {
	p := newPacer(Pacing{GroupsPerStep: 2, MaxOffPolicy: 1})
	room := func(st TrainerState) bool {
		p.update(st, time.Now())
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.room()
	}
	for _, c := range []struct {
		st   TrainerState
		want bool
	}{
		{TrainerState{Version: 3, Trained: 3, Committed: 2}, true},  // 2 in the pipe + 1 <= (1+1) x 2
		{TrainerState{Version: 3, Trained: 4, Committed: 2}, false}, // a version ahead: room for 1 step, full
		{TrainerState{Version: 3, Trained: 4, Committed: 1}, true},  // 1 + 1 <= 2
		{TrainerState{Version: 3, Trained: 5, Committed: 0}, false}, // 2 ahead > 1: nothing is admitted
		{TrainerState{Version: 5, Trained: 5, Committed: 3}, true},  // published: the whole budget again
		{TrainerState{Version: -1, Trained: 9, Committed: 3}, true}, // nothing stamped known: no lag
		{TrainerState{Version: 4, Trained: -1, Committed: 3}, true}, // nothing trained yet
		{TrainerState{Version: 6, Trained: 5, Committed: 3}, true},  // the stamp ahead of the trainer
		{TrainerState{Version: 6, Trained: 5, Committed: 4}, false}, // ... the budget still bounds the pipe
	} {
		if got := room(c.st); got != c.want {
			t.Errorf("%+v: room %v, want %v", c.st, got, c.want)
		}
	}
}
