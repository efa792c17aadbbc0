package dot

import (
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Order checks: now and then a query goes behind another on purpose, and its
// answer shows whether the upstream serves a connection's queries in order
// or side by side. Where each query goes on a connection of its own
// (pickIdle), they are the pool's only view of that.

// orderCheckConn returns a connection with one query outstanding, written within
// twice the usual answer time (at least a millisecond), the latest such, or
// nil. A query put behind it on purpose shows, if its answer overtakes the one
// before, that the upstream no longer answers in order; if the one before is
// slow after all, the order check is rescued like any other query.
func (p *Pool) orderCheckConn(cl *call) *conn {
	recent := nanotime() - max(2*p.learned.mode.usual.Load(), int64(time.Millisecond))
	var best *conn
	for _, c := range *p.conns.Load() {
		if w := c.wroteAt.Load(); c.accepts(c.avail(), cl) && c.load.Load() == 1 && w > recent {
			best, recent = c, w
		}
	}
	return best
}

// orderCheckRolled rolls whether the query about to pick is an order check:
// one in orderCheckRate; while the upstream is slow and unknown, only when
// one is cheap (slowCheckCheap).
//
// While slow and unknown, every other query goes on a connection of its
// own, as forward sends it, and a check is there only to show an upstream
// that serves side by side. An in-order one serves it only after the query
// it went behind, a whole slow answer later: in a small load, that wait is
// the p99; in one that grows, it moves the check's service, and its
// connection's, that much later, onto a higher load, one connection more
// than forward's at its peak. Property seeds 2, 64, 186 and 194 (in order,
// lognormal, pareto or constant answer times of 30-180 ms) failed so by a
// check's luck: 329 connections against forward's 328, 396 against 395, 51
// against 50, a p99 of 155 ms against 85 (83 queries, one a check), in 2-7
// replays of 20 each. With no check while slow and unknown, none failed in
// 20 replays each; but an upstream that serves side by side was then never
// learned (TestUniformlySlowSteadyLoadLearnedSideBySide,
// TestTurnsUpstreamEndsOnFewConnections): steady, its checks are cheap.
func (p *Pool) orderCheckRolled() bool {
	return rand.Uint32()%p.orderCheckRate() == 0 && (!p.slowUnknown() || p.slowCheckCheap())
}

// orderCheckHeld reports whether a due order check waits for a later query:
// while answers come slow (answersStormy), for up to orderCheckHoldMax since
// the first it was held for. In a storm a check put behind another waits
// that one's slow answer; rescued, it is served twice, once on the
// connection it was put on once that answer comes, once on the rescue's,
// two connections busy for it where forward had one (property seed 184: a
// check put behind a query answered 61 ms later, on 4 ms answers, rescued
// after 11 ms into a stall, 336 connections at the peak against forward's
// 335). A check is a test the pool can defer that long: held no longer, it
// still corrects a wrong in-order belief within a second of when it was due.
func (p *Pool) orderCheckHeld() bool {
	if !p.answersStormy() {
		p.checkHeldAt.Store(0)
		return false
	}
	now := nanotime()
	since := p.checkHeldAt.Load()
	if since == 0 {
		p.checkHeldAt.CompareAndSwap(0, now)
		return true
	}
	return now-since < int64(orderCheckHoldMax)
}

// answersStormy reports whether an answer to a query not an order check
// took stormFactor usual answer times (and 2 minWatchInterval) within the
// last two usual answer times.
func (p *Pool) answersStormy() bool {
	at := p.stormAt.Load()
	return at != 0 && nanotime()-at < 2*p.learned.mode.usual.Load()
}

// noteStormy records, for answersStormy, an answer that took took, read
// at now, if it took stormFactor usual times u (and 2 minWatchInterval).
func (p *Pool) noteStormy(took, now, u int64) {
	if u > 0 && took > max(stormFactor*u, 2*int64(minWatchInterval)) {
		p.stormAt.Store(now)
	}
}

// stormFactor: an answer this many usual times slow marks a storm.
const stormFactor = 3

// orderCheckHoldMax: the longest a due order check is held (orderCheckHeld).
const orderCheckHoldMax = time.Second

// slowCheckCheap reports whether an order check, the upstream slow and
// unknown, now costs little against forward: the pool has read
// minSlowCheckReads answers, and no connection took its first query for two
// usual answer times (the load does not grow, so that the service a check
// moves later lands on no higher a load). Asked only of a query that
// rolled a check: it looks at every connection.
func (p *Pool) slowCheckCheap() bool {
	reads, newest := p.closedReads.Load(), int64(0)
	for _, c := range *p.conns.Load() {
		reads += c.reads.Load()
		newest = max(newest, c.takenAt.Load())
	}
	return reads >= minSlowCheckReads && nanotime()-newest >= 2*p.learned.mode.usual.Load()
}

// minSlowCheckReads: while the upstream is slow and unknown, no order check
// goes out before the pool has read this many answers: the p99 of fewer is
// their slowest answer, which a check waiting an answer time behind another
// would be.
const minSlowCheckReads = 100

// checkOwesWaiter reports whether cl, a query that finds no connection idle,
// waits for one to free rather than dial, in place of an order check: no
// more such queries wait (sparedWaiters) than checks are in the answer time
// they cost (checksOwed.owing), and a connection's answer is due before a
// dial would be done, or overdue (answerDueBy). Asked again at each of cl's
// picks, a wake or a recheck (a dial's time, recheckAfter) apart, until it
// is no longer so and cl dials.
//
// In order, a check put at t behind a query written at t0 is served once
// that one is answered (t0+T) and holds its connection to t0+2T, where
// forward, with the check on a connection of its own, freed both by t+T. So
// from t+T the pool has one connection busy that forward has free, and a
// query that then finds none idle would, under forward, have taken that
// one: it dials no more than forward would. It waits about until the next
// answer (the pool is that busy: answers come about an answer time over
// the connections in use apart), where a dial it started would add a
// connection forward never opened (steady seeds 75 and 94: constant 104
// and 40 ms, paced; 181 connections against forward's 180, 76 against 74,
// each extra dial for a query that took a connection freed 0.1 ms later).
func (p *Pool) checkOwesWaiter(cl *call) bool {
	now, u := nanotime(), p.learned.mode.usual.Load()
	if !cl.spared {
		n := p.sparedWaiters.Add(1) // counted first: two waiters asking at once are not both spared for one check
		if int(n) <= p.checksOwed.owing(now, u) && p.answerDueBy(now+p.dialTime.Load()) {
			cl.spared = true // until it stops waiting or acquireSlow returns (endSpared)
			return true
		}
		p.sparedWaiters.Add(-1)
		return false
	}
	if int(p.sparedWaiters.Load()) <= p.checksOwed.owing(now, u) && p.answerDueBy(now+p.dialTime.Load()) {
		return true
	}
	p.endSpared(cl)
	return false
}

// endSpared takes cl, if spared a dial, out of sparedWaiters: it dials after
// all, or leaves acquireSlow.
func (p *Pool) endSpared(cl *call) {
	if cl.spared {
		cl.spared = false
		p.sparedWaiters.Add(-1)
	}
}

// checksOwed holds when each of the latest order checks went behind another
// (0: none yet), lock-free: a check is written about an answer time over
// orderCheckEvery queries, and an answer time or two of them overlap at a
// few thousand queries a second (steady seed 94: checks 6 and 22 ms apart
// on 40 ms answers, 2 connections busy at once that forward had free).
type checksOwed [4]atomic.Int64

// add records a check that went behind another at now, in a slot free or
// past its due (over two usual answer times u old); with none, the check
// owes nothing.
func (o *checksOwed) add(now, u int64) {
	for i := range o {
		if at := o[i].Load(); (at == 0 || now-at > 2*u) && o[i].CompareAndSwap(at, now) {
			return
		}
	}
}

// owing is how many checks owe a connection at now: each from half a usual
// answer time u after it went behind another to two after. It costs from
// when forward would have answered it (about u after, as its answer time
// varies) to when the pool does (at most 2u after: it went behind a query
// written within 2u, see orderCheckConn). A waiter spared before that cost
// begins waits no longer than a dial would take (answerDueBy), and leaves
// the pool no more connections than forward's.
func (o *checksOwed) owing(now, u int64) int {
	n := 0
	for i := range o {
		if at := o[i].Load(); at != 0 && now >= at+u/2 && now <= at+2*u {
			n++
		}
	}
	return n
}

// answerDueBy reports whether a connection taking queries, with one
// outstanding, is due to answer it by the time by (a usual answer time after
// it was written), or was due already: unlike freeingSoon, an answer a
// little late (a jitter of a few percent) counts.
func (p *Pool) answerDueBy(by int64) bool {
	written := by - p.learned.mode.usual.Load()
	for _, c := range *p.conns.Load() {
		if c.load.Load() == 1 && c.avail().takes() && c.wroteAt.Load() <= written {
			return true
		}
	}
	return false
}

// A young belief in order: learned on little evidence (a few slow gaps,
// which an out-of-order upstream shows too when answers happen to come in
// write order), in order gives each query a connection of its own, and then
// only order checks can show it wrong. At one in orderCheckEvery, a few
// hundred queries a second put them a second apart, and an upstream served
// side by side needs about four of them (minSideEvidence, decayed) or the
// luck of one that overtakes: the wrong belief held for seconds, until it
// lapsed (property seed 70 before slowGapSpan: corrected by a check in 9 of
// 20 runs before the load ended). So checks go 2^youngCheckLevel times as
// often as in order is learned, and half as often again with each check
// whose answer confirms it (it came after the query it went behind, a
// service time later: a slow gap or a waited answer), for youngBeliefSpan at
// most; a check answered side by side raises the rate (checkContradicted).
// On an upstream truly in order that is youngCheckLevel checks in the first
// few hundred queries, each an answer time late, where one in
// orderCheckEvery would have made one.

// orderCheckRate is how many queries, one of which is an order check: fewer
// while the in-order belief is young (see youngCheckLevel).
// Once the young rate is over (its span ended, or in order lapsed), the
// first query to see it sets youngLevel to 0, so that the queries after it
// read one atomic and no clock.
func (p *Pool) orderCheckRate() uint32 {
	l := p.youngLevel.Load()
	if l == 0 {
		return orderCheckEvery
	}
	if nanotime() >= p.youngUntil.Load() || p.learned.mode.get() != ModeInOrder {
		p.youngLevel.CompareAndSwap(l, 0)
		return orderCheckEvery
	}
	return orderCheckEvery >> l
}

// beliefYoung starts the young rate of order checks: in order was learned at
// now. Called by the sweeper only.
func (p *Pool) beliefYoung(now int64) {
	p.youngUntil.Store(now + int64(youngBeliefSpan))
	p.youngLevel.Store(youngCheckLevel)
}

// checkConfirmed halves the young rate of order checks: an order check's
// answer came after the query it went behind, as in order answers it.
func (p *Pool) checkConfirmed() {
	for {
		l := p.youngLevel.Load()
		if l <= 0 || p.youngLevel.CompareAndSwap(l, l-1) {
			return
		}
	}
}

// checkContradicted raises the young rate of order checks to
// contradictedLevel: an order check's answer came side by side with the
// query before it, which in order never does. Where answers never overtake
// (every one after the same time), only such answers correct the belief,
// minSideEvidence of them and sideShare of the slow gaps that taught it
// (decayed: nine or so after a burst learned it), and the young rate alone
// took about a second to gather them at 333 QPS.
// No level is above contradictedLevel (the guard below), so a store raises.
func (p *Pool) checkContradicted() { p.youngLevel.Store(contradictedLevel) }

// contradictedLevel: see checkContradicted.
const contradictedLevel = 4

// The build fails if a young belief starts above contradictedLevel, which
// checkContradicted would then lower.
const _ = uint(contradictedLevel - youngCheckLevel)

// youngCheckLevel: as in order is learned, order checks go 2^youngCheckLevel
// times as often (see orderCheckRate).
const youngCheckLevel = 2

// youngBeliefSpan: the young rate of order checks lasts this long at most
// after in order is learned.
const youngBeliefSpan = 2 * time.Second
