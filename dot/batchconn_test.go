package dot

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
)

// deadlineConn counts the write deadlines set on it.
type deadlineConn struct {
	net.Conn
	sets atomic.Int32
}

func (d *deadlineConn) SetWriteDeadline(t time.Time) error {
	d.sets.Add(1)
	return d.Conn.SetWriteDeadline(t)
}

// pipe returns the two ends of an in-memory connection, closed when t ends; with
// drained, whatever the first end writes is read and thrown away.
func pipe(t *testing.T, drained bool) (net.Conn, net.Conn) {
	a, b := dottest.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	if drained {
		go io.Copy(io.Discard, b)
	}
	return a, b
}

// A write to a peer that does not read fails within the write timeout: a flush,
// and a write outside a batch (crypto/tls's own: the handshake, alerts, the
// reply to a KeyUpdate).
func TestWriteToPeerThatDoesNotReadTimesOut(t *testing.T) {
	const timeout = time.Second
	for _, batched := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			a, _ := pipe(t, false)
			bc := &batchConn{Conn: a, timeout: timeout}
			big := make([]byte, 2*dottest.PipeBuffer) // more than the pipe holds
			start := time.Now()
			var err error
			if batched {
				bc.begin()
				bc.Write(big)
				err = bc.flush()
			} else {
				_, err = bc.Write(big)
			}
			if took := time.Since(start); !errors.Is(err, os.ErrDeadlineExceeded) || took < timeout/2 || took > timeout {
				t.Errorf("Batched %v: the write returned %v after %v, want a deadline error after %v to %v", batched, err, took, timeout/2, timeout)
			}
		})
	}
}

// The write deadline is moved only when it comes within half the timeout, not
// around every flush (which cost latency and CPU, see armLocked); and, left
// armed over an idle spell, it fails no later write: crypto/tls replies to a
// KeyUpdate on its own, outside a batch, after any idle spell.
func TestWriteDeadlineArmedAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = time.Second
		a, _ := pipe(t, true)
		dc := &deadlineConn{Conn: a}
		bc := &batchConn{Conn: dc, timeout: timeout}
		for i := range 100 { // 100 flushes within one timeout
			bc.begin()
			bc.Write([]byte("query"))
			if err := bc.flush(); err != nil {
				t.Fatalf("Flush %d: %v", i, err)
			}
			time.Sleep(timeout / 100)
		}
		// Armed at the first flush, moved once at half the timeout.
		if n := dc.sets.Load(); n != 2 {
			t.Errorf("Write deadline set %d times for 100 flushes within %v, want 2", n, timeout)
		}
		time.Sleep(10 * timeout)
		if _, err := bc.Write([]byte("reply to a KeyUpdate")); err != nil {
			t.Errorf("Write after an idle spell: %v, want it written", err)
		}
		time.Sleep(10 * timeout)
		bc.begin()
		bc.Write([]byte("query"))
		if err := bc.flush(); err != nil {
			t.Errorf("Flush after an idle spell: %v, want it written", err)
		}
	})
}

// kill fails a write blocked on a peer that does not read at once, long before
// the write timeout, and every write after it: the deadline it leaves in the
// past is not moved again.
func TestKillFailsBlockedAndLaterWrites(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = time.Hour
		a, _ := pipe(t, false)
		bc := &batchConn{Conn: a, timeout: timeout}
		done := make(chan error)
		go func() {
			bc.begin()
			bc.Write(make([]byte, 2*dottest.PipeBuffer)) // more than the pipe holds
			done <- bc.flush()
		}()
		synctest.Wait() // the flush is blocked
		start := time.Now()
		bc.kill()
		if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 0 {
			t.Errorf("Blocked flush after kill: %v after %v, want a deadline error at once", err, time.Since(start))
		}

		// A connection killed while no write was blocked, its deadline due
		// to move: the next write fails all the same.
		c, _ := pipe(t, true)
		bc = &batchConn{Conn: c, timeout: timeout}
		if _, err := bc.Write([]byte("handshake")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(timeout/2 + time.Minute) // the next write would move the deadline
		bc.kill()
		if _, err := bc.Write([]byte("alert")); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("Write after kill: %v, want a deadline error", err)
		}
	})
}
