package train

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMembersOfOneProcessShareRecords: members that share a GroupLog (the
// members one serve runs) replay the log once and put their events in
// shared records; one of them dies holding shards, the others (and a
// member with a log of its own, another process) take them over, and
// every group is acknowledged exactly once.
func TestMembersOfOneProcessShareRecords(t *testing.T) {
	root := t.TempDir()
	writeShardsTo(t, root, 0, 300)
	ctx := context.Background()
	_, logObj := openGroup(t, root, "trainers")
	shared, err := OpenGroupLog(ctx, logObj)
	if err != nil {
		t.Fatal(err)
	}
	obj := shareWorkAndSurvive(t, root, func(name string) *GroupLog {
		if name == "alone" {
			return nil // a log of its own: another process
		}
		return shared
	}, "a", "b", "c", "d", "alone")
	// The audit lists every acknowledged group once, from shared records
	// too.
	batches, err := ReadConsumed(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	audited := map[string]int{}
	for _, b := range batches {
		for _, g := range b.Groups {
			audited[g.GroupID]++
		}
	}
	if len(audited) != 300 {
		t.Errorf("the audit holds %d groups, want 300", len(audited))
	}
	for g, n := range audited {
		if n != 1 {
			t.Errorf("the audit holds group %s %d times", g, n)
		}
	}
	// Some record holds several members' events.
	files, _ := filepath.Glob(filepath.Join(root, GroupDir("trainers"), "0*.json"))
	shared2 := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		es, err := decodeEvents(data, 0)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		members := map[string]bool{}
		for _, e := range es {
			members[e.Member] = true
		}
		if len(members) > 1 {
			shared2++
		}
	}
	if shared2 == 0 {
		t.Errorf("no record of the %d left holds events of several members", len(files))
	}
}

// A record of several events fails a reader that knows only single
// events, instead of reading as an empty event.
func TestBatchRecordFailsOldReaders(t *testing.T) {
	data, err := encodeEvents([]event{{Member: "a/1", Release: []string{"s"}}, {Member: "b/1", Release: []string{"t"}}})
	if err != nil {
		t.Fatal(err)
	}
	var old event
	if err := json.Unmarshal(data, &old); err == nil || !strings.Contains(err.Error(), "seq") {
		t.Errorf("an old reader decoded a batch record: %+v (%v)", old, err)
	}
	es, err := decodeEvents(data, 7)
	if err != nil || len(es) != 2 || es[1].Member != "b/1" || es[0].Seq != 7 || es[1].Seq != 7 {
		t.Errorf("decodeEvents: %+v %v", es, err)
	}
	one, _ := encodeEvents(es[:1])
	if err := json.Unmarshal(one, &old); err != nil || old.Member != "a/1" {
		t.Errorf("a record of one event is not the event: %s", one)
	}
}
