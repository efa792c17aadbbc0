package dot

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// newBareConn returns a connection that is registered with nothing and has no
// goroutines, for white-box tests of its table and dispatch.
func newBareConn(t testing.TB, maxInflight int) *conn {
	t.Helper()
	p, err := New(Config{Addr: "127.0.0.1:853", TLS: &tls.Config{ServerName: "dot.test"}, MaxInflight: maxInflight, Observer: newRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	bc := &batchConn{Conn: a}
	return newConn(p, tls.Client(bc, p.tls), bc)
}

func mustPrepare(t testing.TB, name string) *query {
	q, err := prepareQuery(newQuery(name, dns.TypeA), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func newTestCall(q *query) *call {
	return &call{q: q, deadline: nanotime() + int64(1e12), resp: make(chan result, 1)}
}

// IDs are never live twice on a connection, and a tombstoned ID is skipped until
// its tombstone goes, even when the counter wraps onto it.
func TestIDsSkipLiveAndTombstonedIDs(t *testing.T) {
	c := newBareConn(t, 8)
	q := mustPrepare(t, "a.example.")
	first := newTestCall(q)
	if !c.register(first) {
		t.Fatal("register failed on an empty connection")
	}
	<-c.writeq
	first.state.Store(callSent)
	c.mu.Lock()
	c.giveUpLocked(first, nanotime()) // sent, then the caller gave up: a tombstone
	c.nextID = first.id               // the counter wraps around onto it
	c.mu.Unlock()

	seen := map[uint16]bool{first.id: true}
	for range 7 {
		cl := newTestCall(q)
		if !c.register(cl) {
			t.Fatal("register failed below the cap")
		}
		<-c.writeq
		if seen[cl.id] {
			t.Fatalf("ID %d handed out while live or tombstoned", cl.id)
		}
		seen[cl.id] = true
	}
	if c.register(newTestCall(q)) {
		t.Error("register went past MaxInflight; the tombstone must count against it")
	}
}

// frame prefixes msg with its length.
func frame(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)
}

func answerFor(t testing.TB, q *query, id uint16) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(q.wire[2:]); err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	r.SetReply(m)
	r.Id = id
	b, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Each call is completed exactly once whatever the reader is fed, and only with an
// answer to its own question.
func TestDispatchCompletesEachCallOnce(t *testing.T) {
	c := newBareConn(t, 8)
	qa, qb := mustPrepare(t, "a.example."), mustPrepare(t, "b.example.")
	a, b := newTestCall(qa), newTestCall(qb)
	for _, cl := range []*call{a, b} {
		c.register(cl)
		<-c.writeq
		cl.state.Store(callSent)
	}
	var in bytes.Buffer
	in.Write(frame(answerFor(t, qa, a.id)))
	in.Write(frame(answerFor(t, qa, a.id))) // duplicate: unknown ID by now
	in.Write(frame(answerFor(t, qa, b.id))) // b's ID with a's question
	in.Write(frame([]byte{1, 2, 3}))        // runt
	c.readFrames(&in)
	c.closeFor(errServerClosed, CloseServer)

	if r := <-a.resp; r.err != nil || r.msg == nil || r.msg.Id != qa.origID {
		t.Errorf("Call a got %v, want its answer", r.err)
	}
	if r := <-b.resp; r.err == nil {
		t.Error("Call b got an answer to another question")
	}
	for _, cl := range []*call{a, b} {
		if n := cl.completions.Load(); n != 1 {
			t.Errorf("Call %d completed %d times", cl.id, n)
		}
	}
	rec := c.pool.obs.(*recorder)
	if rec.drops[DropUnknownID] != 1 || rec.drops[DropWrongQuestion] != 1 || rec.drops[DropMalformed] != 1 {
		t.Errorf("Drops = %v, want one unknown ID, one wrong question, one malformed", rec.drops)
	}
}

// A connection dialled ahead of need and closed by the server before it carried
// a query was closed for idleness: no failure, no backoff, and the next query
// dials at once.
func TestUnusedConnectionClosedByServerIsNoFailure(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	p, rec := newTestPool(t, s, func(c *Config) { c.Backoff = Backoff{Base: time.Hour} })
	p.mu.Lock()
	p.startDialLocked(0, false)
	p.mu.Unlock()
	// The server's handshake too: closed before it read the client's Finished,
	// the connection would be reset, not closed.
	waitFor(t, "the connection", func() bool { return p.Stats().Conns == 1 && s.Handshakes() == 1 })
	c := (*p.conns.Load())[0]
	c.mu.Lock()
	c.born -= int64(minIdleLife) // as old as an idle timeout can be
	c.mu.Unlock()
	s.CloseConns()
	waitFor(t, "the server's close", func() bool { return rec.get(func(r *recorder) int { return r.closes[CloseServer] }) == 1 })
	if f := rec.get(func(r *recorder) int { return r.failures }); f != 0 {
		t.Errorf("Failures = %d, want 0: the connection carried no query", f)
	}
	if _, err := exchange(p, "next.example."); err != nil {
		t.Errorf("Query after the idle close: %v, want an answer on a new connection", err)
	}
}

func TestConnLifeFailed(t *testing.T) {
	tests := []struct {
		life   connLife
		reason CloseReason
		want   bool
	}{
		{connLife{accepted: 1}, CloseServer, true}, // carried a query, died before answering
		{connLife{accepted: 1}, CloseStall, true},  //
		{connLife{accepted: 1, answered: 1}, CloseServer, false},
		{connLife{accepted: 1, idleRace: true}, CloseServer, false},                          // closed for idleness as its first query went out
		{connLife{age: time.Millisecond}, CloseServer, true},                                 // hung up right after the handshake
		{connLife{age: time.Minute}, CloseServer, false},                                     // the server's idle timeout
		{connLife{age: 600 * time.Millisecond, serverIdle: time.Second}, CloseServer, false}, // past half the told idle timeout
		{connLife{age: 400 * time.Millisecond, serverIdle: time.Second}, CloseServer, true},  // sooner: hung up
		{connLife{age: time.Minute}, CloseError, false},
		{connLife{accepted: 1}, CloseIdle, false},
		{connLife{accepted: 1}, ClosePool, false},
		{connLife{accepted: 1}, CloseMaxAge, false},
	}
	for _, tc := range tests {
		if got := tc.life.failed(tc.reason); got != tc.want {
			t.Errorf("%+v closed for %v: failed = %v, want %v", tc.life, tc.reason, got, tc.want)
		}
	}
}

// Closing the pool while a dial is in flight is not a failure of the upstream.
func TestCloseDuringDialIsNoFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() { // accepts and never answers the handshake
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	rec := newRecorder()
	p, err := New(Config{Addr: ln.Addr().String(), TLS: &tls.Config{ServerName: "x.test"}, Observer: rec, DialTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	go exchange(p, "a.example.")
	c := <-accepted
	defer c.Close()
	p.Close()
	checkNoPoolGoroutines(t)
	if f, d := rec.get(func(r *recorder) int { return r.failures }), rec.get(func(r *recorder) int { return r.dialErrs }); f != 0 || d != 0 {
		t.Errorf("Failures = %d, dial errors = %d after Close cut a dial short, want 0 and 0", f, d)
	}
}

// An upstream that does not serve ALPN "dot" is named as the cause.
func TestALPNRefusalIsExplained(t *testing.T) {
	s := dottest.Start(t, dottest.Options{TLS: func(c *tls.Config) { c.NextProtos = []string{"h2"} }})
	p, _ := newTestPool(t, s, nil)
	_, err := exchange(p, "a.example.")
	if !errors.Is(err, ErrDial) || !isAlert(err, alertNoApplicationProtocol) {
		t.Fatalf("Error = %v, want ErrDial wrapping the no_application_protocol alert", err)
	}
	if !strings.Contains(err.Error(), `refused ALPN "dot"`) {
		t.Errorf("Error = %q, want it to say the upstream refused ALPN \"dot\"", err)
	}
}

// The upstream sees padded queries, and the keepalive it advertises is honoured.
func TestPaddingOnTheWireAndKeepalive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sizes []int
		s := startPipe(t, dottest.Options{
			OnQuery: func(wire []byte) {
				mu.Lock()
				sizes = append(sizes, len(wire))
				mu.Unlock()
			},
			Handler: func(q *dns.Msg) *dns.Msg {
				r := dottest.DefaultAnswer(q)
				r.SetEdns0(1232, false)
				// 3 units = 300ms: the pool must close idle connections before that.
				r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE, Timeout: 3})
				return r
			},
		})
		// An idle timeout far above the server's: only its keepalive can close the
		// connection within the test.
		p, rec := newTestPool(t, s, func(c *Config) { c.IdleTimeout = time.Hour })
		for _, name := range []string{"a.example.", "a-much-longer-name-for-another-size.example.org."} {
			r, err := exchange(p, name)
			if err != nil {
				t.Fatal(err)
			}
			if r.IsEdns0() != nil {
				t.Errorf("The server's keepalive OPT reached a client that sent no EDNS: %v", r.IsEdns0())
			}
		}
		mu.Lock()
		for _, n := range sizes {
			if n%128 != 0 {
				t.Errorf("Query of %d bytes on the wire, want a multiple of 128", n)
			}
		}
		mu.Unlock()
		c := (*p.conns.Load())[0]
		c.mu.Lock()
		idle := c.idle
		c.mu.Unlock()
		want := 300 * time.Millisecond * 3 / 4
		if idle != want {
			t.Errorf("Idle timeout after the server's 300ms keepalive = %v, want %v", idle, want)
		}
		waitFor(t, "the idle close before the server's keepalive", func() bool {
			return rec.get(func(r *recorder) int { return r.closes[CloseIdle] }) == 1
		})
		// A new connection keeps what the server told on the others before
		// it hears it itself: a spare that carries no query never does.
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		bc := &batchConn{Conn: a}
		if n := newConn(p, tls.Client(bc, p.tls), bc); n.idle != want {
			t.Errorf("A new connection's idle timeout = %v, want the told %v", n.idle, want)
		}
	})
}

