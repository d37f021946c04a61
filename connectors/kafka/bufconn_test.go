package kafka

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	kgo "github.com/segmentio/kafka-go"
)

// countingConn counts the reads that reach the socket.
type countingConn struct {
	net.Conn
	reads *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// TestIntegrationFetchReadBuffer: a fetch of records larger than
// kafka-go's own 4 KiB buffer reads the socket a few times per megabyte,
// not several times per record, and the records come out whole and in
// order.
func TestIntegrationFetchReadBuffer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := newTopic(ctx, t, "bufconn", 1)
	out, err := NewOutput(cfg, OutputOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	const n = 500
	var recs []Keyed
	for i := range n {
		recs = append(recs, Keyed{Key: "k", Line: fmt.Appendf(nil, `{"n":%d,"pad":"%s"}`, i, bytes.Repeat([]byte("x"), 8000))})
	}
	if err := out.Write(ctx, recs); err != nil {
		t.Fatal(err)
	}

	var reads atomic.Int64
	base, err := cfg.dialer()
	if err != nil {
		t.Fatal(err)
	}
	base.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{c, &reads}, nil
	}
	conn, err := WithReadBuffer(base).DialLeader(ctx, "tcp", cfg.Brokers[0], cfg.Topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	got := 0
	for got < n {
		before := reads.Load()
		batch := conn.ReadBatchWith(kgo.ReadBatchConfig{MinBytes: 1, MaxBytes: FetchBytes, MaxWait: time.Second})
		read := 0
		for {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			if want := fmt.Sprintf(`{"n":%d,`, got); !bytes.HasPrefix(m.Value, []byte(want)) || len(m.Value) < 8000 {
				t.Fatalf("record %d: got %.20q (%d bytes)", got, m.Value, len(m.Value))
			}
			got++
			read++
		}
		if err := batch.Close(); err != nil {
			t.Fatal(err)
		}
		calls := reads.Load() - before
		t.Logf("fetch: %d records, %d socket reads", read, calls)
		if read > 50 && calls > int64(read/4) {
			t.Errorf("%d socket reads for %d records of 8 KB: kafka-go reads the socket directly", calls, read)
		}
	}
}
