package kafka

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	kgo "github.com/segmentio/kafka-go"

	"github.com/rllm-pipe/rllm-pipe/ingest"
)

// silentBroker accepts connections and never answers: a broker that is up
// but stalled (a paused JVM, an overloaded host).
func silentBroker(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range held {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// within fails the test if f has not returned d after it started.
func within(t *testing.T, d time.Duration, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s still blocked %s after its context ended", what, d)
	}
}

// TestSilentBrokerEndsWithContext: calls that wait on the broker end with
// their context even when the broker never answers. Before, a partition's
// fetch sought its offset before the context could interrupt it, and
// creating or deleting a topic had no deadline at all: each blocked for
// ever, and with it a stopping ingest, gateway or produce.
func TestSilentBrokerEndsWithContext(t *testing.T) {
	addr := silentBroker(t)
	t.Run("fetch", func(t *testing.T) {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn := kgo.NewConn(raw, "t", 0)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		s := &source{topic: "t"}
		var lag atomic.Int64
		within(t, 5*time.Second, "fetch", func() { s.fetch(ctx, conn, 0, nil, 42, &lag) })
	})
	cfg := Config{Brokers: []string{addr}, Topic: "t"}
	t.Run("Reread", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		again := &partitionRecords{c: &Consumer{cfg: cfg, dialer: &kgo.Dialer{Timeout: time.Minute}}}
		within(t, 5*time.Second, "Reread", func() {
			if _, _, err := again.Reread(ctx, []ingest.RawRef{{From: again, Off: 42, Len: 1}}); err == nil {
				t.Error("Reread from a broker that never answers succeeded")
			}
		})
	})
	t.Run("EnsureTopic", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		within(t, 5*time.Second, "EnsureTopic", func() {
			if err := EnsureTopic(ctx, cfg, 1, 1); err == nil {
				t.Error("EnsureTopic on a broker that never answers succeeded")
			}
		})
	})
	t.Run("DeleteTopics", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(200*time.Millisecond, cancel)
		within(t, 5*time.Second, "DeleteTopics", func() {
			if err := DeleteTopics(ctx, cfg, "t"); err == nil {
				t.Error("DeleteTopics on a broker that never answers succeeded")
			}
		})
	})
}
