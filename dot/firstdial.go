package dot

// The pool's first dial, before the first answer: which queries share it and
// which dial one of their own. Nothing tells yet a slow upstream from a fast
// one that shakes hands slowly, nor an in-order one from one that is not. The
// burst that starts the first dial shares it, and its answers tell how the
// upstream serves; a query that comes apart from it (past shareWindow) while
// the dial is under way dials, as forward does: shared, a slow handshake
// gathered the queries of its time on one connection, which an in-order
// upstream served one after the other (issue 21, seeds 29, 45, 79, 149). For
// the same reason no more than firstDialShareMax go on the first connection
// for having dialled before it opened (seeds 132, 35).
//
// Queries that came within 10 ms of the first dial's start shared it too (up
// to 16, firstDialShare): a bet that the upstream is fast, which one that
// answers in order in tens of milliseconds, or is slowed as the connection
// opens, loses by up to 16 answer times. Property seeds 36, 46, 82, 117 and
// 120 failed in 27 to 34 of 34 strict runs with it, in none of 17 without;
// 71, 79, 132 and 78, whose extra connections its queue saved, fail now (13
// to 17 of 17; with it 12, 0, 1 and 1 of 34): 15.1 seeds failed per strict
// run against 18.4. A window of 1 ms did no better than 10 (18.0 and 18.5
// seeds failing, 4 strict runs each).

// firstDialShareMax: at most this many queries go on the pool's first
// connection for having dialled before it opened (see joinFirst). The next
// ones wait for their dials, as forward's would. An in-order upstream serves
// the queries on one connection one after the other; uncapped, a slow
// handshake (37 ms) at 2,784 QPS gathered about 60 of the queries that came
// during it, and they waited 400-450 ms (issue 21, seed 132; seed 35: 55 on a
// connection the server cut after 6 answers).
const firstDialShareMax = 16

// firstDialBurst reports, for a query that arrives before the pool has a
// connection, whether it shares the dial under way: it comes within
// shareWindow of the last query that came so (after since), a burst, or it
// already shares (cl.firstDial). Any other starts a burst: the first dial,
// here, if none is under way, or later a dial of its own (dialForWaiter, as
// any query that finds no connection idle). The decision and the first
// dial's start are one step under p.mu, so that queries that come together
// cannot each see no dial under way and each start one. A query that shares
// counts in p.sharers until it stops waiting (endShare): it is owed no dial
// of its own.
func (p *Pool) firstDialBurst(cl *call, since int64) bool {
	if len(*p.conns.Load()) > 0 {
		return false // the common case before the first answer, off the lock
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(*p.conns.Load()) > 0 {
		return false
	}
	now := nanotime()
	if cl.firstDial || p.dials > 0 && p.firstDialAt > since {
		p.firstDialAt = now
		if !cl.firstDial {
			cl.firstDial = true
			p.sharers.Add(1)
			p.firstShared.Add(1)
		}
		return true
	}
	if p.dials == 0 && p.startDialLocked(0, true) {
		p.firstShared.Store(0)
		p.firstJoined.Store(0)
		cl.startsFirst = true
		p.untimedSince.CompareAndSwap(0, now)
	}
	p.firstDialAt = now
	cl.burstStart = true
	return false
}

// endShare is for a query leaving acquireSlow: if it shared the first dial
// (firstDialBurst), it no longer counts in p.sharers. The count is taken out
// after the query left p.waiters, so that waiting queries owed a dial (see
// owedDials) are never more than the real ones.
func (p *Pool) endShare(cl *call) {
	if cl.firstDial {
		p.sharers.Add(-1)
	}
}

// owedDials is how many waiting queries are each owed a connection of their
// own (dialForWaiter): not rescues, which yield to them (see pickIdle), nor
// those that share the pool's first dial (firstDialBurst). Counting these too
// had the one that started the first dial start another for each of them:
// under -race, TestDialIsSharedAndSurvivesCallerCancel saw 2 or 3 dials for
// six queries that came together. Nor those an order check spares a dial
// (checkOwesWaiter): counted, another waiter dialled for each, and the dial
// served nobody (steady property seed 80: 56 connections against forward's
// 55, the last dial taken by none).
func (p *Pool) owedDials() int {
	return int(p.waiters.Load() - p.rescuers.Load() - p.sharers.Load() - p.sparedWaiters.Load())
}

// joinsFirst reports whether cl, finding no connection idle, goes on the
// least loaded one rather than wait for a dial: it is of a burst that shared
// the pool's first dial, or started that dial (its burst took the
// connection), or waited while every connection was lost.
func (p *Pool) joinsFirst(cl *call) bool {
	return cl.firstDial || cl.startsFirst || cl.sharesNext
}

// joinFirst returns the pool's first connection for cl, finding no
// connection idle (idle 0) and not a rescue, if cl dialled for itself before the pool had one, no
// answer came yet, fewer than firstDialShareMax queries are on it, and fewer
// such queries joined it than shared its dial; nil otherwise, and cl waits
// for a dial. The queries that shared the first dial took no connection of
// their own, as forward's would have, and one that joins in place of each
// leaves its own dial, once done, to the queries that come next: forward's
// connections freed there. With none joining, in order, the pool opened
// 2-5 connections more at once than forward (issue 21, seeds 79, 119, 149,
// in 1 replay of 1 each) and seed 92 answered 56 queries of forward's 58.
// With any number joining, each waited behind the first connection's queue
// for no connection: the waiting order (waitOrder) hands a query the dial
// started for it, or an older one's, never a newer one's, and in order a
// join costs an answer time or more (seed 45: 87 ms answers, a 28 ms
// handshake and none sharing; two that came 11 and 21 ms after the first
// joined it and waited 277 ms against forward's 115). Joined only in
// place of a sharer, 45 passed in 8 replays of 8, and 79, 119, 149 and 74
// kept passing. A join whose register then fails keeps its count: the
// joins are at most as many as the sharers, never more. Any number joining
// the connection, or joining any connection, an in-order upstream served
// them one after the other (seed 132: p99 390-550 ms against forward's
// 223, with up to 8 on each connection).
func (p *Pool) joinFirst(cl *call, conns []*conn, idle int) *conn {
	// Asked only where it would join (none idle, no rescue): a join is
	// counted as it is granted.
	if idle > 0 || cl.avoid != nil || !cl.burstStart || len(conns) == 0 || p.learned.mode.usual.Load() != 0 {
		return nil
	}
	// The sharers still waiting, woken with cl when the connection opened,
	// are not counted: counted, they left the connections dialled for the
	// queries that came later to these, and in order the pool opened more
	// than forward (property seeds 119 and 149: 132-136 connections at
	// once against the model's 127 and 129, in 4 replays of 4).
	c := conns[0]
	if !c.accepts(c.avail(), cl) || c.load.Load() >= firstDialShareMax {
		return nil
	}
	for {
		j := p.firstJoined.Load()
		if j >= p.firstShared.Load() {
			return nil
		}
		if p.firstJoined.CompareAndSwap(j, j+1) {
			return c
		}
	}
}
