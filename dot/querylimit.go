package dot

import (
	"math"
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
	cutAt     int64 // unix ns of the server's last cut of a connection, busy or idle
	cutServed int   // the answers before it
	// firstServed: the answers before the first of the cuts that came
	// within restartWindow of each other up to the last, or before the
	// last of them that showed a restart (see limitCut)
	firstServed int
	quietTill   int64 // unix ns until which cuts teach nothing: the server restarted (see learnLimit)
	// n and until before the first of the cuts that came within
	// restartWindow of each other up to the last one: what a restart
	// among them takes back to, however many of them taught.
	prevN     int32
	prevUntil int64
	// The last connection that fell silent (see silentBeyondLocked), after
	// how many answers (0: none), and whether another one before it did
	// after as many. silentServed is written under Pool.mu and read by the
	// sweeper's silence watch without it: a second connection silent after
	// as many answers needs less evidence to be judged so.
	silentConn   *conn
	silentServed atomic.Int64
	silentAlike  bool

	probedAt atomic.Int64 // unix ns when a connection last went past n (see probe)

	// proven: the most answers one connection served, ever; the server's
	// limit, if it has one, is no lower. Written by the readers, read
	// lock-free (see reach).
	proven atomic.Int32
	// deepest: the highest write order (call.seq) one connection's server
	// served, ever; likewise (see probedReach).
	deepest atomic.Int32
	// probedTo: unprovenDepth past the deepest served as the depth probe
	// first engaged; once the server served that deep, the probe hands back
	// to the reach (see probedReach, probe.go). Likewise.
	probedTo atomic.Int32
}

// noteServed is told that a connection has served served answers.
func (l *queryLimit) noteServed(served int) {
	for v := int32(served); ; {
		if o := l.proven.Load(); o >= v || l.proven.CompareAndSwap(o, v) {
			return
		}
	}
}

// reach is the most queries a connection takes while another open one has
// room (see Pool.pick): twice the most answers one connection served, and
// unprovenDepth more. Past the most served, a query may be past a limit
// nothing has shown yet, which the server ignores until the slowest answer
// before it and its cut; spread over the connections already open, no
// query goes so far before answers prove the depth. Filled in turn to
// MaxInflight, the oldest connections took 129 to 177 queries each as the
// mode turned out of order during a stall, where the server cut after 66
// (property seed 178: 123 queries timed out against the model's 18). Twice
// the most served, not the most served: the connection that served most
// holds as many queries outstanding as the load needs beyond it (a fast
// upstream at full load: about a hundred), and a cap at its answers spread
// them over a dozen connections where four do (TestRegimeSwitchingUpstream).
// A learned limit is below the reach: a connection drains there first.
//
// Against a slow upstream the reach still bets: property seed 19 (out of
// order, 98 ms answers, a limit of 22 after 16 served in its first batch)
// filled connection after connection to 48 as out of order was learned at
// 142 ms, 26 of each ignored until two silences taught the limit (p99 367-480
// ms against the model's 140). Going no deeper than the deepest write order
// served, one connection at a time past it (a probe), passed it in every run,
// but cost a limitless slow upstream connections and the turns upstream its
// few connections under the race detector (branch s19, bbd9f7f and its revert).
func (l *queryLimit) reach() int32 {
	// In int64: a connection that served a billion answers (six hours at
	// 50,000 QPS) would make twice as many wrap negative, and every pick
	// then look twice.
	return int32(min(2*int64(l.proven.Load())+unprovenDepth, math.MaxInt32))
}

// unprovenDepth: see reach.
const unprovenDepth = 16

// limitProbeEvery is how often a new connection goes past the limit in force
// to re-test it: a limit is a belief the pool can no longer test once it
// holds it (it closes its connections at it, so none shows the server would
// have served more), and one learned wrongly (a restart's cuts that looked
// like a limit) cost a handshake every few queries for learnedTTL. A server
// that does cut there cuts the probe, which teaches the limit again; what
// that costs is one connection's queries past the limit replayed, every
// limitProbeEvery.
const limitProbeEvery = 10 * time.Second

