package dot

import (
	"cmp"
	"slices"
)

// Ordered queues: a connection's own evidence that its server, taken for out
// of order, serves the queries past a few in write order.
//
// Out of order, pickInTurn fills the oldest connection with room, up to
// MaxInflight. A server that works on at most k of a connection's queries at
// once and queues the rest in order (dnsdist's maxInFlight) answers a query
// written behind d others about d/k answer times later, where forward's waits
// for none. The depth cost (depthcost.go) bounds that, but only from two fits
// of answers across connections, and only for the queries written after it:
// mixed property seed 29 (k = 4, handshakes of 37 ms, answers of about 6 ms)
// learned out of order at 46 ms from the answers overtaking among the four,
// filled the oldest connections with 100-130 queries each, and had its depth
// cost at 99-185 ms; the queries written on them meanwhile were answered
// 100-130 ms later (p99 117-246 ms against the model's 66, 5 replays of 5).
// Such a connection reads all the while, so it is never quiet, and
// rescueStuck never sees it.
//
// So on each tick, out of order, the sweeper looks at the connections
// holding more than minQueueDepth: a written query there waits in an ordered
// queue when its connection has since read orderedReads answers or more,
// none to a query written after it (lastServed), and the queries still ahead
// of it, at the spacing those answers came at, hold it longer than a fresh
// attempt takes (orderedWorth: a dial and a usual answer time, 20 ms at
// least). Then the connection takes no more than the depth that waits
// depthFloor (orderedCap, for its life: a connection's server does not
// change under it), a query finding every connection full goes as pickIdle
// sends it (a connection idle, or a dial of its own), and the queries so held
// are rescued (rescue.go: sent once more on a connection with nothing
// outstanding, the first answer of the two wins, the loser's dropped and
// counted) at in order's cost of the budget: past k, the queue is served in
// order. Seed 29 then passed in 5 strict runs of 5 and 10 replays of 10, and
// 34 (balanced to 5 and 2 at once) in 5 of 5 too; 78 failed in 5 of 5 (5 of
// 9 before): with its deep queries rescued, the depth cost was fitted at 0.8
// ms where 1.4 was, and its cut to an in-order server then left the new
// connections bounded at 6 queries, not 3. Not where the reader is
// behind (answers unread in the socket: a busy machine's hiccup, not the
// server), and the pool's own hold-up is not counted as the queue's time
// (as overdue does). A fast out-of-order upstream's queues never wait that
// long: make bench's unbound answers a connection's queries tens of
// microseconds apart, and 128 of them ahead wait a few milliseconds.

// orderedReads: the answers a connection must have read since a query was
// written for their spacing to time the queue ahead of it.
const orderedReads = 4

// orderedWorth is the wait ahead (ns) that a fresh attempt beats: a dial and
// a usual answer time, and 2 x minRescueDelay at least.
func (p *Pool) orderedWorth() int64 {
	return max(2*int64(minRescueDelay), p.dialTime.Load()+p.learned.mode.usual.Load())
}

// watchOrderedQueues finds, out of order and with no connection cap, the
// connections whose queries wait in an ordered queue (see above), bounds
// them and rescues those queries. The sweeper's, on each tick.
func (p *Pool) watchOrderedQueues(w *stuckWatch, conns []*conn) {
	if p.cfg.MaxConns > 0 || p.learned.mode.get() != ModeOutOfOrder {
		return
	}
	ow := *w
	ow.cost = rescueCost[ModeInOrder]
	worth := p.orderedWorth()
	for _, c := range conns {
		if c.load.Load() > minQueueDepth {
			c.rescueOrderedQueue(&ow, worth)
		}
	}
}

// rescueOrderedQueue bounds c and rescues its queries waiting in an ordered
// queue more than worth ns (see above).
func (c *conn) rescueOrderedQueue(w *stuckWatch, worth int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateClosed {
		return
	}
	out := c.writtenLocked()
	reads, checked := c.reads.Load(), false
	for i, cl := range out {
		since := reads - cl.readsAt.Load()
		if cl.tombUntil != 0 || since < orderedReads || c.lastServed >= cl.seq {
			continue
		}
		spacing := c.pool.unheld(cl.sentAt.Load(), w.now) / since
		if int64(i)*spacing <= worth {
			continue
		}
		if !checked {
			// Asked once, and last: it costs a syscall (see watch).
			if c.bc.unread() {
				return
			}
			checked = true
		}
		if c.orderedCap.Load() == 0 {
			c.orderedCap.Store(int32(max(int64(depthFloor)/max(spacing, 1), minQueueDepth)))
		}
		if cl.rescuable && !cl.rescued && cl.deadline-w.now >= worth && *w.tokens >= w.cost {
			w.tellLocked(cl)
		}
	}
}

// cappedAt reports whether c, holding l queries, is full to the bound of
// its ordered queue (orderedCap), if it has one: pickInTurn passes it over.
func (c *conn) cappedAt(l int32) bool {
	k := c.orderedCap.Load()
	return k > 0 && l >= k
}

// writtenLocked returns c's written calls still outstanding, live or
// tombstones, in write order. c.mu must be held.
func (c *conn) writtenLocked() []*call {
	var out []*call
	for cl := range c.calls.all() {
		if cl.tombUntil != 0 || cl.state.Load() == callSent {
			out = append(out, cl)
		}
	}
	slices.SortFunc(out, func(a, b *call) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// unheld is the time from since to now less the part of the pool's last
// hold-up that came after since (see overdue).
func (p *Pool) unheld(since, now int64) int64 {
	d := now - since
	if end := p.heldUntil.Load(); end > since {
		d -= min(p.heldFor.Load(), end-since)
	}
	return d
}
