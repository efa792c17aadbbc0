package dot

// The depth bound: while the upstream's mode is unknown, how many queries one
// connection is given (queueDepth; none behind an overdue answer:
// overdueAfter), and which queries wait for dials of their
// own until the bound can be figured (awaitsItsDial, spacingWanted).

// queueDepth is how many queries pickInTurn puts on one connection: MaxInflight,
// or, while the mode is unknown (the cap auto), as many as an in-order
// upstream would serve in a dial's time: the dial time over the spacing of a
// busy connection's answers (serveMode.spacing), which in order is the time
// each query written before one adds to its wait. A query written behind as
// many others would wait, were the upstream in order, longer than a
// connection of its own costs; forward would have dialled one for it, and the
// pool does (pickIdle, dialForWaiter: one dial per waiting query, so never
// more connections than forward's one per query out).
//
// The spacing, not the answer time: under a saturating load the answer time
// is mostly the wait in the upstream's (or the machine's) queue, which a
// query on a connection of its own waits too, while the answers of a busy
// connection come tens of microseconds apart. Divided by the answer time
// (milliseconds), the bound dialled a connection for every few queries of
// make bench's unbound: 40-53 where 4 serve it (156-197 in
// TestSaturatedFastUpstreamKeepsFewConnections). The spacing counts for no
// more than the usual answer time (it is the send gap where queries come
// apart), and the bound holds only while a query alone on its connection is
// answered within queueShared spacings: the wait is then the connection's
// queue, which a new connection spares (in order, a query alone waits one
// service time, its answers' spacing); where queries wait much longer than
// that, they wait for something all connections share (unbound's one thread
// serving its connections in turn), which more connections only lengthen.
//
// Not while that is fewer than two: a query then waits behind one other about
// as long as for a dial, and the answers of queries written behind others are
// what the mode is learned from (in order: slow gaps, waited answers; out of
// order: inversions). A pool that dialled for every second query learned
// neither, and held twice the connections of an upstream whose one CPU serves
// every connection in turn (TestRegimeBusyTurnsUpstream). There, and until
// the spacing is timed, the oldest connection alone holds a queue of
// minQueueDepth where the upstream is fast but a queue costs about a dial
// or more (dearQueue); elsewhere no bound. Nor while the
// upstream as a whole read nothing for two answer times (and two ticks, see
// servingAt): it paused, and more connections would not shorten the pause
// (TestPausingUpstreamKeepsFewConnections). Until the first answer and the
// first dial are timed, a query each anyway (slowUnknown); until the first
// busy answers are (the next tick's learn, see spacingWanted), no bound:
// taking the answer time for the spacing meanwhile, as it grew with the
// saturated upstream's queue, dialled 193-198 connections in that test (195
// again in session 15), and once a connection carries a query or two, its
// answers come a round of the upstream's turns apart, which looks like
// in-order service and keeps the bound. Only a query that waited for a dial
// of its own keeps waiting for it meanwhile (awaitsItsDial).
func (p *Pool) queueDepth() int32 {
	depth, _ := p.queueBound()
	return depth
}

// queueBound is queueDepth, and whether only the oldest connection with
// room holds a queue (dearQueue): each other one takes a query only with
// nothing outstanding.
func (p *Pool) queueBound() (depth int32, oldestOnly bool) {
	slots := int32(p.cfg.MaxInflight)
	if p.cfg.MaxConns == 0 && p.learned.mode.get() == ModeOutOfOrder {
		return p.depthBound(slots), false // see depthcost.go
	}
	if p.cfg.MaxConns > 0 || p.learned.mode.get() != ModeUnknown {
		return slots, false
	}
	m := &p.learned.mode
	u, s, d := m.usual.Load(), m.spacing.Load(), p.dialTime.Load()
	if u == 0 || s != 0 && u > queueShared*s {
		return slots, false
	}
	if s != 0 {
		s = min(s, u)
	}
	if s != 0 && d >= minQueueDepth*s {
		if nanotime()-p.servingAt.Load() > max(2*u, int64(2*minWatchInterval)) {
			return slots, false
		}
		return int32(min(d/s, int64(slots))), false
	}
	if p.dearQueue(u, s, d) {
		if p.learned.limit.get() == 0 && p.pausedFor(u, max(p.servingAt.Load(), p.askedAt.Load())) {
			return 1, true // see dearQueue: a pause
		}
		return minQueueDepth, true
	}
	return slots, false
}

