package dot

import (
	"cmp"
	"math"
	"time"
)

// How a query finds its connection: the hot path, every query, lock-free but
// for the connection it registers on. Where it goes depends on how the
// upstream serves a connection (its Mode, learned.go): filled in turn while
// queries wait for nobody (pickInTurn), or one to a connection, as forward
// sends them, when a query put behind another would wait for it (pickIdle).
// How many connections there are is sizing.go's.

const (
	// orderCheckEvery: one query in this many goes behind another on an
	// in-order upstream, to see whether it still answers in order (orderCheckConn).
	orderCheckEvery = 256
	// shareWindow: before the first answer, queries that come this close
	// together (a burst) share a connection (see burstSince).
	shareWindow = 50 * time.Microsecond
)

// accepts reports whether c, in state a (c.avail), may take cl: it takes
// queries, and a rescue goes only to another connection with nothing
// outstanding, so that it is not stuck in turn.
func (c *conn) accepts(a avail, cl *call) bool {
	return a.takes() && (cl.avoid == nil || c != cl.avoid && c.load.Load() == 0)
}

// pick registers cl on a connection that takes it, as the upstream's mode says
// (see pickInTurn, pickIdle), and starts a dial when the pool will soon need
// another connection. It returns nil if no connection had room.
func (p *Pool) pick(cl *call) *conn {
	if p.oneEach() || p.awaitsItsDial(cl) {
		return p.pickIdle(cl)
	}
	if r := p.probedReach(); r != 0 {
		// Slow, out of order, no limit known: within the depth served,
		// then the probe past it, then a connection of its own, for which
		// one that reached the depth is retired once open (probe.go).
		if c := p.pickInTurn(cl, r); c != nil {
			return c
		}
		if c := p.pickProbe(cl); c != nil {
			return c
		}
		return p.pickIdle(cl)
	}
	// A connection that took more than the limit's reach takes no more
	// while another open one has room: it may be past a limit not shown yet.
	c := p.pickInTurn(cl, p.learned.limit.reach())
	if c == nil {
		c = p.pickInTurn(cl, 0)
	}
	if c == nil && cl.within != 0 {
		// No open connection took fewer queries than the replay's cut came
		// after: it goes where any query would, rather than wait for one
		// the out-of-order sizing may not open.
		cl.within = 0
		c = p.pickInTurn(cl, 0)
	}
	return c
}

// oneEach reports whether each query goes to a connection of its own (or
// waits for one dialled for it), as forward sends them, and the pool opens as
// many as the load needs: the upstream is in order, or slowUnknown.
func (p *Pool) oneEach() bool {
	return p.learned.mode.get() == ModeInOrder || p.slowUnknown()
}

