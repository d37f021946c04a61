package transform

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// agentLines renders one multi-turn trajectory of n steps as whole
// records, each prompt the conversation so far and each message list the
// one before plus two; spaced, every record is written with ", "
// separators in its lists. reset, if > 0, is a step that starts over.
func agentLines(r *rand.Rand, traj string, n, reset int, spaced bool) []string {
	sep := ","
	if spaced {
		sep = ", "
	}
	ints := func(xs []int) string {
		s := make([]string, len(xs))
		for i, x := range xs {
			s[i] = fmt.Sprint(x)
		}
		return "[" + strings.Join(s, sep) + "]"
	}
	var lines []string
	prompt := make([]int, 300)
	for i := range prompt {
		prompt[i] = r.IntN(50000)
	}
	msgs := []string{`{"role":"system","content":"you are an agent"}`, `{"role":"user","content":"fix the bug"}`}
	for k := range n {
		if k == reset && k > 0 {
			prompt, msgs = prompt[:50:50], msgs[:1:1]
		}
		resp := make([]int, 20+r.IntN(40))
		lp := make([]string, len(resp))
		for i := range resp {
			resp[i], lp[i] = r.IntN(50000), fmt.Sprintf("-0.%06d", r.IntN(1000000))
		}
		lines = append(lines, fmt.Sprintf(`{"type":"step","step_id":"%s#%d","task_id":"t","trajectory_id":"%s","step_index":%d,"policy_version":0,"prompt_ids":%s,"response_ids":%s,"response_logprobs":[%s],"messages":[%s]}`,
			traj, k, traj, k, ints(prompt), ints(resp), strings.Join(lp, ","), strings.Join(msgs, sep)))
		obs := make([]int, 80+r.IntN(200))
		for i := range obs {
			obs[i] = r.IntN(50000)
		}
		prompt = append(append(prompt, resp...), obs...)
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"step %d"}`, k), fmt.Sprintf(`{"role":"tool","content":"%s"}`, strings.Repeat("out ", r.IntN(50))))
	}
	return lines
}

// TestRawKeptAsDelta: the records of a trajectory waiting for its group
// arrive from a source that cannot be read again (their bytes are held
// for a dead letter); in order, each is held as its differences from the
// one before (pieces), so the bytes held follow the new tokens, not the
// whole conversation each turn; a dead letter still carries every record
// exactly as received, whatever its spacing or order, after a reset too.
func TestRawKeptAsDelta(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 5))
	for _, c := range []struct{ spaced, shuffled bool }{{false, false}, {true, false}, {false, true}} {
		spaced := c.spaced
		h := newHarness(t, Config{GroupSize: 2, MinGroupSize: 2})
		lines := agentLines(r, "a", 30, 7, spaced)
		order := make([]string, len(lines))
		copy(order, lines)
		if c.shuffled {
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		h.add(t0, order...)
		tr := h.a.trajs["a"]
		if tr == nil || len(tr.Steps) != len(lines) {
			t.Fatal("the trajectory is not held")
		}
		input, held, pieces := 0, 0, 0
		for _, s := range tr.Steps {
			input += len(s.Raw) + s.rawLen
			held += len(s.Raw)
			for _, p := range s.pieces {
				held += len(p.lit)
			}
			if s.pieces != nil {
				pieces++
			}
		}
		t.Logf("spaced %v: %d bytes held for %d received", spaced, held, input)
		// Every step but the first and the reset repeats its predecessor;
		// shuffled, those that arrive right after it or right before the
		// step after them are kept as pieces.
		if !c.shuffled && (pieces != len(lines)-2 || held*4 > input) || c.shuffled && pieces == 0 {
			t.Errorf("spaced %v: %d of %d records held as pieces, %d bytes held for %d received", spaced, pieces, len(lines), held, input)
		}
		// The group never completes (one trajectory of two, no
		// trajectory record): its records are dead letters, as received.
		h.a.Flush()
		h.take()
		if len(h.dead) != len(lines) {
			t.Fatalf("spaced %v: %d dead letters, want %d", spaced, len(h.dead), len(lines))
		}
		for _, d := range h.dead {
			if d.Reason != schemas.ReasonIncompleteGroup && d.Reason != schemas.ReasonIncompleteTrajectory {
				t.Fatalf("dead letter %s: %s", d.Reason, d.Error)
			}
			if want := order[d.Source.Line-1]; string(d.Record) != want {
				t.Fatalf("spaced %v: dead letter of line %d differs from the record received:\n got %.200s\nwant %.200s", spaced, d.Source.Line, d.Record, want)
			}
		}
	}
}
