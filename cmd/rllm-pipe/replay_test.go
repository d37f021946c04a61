package main

// replay and the consumed view through the real binary: a consumer group
// consumes generated multi-turn data as an Arrow stream; sql's consumed
// view says which groups went into each acknowledged batch at which
// policy version; replay creates a group that consume then reads, and its
// Arrow stream equals the original byte for byte, whatever budget and
// staleness bound the replaying member runs with.

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rllm-pipe/rllm-pipe/train"
)

func TestReplayAndConsumedView(t *testing.T) {
	t.Parallel() // see main_test.go
	work := t.TempDir()
	replayScenario(t, e2eBinary(t), work, filepath.Join(work, "out"), nil)
}

// TestIntegrationReplayS3 is the same over MinIO: the shards, the logs
// and the audit in s3://.
func TestIntegrationReplayS3(t *testing.T) {
	t.Parallel() // see main_test.go
	target := newS3Target(t, "replay")
	replayScenario(t, e2eBinary(t), t.TempDir(), target.url, target.flags())
}

// pastedConsumed checks that the --views-sql script of local root, run in
// a fresh DuckDB after sql has exited (its temporary folder gone), holds
// the consumed rows sql answered.
func pastedConsumed[R any](t *testing.T, bin, work, root string, want []R) {
	t.Helper()
	script, db := viewsScript(t, bin, work, "--from", root)
	if _, err := db.Exec(script); err != nil {
		t.Fatalf("running the --views-sql script: %v", err)
	}
	var got []R
	rows, err := db.Query("SELECT to_json(x)::VARCHAR FROM (SELECT consumer_group, train_step, position, groups_in_batch, member, policy_version, group_id, group_version, staleness, trajectories, steps FROM consumed ORDER BY consumer_group, train_step, position) x")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var line string
		var x R
		if err := rows.Scan(&line); err != nil || json.Unmarshal([]byte(line), &x) != nil {
			t.Fatalf("pasted consumed row %q: %v", line, err)
		}
		got = append(got, x)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pasted consumed rows differ from sql's:\n%v\nwant\n%v", got, want)
	}
}

