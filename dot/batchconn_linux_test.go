package dot

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
)

// unread sees the bytes the kernel holds for the socket, and only until they
// are read; a connection without a socket has none.
func TestUnreadSeesBytesWaitingInTheSocket(t *testing.T) {
	client, server := tcpPair(t)
	bc := &batchConn{Conn: client, rc: rawConn(t, client)}
	if bc.unread() {
		t.Fatal("unread before the server sent anything")
	}
	if _, err := server.Write([]byte("answer")); err != nil {
		t.Fatal(err)
	}
	awaitReadable(t, client)
	if !bc.unread() {
		t.Fatal("unread = false with 6 bytes waiting in the socket")
	}
	buf := make([]byte, 16)
	if n, err := bc.Read(buf); err != nil || n != 6 {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if bc.unread() {
		t.Error("unread = true once everything was read")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if (&batchConn{Conn: a}).unread() {
		t.Error("unread = true for a connection without a socket")
	}
}

// A connection whose answers wait unread in its socket is not stuck behind a
// slow query: its reader is behind. The sweeper leaves its queries alone
// instead of rescuing them, which would only make a process short of CPU
// busier still.
func TestAnswersWaitingUnreadAreNoStuckConnection(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	d := &readGate{}
	p, rec := newTestPool(t, s, func(c *Config) { c.Dial = d.Dial; c.MaxConns = 2 })
	t.Cleanup(d.release) // before the pool closes (cleanups run last first), should the test fail held
	if _, err := exchange(p, "warm.example."); err != nil {
		t.Fatal(err)
	}
	// From now on the reader's next read blocks: the one it has under way
	// takes the first answer, and the ones after it wait in the socket.
	d.hold()
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, name := range []string{"first.example.", "head.example.", "next.example."} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := exchange(p, name)
			errs <- err
		}()
		if name == "first.example." {
			d.awaitBlocked(t) // first's answer was read, and the reader is held
		}
	}
	conn := d.last()
	awaitReadable(t, conn.TCPConn)
	// No event marks a rescue that does not happen: give the sweeper ten times
	// the rescue delay to make a mistake.
	time.Sleep(10 * minRescueDelay)
	d.release()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Query: %v", err)
		}
	}
	if got := rec.get(func(r *recorder) int { return r.rescues }); got != 0 {
		t.Errorf("Rescues = %d, want 0: the answers were in the socket, unread", got)
	}
	if got := d.dials(); got != 1 {
		t.Errorf("Dials = %d, want 1", got)
	}
}

// readGate dials real TCP connections whose reads can be held, keeping the
// socket reachable (syscall.Conn) as the pool's own connections do.
type readGate struct {
	mu      sync.Mutex
	held    chan struct{}   // guarded by mu; non-nil: reads block until it is closed
	blocked chan struct{}   // guarded by mu; closed when a read blocks on held
	conns   []*readGateConn // guarded by mu
}

func (g *readGate) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	rc := &readGateConn{TCPConn: c.(*net.TCPConn), g: g}
	g.mu.Lock()
	g.conns = append(g.conns, rc)
	g.mu.Unlock()
	return rc, nil
}

func (g *readGate) hold() {
	g.mu.Lock()
	g.held, g.blocked = make(chan struct{}), make(chan struct{})
	g.mu.Unlock()
}

func (g *readGate) release() {
	g.mu.Lock()
	if g.held != nil {
		close(g.held)
		g.held = nil
	}
	g.mu.Unlock()
}

func (g *readGate) awaitBlocked(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	blocked := g.blocked
	g.mu.Unlock()
	select {
	case <-blocked:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader never came back for more")
	}
}

func (g *readGate) dials() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.conns)
}

func (g *readGate) last() *readGateConn {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.conns[len(g.conns)-1]
}

type readGateConn struct {
	*net.TCPConn
	g *readGate
}

