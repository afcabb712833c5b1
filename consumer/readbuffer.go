package consumer

import (
	"bufio"
	"context"
	"net"

	"github.com/segmentio/kafka-go"
)

// fetchReadBuffer is the read buffer under each partition reader's connection. kafka-go
// reads a connection through a bufio.Reader of 4 KiB: a fetch answer of several megabytes
// (a partition with a backlog) cost one read(2) per 4 KiB, about 3 % of the consumer
// process's CPU in idemd-bench (BENCHMARKS.md, phase 39). With this buffer below it, one
// read(2) takes up to 64 KiB and kafka-go's reads are copies from it.
const fetchReadBuffer = 64 << 10

// FetchDialer is the dialer of the Kafka door's partition readers: d (kafka-go's
// DefaultDialer when nil) with a read buffer of 64 KiB under each connection it opens, below
// TLS and SASL, which kafka-go adds on top of what DialFunc returns. d is not changed.
// idemd-bench's bare consumer reads with it too, as the door does.
func FetchDialer(d *kafka.Dialer) *kafka.Dialer {
	if d == nil {
		d = kafka.DefaultDialer
	}
	b := *d
	dial := d.DialFunc
	if dial == nil {
		// What kafka-go dials with when DialFunc is nil (its DualStack is Go's default).
		dial = (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	b.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := dial(ctx, network, address)
		if err != nil {
			return nil, err
		}
		return &bufferedConn{Conn: conn, r: bufio.NewReaderSize(conn, fetchReadBuffer)}, nil
	}
	return &b
}

// bufferedConn is a connection read through a buffer. Bytes already buffered are returned
// even once the read deadline has passed; a read that needs the network sees the deadline
// as before.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
