package dot

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// Queries that each wait for a connection of their own (a slow upstream
// whose mode is not known: one query a connection, as forward sends them)
// take the connections in the order they came: each is answered within its
// own dial and answer, as forward's are. Every waiter wakes when a dial is
// done, and the first to run took the connection: one that came later took
// the one dialled for an earlier query, which waited for a later dial.
func TestWaitersTakeConnectionsInTheirOrder(t *testing.T) {
	const service, handshake = 30 * time.Millisecond, 40 * time.Millisecond
	opts := dottest.Options{Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true) // none put behind another on purpose
		checkOutcomes(t, offer(p, 1, 0, names("warm")), func(string) time.Duration { return time.Second })
		if !p.slowUnknown() {
			t.Fatalf("The upstream is not served a query a connection (mode %v): the test tests nothing", p.Stats().Mode)
		}
		// The first takes the warm connection; each of the others dials
		// one, done 2 ms after the one before.
		out := offer(p, 12, 2*time.Millisecond, names("q"))
		checkOutcomes(t, out, func(string) time.Duration { return handshake + service + time.Millisecond })
	})
}

// A waiter that saw a connection idle takes it only while it still is. Two
// waiters woken by one dial's end both see the new connection idle; the
// older takes it and leaves the order before the newer asks whether it
// yields (it then yields to none), and the newer went on the connection
// behind the older one's query: in order, an answer time late
// (TestFirstDialSharedByNoneApart failed so under -race on a loaded machine,
// 7 runs in 300). Here that interleaving is forced: the newer is held where
// it asks (the order's lock) until the older has taken the connection and
// left; it must then wait for its own dial (one is under way), not register.
func TestWaiterTakesNoConnectionTakenSinceItLooked(t *testing.T) {
	c := newBareConn(t, 64)
	p := c.pool
	conns := []*conn{c}
	p.mu.Lock()
	p.conns.Store(&conns)
	p.dials++ // a dial under way for the newer waiter: it may wait for it
	p.mu.Unlock()
	defer func() { p.mu.Lock(); p.dials--; p.mu.Unlock() }()
	p.noOrderChecks.Store(true)
	older, newer := newTestCall(mustPrepare(t, "older.example.")), newTestCall(mustPrepare(t, "newer.example."))
	for _, cl := range []*call{older, newer} {
		cl.waited, cl.ticket = true, p.order.enter() // as acquireSlow leaves them
		p.waiters.Add(1)
	}
	if !p.oneEach() {
		t.Fatalf("Queries do not go one to a connection (mode %v): the test tests nothing", p.Stats().Mode)
	}

	p.order.mu.Lock() // the newer looks, sees c idle, and waits here to ask whether it yields
	got := make(chan *conn)
	go func() { got <- p.pick(newer) }()
	waitFor(t, "the newer waiter to ask whether it yields", func() bool {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		return strings.Contains(stacks, "(*waitOrder).yields")
	})
	if !c.register(older) { // the older takes c, and leaves the order and the waiters
		t.Fatal("The older waiter could not register on the idle connection")
	}
	p.order.tickets = slices.DeleteFunc(p.order.tickets, func(k uint32) bool { return k == older.ticket })
	p.order.n.Store(int32(len(p.order.tickets)))
	p.waiters.Add(-1)
	p.order.mu.Unlock()

	if c2 := <-got; c2 != nil {
		t.Errorf("The newer waiter registered on a connection with %d queries outstanding, want it to wait for its dial", c2.load.Load()-1)
	}
	if l := c.load.Load(); l != 1 {
		t.Errorf("%d queries on the connection the older waiter took, want 1", l)
	}
}
