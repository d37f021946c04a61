package kafka

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	kgo "github.com/segmentio/kafka-go"
)

// TestOutputBrokerDown: with no broker a Write fails within its ctx's
// bound, with an error that says where it was going.
func TestOutputBrokerDown(t *testing.T) {
	out, err := NewOutput(Config{Brokers: []string{"127.0.0.1:1"}, Topic: "down"}, OutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = out.Write(ctx, []Keyed{{Key: "g", Line: []byte(`{}`)}})
	if err == nil || !strings.Contains(err.Error(), "down") {
		t.Fatalf("write to no broker: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("write to no broker took %v", took)
	}
	if err := out.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestOutputRecordTooLarge: a record larger than a request is refused at
// once as a RecordError naming it (no retry can produce it), before
// anything is sent.
func TestOutputRecordTooLarge(t *testing.T) {
	out, err := NewOutput(Config{Brokers: []string{"127.0.0.1:1"}, Topic: "down"}, OutputOptions{BatchBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	// The bound is kafka-go's own: a record of exactly what a request
	// takes goes on to the network (here: no broker), one byte more is
	// refused at once.
	limit := 64<<10 - messageOverhead - 1 // key "g"
	for _, n := range []int{limit, limit + 1} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err = out.Write(ctx, []Keyed{{Key: "g", Line: []byte(strings.Repeat("a", n))}, {Key: "g", Line: []byte(`{}`)}})
		cancel()
		var re *RecordError
		refused := errors.As(err, &re)
		if n == limit && refused {
			t.Fatalf("a record of %d bytes, within a request: %v", n, err)
		}
		if n > limit && (!refused || re.Index != 0 || re.Reason != "too_large" || !errors.Is(err, kgo.MessageSizeTooLarge)) {
			t.Fatalf("a record of %d bytes, over a request: %v", n, err)
		}
	}
}

// TestIntegrationOutputTopicRefuses: a record the broker refuses as larger
// than the topic's message.max.bytes is a RecordError naming it.
func TestIntegrationOutputTopicRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := newTopic(ctx, t, "gateway-big", 1)
	// Requests may be larger than the broker's default message.max.bytes
	// (about 1 MB): the broker is then the one to refuse.
	out, err := NewOutput(cfg, OutputOptions{BatchBytes: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	// The broker refuses the whole partition batch; the record to blame
	// is found by sending them alone, and the others are produced.
	big := append(append([]byte(`{"x":"`), strings.Repeat("a", 2<<20)...), `"}`...)
	err = out.Write(ctx, []Keyed{{Key: "g", Line: []byte(`{"n":1}`)}, {Key: "g", Line: []byte(`{"n":2}`)}, {Key: "g", Line: big}})
	var re *RecordError
	if !errors.As(err, &re) || re.Index != 2 || re.Reason != "too_large" {
		t.Fatalf("a 2 MiB record after two small ones: %v", err)
	}
	r := kgo.NewReader(kgo.ReaderConfig{Brokers: cfg.Brokers, Topic: cfg.Topic, Partition: 0, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	var got []string
	for len(got) < 2 {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("after %q: %v", got, err)
		}
		got = append(got, string(m.Value))
	}
	if got[0] != `{"n":1}` || got[1] != `{"n":2}` {
		t.Fatalf("produced %q", got)
	}
	// Concurrent Writes share batches: small records written beside the
	// oversized one, on the same partition, are never the ones named.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 15 {
				if err := out.Write(ctx, []Keyed{{Key: "g", Line: fmt.Appendf(nil, `{"w":%d,"i":%d}`, w, i)}}); err != nil {
					t.Errorf("a small record beside a large one: %v", err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 5 {
			var re *RecordError
			if err := out.Write(ctx, []Keyed{{Key: "g", Line: big}}); !errors.As(err, &re) || re.Index != 0 {
				t.Errorf("the 2 MiB record: %v", err)
				return
			}
		}
	})
	wg.Wait()
}

// TestIntegrationOutput: concurrent Writes against the real broker; every
// record arrives once, and every key stays in one partition.
func TestIntegrationOutput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const parts = 4
	cfg := newTopic(ctx, t, "gateway-out", parts)
	out, err := NewOutput(cfg, OutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each, groups = 16, 25, 12
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				g := (w*each + i) % groups
				if err := out.Write(ctx, []Keyed{{Key: fmt.Sprintf("task-%d", g), Line: fmt.Appendf(nil, `{"w":%d,"i":%d}`, w, i)}}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	partOf := map[string]int{}
	for p := range parts {
		conn, err := kgo.DialLeader(ctx, "tcp", cfg.Brokers[0], cfg.Topic, p)
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		if err != nil {
			t.Fatal(err)
		}
		conn.Close()
		if last == 0 {
			continue
		}
		r := kgo.NewReader(kgo.ReaderConfig{Brokers: cfg.Brokers, Topic: cfg.Topic, Partition: p, MaxWait: 100 * time.Millisecond})
		for n := int64(0); n < last; n++ {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				r.Close()
				t.Fatal(err)
			}
			seen[string(m.Value)]++
			if q, ok := partOf[string(m.Key)]; ok && q != p {
				t.Errorf("key %s in partitions %d and %d", m.Key, q, p)
			}
			partOf[string(m.Key)] = p
		}
		r.Close()
	}
	if len(seen) != writers*each || len(partOf) != groups {
		t.Fatalf("%d records in %d keys, want %d in %d", len(seen), len(partOf), writers*each, groups)
	}
	for v, n := range seen {
		if n != 1 {
			t.Errorf("%s produced %d times", v, n)
		}
	}
	if err := out.Write(ctx, []Keyed{{Key: "x", Line: []byte(`{}`)}}); err == nil || errors.Is(err, context.Canceled) {
		t.Fatalf("write after close: %v", err)
	}
}