// viewsScript runs `sql --views-sql` with args and opens a fresh DuckDB,
// closed when the test ends, to run the script in.
func viewsScript(t *testing.T, bin, work string, args ...string) (string, *sql.DB) {
	t.Helper()
	r := e2eRun(t, bin, work, append([]string{"sql", "--views-sql"}, args...)...)
	if r.code != 0 {
		t.Fatalf("--views-sql: exit %d\n%s", r.code, r.stderr)
	}
	db, err := sql.Open("duckdb", "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return r.stdout, db
}

// replayScenario consumes root as group orig, checks the consumed view,
// replays orig as again and checks again's Arrow stream and audit. ep are
// the flags that reach root's store.
func replayScenario(t *testing.T, bin, work, root string, ep []string) {
	files := consGenChunks(t, bin, work, 3, "--groups", "24", "--turns", "2..4", "--resets", "0.2")
	consIngest(t, bin, work, root, files, ep...)

	consume := func(group, out string, extra ...string) {
		t.Helper()
		args := append([]string{"consume", "--from", root, "--consumer-group", group, "--name", "m", "--format", "arrow", "--to", out, "--poll", "20ms"}, append(extra, ep...)...)
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
	if ep == nil {
		pastedConsumed(t, bin, work, root, rows)
	}

	replayArgs := func(group, as string) []string {
		return append([]string{"replay", "--from", root, "--consumer-group", group, "--to", as}, ep...)
	}
	r := e2eRun(t, bin, work, replayArgs("orig", "again")...)
	var sum replaySummary
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sum) != nil || sum.Batches != len(steps) || sum.Groups != len(seen) {
		t.Fatalf("replay: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	// The rows the original was consumed as, recorded by its member.
	orig := train.RowSettings{Layout: "trajectories"}
	if sum.Layout != "trajectories" || sum.IncludeFiltered || !slices.Equal(sum.Original, []train.RowSettings{orig}) {
		t.Fatalf("replay summary %+v: want the original's rows %v", sum, orig)
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
	// A member of the replay with other rows is refused before any batch.
	for _, rows := range [][]string{nil, {"--layout", "steps"}, {"--layout", "trajectories", "--include-filtered"}} {
		args := append([]string{"consume", "--from", root, "--consumer-group", "again", "--name", "m", "--format", "arrow", "--to", filepath.Join(work, "refused.arrow"), "--poll", "20ms"}, append(rows, ep...)...)
		r := e2eRun(t, bin, work, args...)
		if r.code == 0 || !strings.Contains(r.stderr, "the group replays orig with --layout trajectories --include-filtered=false") {
			t.Fatalf("consume the replay with %v: exit %d\n%s", rows, r.code, r.stderr)
		}
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

	// Re-training with another estimator: the replay recomputes advantage
	// over the original's batches, so its stream is byte for byte that of
	// a new group consuming the data as the original did with the
	// estimator, and not the original's.
	est := []string{"--layout", "trajectories", "--batch-estimator", "batch_std"}
	if r := e2eRun(t, bin, work, replayArgs("orig", "again-est")...); r.code != 0 {
		t.Fatalf("replay: exit %d\n%s", r.code, r.stderr)
	}
	estArrow, freshArrow := filepath.Join(work, "again-est.arrow"), filepath.Join(work, "fresh-est.arrow")
	consume("again-est", estArrow, append([]string{"--max-tokens", "100", "--policy-version", "7"}, est...)...)
	consume("fresh-est", freshArrow, append([]string{"--max-tokens", "9000", "--policy-version", "5"}, est...)...)
	e, err := os.ReadFile(estArrow)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.ReadFile(freshArrow)
	if err != nil {
		t.Fatal(err)
	}
	if len(e) == 0 || !bytes.Equal(e, f) {
		t.Fatalf("replay with --batch-estimator: %d bytes, a fresh group with it %d", len(e), len(f))
	}
	if bytes.Equal(e, a) {
		t.Fatal("--batch-estimator changed nothing in the replay")
	}
	groupsPerStep := func(group string) map[int64][]string {
		out := map[int64][]string{}
		for _, r := range consumed() {
			if r.Group == group {
				out[r.Step] = append(out[r.Step], r.GroupID)
			}
		}
		return out
	}
	if got := groupsPerStep("again-est"); !maps.EqualFunc(got, steps, slices.Equal) {
		t.Fatalf("replay with --batch-estimator trained %v, the original %v", got, steps)
	}

	// Replaying as other rows: the same groups per step as step rows.
	r = e2eRun(t, bin, work, append(replayArgs("orig", "again-steps"), "--layout", "steps")...)
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &sum) != nil || sum.Layout != "steps" || sum.IncludeFiltered {
		t.Fatalf("replay --layout steps: exit %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	consume("again-steps", filepath.Join(work, "again-steps.arrow"), "--layout", "steps")
	if got := groupsPerStep("again-steps"); !maps.EqualFunc(got, steps, slices.Equal) {
		t.Fatalf("replay as step rows trained %v, the original %v", got, steps)
	}
}

// replay's row settings: the original's when it recorded one set, else
// those given (both, when it recorded none or several).
func TestReplayRows(t *testing.T) {
	traj := train.RowSettings{Layout: "trajectories"}
	steps := train.RowSettings{Layout: "steps", IncludeFiltered: true}
	for _, tc := range []struct {
		name     string
		args     []string
		original []train.RowSettings
		want     train.RowSettings
		err      string
	}{
		{"the original's", nil, []train.RowSettings{traj}, traj, ""},
		{"layout given", []string{"--layout", "steps"}, []train.RowSettings{traj}, train.RowSettings{Layout: "steps"}, ""},
		{"include-filtered given", []string{"--include-filtered"}, []train.RowSettings{traj}, train.RowSettings{Layout: "trajectories", IncludeFiltered: true}, ""},
		{"several recorded", nil, []train.RowSettings{traj, steps}, train.RowSettings{}, "several row settings"},
		{"several recorded, one flag", []string{"--layout", "steps"}, []train.RowSettings{traj, steps}, train.RowSettings{}, "several row settings"},
		{"several recorded, both flags", []string{"--layout", "steps", "--include-filtered=true"}, []train.RowSettings{traj, steps}, steps, ""},
		{"none recorded", nil, nil, train.RowSettings{}, "recorded no --layout/--include-filtered"},
		{"none recorded, both flags", []string{"--layout", "trajectories", "--include-filtered=false"}, nil, traj, ""},
		{"bad layout", []string{"--layout", "rows"}, []train.RowSettings{traj}, train.RowSettings{}, "--layout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newReplayCmd(context.Background())
			if err := cmd.ParseFlags(append([]string{"--consumer-group", "g"}, tc.args...)); err != nil {
				t.Fatal(err)
			}
			o := replayOpts{group: "g"}
			o.layout, _ = cmd.Flags().GetString("layout")
			o.includeFiltered, _ = cmd.Flags().GetBool("include-filtered")
			got, err := replayRows(o, cmd, tc.original)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}
