package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/flight"

	trainflight "github.com/rllm-pipe/rllm-pipe/train/flight"
)

// serveTrainer reads batches from a serve stream and acknowledges each,
// recording the groups of every acknowledgement answered (acked) and of
// those refused or whose answer never came (unsure: they may have landed,
// or come again); a stream that breaks is opened again. It returns when
// the stream ends, when serve is gone, or after stopAfter
// acknowledgements (0: no limit), holding the next batch unacknowledged
// until ctx ends.
func serveTrainer(ctx context.Context, cli flight.Client, name string, stopAfter int, onAck func()) (acked, unsure []string) {
	key := name + "-key-0123456789abcdef"
	n := 0
	for ctx.Err() == nil {
		stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"` + name + `","key":"` + key + `"}`)})
		if err != nil {
			return
		}
		rd, err := flight.NewRecordReader(stream)
		if err != nil {
			if strings.Contains(err.Error(), "ResourceExhausted") {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			return
		}
		for rd.Next() {
			var m trainflight.BatchMeta
			_ = json.Unmarshal(rd.LatestAppMetadata(), &m)
			if stopAfter > 0 && n == stopAfter {
				<-ctx.Done() // holds this batch, unacknowledged, until the end
				rd.Release()
				return
			}
			body, _ := json.Marshal(map[string]any{"consumer": name, "key": key, "batch_ids": []uint64{m.BatchID}})
			res, err := cli.DoAction(ctx, &flight.Action{Type: "ack", Body: body})
			if err == nil {
				_, err = res.Recv()
			}
			if err != nil {
				unsure = append(unsure, m.Groups...)
				continue
			}
			n++
			acked = append(acked, m.Groups...)
			if onAck != nil {
				onAck()
			}
		}
		err = rd.Err()
		rd.Release()
		if err == nil {
			return // the stream ended: every shard done
		}
	}
	return
}

// TestServeKilledWithItsMembers: two serve processes share a consumer
// group, three trainers on each; the first serve is killed with SIGKILL
// while its trainers hold batches, and the second's members take its
// shards over after the lease timeout. The members of one serve share
// their group log's records (group commit): every group is acknowledged
// exactly once all the same, none is lost, and the log holds records of
// several members' events.
func TestServeKilledWithItsMembers(t *testing.T) {
	t.Parallel() // see main_test.go: a late renewal costs a refused ack, which counts as unsure
	bin := e2eBinary(t)
	root := serveShards(t, bin, 400)
	args := []string{"--consumer-group", "g", "--lease-timeout", "5s"}
	s1 := startServe(t, bin, root, nil, args...)
	s2 := startServe(t, bin, root, nil, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	var mu sync.Mutex
	count := map[string]int{}
	var unsure []string
	record := func(a, u []string) {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range a {
			count[g]++
		}
		unsure = append(unsure, u...)
	}
	// The first serve's trainers each acknowledge some batches, then hold
	// one; once 30 acknowledgements landed there, it is killed.
	k1ctx, k1 := context.WithCancel(ctx)
	var n atomic.Int64
	thirty := make(chan struct{})
	onAck := func() {
		if n.Add(1) == 30 {
			close(thirty)
		}
	}
	var wg sync.WaitGroup
	c1 := serveClient(t, s1.addr)
	for _, name := range []string{"a1", "a2", "a3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, u := serveTrainer(k1ctx, c1, name, 15, onAck)
			record(a, u)
		}()
	}
	select {
	case <-thirty:
	case <-ctx.Done():
		t.Fatalf("30 acknowledgements did not come\n%s", s1.stderr)
	}
	if err := s1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	s1.exitWithin(t, 10*time.Second)
	k1()
	wg.Wait()

	c2 := serveClient(t, s2.addr)
	for _, name := range []string{"b1", "b2", "b3"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, u := serveTrainer(ctx, c2, name, 0, nil)
			record(a, u)
		}()
	}
	wg.Wait()

	all := map[string]bool{}
	for g, n := range count {
		all[g] = true
		if n != 1 {
			t.Errorf("group %s acknowledged %d times", g, n)
		}
	}
	for _, g := range unsure {
		all[g] = true
	}
	if len(all) != 400 {
		t.Errorf("%d groups acknowledged (%d of them unsure), want 400", len(all), len(unsure))
	}
	if p := consLocalProgress(t, root, "g"); p.GroupsAcked != 400 || p.Done != p.Shards {
		t.Errorf("the log: %+v, want 400 groups acknowledged, every shard done", p)
	}
	// Records of several members' events: the serves' group commit.
	files, _ := filepath.Glob(filepath.Join(root, "_consumers", "g", "0*.json"))
	several := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), `"events":`) {
			several++
		}
	}
	if several == 0 {
		t.Errorf("none of the log's %d records holds several events", len(files))
	}
	t.Logf("%d groups, %d acknowledged before the kill or after it, %d unsure; %d of %d records shared", len(all), len(count), len(unsure), several, len(files))
}
