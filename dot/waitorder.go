package dot

import (
	"slices"
	"sync"
	"sync/atomic"
)

// The order of the waiting room: where queries go one to a connection
// (pickIdle), an idle connection goes to the query that has waited longest,
// as each of forward's queries takes the connection it dialled. Every waiter
// wakes when a dial is done or a connection frees (wakeLocked), and the
// first to run used to take it: a query that came later took the connection
// dialled for an earlier one, which waited for the next dial, and the next
// (issue 21, seed 33: slow and not known in order, a query waited 156 ms for
// connections dialled 55 ms after it came, each taken by one that came after
// it, against forward's 114 ms). Taken in order, a waiter has a connection
// once the dial started when it came is done, or sooner.
//
// The queries that share the pool's first dial (call.firstDial) are not in
// the order: they go on the first connection whichever takes it first, and
// one made to yield there to the query that started the dial wrote the
// burst in more batches, which slowed learning the mode (seed 61: in order
// learned 5 ms later, 12 connections against forward's 9).

// waitOrder holds the tickets of the queries waiting in acquireSlow for a
// connection of their own.
type waitOrder struct {
	mu      sync.Mutex
	last    uint32   // guarded by mu: the latest ticket given
	tickets []uint32 // guarded by mu: the waiting queries' tickets, ascending
	// passed, guarded by mu: a query left an idle connection to an older
	// waiter (yields); the next waiter to leave wakes the others, so that it
	// looks again once the older one has taken its connection.
	passed bool
	n      atomic.Int32 // len(tickets), for pickIdle's common case off the lock
}

// enter gives a query that starts waiting its ticket, later than all others.
func (w *waitOrder) enter() uint32 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last++
	w.tickets = append(w.tickets, w.last)
	w.n.Store(int32(len(w.tickets)))
	return w.last
}

// leave takes ticket t out of the order, and reports whether a query yielded
// to an older one since the last waiter left: the caller then wakes them.
func (w *waitOrder) leave(t uint32) (wake bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if i, ok := slices.BinarySearch(w.tickets, t); ok {
		w.tickets = slices.Delete(w.tickets, i, i+1)
	}
	w.n.Store(int32(len(w.tickets)))
	if len(w.tickets) == 0 {
		w.last = 0 // the room emptied: the tickets start again, far from wrapping
	}
	wake, w.passed = w.passed, false
	return wake
}

// yields reports whether the query of ticket t (0: one not waiting yet,
// later than all) leaves the idle connections it sees to older waiters:
// these are as many as the idle connections, or more. The count and passed
// are one step under mu, so that an older waiter that leaves after the count
// finds passed set and wakes this one.
func (w *waitOrder) yields(t uint32, idle int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	older := len(w.tickets)
	if t != 0 {
		older, _ = slices.BinarySearch(w.tickets, t)
	}
	if older < idle {
		return false
	}
	w.passed = true
	return true
}

// yieldsIdle reports whether cl, finding a connection idle in pickIdle,
// leaves it to an older waiter (see waitOrder). A rescue never waits in the
// order: it yields to every waiting query (pickIdle); nor does a query that
// shares the first dial.
func (p *Pool) yieldsIdle(cl *call) bool {
	n := p.order.n.Load()
	if cl.avoid != nil || cl.firstDial || n == 0 || n == 1 && cl.ticket != 0 {
		return false
	}
	idle := 0
	for _, c := range *p.conns.Load() {
		if c.accepts(c.avail(), cl) && c.load.Load() == 0 {
			idle++
		}
	}
	return p.order.yields(cl.ticket, idle)
}

// enterOrder gives cl, as it starts waiting for a connection, its ticket;
// not to a rescue nor a query sharing the first dial (see yieldsIdle).
func (p *Pool) enterOrder(cl *call) {
	if cl.avoid == nil && !cl.firstDial {
		cl.ticket = p.order.enter()
	}
}

// leaveOrder takes cl out of the order as it stops waiting, and wakes the
// waiters if one yielded to an older one meanwhile.
func (p *Pool) leaveOrder(cl *call) {
	if cl.ticket == 0 {
		return
	}
	wake := p.order.leave(cl.ticket)
	cl.ticket = 0
	if wake {
		p.slotFreed()
	}
}