// The server's keepalive timeout, heard on one connection, holds for the
// connections opened before it was heard: a spare that carries no query hears
// it never, and the server would close it first (e2e
// TestUpstreamKeepaliveTimeout: 3 idle closes by the pool, 1 by unbound).
func TestKeepaliveLowersEveryConnection(t *testing.T) {
	heard := newBareConn(t, 64)
	p := heard.pool
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	bc := &batchConn{Conn: a}
	spare := newConn(p, tls.Client(bc, p.tls), bc)
	p.mu.Lock()
	p.conns.Store(&[]*conn{heard, spare})
	p.mu.Unlock()
	heard.keepalive(3) // 300ms
	want := idleWithin(300 * time.Millisecond)
	for name, c := range map[string]*conn{"heard it": heard, "is a spare": spare} {
		c.mu.Lock()
		idle := c.idle
		c.mu.Unlock()
		if idle != want {
			t.Errorf("The connection that %s: idle timeout %v, want %v", name, idle, want)
		}
	}
}

// A keepalive timeout of 0 means: send nothing more, close once answers are in.
func TestKeepaliveZeroDrains(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
			r := dottest.DefaultAnswer(q)
			r.SetEdns0(1232, false)
			if q.Question[0].Name == "bye.example." {
				// miekg/dns packs a zero timeout as an empty option; send it by hand.
				r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: dns.EDNS0TCPKEEPALIVE, Data: []byte{0, 0}})
			}
			return r
		}})
		p, rec := newTestPool(t, s, nil)
		if _, err := exchange(p, "bye.example."); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the drain", func() bool { return rec.get(func(r *recorder) int { return r.closes[CloseDrain] }) == 1 })
		if _, err := exchange(p, "next.example."); err != nil {
			t.Fatal(err)
		}
		if h := s.Handshakes(); h != 2 {
			t.Errorf("Handshakes = %d, want 2: the drained connection must not be reused", h)
		}
	})
}

