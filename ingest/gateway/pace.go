package gateway

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// Trainer is the trainer's side of the loop as the gateway follows it
// (cmd: the store's, package train/loop).
type Trainer interface {
	State(ctx context.Context) (TrainerState, error)
}

// TrainerState is what the trainer's side says at one poll.
type TrainerState struct {
	// Version is the newest policy version the trainer published as
	// served by the inference workers; -1 when none is.
	Version int64
	// Trained is the newest policy version the consumer group's trainer
	// acknowledged a step with (the weights its optimizer made, served or
	// not yet); -1 when none.
	Trained int64
	// Committed counts the groups committed to the store, Consumed those
	// the consumer group acknowledged or skipped as stale.
	Committed, Consumed int64
	// CommittedKeys are the group keys committed since the previous poll.
	CommittedKeys []string
}

// Pacing is admission control by the trainer's progress: a new group's
// first call is admitted only while the groups in the pipe — committed
// and not consumed, and in flight here (admitted, and not yet committed)
// — leave room for it within (MaxOffPolicy + 1) × GroupsPerStep. That is
// AReaL's rule (accepted + running ≤ (max_head_offpolicyness + version +
// 1) × batch size) counted in groups from the store's state instead of
// from version numbers: when the trainer takes GroupsPerStep groups a
// step, a group admitted now is trained at most MaxOffPolicy versions
// after the policy that generated it was published. A session of a group
// already admitted is never held, and no call of an admitted session is.
//
// Between an optimizer step and the publication of its weights the
// trainer is ahead of the version stamped on new calls; a group admitted
// then is trained that much later, so the pipe's room shrinks by a step's
// groups for every version the trainer is ahead (TrainerState.Trained
// minus the version stamped), and nothing is admitted while it is more
// than MaxOffPolicy ahead.
type Pacing struct {
	MaxOffPolicy  int64 // versions; 0: on-policy (one step's groups at a time)
	GroupsPerStep int64 // the trainer's groups per optimizer step; 0: no pacing
	// Wait is how long a new group's first call waits for room before it
	// is answered 429 with Retry-After (default 30s).
	Wait time.Duration
	// CommitTimeout is how long a finished group counts as in flight while
	// it is not seen committed (a group dead-lettered never is; default
	// 2m).
	CommitTimeout time.Duration
}

// on reports whether pacing is configured.
func (p Pacing) on() bool { return p.GroupsPerStep > 0 }

// budget is the number of groups the pipe may hold while the trainer is
// lag versions ahead of the version stamped on new calls.
func (p Pacing) budget(lag int64) int64 {
	steps := p.MaxOffPolicy + 1 - max(lag, 0)
	switch {
	case steps <= 0:
		return 0
	case steps > math.MaxInt64/p.GroupsPerStep:
		return math.MaxInt64
	}
	return steps * p.GroupsPerStep
}

// lag is how many versions the trainer is ahead of the version stamped on
// new calls (0 when either is unknown); p.mu held.
func (p *pacer) lag() int64 {
	if p.st.Trained < 0 || p.st.Version < 0 {
		return 0
	}
	return max(p.st.Trained-p.st.Version, 0)
}

// pacer holds the state of the loop: the trainer's last state and the
// groups in flight here.
type pacer struct {
	cfg Pacing

	mu       sync.Mutex
	known    bool              // a poll answered
	st       TrainerState      // the last answer
	open     map[string]*paced // admitted groups with sessions running
	awaiting map[string]int64  // finished groups not seen committed: when (unix ns)
	changed  chan struct{}     // closed (and replaced) when room may have opened
	stopped  chan struct{}     // closed when the gateway closes: waiting calls end
	stopOnce sync.Once

	// starving is when calls began to wait with nothing consumed;
	// warned, starved's last warning.
	starving, warned time.Time

	admitted, held, refused atomic.Int64
	waiting                 atomic.Int64
	pollErrors              atomic.Int64
}

