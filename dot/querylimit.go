package dot

import (
	"sync/atomic"
	"time"
)

// queryLimit is the number of queries the server serves on one connection before
// it cuts it, learned from its cuts; 0 when none holds.
type queryLimit struct {
	n     atomic.Int32 // written under Pool.mu (limitCut), read lock-free
	until atomic.Int64 // unix ns until which n holds; likewise

	// Guarded by Pool.mu (learnLimit):
	small     int   // the answers before the last cut under minLearnedLimit
	cutAt     int64 // unix ns of the last cut of a busy connection
	cutServed int   // the answers before it
	quietTill int64 // unix ns until which cuts teach nothing: the server restarted (see learnLimit)
	learnedAt int64 // unix ns when n was last set
	prevN     int32 // n and until before that, to restore if it came of a restart
	prevUntil int64
	// The last connection that fell silent (see silentBeyondLocked), after
	// how many answers, and whether another one before it did after as many.
	silentConn   *conn
	silentServed int
	silentAlike  bool
}

// minLearnedLimit is the fewest answers after which one cut of a server
// teaches a query limit. Fewer is as likely a fault (a restart) as a policy,
// and a limit that low costs a handshake every few queries: it is learned
// only when two cuts in a row came after the same number of answers (give or
// take one), which a restart does not do and a policy does.
const minLearnedLimit = 16

// get returns the limit in force, or 0.
func (l *queryLimit) get() int32 {
	if nanotime() > l.until.Load() {
		return 0
	}
	return l.n.Load()
}

// learn is told that the server cut a connection after answering answered
// queries. It returns the new limit if it lowered the one in force, else 0.
// Either way the limit is kept for learnedTTL more: a cut may have been a one-off
// (a restart), and a needlessly low limit costs handshakes.
//
// The limit keeps a margin of one query in 50 below the cut, for a server that
// counts something else than queries (bytes): a handshake per connection is
// what a server cutting connections costs most, so the margin is small, and a
// cut before it only lowers the limit further.
func (l *queryLimit) learn(answered int) int32 {
	defer l.until.Store(nanotime() + int64(learnedTTL))
	limit := int32(answered - max(answered/50, 1))
	if old := l.get(); old != 0 && limit >= old {
		return 0
	}
	l.n.Store(limit)
	return limit
}

// learnLimit is told how a connection ended. A server that closes a busy
// connection after answering many queries teaches the pool its query limit. It
// runs before the dead connection's queries are moved or replayed, so that the
// connections they go to already respect the limit.
//
// A server that restarts cuts every connection at once, each after however
// many answers it served: two busy connections cut within restartWindow of
// each other after unlike numbers of answers (more than one apart) are a
// restart, not a policy. Then no cut teaches a limit until restartWindow
// after the last such cut, and a limit learned within restartWindow before
// is taken back.
func (p *Pool) learnLimit(reason CloseReason, served, outstanding int) {
	if reason != CloseServer || outstanding == 0 {
		return
	}
	if limit := p.limitCut(served, nanotime()); limit != 0 {
		p.applyLimit(limit)
	}
}

// applyLimit applies a newly learned query limit to every open connection:
// those opened with the one that taught it are as old and about to be cut
// too, so they take no more queries than the limit either, and the queries
// they hold beyond it go elsewhere (the dead connection's replays must not
// land on them and die again).
func (p *Pool) applyLimit(limit int32) {
	for _, c := range *p.conns.Load() {
		c.setQueryLimit(int(limit))
	}
}

// restartWindow: cuts this close together after unlike numbers of answers
// are a restart (see learnLimit).
const restartWindow = 50 * time.Millisecond

// limitCut records a busy connection's cut after served answers, at now, and
// learns from it if it may teach a limit: it is no part of a restart, it came
// after two answers at least, and if after fewer than minLearnedLimit, the
// small cut before it came after as many, give or take one. It returns the
// new limit if it lowered the one in force, else 0.
func (p *Pool) limitCut(served int, now int64) int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.learned.limit
	if now-l.cutAt < int64(restartWindow) && !alike(served, l.cutServed) {
		l.quietTill = now + int64(restartWindow)
		if now-l.learnedAt < int64(restartWindow) {
			l.n.Store(l.prevN) // learned from the restart's first cut
			l.until.Store(l.prevUntil)
			l.learnedAt = 0
		}
	}
	l.cutAt, l.cutServed = now, served
	if now < l.quietTill || served < 2 {
		return 0
	}
	if served < minLearnedLimit {
		last := l.small
		l.small = served
		if !alike(served, last) {
			return 0 // the first such cut, or one unlike the last: not yet a policy
		}
	}
	l.prevN, l.prevUntil, l.learnedAt = l.n.Load(), l.until.Load(), now
	return l.learn(served)
}

// alike reports whether two cuts came after as many answers, give or take one.
func alike(a, b int) bool { return a >= b-1 && a <= b+1 }

// learnSilence is told that c's server stopped answering the queries written
// after its served-th (see silentBeyondLocked): a query limit that cuts the
// connection only after its slowest answer. It learns from it as from a cut,
// and sends c's queries past it elsewhere at once whether or not the pool
// learned a limit (a small one needs two like cuts): c drains.
//
// One silent connection may be one whose queries were all slow names: it
// teaches only if another one fell silent after as many answers (give or
// take one) before. Its own queries past it go elsewhere all the same: if
// they were slow names, that costs their wait so far and a connection; if
// not, they would wait for its cut (property seed 63: p99 580 ms against
// 446 ms, where 1.2 times the model's and 5 ms is 533 ms).
func (p *Pool) learnSilence(c *conn, served int) {
	if !p.silenceAlike(c, served) {
		c.setQueryLimit(served)
		return
	}
	if limit := p.limitCut(served, nanotime()); limit != 0 {
		p.applyLimit(limit)
		return
	}
	c.setQueryLimit(served)
}

// silenceAlike records c's silence after served answers and reports whether
// another connection's last silence came after as many.
func (p *Pool) silenceAlike(c *conn, served int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.learned.limit
	if l.silentConn == c {
		return l.silentAlike
	}
	l.silentAlike = l.silentConn != nil && alike(served, l.silentServed)
	l.silentConn, l.silentServed = c, served
	return l.silentAlike
}
