package rllmdata

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// Outcome is the score of a session, episode or trajectory.
type Outcome struct {
	Reward            float64
	IsCorrect         *bool
	TerminationReason string
	Signals           map[string]float64
	Metadata          json.RawMessage
}

// Rewards maps session, episode or trajectory ids to outcomes. Lookups
// are recorded so that unused entries can be reported. The zero value is
// empty; copies share their entries. Not safe for concurrent use.
type Rewards struct {
	byID map[string]Outcome
	used map[string]bool
}

// Len returns the number of entries.
func (r *Rewards) Len() int { return len(r.byID) }

// Set adds (or replaces) the outcome of id.
func (r *Rewards) Set(id string, o Outcome) {
	if r.byID == nil {
		// Both maps now, so that copies of r (Options is passed by value)
		// share the record of lookups.
		r.byID, r.used = map[string]Outcome{}, map[string]bool{}
	}
	r.byID[id] = o
}

// lookup returns the outcome of the first id present.
func (r *Rewards) lookup(ids ...string) (Outcome, bool) {
	for _, id := range ids {
		if id == "" {
			continue
		}
		if o, ok := r.byID[id]; ok {
			r.used[id] = true
			return o, true
		}
	}
	return Outcome{}, false
}

func (r *Rewards) unused() int64 {
	return int64(len(r.byID) - len(r.used))
}

// rewardLine is one line of a rewards file.
type rewardLine struct {
	SessionID         string             `json:"session_id"`
	EpisodeID         string             `json:"episode_id"`
	TrajectoryID      string             `json:"trajectory_id"`
	ID                string             `json:"id"`
	Reward            *float64           `json:"reward"`
	IsCorrect         *bool              `json:"is_correct"`
	TerminationReason string             `json:"termination_reason"`
	Signals           map[string]float64 `json:"signals"`
	Metadata          json.RawMessage    `json:"metadata"`
}

// ReadRewards reads a rewards file: JSON lines, each naming one of
// session_id, episode_id, trajectory_id or id, with a finite reward and
// optionally is_correct, termination_reason, signals and metadata:
//
//	{"session_id":"t42:3","reward":1.0,"is_correct":true,"termination_reason":"env_done"}
//
// Blank lines are skipped. A bad line is an error naming its line
// number: rewards are an input the user controls, not data to skip.
func ReadRewards(r io.Reader) (Rewards, error) {
	var out Rewards
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var l rewardLine
		dec := json.NewDecoder(bytes.NewReader(line))
		if err := dec.Decode(&l); err != nil {
			return Rewards{}, fmt.Errorf("rewards line %d: %w", n, err)
		}
		id := firstNonEmpty(l.SessionID, l.EpisodeID, l.TrajectoryID, l.ID)
		switch {
		case id == "":
			return Rewards{}, fmt.Errorf("rewards line %d: no session_id, episode_id, trajectory_id or id", n)
		case l.Reward == nil:
			return Rewards{}, fmt.Errorf("rewards line %d (%s): no reward", n, id)
		case math.IsNaN(*l.Reward) || math.IsInf(*l.Reward, 0):
			return Rewards{}, fmt.Errorf("rewards line %d (%s): reward is not finite", n, id)
		}
		if _, dup := out.byID[id]; dup {
			return Rewards{}, fmt.Errorf("rewards line %d: %s given twice", n, id)
		}
		out.Set(id, Outcome{
			Reward: *l.Reward, IsCorrect: l.IsCorrect, Signals: l.Signals, Metadata: l.Metadata,
			TerminationReason: ingest.CanonicalTermination([]byte(l.TerminationReason)),
		})
	}
	if err := sc.Err(); err != nil {
		return Rewards{}, fmt.Errorf("read rewards: %w", err)
	}
	return out, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}
