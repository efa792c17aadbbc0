package dot

import (
	"testing"
)

// Each connection has one state, and the census that Stats and the sizing's
// report (the conns_taking gauge) read counts them alike: a connection near
// its end takes queries (Stats counted it, the gauge did not), a quiet one
// too, a blocked, draining or closed one does not.
func TestCensus(t *testing.T) {
	c := newBareConn(t, 64)
	p := c.pool
	conns := []*conn{c}
	for range 5 {
		o := newConn(p, c.tc, c.bc)
		conns = append(conns, o)
	}
	conns[1].quietAt.Store(conns[1].reads.Load() + 1)
	conns[1].load.Store(1) // quiet only while a query is outstanding
	conns[2].nearEnd.Store(true)
	conns[3].blockedAt.Store(conns[3].reads.Load() + 1)
	conns[4].mu.Lock()
	conns[4].setDrainingLocked(CloseDrain)
	conns[4].mu.Unlock()
	conns[5].mu.Lock()
	conns[5].state = stateClosed // as closeFor leaves it, without its goroutines to stop
	conns[5].closed.Store(true)
	conns[5].unusable.Store(true)
	conns[5].mu.Unlock()
	want := []avail{availTaking, availQuiet, availNearEnd, availBlocked, availDraining, availClosed}
	for i, o := range conns {
		if a := o.avail(); a != want[i] {
			t.Errorf("Connection %d: state %d, want %d", i, a, want[i])
		}
	}
	n := countConns(conns)
	if n.takes() != 3 || n.steady() != 2 || n.open() != 4 || n.n[availBlocked] != 1 {
		t.Errorf("Census: %d take queries, %d not near their end, %d open, %d blocked; want 3, 2, 4, 1", n.takes(), n.steady(), n.open(), n.n[availBlocked])
	}
	if n.idle != 2 {
		t.Errorf("Census: %d idle, want 2: the taking and the near-end ones, with nothing outstanding", n.idle)
	}
	conns[3].reads.Add(1) // it read: no longer blocked
	if a := conns[3].avail(); a != availTaking {
		t.Errorf("A blocked connection that read again: state %d, want taking", a)
	}
	conns[3].blockedAt.Store(conns[3].reads.Load() + 1)

	p.mu.Lock()
	p.conns.Store(&conns)
	p.mu.Unlock()
	if s := p.Stats(); s.Taking != 3 || s.Blocked != 1 || s.Conns != 6 {
		t.Errorf("Stats: %d taking, %d blocked of %d, want 3, 1 of 6", s.Taking, s.Blocked, s.Conns)
	}
	rec := p.obs.(*recorder)
	open := func(r *recorder) int { return r.open }
	waitFor(t, "the sizing to report the connections taking queries", func() bool { return rec.get(open) != 0 })
	if got := rec.get(open); got != 3 {
		t.Errorf("The sizing reported %d connections taking queries, want 3 as Stats counts them", got)
	}
}
