package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMultiTurnDeadLettersExact: multi-turn agents sent whole on stdin
// (a source that cannot be read again, so each waiting record's bytes are
// held for its dead letter, as differences from the record before), some
// trajectories never finished (their trajectory records left out): every
// record of those comes back in _dlq byte for byte, every other step is
// written, and nothing is both.
func TestMultiTurnDeadLettersExact(t *testing.T) {
	bin := e2eBinary(t)
	work := t.TempDir()
	in := filepath.Join(work, "agents.jsonl")
	if r := e2eRun(t, bin, work, "gen", "--to", in, "--groups", "6", "--group-size", "3", "--turns", "8..14",
		"--prompt-len", "400", "--observation-len", "150", "--resets", "0.05", "--seed", "11"); r.code != 0 {
		t.Fatalf("gen: exit %d\n%s", r.code, r.stderr)
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	// Leave out the trajectory records of every other trajectory: their
	// groups never complete, and every one of their records is a dead
	// letter at the end of the input.
	type line struct {
		Type         string `json:"type"`
		TrajectoryID string `json:"trajectory_id"`
		TaskID       string `json:"task_id"`
	}
	var kept [][]byte
	var recs []line
	seen, deadTask := map[string]bool{}, map[string]bool{} // a group is a task here
	for _, l := range e2eSplitLines(data) {
		var rec line
		if json.Unmarshal(l, &rec) != nil {
			t.Fatalf("gen wrote a line that is not JSON: %s", e2eClip(string(l), 200))
		}
		if rec.Type == "trajectory" && !seen[rec.TrajectoryID] {
			seen[rec.TrajectoryID] = true
			if len(seen)%2 == 0 {
				deadTask[rec.TaskID] = true
				continue
			}
		}
		kept, recs = append(kept, l), append(recs, rec)
	}
	input := append(bytes.Join(kept, []byte("\n")), '\n')
	out := filepath.Join(work, "out")
	cmd := exec.Command(bin, "ingest", "--from", "-", "--to", out, "--group-size", "3", "--min-group-size", "3", "--quiet")
	cmd.Dir, cmd.Stdin = work, bytes.NewReader(input)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ingest: %v\n%s", err, stderr.String())
	}
	o := e2eReadOutput(t, out, "")
	byLine := map[int64]*e2eDLQEntry{}
	for _, e := range o.dlq {
		if byLine[e.Source.Line] != nil {
			t.Fatalf("line %d dead-lettered twice", e.Source.Line)
		}
		byLine[e.Source.Line] = e
	}
	want := 0
	for i, l := range kept {
		// A group with a dropped trajectory never completes: all its
		// records are dead letters.
		inDead, traj := deadTask[recs[i].TaskID], recs[i].TrajectoryID
		e := byLine[int64(i+1)]
		switch {
		case inDead && e == nil:
			t.Fatalf("line %d (trajectory %s of an unfinished group) is not in _dlq", i+1, traj)
		case inDead && e.Record != string(l):
			t.Fatalf("line %d: the dead letter's record differs from the line received:\n got %s\nwant %s", i+1, e2eClip(e.Record, 300), e2eClip(string(l), 300))
		case !inDead && e != nil:
			t.Fatalf("line %d (a finished group) dead-lettered: %s: %s", i+1, e.Reason, e.Error)
		}
		if inDead {
			want++
		}
	}
	if want == 0 || len(o.dlq) != want {
		t.Fatalf("%d dead letters, want %d", len(o.dlq), want)
	}
}
