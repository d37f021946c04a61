package kafka

import (
	"bufio"
	"context"
	"net"

	kgo "github.com/segmentio/kafka-go"
)

// FetchReadBuffer is the read buffer of a fetch connection. kafka-go reads
// a fetch response through a 4 KiB bufio.Reader, field by field: every
// record's length, headers and value cost read system calls of their own
// (754 for 500 records of 8 KB, TestIntegrationFetchReadBuffer). Under a
// buffer this size, one call takes in whatever the socket holds (22 calls
// for the same fetch), and kafka-go's small reads are served from memory.
// It costs 256 KiB per partition read (1 MiB was no faster in alternated
// runs); docs/performance.md#choices-behind-the-defaults ("Kafka path") has the
// throughput before and after.
const FetchReadBuffer = 256 << 10

// bufferedConn is a net.Conn whose reads go through a large buffer.
// Deadlines and writes pass straight through.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// WithReadBuffer returns a copy of d whose connections read through a
// FetchReadBuffer buffer (TLS, when set, runs above it).
func WithReadBuffer(d *kgo.Dialer) *kgo.Dialer {
	out := *d
	dial := d.DialFunc
	if dial == nil { // what kafka-go dials with when DialFunc is unset
		dial = (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	out.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := dial(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return &bufferedConn{Conn: conn, r: bufio.NewReaderSize(conn, FetchReadBuffer)}, nil
	}
	return &out
}
