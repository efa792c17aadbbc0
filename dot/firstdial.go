package dot

import "time"

// The pool's first dial, before the first answer: which queries share it and
// which dial one of their own. Nothing tells yet a slow upstream from a fast
// one that shakes hands slowly, nor an in-order one from one that is not. The
// burst that starts the first dial shares it, and its answers tell how the
// upstream serves; a query that comes later while a slow handshake is under
// way dials, as forward does: shared, a slow handshake gathered every query
// of its time on one connection, which an in-order upstream served one after
// the other (issue 21, seeds 29, 45, 79, 149).

// firstDialShare: the queries that come within this of the start of the
// pool's first dial share it, as a burst does (see firstDialBurst): a nearby
// upstream's handshake takes less, and a cold start opens one connection, not
// one per query of its handshake's time.
const firstDialShare = 10 * time.Millisecond

// firstDialBurst reports, for a query that arrives before the pool has a
// connection, whether it shares the dial under way: it comes within
// shareWindow of the last query that came so (after since), a burst, or
// within firstDialShare of the first dial's start, or it already shares
// (cl.firstDial). Any other starts a burst: the first dial, here, if none is
// under way, or later a dial of its own (dialForWaiter, as any query that
// finds no connection idle). The decision and the first dial's start are one
// step under p.mu, so that queries that come together cannot each see no dial
// under way and each start one. A query that shares counts in p.sharers
// until it stops waiting (endShare): it is owed no dial of its own.
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
	if cl.firstDial || p.dials > 0 && (p.firstDialAt > since || now-p.firstDialFrom < int64(firstDialShare)) {
		p.firstDialAt = now
		if !cl.firstDial {
			cl.firstDial = true
			p.sharers.Add(1)
		}
		return true
	}
	if p.dials == 0 && p.startDialLocked(0, true) {
		p.firstDialFrom = now
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
// six queries that came together.
func (p *Pool) owedDials() int {
	return int(p.waiters.Load() - p.rescuers.Load() - p.sharers.Load())
}

// joinsFirst reports whether cl, finding no connection idle, goes on the
// least loaded one rather than wait for a dial: it is of a burst that shared
// the pool's first dial, or, before the first answer, it dialled for itself
// before the pool had a connection and another query took that one (the
// first to wake takes a new connection). Waiting for yet another dial, one
// per query that came later, it could wait a handshake or more for each
// (issue 21, seeds 74 and 107: 119 ms against forward's 83, 32 against 20).
func (p *Pool) joinsFirst(cl *call) bool {
	return cl.firstDial || cl.sharesNext || cl.burstStart && p.learned.mode.usual.Load() == 0
}
