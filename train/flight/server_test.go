package flight

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/flight"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/loop"
	"github.com/rllm-pipe/rllm-pipe/train/traintest"
)

// group joins members over a directory of shards.
type group struct {
	sh  *local.Reader
	obj train.Objects
}

func (g group) Join(ctx context.Context, name string, _ Ticket) (*train.Consumer, error) {
	cfg := train.ConsumerConfig{Config: train.Config{MaxStaleness: -1, IncludeFiltered: true}, Name: name, Poll: 10 * time.Millisecond, MaxInflight: 2}
	return train.NewConsumer(ctx, g.sh, g.obj, cfg)
}

// writeShard commits one shard of n one-row groups.
func writeShard(t *testing.T, root string, n int) { writeShards(t, root, 1, n, 0) }

// writeShards commits shards shards of n one-row groups each (group ids
// g000, g001, ... across them), every row with tokens prompt tokens.
func writeShards(t *testing.T, root string, shards, n, tokens int) {
	t.Helper()
	traintest.WriteShards(t, root, shards, n, tokens)
}

func TestServerProtocol(t *testing.T) {
	root := t.TempDir()
	writeShard(t, root, 6)
	sh, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := sh.Objects(train.GroupDir("g"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr := make(chan string, 1)
	srvCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- Serve(srvCtx, "127.0.0.1:0", NewServer(group{sh, obj}, Options{RejoinWait: 200 * time.Millisecond}), func(a string) { addr <- a })
	}()
	cli, err := flight.NewClientWithMiddleware(<-addr, nil, nil, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	action := func(kind string, body any) ([]byte, error) {
		data, _ := json.Marshal(body)
		st, err := cli.DoAction(ctx, &flight.Action{Type: kind, Body: data})
		if err != nil {
			return nil, err
		}
		r, err := st.Recv()
		if err != nil {
			return nil, err
		}
		return r.Body, nil
	}

	const key = "t0-secret-0123456789"
	stream, err := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"t0","key":"` + key + `"}`)})
	if err != nil {
		t.Fatal(err)
	}
	rd, err := flight.NewRecordReader(stream)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Release()
	// A second stream under a name already streaming is refused.
	dup, _ := cli.DoGet(ctx, &flight.Ticket{Ticket: []byte(`{"consumer":"t0"}`)})
	if _, err := dup.Recv(); status.Code(err) != codes.AlreadyExists {
		t.Errorf("duplicate consumer: %v, want AlreadyExists", err)
	}
	if _, err := action("nope", nil); status.Code(err) != codes.Unimplemented {
		t.Errorf("unknown action: %v", err)
	}
	if _, err := action("ack", map[string]any{"consumer": "t0", "key": key, "batch_ids": []int{99}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("ack of a batch never delivered: %v", err)
	}
	var groups []string
	for rd.Next() {
		var m BatchMeta
		if err := json.Unmarshal(rd.LatestAppMetadata(), &m); err != nil {
			t.Fatal(err)
		}
		if m.Rows != rd.RecordBatch().NumRows() || len(m.Groups) != 1 {
			t.Errorf("metadata %+v for a batch of %d rows", m, rd.RecordBatch().NumRows())
		}
		groups = append(groups, m.Groups...)
		body, err := action("ack", map[string]any{"consumer": "t0", "key": key, "batch_ids": []uint64{m.BatchID}})
		if err != nil {
			t.Fatal(err)
		}
		var res train.AckResult
		_ = json.Unmarshal(body, &res)
		if res.Groups != 1 || res.Lost != 0 {
			t.Errorf("ack result %+v", res)
		}
		if len(groups) > 1 {
			continue // the stream ends once everything is acknowledged
		}
		// A repeat returns the first answer; an ack naming another stream
		// of the name is refused.
		again, err := action("ack", map[string]any{"consumer": "t0", "key": key, "member": m.Member, "batch_ids": []uint64{m.BatchID}})
		if err != nil || string(again) != string(body) {
			t.Errorf("repeated ack: %s, %v; want %s", again, err, body)
		}
		if _, err := action("ack", map[string]any{"consumer": "t0", "key": key, "member": "t0/ended", "batch_ids": []uint64{m.BatchID}}); status.Code(err) != codes.FailedPrecondition {
			t.Errorf("ack naming an ended stream: %v", err)
		}
	}
	if rd.Err() != nil {
		t.Fatal(rd.Err())
	}
	if len(groups) != 6 {
		t.Errorf("%d groups streamed, want 6", len(groups))
	}
	// Tallies outlive the stream.
	body, err := action("stats", map[string]string{"consumer": "t0", "key": key})
	if err != nil {
		t.Fatal(err)
	}
	var st train.Stats
	_ = json.Unmarshal(body, &st)
	if st.GroupsAcked != 6 || st.Batches != 6 {
		t.Errorf("stats %+v", st)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPublishPolicyVersion: a member publishes the version its workers
// serve; it lands in the store (where the gateway follows it) and is the
// member's own version too. Without Versions the action is refused.
func TestPublishPolicyVersion(t *testing.T) {
	root := t.TempDir()
	writeShards(t, root, 1, 4, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g := newGroup(t, root, -1, 2)
	vobj, err := g.sh.Objects(loop.VersionsDir("g"))
	if err != nil {
		t.Fatal(err)
	}
	r := startServer(t, g, Options{Versions: loop.Publisher{Obj: vobj}})
	cli := dial(t, r.addr, "", nil)
	const key = "key-0123456789abcdef"
	open(ctx, t, cli, `{"consumer":"rank-0","key":"`+key+`"}`)
	if _, err := act(ctx, cli, "publish_policy_version", map[string]any{"consumer": "rank-0", "key": key, "policy_version": 9}); err != nil {
		t.Fatal(err)
	}
	p, ok, err := loop.Served(ctx, vobj)
	if err != nil || !ok || p.PolicyVersion != 9 || p.By != "rank-0" {
		t.Fatalf("served %+v %v %v, want 9 by rank-0", p, ok, err)
	}
	body, err := act(ctx, cli, "stats", map[string]any{"consumer": "rank-0", "key": key})
	var st train.Stats
	if err != nil || json.Unmarshal(body, &st) != nil || st.PolicyVersion != 9 {
		t.Fatalf("the publisher's own version: %+v %v", st, err)
	}

	r = startServer(t, newGroup(t, root, -1, 2), Options{})
	cli = dial(t, r.addr, "", nil)
	open(ctx, t, cli, `{"consumer":"rank-0","key":"`+key+`"}`)
	_, err = act(ctx, cli, "publish_policy_version", map[string]any{"consumer": "rank-0", "key": key, "policy_version": 10})
	wantCode(t, "publish without Versions", err, codes.Unimplemented)
}
