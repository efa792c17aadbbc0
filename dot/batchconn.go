package dot

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// batchConn sits between a tls.Conn and its socket. While the writer has a batch
// open, the records TLS writes are gathered and sent with one syscall when the
// batch is flushed; outside a batch (the handshake, alerts) writes go straight
// through. So however a burst of queries is framed into records (see framing), it
// costs one write.
type batchConn struct {
	net.Conn
	rc       syscall.RawConn // the socket, when Conn has one: for setQuickAck
	flushes  atomic.Uint64   // batches written
	acked    uint64          // reader only: flushes when quick ACKs were last armed
	mu       sync.Mutex
	batching bool   // guarded by mu
	buf      []byte // guarded by mu
	err      error  // guarded by mu: the first write error, sticky
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.err != nil:
		return 0, b.err
	case b.batching:
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	n, err := b.Conn.Write(p)
	if err != nil {
		b.err = err
	}
	return n, err
}

// Read reads from the socket and re-arms quick ACKs (see setQuickAck) if a batch
// was written since they were last armed: Linux goes back to delaying ACKs when
// we send, and stays in quick mode until then, so arming them on every read would
// be a wasted syscall most of the time.
func (b *batchConn) Read(p []byte) (int, error) {
	n, err := b.Conn.Read(p)
	if f := b.flushes.Load(); n > 0 && b.rc != nil && f != b.acked {
		b.acked = f
		b.rc.Control(setQuickAck)
	}
	return n, err
}

// begin opens a batch: writes are buffered until flush.
func (b *batchConn) begin() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

// flush closes the batch and writes what it gathered in one call.
func (b *batchConn) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	if len(b.buf) > 0 && b.err == nil {
		if _, err := b.Conn.Write(b.buf); err != nil {
			b.err = err
		}
		b.flushes.Add(1)
	}
	b.buf = b.buf[:0]
	return b.err
}

// unread reports whether the socket holds bytes nobody has read yet: then a
// connection that read nothing for a while is not waiting for its server, its
// reader is behind (this process is short of CPU).
func (b *batchConn) unread() bool {
	if b.rc == nil {
		return false
	}
	n := 0
	b.rc.Control(func(fd uintptr) { n = unreadBytes(fd) })
	return n > 0
}