// probe reports whether a connection opened now goes past the limit in force,
// to re-test it: the first one limitProbeEvery after the last.
func (l *queryLimit) probe(now int64) bool {
	last := l.probedAt.Load()
	if l.get() == 0 {
		return false
	}
	if last == 0 { // since the limit was learned: one period from now
		l.probedAt.CompareAndSwap(0, now)
		return false
	}
	return now-last >= int64(limitProbeEvery) && l.probedAt.CompareAndSwap(last, now)
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
// The limit keeps a margin of one query in 50 below the cut, rounded down, for
// a server that counts something else than queries (bytes): a handshake per
// connection is what a server cutting connections costs most, so the margin
// is small, and a cut before it only lowers the limit further. Below 50 there
// is none: a margin of one there (at least one, as it was) retired each
// connection a query before forward's, a thirtieth of a small limit, and in
// order the connections dialled together reached it together while forward's
// still took a query each, so that the pool's queries found none idle and
// dialled (steady property seed 3: a cut after 34 answers, 62-65 connections
// at once against the model's 61).
func (l *queryLimit) learn(answered int) int32 {
	defer l.until.Store(nanotime() + int64(learnedTTL))
	limit := int32(answered - answered/50)
	old := l.get()
	if old != 0 && limit >= old {
		return 0
	}
	if old == 0 {
		l.probedAt.Store(0) // a new limit: probed a whole period from now (see probe)
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
// many answers it served, idle ones too: two connections cut within
// restartWindow of each other after unlike numbers of answers (more than one
// apart), busy or idle, are a restart, not a policy, and so is a busy one cut
// after fewer answers than another connection has served (a server with a
// limit lets none serve more, see refutesLimit). Then no cut teaches a limit
// until restartWindow after the last such cut, and whatever the cuts close
// together before it taught is taken back. A restart that cut one busy
// connection and idle ones had taught the busy one's count (TestServerRestartTeachesNoLimit,
// 1 run in 60 under -race).
//
// atAnswer: the connection had nothing outstanding and was cut within
// answerCutWithin of its last answer (see limitCut).
func (p *Pool) learnLimit(reason CloseReason, served, outstanding int, atAnswer bool) {
	if reason != CloseServer {
		return
	}
	if limit := p.limitCut(served, p.mostServed(), outstanding > 0, atAnswer, nanotime()); limit != 0 {
		p.applyLimit(limit, served)
	}
}

// mostServed returns the most answers any of the pool's connections served
// (closed ones still listed included), or the deepest write order a
// connection's server served if deeper: a server with a query limit serves
// none past it, so either refutes a cut after fewer (refutesLimit). The
// deepest outlives the connection that served it: under the depth probe
// (probe.go) every connection takes queries up to the deepest served and no
// further, one at a time there, so that a server's idle timeout cuts them
// all after about as many answers, and two such cuts at an answer within a
// dial's time of each other taught a limit below the depth the server had
// served (steady property seed 45: idle timeout 144 ms, answers 276 ms,
// limit 14 learned with the deepest served 22, 256 queries evicted and
// replayed, p99 620-630 ms against the model's 375). It takes each
// connection's lock in turn, with Pool.mu not held.
func (p *Pool) mostServed() int {
	most := int(p.learned.limit.deepest.Load())
	for _, c := range *p.conns.Load() {
		c.mu.Lock()
		most = max(most, c.served)
		c.mu.Unlock()
	}
	return most
}

// refutesLimit reports whether a connection that served most answers shows
// that a cut after served was no query limit: the server let it serve more
// (give or take one, as alike allows two cuts at one limit).
func refutesLimit(most, served int) bool { return most > served+1 }

// applyLimit applies a newly learned query limit to every open connection:
// those opened with the one that taught it are as old and about to be cut
// too, so they take no more queries than the limit either, and the queries
// they hold beyond it go elsewhere (the dead connection's replays must not
// land on them and die again).
//
// Every connection stops taking queries past the limit before any moves the
// ones it holds past it: moved while the next ones still took queries, they
// went onto those, filled past the same limit, and were moved again a moment
// later, written three times (TestRegimeQueryLimitSlowTail's warm-up, once
// out of order was learned from answers that overtook slow ones: the limit
// taught by a second silence at 104.5 ms moved the queries of four
// connections in turn; 6 runs of 100). Only the queries past served, the
// answers the cut or silence that taught it came after, move: see
// setQueryLimit.
func (p *Pool) applyLimit(limit int32, served int) {
	conns := *p.conns.Load()
	for _, c := range conns {
		c.takeUpTo(int(limit))
	}
	for _, c := range conns {
		c.setQueryLimit(int(limit), served)
	}
}

// restartWindow: cuts this close together after unlike numbers of answers
// are a restart (see learnLimit).
const restartWindow = 50 * time.Millisecond

// answerCutWithin: a server's cut of a connection with nothing outstanding
// this soon after its last answer came at that answer, as a query limit's
// does, not after an idle spell: idle timeouts are longer (dnsdist's 2 s; the
// property test draws 50 ms to 10 s).
const answerCutWithin = 10 * time.Millisecond

// limitCut records a connection's cut after served answers, at now, when some
// connection of the pool served most; busy, it had queries outstanding. A
// busy one's cut teaches a limit if it may: it is no part of a restart, it
// came after two answers at least, and if after fewer than minLearnedLimit,
// the small cut before it came after as many, give or take one. An idle one's
// teaches none (a server's idle timeout cuts those) but may show a restart,
// unless it came at its last answer (atAnswer) within a dial's time (and
// restartWindow) of another cut, which came after as many answers, give or
// take one (else the two are a restart): two cuts alike, as a small busy cut
// needs. Under a
// load that leaves no query outstanding when a limit's answer goes out (a
// query a connection, each answered before the next comes), a server with a
// query limit cuts every connection so: none were busy in TestRegimeChurn's
// warm-up (40 cuts after 25 answers, 10,000 QPS) once no query shared the
// first connection for coming soon after its dial started, no limit was
// learned, and its queries then waited up to two handshakes (there, cuts
// came 2.5 ms apart, handshakes took 4). Not from cuts further apart: a
// lighter load is served as well without the limit (forward redials after a
// cut, in time for the next), and the successors dialled ahead of a learned
// one were a connection more than forward opened (property seeds 17, 111
// and 130, cut after 12, 22 and 10 answers at 26 to 122 QPS: taught by any
// two cuts at answers, they failed in 9 of 9 replays; 17 still in 1 of 10
// with two within restartWindow). It returns the new limit if it lowered
// the one in force, else 0.
func (p *Pool) limitCut(served, most int, busy, atAnswer bool, now int64) int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.learned.limit
	together := now-l.cutAt < int64(restartWindow)
	quick := together && now-l.cutAt < p.dialTime.Load() // see atAnswer above
	if !together {
		l.prevN, l.prevUntil = l.n.Load(), l.until.Load()
		l.firstServed = served
	}
	// Unlike the last cut, or the first of those together: a restart's cuts
	// after 37, 36, 35 and 34 answers are each alike the one before.
	if (busy || atAnswer) && refutesLimit(most, served) || together && (!alike(served, l.cutServed) || !alike(served, l.firstServed)) {
		l.quietTill = now + int64(restartWindow)
		l.n.Store(l.prevN) // a restart: take back what its first cuts taught
		l.until.Store(l.prevUntil)
		// The cuts after it are compared with this one, not with the
		// first: the rest of a restart's drift comes within quietTill,
		// which teaches nothing anyway. Compared with the first, one odd
		// first cut (after 97 answers, where the server cuts after 100)
		// made every cut after it a restart for as long as cuts came
		// within restartWindow of each other, and without a limit at
		// full load they always do: the server cut every connection
		// after its 100 answers, with the queries past them outstanding,
		// each replayed (TestQueryLimitOddFirstCutLocksNothingOut).
		l.firstServed = served
	}
	l.cutAt, l.cutServed = now, served
	if !busy && !(atAnswer && quick) || now < l.quietTill || served < 2 {
		return 0
	}
	if !busy && served < minLearnedLimit {
		// Two idle cuts at answers after as few: as likely a server's idle
		// timer run from its last read, which cuts a connection whose
		// answers take longer soon after each answer, as a limit. Unlearnt,
		// such a limit costs nothing: no query was outstanding, and the
		// next one dials as forward's does.
		return 0
	}
	if busy && served < minLearnedLimit {
		last := l.small
		l.small = served
		if !alike(served, last) {
			return 0 // the first such cut, or one unlike the last: not yet a policy
		}
	}
	return l.learn(served)
}

// limitRefutedLocked reports, for a connection that goes past the learned
// limit (limitProbe), the limit if it served more answers than the cut that
// taught it came after (give or take one, as refutesLimit): the server has
// no such limit. c.mu must be held.
func (c *conn) limitRefutedLocked() int {
	if c.limitProbe == 0 || !refutesLimit(c.served, taughtBy(c.limitProbe)) {
		return 0
	}
	n := c.limitProbe
	c.limitProbe = 0
	return n
}

// taughtBy is the most answers after which the cut that taught limit n came:
// learn keeps a margin of one answer in 50 below it (none below 50). A probe that serves as
// many is cut there by a server that has the limit, and shows nothing.
func taughtBy(n int) int { return n + n/49 }

// unlearnLimit drops the limit in force if it is still n, which a connection
// showed wrong by serving more (limitRefutedLocked).
func (p *Pool) unlearnLimit(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &p.learned.limit
	if int(l.n.Load()) == n {
		l.n.Store(0)
		l.until.Store(0)
		l.probedAt.Store(0)
		// The silences that taught it, if they did, are refuted with
		// it: the next silence after as many answers needs the full
		// evidence again (see silentBeyondLocked).
		l.silentConn = nil
		l.silentServed.Store(0)
	}
}

// alike reports whether two cuts came after as many answers, give or take one.
func alike(a, b int) bool { return a >= b-1 && a <= b+1 }

// A connection's side of the limit: draining at it, and what its silence and
// its cut teach.

// checkQueryLimitLocked applies the learned query limit to what the connection has
// accepted: from nearEndAfter on, its successor is dialled. c.mu must be held.
func (c *conn) checkQueryLimitLocked() {
	if c.queryLimit > 0 && !c.nearEnd.Load() && c.accepted >= c.pool.nearEndAfter(c.queryLimit) {
		c.nearEnd.Store(true) // once: nearEndAfter reads the mode's atomics and divides
	}
	if c.queryLimit > 0 && c.accepted >= c.queryLimit {
		// The server cuts connections after about this many queries: stop here so
		// that nothing we write is cut off.
		c.setDrainingLocked(CloseLimit)
	}
}

// nearEndAfter is how many queries a connection under a learned query limit
// takes before it is near its end and its successor is dialled. Filled in
// turn, it may take a query as often as they come: from half the limit on (a
// handshake takes longer than the server takes to answer a quarter of it).
// One each (oneEach), it takes at most one an answer time, so its
// last ones take that many answer times: the successor is due once they take
// a dial's time or less, and with answers longer than a dial, at its last
// query, when forward, which dials as a query finds none idle, would. From
// half the limit on, the successors (and the sizer's spares for them) sat
// idle for half the limit's answer times, one to three connections held past
// forward's (steady property seeds 32 and 41: 13-14 against 12, 22-23
// against 21; TestInOrderLimitDialsSuccessorsOnlyNearTheCut).
func (p *Pool) nearEndAfter(limit int) int {
	if p.oneEach() {
		if u := p.learned.mode.usual.Load(); u > 0 {
			return limit - int(p.dialTime.Load()/u)
		}
	}
	return limit / 2
}

// idledBeforeCutLocked reports whether the queries c holds went out after it
// had sat with nothing outstanding for more than answerCutWithin since its
// last answer: a server's cut of it then is no query limit's, which cuts a
// connection at the answer that uses it up, before a query that comes that
// much later, but its idle timer's (or a restart's), and teaches no limit
// (a busy cut after 16 answers or more teaches one alone). idleRaceAfter
// (100 ms, on the coarse clock) took a server that closes connections idle
// for less for a limit: one idle 30 ms after 20 answers, the query that came
// then cut, taught a limit of 19, and the next 20 queries took 4 handshakes
// more (TestIdleTimerCutAfterManyAnswersTeachesNoLimit). Queries written
// before the last answer, or within answerCutWithin of it (a query that
// went out as the cut came: the limit's busy cut of a connection taking
// one query at a time), are still caught by a limit's cut. c.mu must be held.
func (c *conn) idledBeforeCutLocked() bool {
	return c.answerAt != 0 && c.busyAt.Load()-c.answerAt > int64(answerCutWithin)
}

// takeUpTo makes an open connection take no query past limit (see
// applyLimit), leaving those it holds past it where they are.
func (c *conn) takeUpTo(limit int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != stateClosed {
		c.queryLimit = limit
		c.checkQueryLimitLocked()
	}
}

// setQueryLimit applies a newly learned query limit to an open connection,
// whose server was seen to serve served queries on one (the cut or the
// silence that taught it). The calls it holds beyond served are sent again
// elsewhere now: the server ignores them (or cuts the connection before
// answering them), and left in place they would wait for its cut, which
// comes after its slowest answer. Those between the limit and served stay:
// the limit's margin (see learn) is for the queries to come, and the server
// answers these before its cut. Sent elsewhere too, each was answered twice,
// and its replay dialled a connection while the old one stayed open for the
// answer (TestLearnedLimitKeepsTheQueriesItsCutServed).
func (c *conn) setQueryLimit(limit, served int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateClosed {
		return
	}
	c.queryLimit = limit
	c.checkQueryLimitLocked()
	if c.accepted > served {
		c.evictBeyondLocked(served, nanotime())
	}
}

// evictBeyondLocked completes the live calls placed after the limit-th: one
// not yet written moves elsewhere at no cost (errUnsent); a written one is
// replayed (a connLostError as if the server had cut it, which it will) and
// leaves a tombstone, marked lost so that it is not taken for a black hole,
// for its answer in case the server serves it after all. c.mu must be held;
// the completions do not block (see call.complete).
func (c *conn) evictBeyondLocked(limit int, now int64) {
	lost := &connLostError{cause: errBeyondLimit, replayable: true, serverCut: true}
	for cl := range c.calls.all() {
		switch {
		case cl.tombUntil != 0 || cl.nth <= limit:
		case cl.state.CompareAndSwap(callQueued, callAbandoned):
			c.removeLocked(cl)
			cl.complete(result{err: errUnsent})
		case int(cl.seq) > limit: // written (seq is set before the state)
			cl.tombUntil, cl.lost, cl.evicted = now+int64(c.pool.cfg.TombstoneTTL), true, true
			cl.complete(result{err: lost})
		}
	}
}

// cutConfirmsLocked reports whether the server's cut of c, which fell silent
// after silentAt answers and drains since (learnSilence), confirms a query
// limit there: it came after as many answers or more (the silence counts the
// write order of the last query served, at most the limit), and ignored
// queries past them, evicted, were still unanswered. Such a cut is a busy
// one's for learnLimit, though c drained: the server held queries when it cut
// it, and the pool had stopped feeding it only because of that limit. Taken
// for a drained connection's, it taught nothing, and the limit waited for a
// second cut 640 ms later, while another connection filled past it (property
// seed 41: p99 473 ms against the model's 355). c.mu must be held.
func (c *conn) cutConfirmsLocked(reason CloseReason, ignored int) bool {
	return reason == CloseServer && c.silentAt > 0 && c.served >= c.silentAt && ignored > 0
}
