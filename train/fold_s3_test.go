package train

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/rllm-pipe/rllm-pipe/connectors/s3"
)

// On S3 too, with snapshots of the manifest in small segments: two
// members consume every group once while the group folds done shards,
// and a member joining afterwards reads the manifest from the watermark,
// fetching only its last segments.
func TestIntegrationLowWatermarkOnS3(t *testing.T) {
	ep := os.Getenv("RLLM_PIPE_S3_ENDPOINT")
	if ep == "" {
		t.Skip("RLLM_PIPE_S3_ENDPOINT not set: run `make test` (it starts MinIO)")
	}
	var b [4]byte
	rand.Read(b[:])
	cfg, err := s3.ParseURL("s3://rllm-pipe-test/" + t.Name() + "-" + hex.EncodeToString(b[:]))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Endpoint, cfg.SnapshotEvery, cfg.SegmentSize = ep, 4, 4
	t.Cleanup(func() {
		if !t.Failed() {
			_, _ = s3.RemovePrefix(context.Background(), cfg)
		}
	})
	ctx := context.Background()
	w, err := s3.Open(ctx, cfg, "writer")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		writeShardsInto(t, w, i*10, 10)
	}
	conf := func(name string) ConsumerConfig {
		return ConsumerConfig{Config: Config{MaxStaleness: -1, MaxTokens: 16, IncludeFiltered: true}, Name: name, LeaseTimeout: time.Minute, Poll: 5 * time.Millisecond}
	}
	open := func() (*s3.Store, Objects) {
		r, err := s3.OpenReader(ctx, cfg, "reader")
		if err != nil {
			t.Fatal(err)
		}
		obj, err := r.Objects(GroupDir("g"))
		if err != nil {
			t.Fatal(err)
		}
		return r, obj
	}
	l := &ledger{acked: map[string]int{}}
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		r, obj := open()
		c, err := NewConsumer(ctx, r, obj, conf(name))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := consume(t, c, l, 16, 0); err != nil {
				t.Error(err)
			}
			if err := c.Close(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i := 8; i < 10; i++ {
		writeShardsInto(t, w, i*10, 10)
	}
	r, obj := open()
	fs := &foldingShards{Shards: r, f: r}
	late, err := NewConsumer(ctx, fs, obj, conf("late"))
	if err != nil {
		t.Fatal(err)
	}
	if err := consume(t, late, l, 16, 0); err != nil {
		t.Fatal(err)
	}
	if err := late.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if len(l.acked) != 100 {
		t.Fatalf("%d groups acknowledged, want 100", len(l.acked))
	}
	for k, n := range l.acked {
		if n != 1 {
			t.Fatalf("group %s acknowledged %d times", k, n)
		}
	}
	p, err := GroupProgress(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	if fs.first() == 0 || p.GroupsAcked != 100 || p.Done != p.Shards {
		t.Fatalf("the late member read the manifest from shard %d; progress %+v", fs.first(), p)
	}
}