func (c *readGateConn) Read(b []byte) (int, error) {
	c.g.mu.Lock()
	held, blocked := c.g.held, c.g.blocked
	if held != nil {
		select {
		case <-blocked:
		default:
			close(blocked)
		}
	}
	c.g.mu.Unlock()
	if held != nil {
		<-held
	}
	return c.TCPConn.Read(b)
}

// tcpPair returns both ends of a TCP connection over 127.0.0.1.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func rawConn(t *testing.T, c net.Conn) syscall.RawConn {
	t.Helper()
	rc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	return rc
}

// awaitReadable waits, through the runtime's poller and without reading, until
// c's socket holds bytes, or fails the test after 5 s. It leaves c's deadlines
// alone (the pool uses them to wake its reader); the wait ends at the latest
// when the socket is closed.
func awaitReadable(t *testing.T, c net.Conn) {
	t.Helper()
	rc := rawConn(t, c)
	done := make(chan error, 1)
	go func() { done <- rc.Read(func(fd uintptr) bool { return unreadBytes(fd) > 0 }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Waiting for bytes in the socket: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("No bytes came into the socket within 5 s")
	}
}

// Answers that came together are read with one read(2): crypto/tls alone reads
// a record header, then the record, and little more than it asks for. The
// server writes ten TLS records in one write (a batchConn batch); once they are
// all in the client's socket, the client's TLS takes them with one socket read
// through the read-ahead buffer, and unread sees what TLS has not taken yet.
func TestReadAheadTakesQueuedRecordsInOneRead(t *testing.T) {
	const records, size = 10, 300
	client, server := tcpPair(t)
	cert, err := dottest.NewCert()
	if err != nil {
		t.Fatal(err)
	}
	sc, cc := &countingConn{Conn: server}, &countingConn{Conn: client}
	sbc, cbc := &batchConn{Conn: sc}, &batchConn{Conn: cc, rc: rawConn(t, client)}
	stls, ctls := tls.Server(sbc, cert.ServerTLS()), tls.Client(cbc, cert.ClientTLS(dottest.ServerName))
	errs := make(chan error, 1)
	go func() { errs <- stls.Handshake() }()
	if err := ctls.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	cbc.readAhead(bufio.NewReaderSize(nil, readAheadSize))

	sbc.begin()
	for i := range records {
		if _, err := stls.Write(bytes.Repeat([]byte{byte(i)}, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := sbc.flush(); err != nil {
		t.Fatal(err)
	}
	// Everything the server wrote and the client has not read (the records,
	// and TLS 1.3's session tickets, sent after the handshake) is in the socket.
	awaitUnread(t, client, int(sc.written.Load()-cc.read.Load()))

	before := cc.reads.Load()
	buf := make([]byte, size)
	for i := range records {
		if _, err := io.ReadFull(ctls, buf); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if buf[0] != byte(i) {
			t.Fatalf("record %d holds %d", i, buf[0])
		}
		if i == 0 && !cbc.unread() {
			t.Error("unread = false with nine records read ahead and not taken by TLS")
		}
	}
	if n := cc.reads.Load() - before; n != 1 {
		t.Errorf("the client read the socket %d times for %d records that were all there: want 1", n, records)
	}
	if cbc.unread() {
		t.Error("unread = true once every record was taken")
	}
}

// countingConn counts the reads of its connection and the bytes read from and
// written to it.
type countingConn struct {
	net.Conn
	reads         atomic.Int64
	read, written atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// awaitUnread waits, through the runtime's poller and without reading, until
// c's socket holds at least n bytes, or fails the test after 5 s.
func awaitUnread(t *testing.T, c net.Conn, n int) {
	t.Helper()
	rc := rawConn(t, c)
	done := make(chan error, 1)
	go func() { done <- rc.Read(func(fd uintptr) bool { return unreadBytes(fd) >= n }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Waiting for %d bytes in the socket: %v", n, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("The socket holds fewer than %d bytes after 5 s", n)
	}
}