// pausedFor reports whether the upstream as a whole paused, where a queue
// is dear (see dearQueue): it read nothing since serving, for two usual
// answer times u (and two ticks, see servingAt), while pauseOutstanding
// queries or more were out. Fewer, the silence is likelier one slow name
// (and a query queued behind it) on the one busy connection of a light
// load, and the dear queue's bound holds (minQueueDepth on the oldest):
// counted as a pause, property seed 142 (a quarter of the names 31 times
// slower) failed its p99 in 4 replays of 4 (36 ms against forward's 24),
// and seed 41 in 2 of 4. Elsewhere (queueBound's bound by the spacing,
// overdueAfter) a pause is the silence alone: counted so there too,
// TestUnknownModeHiccupsDialNone used the warm-up's second connection under
// its load in 10 runs of 10. It loads the connections only once the silence
// is that long, off the common path.
func (p *Pool) pausedFor(u, serving int64) bool {
	if nanotime()-serving <= max(2*u, int64(2*minWatchInterval)) {
		return false
	}
	n := int32(0)
	for _, c := range *p.conns.Load() {
		if n += c.load.Load(); n >= pauseOutstanding {
			return true
		}
	}
	return false
}

// pauseOutstanding: the fewest queries out that a silence of the upstream
// as a whole counts as a pause with (see pausedFor).
const pauseOutstanding = 3

// queueOnOldest reports whether only the oldest connection with room holds
// a queue (see queueBound, dearQueue): then, in order, a busy answer there
// came a service time after the one before it, the query written as that
// one came (see servedAfter). Not in a pause, where no connection holds one.
func (p *Pool) queueOnOldest() bool {
	depth, oldestOnly := p.queueBound()
	return oldestOnly && depth > 1
}

// dearQueue reports whether, the mode unknown and the spacing not timed or
// more than half a dial, a query queued behind another would, were the
// upstream in order, wait about as long as a dial of its own or longer:
// a dial (d) is shorter than two spacings (s; the answer time until the
// spacing is timed: in order, the spacing is the service time), and the
// upstream answers sooner than unknownSlow (slower, slowUnknown gives each
// query a connection anyway). Then the oldest connection with room takes
// minQueueDepth queries, one waiting (in order, the waited answers that
// learn the mode: see servedAfter), and any other connection a query only
// with nothing outstanding; a query that finds none so goes as pickIdle
// sends it (an idle connection, or a dial of its own), as forward's would.
//
// There queueDepth used to set no bound: a queue of one was thought to cost
// no more than a dial. But until in order is learned (four waited answers,
// about four answer times), every arrival queued: after a health probe's
// lone 5 ms answer (CoreDNS's start), the load queued 42 deep on the pool's
// one connection at 2,000 QPS, and the rescues of that queue, once in order
// was learned, opened 28 connections where forward opened 13 (make bench's
// dnsdist-slow: 29-43 against 20-21;
// TestFastInOrderAfterAProbeHoldsNoMoreConnectionsThanForward). Queues of
// two on every connection instead left one query queued per connection as
// in order was learned: 19 against 13. A cold start of more than four dials
// before the first answer (coldFirst, which this replaces) was the one shape
// that spread them.
//
// While the upstream as a whole paused (pausedFor; not when it was asked
// nothing before, askedAt: the load's first query after an idle spell,
// which the probe's is), every connection takes a query only with nothing
// outstanding (queueBound's depth 1), and the queries that come in the
// pause go as pickIdle sends them, each on a connection of its own as
// forward's. Such a pause used to set no bound at all (more connections do
// not shorten a pause), and every query that came in it queued on the
// oldest connection; but where a queue is dear, an in-order upstream
// serves those queries one after the other once it resumes, each a service
// time later, and a slow name among them holds up all behind it, where
// forward's, each on its own connection, were served side by side. A slow
// name alone on the one busy connection looked like such a pause too (see
// pausedFor), and the queries queued behind it were rescued, each then
// served twice: past the CI range, property seeds 286, 472, 506, 519 and
// 554 (slow names, storms, stalls) opened 1-31 connections more than
// forward in 5 replays of 5 (seed 519: 25 rescues), and in none of 5 with
// this (seed 519: 7 rescues). Not under a learned query limit: there the
// oldest connection keeps its queue of minQueueDepth through a pause (one
// a connection, property seed 67 opened one connection more than forward,
// 130 against 129, in every replay; it went into its stall with 3
// connections against forward's 2).
//
// Nor once a query a connection was left as sparing no wait (spreadless:
// the upstream serves its connections in turn, and more of them only
// lengthen the turn, TestRegimeBusyTurnsUpstream: 7 connections against 4
// without this).
func (p *Pool) dearQueue(u, s, d int64) bool {
	if s == 0 {
		s = u
	}
	return d != 0 && d < minQueueDepth*s && u < int64(unknownSlow) && !p.learned.mode.spreadless.Load()
}