// pickInTurn registers cl on the oldest connection with room (and that took
// fewer than reach queries, unless reach is 0), and starts a dial
// when that one is three-quarters full (all older ones being full) or near its
// end (unless its successor is ready), so that the next connection is ready
// before it is needed. Filling connections in turn, as HTTP/2 clients do,
// rather than spreading queries over all of them, keeps the batches of
// queries and answers large: each costs one syscall, and a TLS record read,
// at each end, whatever its size.
//
// With reach, it returns nil rather than dial or wait when no connection has
// room within it: the caller looks again without (see pick), so that reach
// only spreads queries over the connections open, and opens none.
func (p *Pool) pickInTurn(cl *call, reach int32) *conn {
	slots := int32(p.cfg.MaxInflight)                    // per connection
	depth, oldestOnly := p.queueBound()                  // the queries one is given: slots or fewer; the oldest alone queues
	after, now := p.overdueAfter()                       // connections overdue take no more
	serialOnes := p.learned.mode.get() == ModeOutOfOrder // connections serial by their own answers take one at a time (serial.go)
	for range 3 {                                        // losing the last slot to another caller: is retried on a fresh snapshot
		var best, quiet *conn
		oldest := true // no connection that accepts cl was looked at yet
		var load, quietLoad int32
		within := depth            // best takes cl only while it holds fewer (see registerWithin)
		near, more := false, false // best is near its end; every connection with room is quiet
		spares := 0                // newer connections than best that take queries with none outstanding
		counted := 0               // connections that count toward the cap
		served := int64(0)         // unix ns of the latest answer that served a connection's next query
		overdue := false           // a connection with room was passed over as overdue
		serial := false            // a connection with room was passed over as serial (serial.go)
		for _, c := range *p.conns.Load() {
			a := c.avail()
			if p.countsTowardCap(a) {
				counted++
			}
			if depth < slots {
				served = max(served, c.servedAt.Load())
				if oldestOnly {
					// A connection that took a query with none
					// outstanding is served from then on: the
					// load's first queries after an idle spell (see
					// dearQueue) are no pause.
					served = max(served, c.busyAt.Load())
				}
			}
			if !c.accepts(a, cl) || cl.within != 0 && c.taken.Load() >= cl.within || reach != 0 && c.taken.Load() >= reach {
				continue
			}
			l := c.load.Load()
			lim := depth
			if oldestOnly && !oldest {
				lim = 1 // see dearQueue: only the oldest holds a queue
			}
			if serialOnes && c.serial.Load() {
				lim = 1 // its own answers show it serves in order (serial.go)
			}
			oldest = false
			switch {
			case best != nil:
				if a == availTaking && l == 0 {
					spares++
				}
			case l >= lim:
				serial = serial || serialOnes && l < depth && c.serial.Load()
			case c.cappedAt(l):
				overdue = true // full to the bound of its ordered queue: as an overdue one
			case c.overdue(after, now):
				overdue = true
			case a != availQuiet:
				best, load, near = c, l, a == availNearEnd
				if k := c.orderedCap.Load(); k > 0 {
					within = min(within, k) // see cappedAt
				}
			case quiet == nil || l < quietLoad: // the least loaded of the quiet ones
				quiet, quietLoad = c, l
			}
		}
		if best == nil && reach != 0 && !serial {
			// Not past a serial connection busy (serial.go): the query
			// goes as pickIdle sends it, below, rather than past the
			// reach on the one that overtakes (mixed property seed 63:
			// its one out-of-order connection took every query as the
			// others served theirs in order, past a query limit of 809).
			return nil
		}
		if best == nil {
			// Every connection with room is quiet: its queries may wait
			// behind a slow one, so the next connection is dialled now,
			// and the query goes to the least loaded quiet one.
			best, load, more = quiet, quietLoad, true
		}
		queuesServed := best == nil && depth < slots && p.servedLately(served) // queues served: no pause
		if best == nil && !queuesServed && cl.avoid == nil && p.countsTowardCap(availBlocked) && counted >= p.capConns() {
			// Every connection is blocked, the pool takes that for the
			// upstream pausing (see countsTowardCap), and they are as
			// many as it opens: it dials no more. The query goes out on
			// the least loaded one rather than wait unwritten for the
			// pause to end: then it is answered as soon as the upstream
			// resumes, as forward's would be, not an answer time or a
			// move later (issue 21, seed 97). Not while queueBound
			// bounds the queues and they are served (queuesServed): then
			// the connections with room are merely full to their
			// bound, the blocked one is stuck behind a slow answer of
			// its own, and the query goes as pickIdle sends it, below
			// (a dial of its own, as forward's). Put behind the
			// blocked one, every query that came queued there and an
			// in-order upstream served them a slow answer time each
			// (property seed 77: 46 deep behind the first dial's
			// three, rescued as in order was learned, into a stall;
			// TestServingUpstreamQueuesNothingBehindTheBlocked).
			best, load = leastLoadedBlocked(*p.conns.Load(), slots)
			within = slots
		}
		if best == nil && cl.within == 0 && (overdue || queuesServed || oldestOnly || serial) {
			// Every connection with room holds a queue that, were the
			// upstream in order, would take longer than a dial, and
			// queues are being served, or waits for an overdue answer,
			// or a queue is dear (oldestOnly: the oldest holds its one,
			// the others theirs; in a pause, none takes one, see
			// dearQueue): the query goes as pickIdle sends it (an idle
			// connection, or a dial of its own). Not a
			// replay held by its cut: it looks at the open connections
			// again without it first (pick), and a dial pickIdle started
			// for it was left a spare when it took a slot there
			// (TestReplayBeyondItsCutDialsNone).
			return p.pickIdle(cl)
		}
		if best == nil {
			return nil
		}
		if best.registerWithin(cl, int(within)) {
			// A connection near its end whose successor is ready (a
			// newer one idle, waiting its turn) dials no other if it took
			// longer than a dial to get here from its first query: the
			// successor lasts as long, and dials its own in time.
			// Dialling one for each query past half the limit kept the
			// cap's worth of idle successors open (property seed 155: 6
			// connections at 42 QPS, a query limit of 5, against
			// forward's 5). A server that uses a connection up faster
			// than a handshake needs several successors at once, and gets
			// them (TestRegimeChurn).
			if near && spares > 0 && nanotime()-best.takenAt.Load() > p.dialTime.Load() {
				return best
			}
			if (near || more || load+1 >= slots*3/4) && (near || counted < p.capConns()) && p.dialing.Load() < maxParallelDials {
				p.dialNow()
			}
			return best
		}
	}
	return nil
}