func newPacer(cfg Pacing) *pacer {
	if cfg.Wait <= 0 {
		cfg.Wait = 30 * time.Second
	}
	if cfg.CommitTimeout <= 0 {
		cfg.CommitTimeout = 2 * time.Minute
	}
	return &pacer{cfg: cfg, open: map[string]*paced{}, awaiting: map[string]int64{}, changed: make(chan struct{}), stopped: make(chan struct{})}
}

// paced is an admitted group with sessions running.
type paced struct {
	sessions int // admitted, not finished nor gone
	finished int // finished: the group has records to commit
}

// paceKey is the group a session's records belong to, as ingest and the
// manifest name it.
func (s *session) paceKey() string { return schemas.GroupKey(s.groupID, s.taskID, s.role) }

// wake tells waiters that room may have opened; p.mu held.
func (p *pacer) wake() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// room reports whether one more group fits; p.mu held.
func (p *pacer) room() bool {
	if !p.known {
		return false
	}
	backlog := max(p.st.Committed-p.st.Consumed, 0)
	inFlight := int64(len(p.open) + len(p.awaiting))
	return backlog+inFlight+1 <= p.cfg.budget(p.lag())
}

// stop ends every wait for room (the gateway is closing: its shutdown
// must not wait out Wait).
func (p *pacer) stop() { p.stopOnce.Do(func() { close(p.stopped) }) }

// admit admits sess (its first recorded call) and reports whether it may
// go on; false when ctx ended, the pacer stopped or no room opened within
// Wait (the caller answers 429). Admitted sessions are released with
// release.
func (p *pacer) admit(ctx context.Context, sess *session) bool {
	if !p.cfg.on() {
		return true
	}
	key := sess.paceKey()
	p.mu.Lock()
	var timer *time.Timer
	held := false
	for {
		if sess.paced { // admitted already (or by a call of it that waited beside this one)
			p.mu.Unlock()
			return true
		}
		g, running := p.open[key]
		_, finished := p.awaiting[key]
		if running || finished || p.room() {
			// A session of a group admitted earlier joins it: a group is
			// never half held.
			if !running {
				g = &paced{}
				if finished {
					g.finished = 1
				}
				delete(p.awaiting, key)
				p.open[key] = g
			}
			g.sessions++
			sess.paced = true
			p.mu.Unlock()
			p.admitted.Add(1)
			return true
		}
		if timer == nil {
			timer = time.NewTimer(p.cfg.Wait)
			defer timer.Stop()
			p.waiting.Add(1)
			defer p.waiting.Add(-1)
		}
		if !held {
			held = true
			p.held.Add(1)
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-timer.C:
			p.refused.Add(1)
			return false
		case <-ctx.Done():
			return false
		case <-p.stopped:
			return false
		}
		p.mu.Lock()
	}
}

// finished counts sess out of its group: it finished.
func (p *pacer) finished(sess *session) { p.release(sess, true) }

// left counts sess out of its group: it left the table unfinished (a
// failed first call, DELETE) or finished (then already counted out).
func (p *pacer) left(sess *session) { p.release(sess, false) }

// release counts sess out of its group. The group's last session moves
// it to the groups awaiting their commit, unless none of its sessions
// finished (nothing of it will be committed).
func (p *pacer) release(sess *session, finished bool) {
	if !p.cfg.on() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !sess.paced {
		return
	}
	sess.paced = false
	key := sess.paceKey()
	g := p.open[key]
	g.sessions--
	if finished {
		g.finished++
	}
	if g.sessions > 0 {
		return
	}
	delete(p.open, key)
	if g.finished > 0 {
		p.awaiting[key] = time.Now().UnixNano()
	}
	p.wake()
}

