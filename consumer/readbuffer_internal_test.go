package consumer

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
)

// countingConn counts the reads that reach the connection.
type countingConn struct {
	net.Conn
	reads *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// A partition reader's connection takes a fetch answer in reads of up to 64 KiB, however
// small the reads kafka-go makes above it (4 KiB), and returns every byte in order.
func TestFetchDialerReadsTheNetworkInLargeReads(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	want := make([]byte, 4<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		for b := want; len(b) > 0; b = b[min(len(b), 3000):] { // small writes, as a broker's
			if _, err := c.Write(b[:min(len(b), 3000)]); err != nil {
				return
			}
		}
	}()

	var reads atomic.Int64
	user := &kafka.Dialer{ClientID: "me", TLS: &tls.Config{ServerName: "kafka"}, DialFunc: func(ctx context.Context, network, address string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, address)
		return countingConn{Conn: c, reads: &reads}, err
	}}
	d := FetchDialer(user)
	require.Equal(t, "me", d.ClientID)
	require.Same(t, user.TLS, d.TLS)
	require.NotNil(t, user.DialFunc, "the user's dialer is left as it was")

	conn, err := d.DialFunc(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	require.True(t, bytes.Equal(want, readSmall(t, conn, len(want))), "the bytes read are the bytes sent")
	// 4 MiB in reads of 4 KiB would be 1,024 reads (and are, without the buffer: checked
	// with user.DialFunc); through the buffer, one read per 64 KiB when the data is
	// there, more only when a read finds less waiting.
	require.Less(t, reads.Load(), int64(1024/2), "reads of the connection")
	t.Logf("%d reads of the connection for %d bytes", reads.Load(), len(want))
}

// readSmall reads n bytes from conn as kafka-go does: through a bufio.Reader of 4 KiB, a
// few hundred bytes at a time (lengths, keys, values).
func readSmall(t *testing.T, conn net.Conn, n int) []byte {
	r := bufio.NewReaderSize(conn, 4096)
	got := make([]byte, n)
	for off := 0; off < n; off += 200 {
		_, err := io.ReadFull(r, got[off:min(n, off+200)])
		require.NoError(t, err)
	}
	return got
}

// A read that needs the network still sees the read deadline kafka-go sets; bytes already
// buffered are returned.
func TestFetchDialerKeepsTheReadDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	sent := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Write([]byte("hello"))
		close(sent)
		time.Sleep(5 * time.Second) // nothing more, the connection open
	}()
	conn, err := FetchDialer(nil).DialFunc(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	<-sent
	p := make([]byte, 3)
	n, err := io.ReadFull(conn, p)
	require.NoError(t, err)
	require.Equal(t, "hel", string(p[:n]))

	require.NoError(t, conn.SetReadDeadline(time.Now().Add(-time.Second)))
	n, err = conn.Read(p)
	require.NoError(t, err, "buffered bytes are returned")
	require.Equal(t, "lo", string(p[:n]))

	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, err = conn.Read(p)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second)
}
