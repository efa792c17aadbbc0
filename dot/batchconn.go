package dot

import (
	"bufio"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// batchConn sits between a tls.Conn and its socket. While the writer has a batch
// open, the records TLS writes are gathered and sent with one syscall when the
// batch is flushed; outside a batch (the handshake, alerts) writes go straight
// through. So however a burst of queries is framed into records (see framing), it
// costs one write. Every write to the socket is bounded by timeout (see
// armLocked).
type batchConn struct {
	net.Conn
	rc       syscall.RawConn // the socket, when Conn has one: for setQuickAck
	timeout  time.Duration   // bounds each write to the socket (Config.WriteTimeout)
	flushes  atomic.Uint64   // batches written
	acked    uint64          // reader only: flushes when quick ACKs were last armed
	killed   atomic.Bool     // kill was called: writes fail from now on
	mu       sync.Mutex
	batching bool      // guarded by mu
	buf      []byte    // guarded by mu
	err      error     // guarded by mu: the first write error, sticky
	until    time.Time // guarded by mu: the write deadline armed on Conn

	// ahead, set by readAhead before the reader starts, reads the socket ahead
	// of TLS (reader only); ahead holds what it has read and TLS has not taken,
	// for unread (written by the reader, read by the sweeper).
	ahead  *bufio.Reader
	aheadN atomic.Int32
	// readAt: unix ns when a read(2) last brought bytes; 0 before. The
	// reader's (the handshake's before the reader starts): see arrival.
	readAt int64

	asked atomic.Uint64 // times unread was asked: the sweeper asks only of a connection that looks stuck
}

// Write is how crypto/tls writes: into the open batch, else (the handshake,
// alerts, the reply to a KeyUpdate) straight to the socket.
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
	b.armLocked(time.Now())
	n, err := b.Conn.Write(p)
	if err != nil {
		b.err = err
	}
	return n, err
}

// Read is how crypto/tls reads. Once readAhead gave it a buffer, it reads the
// socket through it: crypto/tls asks for a record header, then for the record,
// and reads at most a little more than it asks for (its input buffer grows only
// to the largest record), so answers that came together would cost a read(2)
// each, or one per few; through the buffer, whatever the socket holds (up to
// its size) is taken in one.
func (b *batchConn) Read(p []byte) (int, error) {
	if b.ahead == nil {
		return b.readSocket(p)
	}
	n, err := b.ahead.Read(p)
	b.aheadN.Store(int32(b.ahead.Buffered()))
	return n, err
}

// readAhead makes Read go through r (reset to read the socket), from the
// reader's first read on; the handshake read the socket directly.
func (b *batchConn) readAhead(r *bufio.Reader) {
	r.Reset(socketReader{b})
	b.ahead = r
}

// socketReader is the socket, as the read-ahead buffer reads it.
type socketReader struct{ b *batchConn }

func (s socketReader) Read(p []byte) (int, error) { return s.b.readSocket(p) }

// readSocket is one read(2) on the socket. It re-arms quick ACKs (see
// setQuickAck) if a batch was written since they were last armed: Linux goes
// back to delaying ACKs when we send, and stays in quick mode until then, so
// arming them on every read would be a wasted syscall most of the time.
func (b *batchConn) readSocket(p []byte) (int, error) {
	n, err := b.Conn.Read(p)
	if n > 0 {
		b.readAt = nanotime()
	}
	if f := b.flushes.Load(); n > 0 && b.rc != nil && f != b.acked {
		b.acked = f
		b.rc.Control(setQuickAck)
	}
	return n, err
}

// arrival is when the answer the reader is dispatching came: when the read(2)
// that brought its last bytes returned. Answers that came together are timed
// by one clock read, not one each (a clock read costs as much as a map
// lookup, and a read(2) brings three or four answers at full speed), and as
// they came, not later by the work of dispatching the ones before them. A
// frame is dispatched before the reader reads the socket again (TLS and the
// frame buffer read only when they run dry), so no later read's time is taken
// for it. Before any read through the socket (tests that feed frames to
// readFrames), the clock.
func (b *batchConn) arrival() int64 {
	if b.readAt != 0 {
		return b.readAt
	}
	return nanotime()
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
		b.armLocked(time.Now())
		if _, err := b.Conn.Write(b.buf); err != nil {
			b.err = err
		}
		b.flushes.Add(1)
	}
	b.buf = b.buf[:0]
	return b.err
}

// armLocked makes sure that the socket's write deadline is at least half the
// timeout after now, before a write: a write to a peer that does not read fails
// after timeout/2 to timeout. The deadline moves only when it comes that close,
// and stays armed in between. Moving it re-arms a runtime timer: clearing it
// after every flush and setting it before the next cost 15 µs of median latency
// and 1.6 % of CPU per query at 11,500 QPS (make bench's latency phase). Left
// armed over an idle spell, it fails no write: every write comes through Write
// or flush, which arm it first. After kill, it is left in the past. b.mu must be
// held.
func (b *batchConn) armLocked(now time.Time) {
	if b.timeout <= 0 || b.killed.Load() || b.until.Sub(now) >= b.timeout/2 {
		return
	}
	b.until = now.Add(b.timeout)
	b.Conn.SetWriteDeadline(b.until)
}

// kill fails the write blocked now, if any, and every later one: the
// connection is closing, and its peer may not read. It does not wait for mu,
// which a blocked write holds.
func (b *batchConn) kill() {
	b.killed.Store(true)
	b.Conn.SetWriteDeadline(time.Unix(1, 0))
}

// unread reports whether the socket holds bytes nobody has read yet: then a
// connection that read nothing for a while is not waiting for its server, its
// reader is behind (this process is short of CPU).
func (b *batchConn) unread() bool {
	b.asked.Add(1)
	if b.aheadN.Load() > 0 {
		return true // read from the socket, not yet by TLS
	}
	if b.rc == nil {
		return false
	}
	n := 0
	b.rc.Control(func(fd uintptr) { n = unreadBytes(fd) })
	return n > 0
}