// update takes a poll's answer: committed groups leave the in-flight
// count, finished groups not seen committed within CommitTimeout too.
func (p *pacer) update(st TrainerState, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.known, p.st = true, st
	for _, k := range st.CommittedKeys {
		delete(p.awaiting, k)
	}
	p.st.CommittedKeys = nil
	cut := now.Add(-p.cfg.CommitTimeout).UnixNano()
	for k, at := range p.awaiting {
		if at < cut {
			delete(p.awaiting, k)
		}
	}
	p.wake()
}

// follow polls the trainer every poll until ctx ends: a newer published
// version becomes the weight version stamped on calls (never lowered), and
// the pacer takes the progress.
func (s *Server) follow(ctx context.Context, t Trainer, poll time.Duration) {
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		st, err := t.State(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			if s.pacer.pollErrors.Add(1)%100 == 1 {
				s.log.Warn("gateway: reading the trainer's state from the store (the last state stands)", "err", err)
			}
		default:
			for v := s.weight.Load(); st.Version > v; v = s.weight.Load() {
				if s.weight.CompareAndSwap(v, st.Version) {
					s.log.Info("gateway: weight version from the trainer's publication", "weight_version", st.Version, "was", v)
					break
				}
			}
			st.Version = s.weight.Load() // the version stamped on new calls, whoever set it
			s.pacer.update(st, time.Now())
			if s.pacer.starved(time.Now()) {
				s.log.Warn("gateway: pacing holds new groups and the trainer's consumer group has consumed nothing: is the trainer's consumer group the one followed (--consumer-group)?",
					"committed", st.Committed, "consumed", st.Consumed, "budget_groups", s.pacer.cfg.budget(0))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// starved reports, at most once a minute, whether calls have waited for
// 30 s while the consumer group followed has consumed nothing: most
// likely the trainer consumes under another group's name, and nothing
// will ever make room.
func (p *pacer) starved(now time.Time) bool {
	if !p.cfg.on() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waiting.Load() == 0 || p.st.Consumed > 0 || p.room() {
		p.starving = time.Time{}
		return false
	}
	if p.starving.IsZero() {
		p.starving = now
	}
	if now.Sub(p.starving) < 30*time.Second || now.Sub(p.warned) < time.Minute {
		return false
	}
	p.warned = now
	return true
}

// writeMetrics writes the loop's metrics.
func (p *pacer) writeMetrics(w io.Writer) {
	one := func(name, typ, help string, v int64) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %d\n", name, help, name, typ, name, v)
	}
	one("rllm_gateway_pace_admitted_total", "counter", "Sessions admitted by pacing (a session of a group already admitted included).", p.admitted.Load())
	one("rllm_gateway_pace_held_total", "counter", "Sessions whose first call waited for room.", p.held.Load())
	one("rllm_gateway_pace_refused_total", "counter", "Sessions refused (429) after waiting --pace-wait.", p.refused.Load())
	one("rllm_gateway_pace_waiting", "gauge", "First calls waiting for room now.", p.waiting.Load())
	one("rllm_gateway_trainer_poll_errors_total", "counter", "Failed reads of the trainer's state from the store.", p.pollErrors.Load())
	p.mu.Lock()
	open, awaiting, st, known, lag := len(p.open), len(p.awaiting), p.st, p.known, p.lag()
	p.mu.Unlock()
	if !p.cfg.on() || !known {
		return
	}
	one("rllm_gateway_pace_in_flight_groups", "gauge", "Groups admitted here and not seen committed.", int64(open+awaiting))
	one("rllm_gateway_pace_backlog_groups", "gauge", "Groups committed and not consumed by the trainer.", max(st.Committed-st.Consumed, 0))
	one("rllm_gateway_pace_budget_groups", "gauge", "(max off-policy + 1 - versions the trainer is ahead of the one served) x groups per step: what the pipe may hold now.", p.cfg.budget(lag))
	one("rllm_gateway_pace_trainer_lead_versions", "gauge", "Versions the trainer's newest acknowledged step is ahead of the version stamped on new calls (weights not yet published).", lag)
}
