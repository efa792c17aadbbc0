package dot

import (
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

// A waiter takes a connection it saw idle only while it still is. Here
// another query is on the connection, its load not stored yet (the instant
// inside that query's register, as when waiters woken by a dial's end race
// for it): the waiter, first in the order, does not go behind it but looks
// again and returns none, to wait for its own dial. A query that has not
// waited still takes it: a fast upstream's picks race so all the time, and
// failing their registers made them dial.
func TestWaiterTakesOnlyAConnectionStillIdle(t *testing.T) {
	c := newBareConn(t, 64)
	p := c.pool
	p.noOrderChecks.Store(true)
	conns := []*conn{c}
	p.mu.Lock()
	p.conns.Store(&conns)
	p.mu.Unlock()
	c.mu.Lock()
	c.calls.put(newTestCall(mustPrepare(t, "other.example."))) // registered, load still 0
	c.mu.Unlock()
	waiter := newTestCall(mustPrepare(t, "waiter.example."))
	waiter.burstStart = true // not one waiting for the first connection's burst
	p.enterOrder(waiter)
	if got := p.pickIdle(waiter); got != nil {
		t.Errorf("A waiter went on a connection another query had taken since it looked")
	}
	p.leaveOrder(waiter)
	fresh := newTestCall(mustPrepare(t, "fresh.example."))
	fresh.burstStart = true
	if got := p.pickIdle(fresh); got != c {
		t.Errorf("A query that has not waited did not take the connection it saw idle (got %v)", got)
	}
}