// An empty keepalive option in an answer (invalid from a server) is no timeout,
// and must not drain the connection.
func TestEmptyKeepaliveIsIgnored(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		r := dottest.DefaultAnswer(q)
		r.SetEdns0(1232, false)
		r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE})
		return r
	}})
	p, rec := newTestPool(t, s, nil)
	for range 3 {
		if _, err := exchange(p, "a.example."); err != nil {
			t.Fatal(err)
		}
	}
	if h := s.Handshakes(); h != 1 {
		t.Errorf("Handshakes = %d, want 1", h)
	}
	if d := rec.get(func(r *recorder) int { return r.closes[CloseDrain] }); d != 0 {
		t.Errorf("Drains = %d, want 0", d)
	}
}

// A rescue goes only to a connection with nothing outstanding, and register
// holds to that under the connection's lock: pickIdle reads the loads without
// it, and rescues woken together all took the same idle connection, one behind
// the other, each stuck in turn (TestInOrderQueueRescuedOnceLearned: 34 dials
// for 90 rescues, the last answer after 304 ms, in about 1 run in 20).
func TestRescuesTakeIdleConnsAlone(t *testing.T) {
	c, stuck := newBareConn(t, 64), newBareConn(t, 64)
	q := mustPrepare(t, "example.org.")
	first, second := newTestCall(q), newTestCall(q)
	first.avoid, second.avoid = stuck, stuck
	if !c.register(first) {
		t.Fatal("A rescue was refused by a connection with nothing outstanding")
	}
	if c.register(second) {
		t.Error("A second rescue went on a connection that holds one: want it refused")
	}
	if !c.register(newTestCall(q)) {
		t.Error("A query that is no rescue was refused by a connection with room")
	}
}

