package train_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow/array"

	"github.com/rllm-pipe/rllm-pipe/connectors/local"
	"github.com/rllm-pipe/rllm-pipe/schemas"
	"github.com/rllm-pipe/rllm-pipe/train"
	"github.com/rllm-pipe/rllm-pipe/train/traintest"
)

// TestStalenessHoldsWhereTrained: a trainer that prefetches 4 batches
// (a reader goroutine ahead of the training loop, as a Flight client's
// buffer is) and advances one version per batch never trains on a row
// more than MaxStaleness behind the version that trains it; every group
// is acknowledged or skipped, once. (No version-lead cap here: the
// trainer runs ahead of the rollouts' versions on purpose, and the cap
// judges a member further ahead than it from the cap.)
func TestStalenessHoldsWhereTrained(t *testing.T) {
	const maxStale, groups = 1, 48
	var versions []int64
	for g := range groups {
		versions = append(versions, int64(g/3)) // rollouts slower than the trainer: it falls behind
	}
	root := t.TempDir()
	traintest.WriteVersionedShards(t, root, versions, 1, 4)
	r, err := local.OpenReader(root)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	obj, err := r.Objects(train.GroupDir("g"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := train.NewConsumer(ctx, r, obj, train.ConsumerConfig{Config: train.Config{MaxStaleness: maxStale, IncludeFiltered: true},
		Name: "t", Poll: 10 * time.Millisecond, MaxInflight: 4, MaxVersionLead: -1})
	if err != nil {
		t.Fatal(err)
	}
	batches := make(chan *train.Delivery, 4)
	readErr := make(chan error, 1)
	go func() { // the client's buffer: up to MaxInflight batches ahead
		defer close(batches)
		for {
			d, err := c.Next(ctx)
			if err != nil {
				readErr <- err
				return
			}
			batches <- d
		}
	}()
	v, acked, violations := int64(0), 0, 0
	for d := range batches {
		gv := d.Record.Column(schemas.ColGroupVersion).(*array.Int64)
		for i := range gv.Len() {
			if v-gv.Value(i) > maxStale {
				violations++
				t.Errorf("batch %d trained at version %d holds a row of version %d", d.ID, v, gv.Value(i))
			}
		}
		d.Record.Release()
		time.Sleep(2 * time.Millisecond) // the optimizer step
		v++
		c.SetPolicyVersion(v)
		res, err := c.Ack(ctx, d.ID)
		if err != nil {
			t.Fatal(err)
		}
		acked += res.Groups
	}
	if err := <-readErr; !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	st := c.Stats()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d groups trained, %d skipped as stale, trainer at version %d", acked, st.SkippedStale, v)
	if int64(acked)+st.SkippedStale != groups || acked == 0 || st.SkippedStale == 0 {
		t.Errorf("acknowledged %d + skipped %d, want %d, both > 0", acked, st.SkippedStale, groups)
	}
}
