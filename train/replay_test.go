package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"
)

// Members record the row settings they join with; a replay plan carries
// the settings it delivers with, and a member of the replay with others
// is refused before it takes a batch.
func TestReplayRowSettings(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 6)
	ctx := context.Background()
	join := func(group string, layout Layout, filtered bool) (*Consumer, error) {
		sh, obj := openGroup(t, root, group)
		return NewConsumer(ctx, sh, obj, ConsumerConfig{
			Config: Config{MaxStaleness: -1, MaxTokens: 30, Layout: layout, IncludeFiltered: filtered},
			Name:   "m", Poll: 10 * time.Millisecond,
		})
	}
	settings := func(group string) []RowSettings {
		t.Helper()
		_, obj := openGroup(t, root, group)
		got, err := ReadRowSettings(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	traj := RowSettings{Layout: "trajectories"}
	stepsFiltered := RowSettings{Layout: "steps", IncludeFiltered: true}

	if got := settings("orig"); len(got) != 0 {
		t.Fatalf("a group nobody joined records %v", got)
	}
	for range 2 { // joining again with the same settings adds nothing
		c, err := join("orig", LayoutTrajectories, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := settings("orig"); !slices.Equal(got, []RowSettings{traj}) {
		t.Fatalf("orig records %v, want [%v]", got, traj)
	}
	c, err := join("mixed", LayoutTrajectories, false)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	if c, err = join("mixed", LayoutSteps, true); err != nil {
		t.Fatal(err)
	}
	_ = c.Close(ctx)
	if got := settings("mixed"); len(got) != 2 || !slices.Contains(got, traj) || !slices.Contains(got, stepsFiltered) {
		t.Fatalf("mixed records %v", got)
	}

	for i, tc := range []struct {
		name     string
		rows     *RowSettings
		layout   Layout
		filtered bool
		refused  bool
	}{
		{"same settings", &traj, LayoutTrajectories, false, false},
		{"other layout", &traj, LayoutSteps, false, true},
		{"other include-filtered", &traj, LayoutTrajectories, true, true},
		{"the plan's other settings", &stepsFiltered, LayoutSteps, true, false},
		{"a plan without settings checks nothing", nil, LayoutSteps, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			group := fmt.Sprintf("replay-%d", i)
			_, obj := openGroup(t, root, group)
			plan := ReplayPlan{From: "orig", Rows: tc.rows, Batches: []Consumed{}}
			if err := CreateReplay(ctx, obj, plan); err != nil {
				t.Fatal(err)
			}
			c, err := join(group, tc.layout, tc.filtered)
			if tc.refused {
				if !errors.Is(err, ErrReplayRows) {
					t.Fatalf("joined with %v: err %v, want ErrReplayRows", rowSettingsOf(&Config{Layout: tc.layout, IncludeFiltered: tc.filtered}), err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if got := settings(group); len(got) != 0 {
				t.Fatalf("a replay group records %v (its plan holds its settings)", got)
			}
		})
	}
}