// overdueAfter is, while queueDepth bounds queues (the mode unknown, the
// upstream fast, a query alone answered within queueShared spacings, and
// serving), how long a connection's next query may be in service, nothing
// served since, before pickInTurn gives that connection no more (overdue):
// the usual answer time and a dial's. 0: none is overdue. now is the time
// it was figured at, for overdue.
//
// queueDepth counts a spacing for each query queued; the one in service may
// take far longer than its share. Behind a slow name of a fast in-order
// upstream (property seed 142: a quarter of its names 31 times slower, 19 ms
// against 0.6), a query waited the slow answer's whole rest, while forward,
// finding no connection idle, dialled one for it: a 1.4 ms handshake. One
// overdue by a dial's time is likelier a slow one, whose rest (a heavy tail:
// as long as it has taken, or longer) exceeds a dial. Not while the upstream
// as a whole reads nothing (a pause, see queueDepth): every connection is
// then overdue, and more of them would not shorten the pause
// (TestPausingUpstreamKeepsFewConnections).
// Nor sooner than that pause is told (twice minWatchInterval): against a
// fast upstream (unbound, 0.1 ms answers, 1 ms handshakes) the answer time
// and a dial's came to about 1 ms, every hiccup of a busy machine made the
// one connection overdue, and each query that came in it dialled (make
// bench's unbound regime: 5-14 dials a run, up to 13 connections, against
// none and 1 with the floor; TestUnknownModeHiccupsDialNone).
func (p *Pool) overdueAfter() (after, now int64) {
	if p.cfg.MaxConns > 0 || p.learned.mode.get() != ModeUnknown {
		return 0, 0
	}
	m := &p.learned.mode
	u, s, d := m.usual.Load(), m.spacing.Load(), p.dialTime.Load()
	if u == 0 || s == 0 || d == 0 || u >= int64(unknownSlow) || u > queueShared*s {
		return 0, 0
	}
	now = nanotime()
	if now-p.servingAt.Load() > max(2*u, int64(2*minWatchInterval)) {
		return 0, 0
	}
	return max(u+d, int64(2*minWatchInterval)), now
}

// overdue reports whether c's next query has been in service longer than
// after (see overdueAfter) at now: since the later of c's last serve and its
// last write, less the part of the pool's last hold-up (heldUntil, heldFor)
// that came after it. After a hold-up the readers run in any order: one
// connection's backlog read made the upstream look served (servingAt, even
// at the late tick: servedBy), while another's query, its answer unread
// behind the hold-up, looked in service since before it, and the queries of
// the hold-up's backlog passed over that connection and dialled
// (TestUnknownModeHeldUpReadsOneFirstDialsNone: 4-16 dials in 6 of 6 runs
// without it). Only the hold-up's length is taken off, not the time before
// it: on a loaded machine ticks run past lateTick every few ticks, and a
// query's time counted from the last of them was never overdue.
func (c *conn) overdue(after, now int64) bool {
	if after == 0 || c.load.Load() == 0 {
		return false
	}
	return c.pool.unheld(max(c.servedAt.Load(), c.wroteAt.Load()), now) > after
}

// awaitsItsDial reports whether cl, a query that waited for a connection
// dialled for it (dialForWaiter), goes as pickIdle sends it (an idle
// connection, or the dial) rather than in turn: the mode is unknown and no
// busy connection's answers are timed yet, so that queueDepth sets no bound.
// The pool's first answer wakes every waiting query at once: pipelined, the
// queries that came during a slow handshake all went on one connection
// (issue 21, seed 29: 85 at once, 37 ms handshakes, at 2,755 QPS), which an
// in-order upstream served one after the other, while the dials under way
// for them, as forward's, were done within a handshake.
func (p *Pool) awaitsItsDial(cl *call) bool {
	m := &p.learned.mode
	return cl.waited && cl.avoid == nil && !p.joinsFirst(cl) && p.cfg.MaxConns == 0 &&
		m.get() == ModeUnknown && m.spacing.Load() == 0
}

// spacingWanted reports whether the spacing of a busy connection's answers
// is wanted and not yet timed: the upstream is fast, its queries pipelined,
// and queueDepth sets no bound until it is (see awaitsItsDial). A busy
// answer then has the sweeper learn at its next tick, not at the next full
// sweep. Not for a slow upstream: its queries go one to a connection anyway
// (pickIdle), which no depth bounds.
func (p *Pool) spacingWanted() bool {
	return p.learned.mode.spacing.Load() == 0 && !p.slowUnknown()
}

// queueShared: queueDepth bounds a connection's queue only while a query
// alone on its connection is answered within this many spacings of a busy
// connection's answers (see there).
const queueShared = 4

// minQueueDepth: below this many queries in a dial's time, queueDepth puts no
// bound on a connection's queue (see there).
const minQueueDepth = 2