// servedLately reports whether a connection's queue was served (its next
// query answered, at served) within two usual answer times (a millisecond at
// least): queues then move, one answer time a query. When the upstream
// resumes after a pause, every answer due comes at once; the tick's view
// (servingAt, in queueDepth) lags that by a tick, and this one, exact, does
// not see the pause that made the queues: both are asked.
func (p *Pool) servedLately(served int64) bool {
	return nanotime()-served < max(2*p.learned.mode.usual.Load(), int64(time.Millisecond))
}

// leastLoadedBlocked returns the least loaded blocked connection of conns
// with room, and its load: pickInTurn's last resort, off its common path.
func leastLoadedBlocked(conns []*conn, slots int32) (*conn, int32) {
	var best *conn
	load := slots
	for _, c := range conns {
		if l := c.load.Load(); c.avail() == availBlocked && l < load {
			best, load = c, l
		}
	}
	return best, load
}

// pickLooks is how many times pickIdle looks at the connections for one pick.
const pickLooks = 3

// pickIdle, when queries go one to a connection (oneEach), registers cl on a
// connection with nothing outstanding: the warm ones in turn, then the oldest
// (see warmOrder). If there is none it returns nil,
// so that the caller waits for a connection dialled for it or the first to
// become idle (dialForWaiter: a query written behind another waits for it); if
// no dial may start, it registers cl on the least loaded one (the one written
// to last among those). Before the first answer, a query of a burst joins the
// connection the burst is on instead (see burstSince). In order, it starts a
// dial when fewer than inOrderSpares idle ones are left (none are kept by
// default: forward keeps none). A rescue takes no connection while a query
// waits for one of its own.
//
// It looks up to pickLooks times: a register can fail to a query that took
// the connection first, and a dial can end between a look and its ask.
func (p *Pool) pickIdle(cl *call) *conn {
	if cl.avoid != nil && p.waiters.Load() > p.rescuers.Load() {
		// A rescue yields to a query that waits for a connection of its
		// own: that one dialled for itself (dialForWaiter), and the rescue
		// taking it would have it dial again, one connection per rescue
		// (issue 21, seed 78). The rescue's own call may still be answered.
		// Not yielding for the rescues of the first connection's queue
		// (queries that came before the pool had a connection), each owed
		// a dial as a waiting query is, was neutral: 11.0 seeds failing
		// per strict run (10 runs) against 11.25 (12), seed 132 in 8 of
		// 10; those rescues went out before its peak, but the slow names
		// among them, served late, still held connections through it.
		return nil
	}
	var burst *conn
	burstSince := p.burstSince(cl)
	if burstSince != math.MaxInt64 && !cl.burstStart && p.firstDialBurst(cl, burstSince) {
		return nil // it waits for the pool's first connection
	}
	reach := p.probedReach() // a connection that took as many takes one query, idle (probe.go)
	// Under a learned query limit while the mode is unknown, the idle
	// connection served last (or dialled last) is taken, as forward's stack
	// of idle connections gives them: the pool's cuts then fall as forward's
	// do (steady property seed 3: a connection over forward's in 24 % of
	// replays taken oldest first, 15 % so). Not in order: there it broke
	// property seed 7 in every replay (7 connections against forward's 5).
	lifo := p.learned.limit.get() > 0 && p.learned.mode.get() == ModeUnknown
	for look := range pickLooks {
		var best *conn
		load, idle := int32(p.cfg.MaxInflight), 0
		within := p.cfg.MaxInflight // best takes cl only while it holds fewer (see registerWithin)
		looked := p.conns.Load()    // the snapshot this look is of (see dialForWaiter)
		conns := *looked
		if look == pickLooks-1 {
			looked = nil // the last look dials whatever changed (see dialForWaiter)
		}
		warm, turn := p.warmOrder(len(conns))
		for i := range conns {
			c := conns[inTurn(i, warm, turn)]
			if !c.accepts(c.avail(), cl) || reach != 0 && c.taken.Load() >= reach && c.load.Load() != 0 {
				continue
			}
			l := c.load.Load()
			if burstSince != math.MaxInt64 && burst == nil && l > 0 && l < int32(p.cfg.MaxInflight) && c.pickedAt.Load() > burstSince {
				burst = c
			}
			if l == 0 && !c.nearEnd.Load() { // near its end: taking, but no spare
				if idle++; idle > inOrderSpares && best != nil && load == 0 && !lifo {
					break // an idle one is taken, and the spares are left after it
				}
			}
			// The least loaded; among busy ones, the one written to last: a
			// query that has been out long is likelier a slow one.
			if l < load || best != nil && l == load && l > 0 && c.wroteAt.Load() > best.wroteAt.Load() ||
				lifo && best != nil && l == 0 && load == 0 && max(c.servedAt.Load(), c.born) > max(best.servedAt.Load(), best.born) {
				best, load = c, l
			}
		}
		if load == 0 && best != nil && p.yieldsIdle(cl) {
			return nil // an idle connection, but an older waiter's: see waitOrder
		}
		var seen *conn // best, if it was idle when looked at
		if load == 0 {
			seen = best
		}
		var check *conn // the connection an order check goes on
		if cl.avoid == nil && !cl.waited && !p.noOrderChecks.Load() && (p.orderCheckDue.Load() || p.orderCheckRolled()) {
			// An order check is due until one finds a connection to go on.
			// Rolled by a query before it waits (acquire's pick and
			// acquireSlow's first look), not on its picks after a wake,
			// which come as often as slots free
			// (TestWaitingQueryIsNoOrderCheck). In a storm, it is held a
			// while (orderCheckHeld).
			if p.orderCheckHeld() {
				p.orderCheckDue.Store(true)
			} else {
				pc := p.orderCheckConn(cl)
				p.orderCheckDue.Store(pc == nil)
				if pc != nil {
					p.checkHeldAt.Store(0)
				}
				best, check = cmp.Or(pc, best), pc
			}
		}
		if idle == 0 && cl.avoid == nil && (burst != nil || p.joinsFirst(cl) && load < int32(p.cfg.MaxInflight)) {
			// A burst before the first answer, or a query that waited
			// for the pool's first connection: see firstDialBurst.
			best = cmp.Or(burst, best)
		} else if f := p.joinFirst(cl, conns, idle); f != nil {
			// One that dialled before the pool had a connection: see
			// joinFirst.
			best, within = f, firstDialShareMax
		} else if idle == 0 && load > 0 && cl.avoid == nil && p.cfg.MaxConns == 0 {
			// No connection is idle (one near its end, idle, is taken:
			// load 0): as forward does, the query waits for a new one
			// rather than go behind a busy one, but takes the first that
			// becomes idle if that is sooner (acquireSlow).
			switch p.dialForWaiter(cl, looked) {
			case waitForDial:
				return nil
			case lookAgain:
				continue
			}
		}
		if best == nil {
			return nil
		}
		cl.orderCheck = check != nil && best == check
		if reach != 0 && best.taken.Load() >= reach {
			// At the depth served (only idle ones are picked there): one
			// query at a time, as forward's (probe.go).
			within = 1
		}
		if cl.ticket != 0 && best == seen && within == p.cfg.MaxInflight && !cl.orderCheck {
			// A waiter takes a connection it saw idle only while it still
			// is. Waiters woken together (a dial's end) all see it idle;
			// one that counted it idle before its older waiter took it,
			// and asked the order after that one had left it, yielded to
			// none (see yieldsIdle) and went on it behind that one: in
			// order, an answer time more (TestFirstDialSharedByNoneApart,
			// 10 of 100 runs under -race). The register fails then, and it
			// looks again. Only a waiter in the order (ticket): a query
			// that has not waited goes on as before, so that a fast
			// upstream's picks, which race each other for one connection
			// all the time, never fail a register and dial for it (with
			// every pick so, make bench's unbound regime dialled: 9bf8356).
			within = 1
		}
		if p.seatWithin(best, cl, within) {
			if cl.orderCheck {
				p.checksOwed.add(nanotime(), p.learned.mode.usual.Load()) // see checkOwesWaiter
			}
			if burstSince != math.MaxInt64 {
				best.pickedAt.Store(nanotime())
			}
			// In order, the next connection is dialled when none is left
			// idle; not while the mode is unknown: each dial then is for a
			// query that waits (the property test found these spares to
			// be connections more than forward opens). Asked of the mode,
			// not as !slowUnknown: the first answer, timing a fast
			// upstream while this query picked, made that true, and the
			// pool dialled a spare for a pipelined upstream (under -race,
			// TestDialIsSharedAndSurvivesCallerCancel saw 2 dials in
			// about 3 runs of 100, on main too).
			if idle <= inOrderSpares && p.learned.mode.get() == ModeInOrder && p.dialing.Load() < maxParallelDials {
				p.dialNow()
			}
			return best
		}
	}
	return nil
}

