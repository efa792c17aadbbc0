package dottest

import (
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// Pipe returns the two ends of an in-memory connection. Unlike net.Pipe, each
// direction buffers up to PipeBuffer bytes, as a TCP connection's socket
// buffers do: a write returns once its bytes are buffered, not once the peer
// has read them, so a server busy with one query does not hold up the client's
// next writes. Everything it blocks on is a sync.Cond, so a testing/synctest
// bubble's clock advances while both ends wait. Deadlines are supported.
func Pipe() (net.Conn, net.Conn) {
	a, b := newStream(), newStream()
	return &memConn{in: a, out: b}, &memConn{in: b, out: a}
}

// PipeBuffer is how many bytes each direction of a Pipe holds.
const PipeBuffer = 256 << 10

// stream is one direction of a Pipe.
type stream struct {
	mu       sync.Mutex
	cond     sync.Cond
	buf      []byte
	eof      bool      // the writing end closed: reads drain buf, then see io.EOF
	gone     bool      // the reading end closed: writes fail
	rdl, wdl time.Time // the reading and writing ends' deadlines
}

func newStream() *stream {
	s := &stream{}
	s.cond.L = &s.mu
	return s
}

// wait waits for a change, or until deadline (if set). s.mu must be held.
func (s *stream) wait(deadline time.Time) {
	if !deadline.IsZero() {
		t := time.AfterFunc(time.Until(deadline), func() {
			s.mu.Lock()
			s.cond.Broadcast()
			s.mu.Unlock()
		})
		defer t.Stop()
	}
	s.cond.Wait()
}

func (s *stream) read(b []byte, closed *bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		switch {
		case *closed:
			return 0, net.ErrClosed
		case len(s.buf) > 0:
			n := copy(b, s.buf)
			s.buf = s.buf[n:]
			s.cond.Broadcast()
			return n, nil
		case s.eof:
			return 0, io.EOF
		case past(s.rdl):
			return 0, os.ErrDeadlineExceeded
		}
		s.wait(s.rdl)
	}
}

func (s *stream) write(b []byte, closed *bool) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for n < len(b) {
		switch {
		case *closed || s.eof:
			return n, net.ErrClosed
		case s.gone:
			return n, io.ErrClosedPipe
		case past(s.wdl):
			return n, os.ErrDeadlineExceeded
		case len(s.buf) < PipeBuffer:
			k := min(len(b)-n, PipeBuffer-len(s.buf))
			s.buf = append(s.buf, b[n:n+k]...)
			n += k
			s.cond.Broadcast()
			continue
		}
		s.wait(s.wdl)
	}
	return n, nil
}

func past(t time.Time) bool { return !t.IsZero() && !time.Now().Before(t) }

// memConn is one end of a Pipe: it reads in and writes out.
type memConn struct {
	in, out *stream
	rclosed bool // guarded by in.mu: this end is closed
	wclosed bool // guarded by out.mu: this end is closed
}

func (c *memConn) Read(b []byte) (int, error)  { return c.in.read(b, &c.rclosed) }
func (c *memConn) Write(b []byte) (int, error) { return c.out.write(b, &c.wclosed) }

// Close ends both directions: the peer reads what was written, then io.EOF,
// and its writes fail.
func (c *memConn) Close() error {
	c.in.mu.Lock()
	c.rclosed, c.in.gone = true, true
	c.in.cond.Broadcast()
	c.in.mu.Unlock()
	c.out.mu.Lock()
	c.wclosed, c.out.eof = true, true
	c.out.cond.Broadcast()
	c.out.mu.Unlock()
	return nil
}

func (c *memConn) LocalAddr() net.Addr  { return pipeNetAddr{} }
func (c *memConn) RemoteAddr() net.Addr { return pipeNetAddr{} }

func (c *memConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

func (c *memConn) SetReadDeadline(t time.Time) error {
	c.in.mu.Lock()
	c.in.rdl = t
	c.in.cond.Broadcast()
	c.in.mu.Unlock()
	return nil
}

func (c *memConn) SetWriteDeadline(t time.Time) error {
	c.out.mu.Lock()
	c.out.wdl = t
	c.out.cond.Broadcast()
	c.out.mu.Unlock()
	return nil
}

type pipeNetAddr struct{}

func (pipeNetAddr) Network() string { return "pipe" }
func (pipeNetAddr) String() string  { return "pipe" }
