package main

// replay and the consumed view through the real binary: a consumer group
// consumes generated multi-turn data as an Arrow stream; sql's consumed
// view says which groups went into each acknowledged batch at which
// policy version; replay creates a group that consume then reads, and its
// Arrow stream equals the original byte for byte, whatever budget and
// staleness bound the replaying member runs with.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestReplayAndConsumedView(t *testing.T) {
	work := t.TempDir()
	replayScenario(t, e2eBinary(t), work, filepath.Join(work, "out"), nil)
}

// TestIntegrationReplayS3 is the same over MinIO: the shards, the logs
// and the audit in s3://.
func TestIntegrationReplayS3(t *testing.T) {
	target := newS3Target(t, "replay")
	replayScenario(t, e2eBinary(t), t.TempDir(), target.url, target.flags())
}

// replayScenario consumes root as group orig, checks the consumed view,
// replays orig as again and checks again's Arrow stream and audit. ep are
// the flags that reach root's store.
func replayScenario(t *testing.T, bin, work, root string, ep []string) {
	files := consGenChunks(t, bin, work, 3, "--groups", "24", "--turns", "2..4", "--resets", "0.2")
	consIngest(t, bin, work, root, files, ep...)

	consume := func(group, out string, extra ...string) {
		t.Helper()
		args := append([]string{"consume", "--from", root, "--consumer-group", group, "--name", "m", "--format", "arrow", "--out", out, "--poll", "20ms"}, append(extra, ep...)...)
		if r := e2eRun(t, bin, work, args...); r.code != 0 {
			t.Fatalf("consume %s: exit %d\n%s", group, r.code, r.stderr)
		}
	}
	origArrow := filepath.Join(work, "orig.arrow")
	consume("orig", origArrow, "--max-tokens", "9000", "--policy-version", "5", "--layout", "trajectories")

	type row struct {
		Group     string `json:"consumer_group"`
		Step      int64  `json:"train_step"`
		Position  int64  `json:"position"`
		InBatch   int64  `json:"groups_in_batch"`
		Member    string `json:"member"`
		Policy    int64  `json:"policy_version"`
		GroupID   string `json:"group_id"`
		Version   int64  `json:"group_version"`
		Staleness int64  `json:"staleness"`
		Trajs     int64  `json:"trajectories"`
		Steps     int64  `json:"steps"`
	}
	consumed := func() []row {
		t.Helper()
		args := append([]string{"sql", "--from", root, "--format", "jsonl"}, ep...)
		r := sqlRun(t, bin, work, nil, append(args,
			"SELECT consumer_group, train_step, position, groups_in_batch, member, policy_version, group_id, group_version, staleness, trajectories, steps FROM consumed ORDER BY consumer_group, train_step, position")...)
		if r.code != 0 {
			t.Fatalf("sql: exit %d\n%s", r.code, r.stderr)
		}
		var out []row
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			var x row
			if err := json.Unmarshal([]byte(l), &x); err != nil {
				t.Fatalf("sql line %q: %v", l, err)
			}
			out = append(out, x)
		}
		return out
	}
	// Independently: the groups, versions, trajectories and steps the
	// committed data holds.
	ref := sqlRows(t, bin, work, nil, append(append([]string{"--from", root}, ep...),
		"SELECT group_id, any_value(group_version) AS v, count(DISTINCT trajectory_id) AS n, count(*) AS s FROM steps WHERE filter_reason IS NULL GROUP BY group_id")...)
	want := map[string][3]string{}
	for _, r := range ref {
		want[fmt.Sprint(r["group_id"])] = [3]string{fmt.Sprint(r["v"]), fmt.Sprint(r["n"]), fmt.Sprint(r["s"])}
	}
	rows := consumed()
	seen := map[string]bool{}
	steps := map[int64][]string{}
	for _, r := range rows {
		if r.Group != "orig" || r.Member != "m" || r.Policy != 5 || r.Staleness != 5-r.Version {
			t.Fatalf("consumed row %+v", r)
		}
		w, ok := want[r.GroupID]
		if !ok || w != [3]string{fmt.Sprint(r.Version), fmt.Sprint(r.Trajs), fmt.Sprint(r.Steps)} || seen[r.GroupID] {
			t.Fatalf("consumed row %+v: committed %v (seen before: %v)", r, w, seen[r.GroupID])
		}
		seen[r.GroupID] = true
		steps[r.Step] = append(steps[r.Step], r.GroupID)
		if int64(len(steps[r.Step])) != r.Position+1 {
			t.Fatalf("train step %d: position %d out of order", r.Step, r.Position)
		}
	}
	if len(seen) != len(want) || len(steps) < 3 {
		t.Fatalf("consumed has %d groups in %d steps, committed %d groups", len(seen), len(steps), len(want))
	}

	replayArgs := func(group, as string) []string {
		return append([]string{"replay", "--from", root, "--consumer-group", group, "--as", as}, ep...)
	}
	r := e2eRun(t, bin, work, replayArgs("orig", "again")...)
	var sum replaySummary
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sum) != nil || sum.Batches != len(steps) || sum.Groups != len(seen) {
		t.Fatalf("replay: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	if r := e2eRun(t, bin, work, replayArgs("orig", "again")...); r.code != 0 {
		t.Fatalf("replay again: exit %d\n%s", r.code, r.stderr)
	}
	if r := e2eRun(t, bin, work, replayArgs("orig", "orig")...); r.code != exitUsage {
		t.Fatalf("replay onto itself: exit %d", r.code)
	}
	if r := e2eRun(t, bin, work, replayArgs("again", "orig")...); r.code != exitUsage {
		t.Fatalf("replay into a group with a log: exit %d\n%s", r.code, r.stderr)
	}
	againArrow := filepath.Join(work, "again.arrow")
	consume("again", againArrow, "--max-tokens", "100", "--max-staleness", "0", "--policy-version", "7", "--layout", "trajectories")
	a, err := os.ReadFile(origArrow)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(againArrow)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) == 0 || !bytes.Equal(a, b) {
		t.Fatalf("replayed Arrow stream differs: %d bytes vs %d", len(a), len(b))
	}
	// The replay's own audit: the same groups per step, at its policy.
	var again int
	for _, r := range consumed() {
		if r.Group != "again" {
			continue
		}
		again++
		if !slices.Contains(steps[r.Step], r.GroupID) || steps[r.Step][r.Position] != r.GroupID || r.Policy != 7 {
			t.Fatalf("replay consumed %+v, the original step %v", r, steps[r.Step])
		}
	}
	if again != len(seen) {
		t.Fatalf("replay acknowledged %d groups of %d", again, len(seen))
	}
}