// warmOrder returns how many of the n oldest connections pickIdle takes in
// turn (the warm ones: what the load needed over the last inOrderKeep, see
// keepInOrder) and where this pick's turn starts among them. Taken always
// oldest first, the warm connections beyond the load's usual need sat idle,
// and a server that closes idle connections (dnsdist: after 2 s) closed them:
// 134 such closes in a dnsdist-slow run, and the burst they were kept for
// found them gone and waited for dials. Taken in turn, each carries a query
// every few milliseconds, as forward's do; the newer ones, beyond, are taken
// only when the warm ones are busy, and close when idle (sweepAll).
//
// Not under a learned query limit: taken in turn, the warm connections
// reached the limit together, and the pool redialled them all at once
// (property seed 7: four cut within 44 ms, then seven dials for the burst
// that came next, against forward's five). Taken oldest first, one is used
// up after another, as forward's stack of idle connections (the most
// recently used on top) uses them (TestLimitedConnectionsUsedUpOneAfterAnother).
func (p *Pool) warmOrder(n int) (warm, turn int) {
	warm = min(int(p.warm.Load()), n)
	if warm < 2 || p.learned.limit.get() > 0 {
		return 0, 0
	}
	return warm, int(p.warmTurn.Add(1) % uint32(warm))
}

// inTurn is the connection pickIdle looks at i-th: the warm ones from turn
// on, round, then the rest in creation order.
func inTurn(i, warm, turn int) int {
	if i >= warm {
		return i
	}
	return (i + turn) % warm
}

