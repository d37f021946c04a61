package iceberg

import (
	"context"
	"testing"
	"time"
)

// TestFollowerHoldsEveryCommitAtFinish: commits made while a follower
// syncs every few milliseconds, and after its last interval, are all in
// the table once Finish returns, and its totals add up to them.
func TestFollowerHoldsEveryCommitAtFinish(t *testing.T) {
	dir := t.TempDir()
	root := commitRuns(t, dir, 0, 1, 3)
	cat := testCatalog(t, dir, "sqlite")
	defer cat.Close()
	// The interval syncs catch up by themselves.
	f := Follow(context.Background(), newSyncer(t, cat, root, 1), 5*time.Millisecond, func(_ Result, err error) {
		if err != nil {
			t.Error(err)
		}
	})
	n1 := len(committed(t, root))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tbl, err := cat.LoadTable(context.Background(), []string{"rllm", StepsTable})
		if err == nil {
			if pos, _ := Position(tbl); pos.Shards == n1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the interval syncs did not add the first run's shards")
		}
	}
	f.Halt()
	// Commits after the last interval sync: Finish adds them.
	f = Follow(context.Background(), newSyncer(t, cat, root, 1), time.Hour, func(_ Result, err error) {
		if err != nil {
			t.Error(err)
		}
	})
	commitRuns(t, dir, 1, 2, 3)
	res, err := f.Finish(context.Background(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	n := len(committed(t, root))
	if res.Shards != n-n1 || res.Position != n || res.Rows != 2*3*2 {
		t.Errorf("totals %+v; want %d shards added, %d held, 12 rows", res, n-n1, n)
	}
	checkExactlyOnce(t, cat, root, n)
}
