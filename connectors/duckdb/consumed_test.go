package duckdb

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/store"
	"github.com/rllm-pipe/rllm-pipe/schemas"
)

// fakeGroups is a ConsumerGroups over fixed batches; a group mapped to
// nil cannot be read.
type fakeGroups map[string][]schemas.ConsumedBatch

func (f fakeGroups) Groups(context.Context, store.Reader) ([]string, error) {
	var out []string
	for g := range f {
		out = append(out, g)
	}
	slices.Sort(out)
	return out, nil
}

// StaleSkips counts, per version, the groups of g's batches at that
// version, as if they had been skipped.
func (f fakeGroups) StaleSkips(_ context.Context, _ store.Reader, g string) ([]schemas.VersionCount, error) {
	if f[g] == nil {
		return nil, errors.New("torn log")
	}
	by := map[int64]int64{}
	for _, b := range f[g] {
		for _, cg := range b.Groups {
			by[cg.GroupVersion]++
		}
	}
	var out []schemas.VersionCount
	for v, n := range by {
		out = append(out, schemas.VersionCount{Version: v, Groups: n})
	}
	return out, nil
}

func (f fakeGroups) Consumed(_ context.Context, _ store.Reader, g string) ([]schemas.ConsumedBatch, error) {
	if f[g] == nil {
		return nil, errors.New("torn log")
	}
	return f[g], nil
}

// TestConsumedFromInjectedGroups: the consumed view holds one row per
// group of every batch the injected ConsumerGroups returns, numbered by
// the batch's place in its group's log; a group whose log cannot be read
// is left out with a warning; without ConsumerGroups the view is empty.
func TestConsumedFromInjectedGroups(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, store.ConsumersDir), 0o755); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	groups := fakeGroups{
		"trainer": {
			{Seq: 3, Member: "m0/abc", Time: at, BatchID: 7, PolicyVersion: 5, Groups: []schemas.ConsumedGroup{
				{Shard: "s/1.parquet", Ordinal: 0, GroupID: "g1", GroupVersion: 4, Trajectories: 8, Steps: 9},
				{Shard: "s/1.parquet", Ordinal: 1, GroupID: "g2", GroupVersion: 6, Trajectories: 8, Steps: 8},
			}},
			{Seq: 9, Member: "m1/def", Time: at.Add(time.Second), BatchID: 8, PolicyVersion: 6, Groups: []schemas.ConsumedGroup{
				{Shard: "s/2.parquet", Ordinal: 0, GroupID: "g3", GroupVersion: 3, Trajectories: 4, Steps: 4},
			}},
		},
		"broken": nil,
	}
	d, err := OpenLocal(ctx, root, Options{ConsumerGroups: groups})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := queryStrings(t, d, `SELECT concat_ws('|', consumer_group, train_step, position, groups_in_batch, member, member_id,
		batch_id, policy_version, group_id, group_version, staleness, trajectories, steps, log_seq) FROM consumed ORDER BY train_step, position`)
	want := []string{
		"trainer|0|0|2|m0|m0/abc|7|5|g1|4|1|8|9|3",
		"trainer|0|1|2|m0|m0/abc|7|5|g2|6|0|8|8|3",
		"trainer|1|0|1|m1|m1/def|8|6|g3|3|3|4|4|9",
	}
	if !slices.Equal(got, want) {
		t.Errorf("consumed:\n got %q\nwant %q", got, want)
	}
	// The training loop per train step: no shard here, so no finish
	// times (the ages are null).
	q, err := Report(ReportTrainingLoop, ReportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got = queryStrings(t, d, `SELECT concat_ws('|', consumer_group, train_step, policy_version, groups, staleness_max, coalesce(ack_age_p50_s::VARCHAR, 'null')) FROM (`+q+`)`)
	if want := []string{"trainer|0|5|2|1|null", "trainer|1|6|1|3|null"}; !slices.Equal(got, want) {
		t.Errorf("training-loop:\n got %q\nwant %q", got, want)
	}
	got = queryStrings(t, d, `SELECT concat_ws('|', consumer_group, policy_version, groups) FROM stale_skips`)
	if want := []string{"trainer|3|1", "trainer|4|1", "trainer|6|1"}; !slices.Equal(got, want) {
		t.Errorf("stale_skips:\n got %q\nwant %q", got, want)
	}
	if !slices.ContainsFunc(d.Warnings(), func(w string) bool { return strings.Contains(w, "broken") && strings.Contains(w, "torn log") }) {
		t.Errorf("warnings %q: want one naming the unreadable group", d.Warnings())
	}

	none, err := OpenLocal(ctx, root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer none.Close()
	if got := queryStrings(t, none, "SELECT count(*)::VARCHAR FROM consumed"); !slices.Equal(got, []string{"0"}) {
		t.Errorf("consumed without ConsumerGroups: count %q, want 0", got)
	}
	if got := queryStrings(t, none, "SELECT count(*)::VARCHAR FROM stale_skips"); !slices.Equal(got, []string{"0"}) {
		t.Errorf("stale_skips without ConsumerGroups: count %q, want 0", got)
	}
}