// burstSince is, before the pool's first answer, the time after which a
// connection that was given a query is on a burst that cl, arriving now, is
// part of (shareWindow ago); MaxInt64 otherwise, or for a query that waited
// (its pick is no arrival).
func (p *Pool) burstSince(cl *call) int64 {
	if p.learned.mode.usual.Load() != 0 || p.learned.mode.get() != ModeUnknown || cl.waited {
		return math.MaxInt64
	}
	return nanotime() - int64(shareWindow)
}

// dialForRescue starts a dial, within what the load needs (see neededNow),
// for a rescue of a query stuck on c that waits for a connection with nothing
// outstanding, unless one is sooner: the stuck query is answered before a dial
// would be done (in order, c's queries are answered a usual answer time
// apart), or enough dials are under way or connections free before then
// (freeingSoon) for every waiting query, or (in order, a dial longer than an
// answer) a dial is under way already.
func (p *Pool) dialForRescue(c *conn) {
	u, d := p.learned.mode.usual.Load(), p.dialTime.Load()
	if p.learned.mode.get() == ModeInOrder && int64(c.load.Load())*u < d {
		return
	}
	soon := p.freeingSoon(nanotime())
	p.mu.Lock()
	defer p.mu.Unlock()
	if int(p.waiters.Load()) <= p.dials+soon {
		return
	}
	if p.learned.mode.get() == ModeInOrder && p.dials > 0 && d > u {
		// In order, with a dial longer than an answer, rescues go one
		// dial at a time: the queue's connection serves one of them each
		// answer time meanwhile, and the connections already open free
		// theirs as often, so that a dial for each rescue at once was
		// done when the queue was nearly served, one connection more
		// than forward's for each (issue 21, property seed 79: 42 ms
		// handshakes, 9 ms answers, three rescue dials at once, 10
		// connections against forward's 9).
		return
	}
	p.startDialLocked(0, false)
}

// freeingSoon counts the connections with one query outstanding whose answer
// is due (written a usual answer time ago) from now until a dial would be
// done: a query that waits for one of them is served sooner than one that
// waits for a handshake. One whose answer is overdue is not counted: it may
// be a slow one.
func (p *Pool) freeingSoon(now int64) int {
	u, d := p.learned.mode.usual.Load(), p.dialTime.Load()
	if u == 0 || d == 0 {
		return 0
	}
	n := 0
	for _, c := range *p.conns.Load() {
		if c.load.Load() != 1 || !c.avail().takes() {
			continue
		}
		if due := c.wroteAt.Load() + u; due >= now && due < now+d {
			n++
		}
	}
	return n
}