// A replay of a query whose connection the server cut after N answers goes,
// where queries are pipelined, only to a connection that took fewer than N
// queries, if one is open; else where any query would. Piled together onto the
// next connection, a cut connection's queries were cut there again, and again,
// until they ran out of replays (property seed 105: 88 of 555 failed where
// forward answered all).
func TestReplayGoesWithinItsCut(t *testing.T) {
	first := newBareConn(t, 64)
	p := first.pool
	p.cfg.MaxConns = 4 // pipelined from the start: pick is pickInTurn
	conns := []*conn{first}
	for range 2 {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		bc := &batchConn{Conn: a}
		conns = append(conns, newConn(p, tls.Client(bc, p.tls), bc))
	}
	p.mu.Lock()
	p.conns.Store(&conns)
	p.mu.Unlock()
	take := func(c *conn, n int) {
		for range n {
			if !c.register(newTestCall(mustPrepare(t, "taken.example."))) {
				t.Fatal("register failed")
			}
		}
	}
	take(conns[0], 9) // past the cut of 8: a server cutting there would cut it
	take(conns[1], 8) // at it: likewise
	take(conns[2], 7) // one more is the 8th: served before the cut

	q := mustPrepare(t, "replayed.example.")
	q.noteCut(&connLostError{cause: io.EOF, replayable: true, serverCut: true, served: 8})
	q.noteCut(&connLostError{cause: io.EOF, replayable: true, serverCut: true, served: 12}) // a later, larger cut keeps the fewest
	cl := newTestCall(q)
	cl.within = q.cutAfter
	if got := p.pick(cl); got != conns[2] {
		t.Errorf("The replay of a query cut after 8 answers went to connection %d, want 2, the one that took 7", slices.Index(conns, got))
	}
	// Now every connection took 8 or more: it goes where any query would.
	cl = newTestCall(q)
	cl.within = q.cutAfter
	if got := p.pick(cl); got != conns[0] {
		t.Errorf("With no connection within the cut, the replay went to connection %d, want 0 (the oldest with room)", slices.Index(conns, got))
	}
}

// A replay that no connection within its cut takes, while the mode is unknown
// and the depth bound holds (queueDepth), goes where any query would: onto an
// open connection with room under the bound. It went, as one turned away by
// the bound, to pickIdle, which dialled a connection for it (dialForWaiter),
// and then took a slot on an open one with its cut cleared (pick): the dial
// was left a spare.
func TestReplayBeyondItsCutDialsNone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hang := func(ctx context.Context, _, _ string) (net.Conn, error) { <-ctx.Done(); return nil, ctx.Err() }
		p, err := New(Config{Addr: "127.0.0.1:853", TLS: &tls.Config{ServerName: "dot.test"}, MaxInflight: 64, Observer: newRecorder(), Dial: hang})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		p.noOrderChecks.Store(true)
		var conns []*conn
		for range 2 {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			bc := &batchConn{Conn: a}
			c := newConn(p, tls.Client(bc, p.tls), bc)
			for range 2 {
				if !c.register(newTestCall(mustPrepare(t, "taken.example."))) {
					t.Fatal("register failed")
				}
			}
			c.servedAt.Store(nanotime()) // its queue is served: see servedLately
			conns = append(conns, c)
		}
		p.mu.Lock()
		p.conns.Store(&conns)
		p.mu.Unlock()
		ms := int64(time.Millisecond)
		p.learned.mode.usual.Store(ms)
		p.learned.mode.spacing.Store(ms)
		p.dialTime.Store(5 * ms)
		p.servingAt.Store(nanotime())
		if d := p.queueDepth(); d != 5 {
			t.Fatalf("queueDepth %d, want 5: the test tests nothing", d)
		}
		cl := newTestCall(mustPrepare(t, "replayed.example."))
		cl.within = 2 // each connection took 2: none within the cut
		if got := p.pick(cl); got == nil {
			t.Errorf("The replay went on no connection, want one of the two with room")
		}
		if d := p.dialing.Load(); d != 0 {
			t.Errorf("%d dials under way for a replay that went on an open connection, want 0", d)
		}
	})
}

// registerWithin holds a picker's bound on a connection's queue under the
// connection's lock: of 32 queries that register at once within 5, five do,
// however the pickers' lock-free reads of the load raced (issue 21, seed 29:
// 91 went on the pool's first connection where 16 were meant to join it).
func TestRegisterWithinHoldsTheBound(t *testing.T) {
	c := newBareConn(t, 64)
	var took sync.WaitGroup
	var mu sync.Mutex
	n := 0
	for range 32 {
		took.Go(func() {
			if c.registerWithin(newTestCall(mustPrepare(t, "q.example.")), 5) {
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	took.Wait()
	if n != 5 || c.load.Load() != 5 {
		t.Errorf("%d of 32 registered within 5 (load %d), want 5", n, c.load.Load())
	}
}
