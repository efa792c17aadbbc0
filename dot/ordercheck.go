package dot

import (
	"math/rand/v2"
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
// one in orderCheckEvery; while the upstream is slow and unknown, only when
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
	return rand.Uint32()%orderCheckEvery == 0 && (!p.slowUnknown() || p.slowCheckCheap())
}

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
