package dot

import (
	"math"
	"slices"
	"time"
)

// How the pool sizes itself to its upstream.
//
// What a query costs on a busy connection depends on how the upstream serves a
// connection (its Mode, learned.go). Out of order, or not known to be in order,
// a query waits for nobody: connections are filled in turn and a few deep ones
// carry any load, with large batches at both ends. In order, a query waits for
// every query written before it on its connection, and for a slow one that is
// long: each query then goes to the oldest connection with nothing outstanding
// or, finding none, waits for one dialled for it (as forward does) or the first
// to become idle, and the pool opens as many as the load needs
// (Little's law: arrival rate × answer time, which is about the queries in
// flight), up to a cap far above the out-of-order one. Either way a connection
// blocked behind a slow answer takes no new query and its stuck queries are
// rescued (rescue.go), and a connection near its end gets its successor before
// it ends. Idle connections close at IdleTimeout (in order, surplus ones after
// a second, see sweepAll), so the pool shrinks back when the load does.

// Caps of connections that take new queries when Config.MaxConns is 0 (auto).
const (
	AutoMaxConnsOutOfOrder = 4    // out of order or not known: few, full connections
	AutoMaxConnsInOrder    = 1024 // in order: as many as the load needs, up to this (forward has no cap at all)
)

const (
	// maxParallelDials caps the dials under way at once. After a failure only one
	// runs at a time, and the backoff paces them.
	maxParallelDials = 4
	// minExtraConns is how many connections that take no new query (draining,
	// or blocked behind a slow answer) may be open beyond the cap when it is
	// auto: a server that cuts connections after a few dozen queries while some
	// of them are slow keeps a score of them draining.
	minExtraConns = 64
	// inOrderHeadroom multiplies Little's law: an in-order pool may open twice
	// the connections that the arrival rate times the answer time calls for
	// (and more for the bursts of random arrivals, see neededInOrder).
	inOrderHeadroom = 2
	// inOrderSpares is how many connections with nothing outstanding an in-order
	// pool keeps ready, so that a query finds one even while the sweeper has not
	// yet seen that a busy connection is stuck behind a slow answer.
	inOrderSpares = 0
)

// capConns is the most connections that take new queries, in force now.
func (p *Pool) capConns() int {
	switch {
	case p.cfg.MaxConns > 0:
		return p.cfg.MaxConns
	case p.oneEach():
		return AutoMaxConnsInOrder
	}
	return AutoMaxConnsOutOfOrder
}

// maxOpen is the most connections open at once, those that take no new query
// (draining, blocked) included.
func (p *Pool) maxOpen(capConns int) int {
	if p.cfg.MaxConns > 0 {
		return 2 * capConns
	}
	return capConns + max(capConns, minExtraConns)
}

// dialNow starts a dial if the pool may (see startDialLocked).
func (p *Pool) dialNow() { p.dialUpTo(0) }

// dialUpTo starts a dial if the pool may and, if want is not 0, fewer than
// want connections take queries or are being dialled, counted under p.mu: the
// sweeper's snapshot of the connections may miss one that a dial just added.
func (p *Pool) dialUpTo(want int) {
	p.mu.Lock()
	p.startDialLocked(want, false)
	p.mu.Unlock()
}

// startDialLocked starts a dial if none may be needed less: the pool is open,
// no closing connection's verdict is pending, the backoff allows it (a
// dial it allows while armed takes the first strike's retry), fewer
// dials than dialLimit run, the connections that take queries (with those being
// dialled) are under the cap (and, in order, under what the load needs), and
// all open ones are under maxOpen. waiter: the dial is for a query that waits
// for a connection of its own (see dialLimitLocked). It reports whether it
// started one.
func (p *Pool) startDialLocked(want int, waiter bool) bool {
	// While a connection is closing, whether it failed (and so arms the backoff)
	// is not known yet: connClosed wakes the waiters when it is.
	if p.closed || p.closing.Load() > 0 || !p.redial.mayDial(time.Now()) {
		return false
	}
	conns := *p.conns.Load()
	n := countConns(conns)
	taking := n.steady()
	if p.countsTowardCap(availBlocked) {
		taking += n.n[availBlocked]
	}
	if p.dials >= p.dialLimitLocked(n.n[availNearEnd], waiter) {
		return false
	}
	capConns := p.capConns()
	openCap := capConns // what maxOpen allows beyond
	if waiter && (p.queueDepth() < int32(p.cfg.MaxInflight) || p.probedReach() != 0 ||
		p.learned.mode.get() == ModeOutOfOrder && anySerial(conns)) {
		// A query that would wait longer behind others than for a
		// dial (queueDepth), that would go past the depth a slow
		// upstream served (probedReach), or that found a connection
		// serving in order by its own answers busy (anySerial, out of
		// order): the cap in order, as for
		// slowUnknown. Only while that bound holds: other waiters
		// (those of the first dial, firstdial.go) keep the cap of the
		// mode.
		capConns, openCap = AutoMaxConnsInOrder, AutoMaxConnsInOrder
	}
	if p.oneEach() && p.cfg.MaxConns == 0 && !waiter {
		// What the load needs, as the sweeper last saw it; a query that
		// waits for a connection of its own is what the load needs now.
		capConns = min(capConns, max(int(p.needed.Load()), 1))
	}
	if want > 0 {
		capConns = min(capConns, want)
	} else if l := int(p.learned.limit.get()); l > 0 && p.cfg.MaxConns == 0 {
		// A server that serves few queries per connection: one dial per
		// limit's worth of queries waiting for a connection, as forward
		// dials one per query (issue 21, seed 35: six per connection).
		if p.waiters.Load() > 0 {
			capConns = max(capConns, taking+p.limitedDemand())
		}
	}
	if taking+p.dials >= capConns || len(conns)+p.dials >= p.maxOpen(openCap) {
		return false
	}
	if !p.fds.grant(len(conns)+p.dials, time.Now()) {
		return false // out of file descriptors: see fdlimit.go
	}
	p.dials++
	p.dialing.Store(int32(p.dials))
	p.redial.retry = false
	run := p.startRunLocked(waiter)
	p.wg.Add(1)
	go p.dial(run)
	return true
}

// anySerial reports whether a connection of conns that takes queries
// serves in order by its own answers (serial.go): a query that waits for a
// dial of its own found it busy, and forward would have dialled for it. Not
// one closing or cut: the queries a cut replays dial as the mode says. Off
// the hot path: under p.mu, for a waiter's dial.
func anySerial(conns []*conn) bool {
	for _, c := range conns {
		if c.serial.Load() && c.avail().takes() {
			return true
		}
	}
	return false
}

// countsTowardCap reports whether a connection in state a counts toward the
// cap of connections that take queries: a connection draining or near its end
// does not (its successor is dialled before it ends), nor does one blocked
// behind a slow answer, which takes no query either, unless the cap is a
// number (MaxConns: the operator's bound), or the mode is unknown and no
// rescue won lately: then a blocked connection is as likely the upstream
// pausing, which more connections would not help (unbound's hiccups on a busy
// machine).
func (p *Pool) countsTowardCap(a avail) bool {
	switch a {
	case availTaking:
		return true
	case availQuiet:
		return true
	case availBlocked:
		m := &p.learned.mode
		return p.cfg.MaxConns > 0 || m.get() == ModeUnknown && !m.rescue.Load() && p.rescuesWon.Load() == 0
	}
	return false
}

// dialLimitLocked is how many dials may run at once: one after a failure (the
// backoff paces them); for an in-order upstream maxParallelDials; otherwise one,
// and one more for each connection near its end (a server that cuts
// connections after a few dozen queries needs successors faster than one
// handshake at a time gives them) and for each connection the load is short of.
//
// maxParallelDials gives way to what the load is short of (shortfall and
// connections near their end) when each connection serves few queries: in
// order (one at a time) or under a learned query limit. forward dials one
// connection for each query that finds none idle, all at once; a pool that
// dialled four at a time would serve a server cutting every connection after
// six queries, or an in-order one under a burst, far less.
func (p *Pool) dialLimitLocked(ending int, waiter bool) int {
	short := ending + int(p.shortfall.Load())
	switch {
	case p.redial.strikes > 0:
		return 1
	case waiter:
		// A query that waits for a connection of its own (dialForWaiter):
		// one dial per waiting query, as forward would.
		return max(maxParallelDials, short, int(p.waiters.Load())+1)
	case p.oneEach():
		return max(maxParallelDials, short)
	case p.learned.limit.get() != 0:
		// And one for each limit's worth of queries waiting for a connection
		// or coming before a dial would be done (see limitedDemand).
		return max(maxParallelDials, short, p.limitedDemand())
	}
	return min(1+short, maxParallelDials)
}

// limitedDemand is how many connections a server that cuts them at a learned
// query limit calls for by the time a dial started now is done: one for each
// limit's worth of queries waiting for a connection, and, for those that come
// in a dial's time (the sweeper's arrivals, see size), as many as Little's law
// with the in-order headroom gives (neededInOrder): each dial serves a limit's
// worth. Counting the waiting ones alone, the pool dialled only once a queue
// had formed, and held one: at 2,105 QPS, five queries per connection and 26
// ms handshakes, some fifty queries waited for a dial at any time, and one that
// lost the new slots to later arrivals waited for several (issue 21, seed 35:
// p99 136-161 ms, 38-41 ms with the arrivals counted, against forward's 26;
// TestSmallLimitDialsForTheWaitingQueries). forward dials for every query that
// finds no connection idle. The cap on connections counts the arrivals only
// while queries wait: a connection near its end dials its successor
// (pickInTurn), and with the arrivals always counted, a server cutting after
// 11-57 answers at 300-1,300 QPS got 58-68 connections where forward held
// 6-13 (seeds 1, 3, 56, 75).
func (p *Pool) limitedDemand() int {
	l := float64(p.learned.limit.get())
	if l == 0 {
		return 0
	}
	return int(math.Ceil(float64(p.waiters.Load())/l)) + neededInOrder(float64(p.arriving.Load())/l)
}

// sizer is the sweeper's view of the load, for sizing the pool. Sweeper only.
type sizer struct {
	at       int64   // unix ns of the last tick
	total    int64   // frames read by all connections by then
	rate     float64 // answers per second, smoothed over rateWindow
	inflight float64 // queries outstanding (tombstones included), smoothed
	tokens   float64 // rescue budget (see rescue.go)
	// newestSent: the write time (unix ns) of the latest-written call
	// answered, on any connection, closed ones included (see watch)
	newestSent int64
	wanted     int // the last reported Sized figures
	open       int
	perConn    int // the last reported ModeLearned figure (see Pool.learn)
	// arrivals: queries that came per second, smoothed over rateWindow: answers read, and
	// calls registered or waiting (load, waiters) since the last tick, but
	// for the rescues (a second call of a query that came before)
	arrivals float64
	queued   int64                          // load and waiters, less the rescues ever sent, at the last tick
	used     [inOrderKeep / time.Second]int // the most connections with queries outstanding in each of the last seconds, this one first
	usedAt   int64                          // unix ns when used[0]'s second began
}

// noteUsed records how many connections have queries outstanding now.
func (z *sizer) noteUsed(now int64, n int) {
	if now-z.usedAt >= int64(time.Second) {
		copy(z.used[1:], z.used[:])
		z.used[0], z.usedAt = 0, now
	}
	z.used[0] = max(z.used[0], n)
}

// keepInOrder is how many connections an in-order pool keeps when idle ones
// could close: the most that had queries outstanding at once over the last
// inOrderKeep, the spares and one more (see sweepAll).
func (z *sizer) keepInOrder() int { return slices.Max(z.used[:]) + inOrderSpares + 1 }

// takenOpen is how many of conns are open and took a query. As in order is
// learned, the sweeper counts them in the keep (keepInOrder) as used at once,
// for inOrderKeep: what the cold start (or the spell out of order) opened.
// forward keeps its cold start's connections as long as its load lasts (it
// takes them in turn, and none idles out); the pool closed those beyond what
// the load then needed after a second (inOrderIdle), and a hiccup of a loaded
// client (reads late on every connection at once) found it lean: each query
// in it that found none idle dialled, handshakes as slow as the reads
// (2,000 QPS of 5 ms answers, reads 5 ms late for 50 ms: 43 connections
// against forward's 21; reads 10 ms late: p99 24.3 ms against forward's
// 15.1; TestLoadedClientHiccupFaresAsForward).
func takenOpen(conns []*conn) int {
	n := 0
	for _, c := range conns {
		if c.taken.Load() > 0 && c.avail().open() {
			n++
		}
	}
	return n
}

// inOrderKeep is how far back keepInOrder looks: forward's connections
// expire after 10 s unused (its expire's default), and taken in turn, as
// forward takes them, none is unused that long, so forward keeps the most its
// load ever needed. Looking back 5 s, the pool closed the connections a burst
// had needed, and the next burst waited for dials: dnsdist-slow (a server
// that serves a connection's queries one at a time) failed its p99 target in 2
// runs of 10 (27.7 and 31.2 ms against forward's 12-13), with 101-168 dials a
// run; looking back 10 s, in 0 of 10, with 94-101 dials.
const inOrderKeep = 10 * time.Second

// size runs on every tick, after watch: from the answers read since the last
// tick it updates the answer rate and the rescue budget, and it works out how
// many connections the load wants; it dials when the pool is short of them
// (make before break: a connection near its end does not count) and, if
// report, tells the observer what changed.
func (p *Pool) size(now, reads int64, conns []*conn, report bool) {
	z := &p.sizer
	// reads counts closed connections' frames too (see sweep): it only grows.
	n := countConns(conns)
	queued := int64(n.load) + int64(p.waiters.Load()) - p.rescueCalls.Load()
	z.sample(now, reads, queued)
	wait := p.dialWait(now)
	p.arriving.Store(int32(min(z.arrivals*wait.Seconds(), math.MaxInt32/2)))
	turn := max(wait, time.Duration(p.learned.mode.usual.Load()))
	p.turnover.Store(int32(min(z.arrivals*turn.Seconds(), math.MaxInt32/2)))
	z.noteUsed(now, n.used)
	z.inflight += (float64(n.load) - z.inflight) / 8
	needed := p.neededNow(max(z.inflight, float64(n.load)))
	p.needed.Store(int32(needed))
	wanted := p.wanted(n.busy, n.busyLoad, needed) + p.successors(n.busy, n.n[availNearEnd])
	open := n.steady()
	p.shortfall.Store(int32(max(wanted-open, 0)))
	for range min(wanted-open, maxParallelDials) - int(p.dialing.Load()) {
		p.dialUpTo(wanted)
	}
	if taking := n.takes(); report && (wanted != z.wanted || taking != z.open) {
		z.wanted, z.open = wanted, taking
		p.sizeObs.Sized(wanted, taking)
	}
}

// rateWindow is the time constant of the sizer's smoothed rates: a tick's
// rates weigh by the share of it that the tick spans. The rates feed what comes
// in a dial's time (arriving, limitedDemand; 0.2-65 ms of handshake) and in an
// answer's and a dial's (neededNow): a window of about those spans, and the
// one that weighing each tick by a sixteenth gave at the fastest busy tick
// (minWatchInterval, 2.5 ms). Over 20 ms, strict property runs failed about
// as many seeds (9 13 11 against 10-13); over 80 ms, more (13 12 14), and
// seed 78's spike (see sample) outlasted its burst.
const rateWindow = 16 * minWatchInterval

// sample folds the answers read and the queries that came since the last tick
// into the smoothed rates and the rescue budget. Each tick's rates weigh by
// the time it spans (an exponential average in time, window rateWindow), not
// alike: the reader and new queries wake the sweeper (kickLearn,
// kickSweeper), and a tick 12 us after the one before with one arrival read
// 83,000 a second; weighed as a sixteenth, as a 10 ms tick was, it held the
// arrival rate at 4,500-5,000 for 20 ms where 1,800 came (issue 21, property
// seed 67). In seed 78 (in order, 1,177 a second), one tick 58 us after the
// one before took the rate from 1,067 to 2,077, it stayed over 1,650 for the
// next 20 ms, and Little's law let the pool open 23 connections where forward
// held 22. Weighed by time, a tick adds about what came over rateWindow,
// however short it is.
func (z *sizer) sample(now, reads, queued int64) {
	if dt, r := now-z.at, max(reads-z.total, 0); z.at != 0 && dt > 0 {
		w := -math.Expm1(-float64(dt) / float64(rateWindow)) // the tick's weight: 1 - e^(-dt/window)
		z.rate += (float64(r)*1e9/float64(dt) - z.rate) * w
		z.tokens = min(z.tokens+float64(r)*rescueShare, maxRescueBurst)
		came := max(r+queued-z.queued, 0)
		z.arrivals += (float64(came)*1e9/float64(dt) - z.arrivals) * w
	}
	z.at, z.total, z.queued = now, reads, queued
}

// successors is how many connections, beyond what the load holds, a server
// that cuts connections at a learned query limit calls for. Filled in turn, a
// connection near its end takes half the limit more queries, and its
// successors must be ready before that: the answer rate times the dial time,
// in such halves, and one. One each (oneEach), a connection is
// near its end only once its last queries take a dial's time or less
// (nearEndAfter): one successor for each such; the two kept regardless were
// connections forward does not hold (TestInOrderLimitDialsSuccessorsOnlyNearTheCut).
func (p *Pool) successors(busy, nearEnd int) int {
	limit := p.learned.limit.get()
	if limit == 0 || busy == 0 {
		return 0
	}
	if p.oneEach() {
		return nearEnd
	}
	dial := time.Duration(p.dialTime.Load())
	return int(math.Ceil(p.sizer.rate*dial.Seconds()/float64(max(limit/2, 1)))) + 1
}

// dialWait is how long a dial started at now is likely to take: the smoothed
// dial time, or, if longer, twice how long the oldest dial under way has run.
// The smoothed time learns of slower handshakes only as they end; meanwhile
// the queries that come while they run were counted for the old time, and the
// dials started for them served a fraction (issue 21, property seed 67: a
// loaded client made 0.6 ms handshakes take 65 ms, and a server cutting after
// five answers got 15 dials for the 75 queries of those 65 ms). Twice: a dial
// seen some time into its run is as likely near its start as near its end,
// and one started now runs the whole of it, not what is left. Counted for the
// time run alone, seed 67 failed in 6 of 6 replays (p99 163-183 ms against
// 153 allowed) once the arrival rate read right through the slow handshakes
// (1,800 a second, the load's): it had passed only while a tick 12 us after
// the one before read its one arrival as 83,000 a second, and the smoothed
// rate stayed at 4,500-5,000 for the next 20 ms.
func (p *Pool) dialWait(now int64) time.Duration {
	d := p.dialTime.Load()
	if from := p.oldestDial.Load(); from != 0 {
		d = max(d, 2*(now-from))
	}
	return time.Duration(d)
}

// noteDialTime folds a dial's duration into the smoothed dial time.
func (p *Pool) noteDialTime(d time.Duration) {
	old := p.dialTime.Load()
	if old == 0 {
		p.dialTime.Store(int64(d))
		return
	}
	p.dialTime.Store(old + (int64(d)-old)/8) // concurrent dials may lose a sample: no matter
}

// neededNow is the most connections an in-order upstream needs now: Little's
// law on the queries that come (the arrival rate times the usual answer time
// and a dial's: what forward would hold, each query on a connection of its
// own), or, until the answer time is known, on those outstanding. Not on
// those outstanding once it is: a queue that formed on few connections
// before in order was learned is outstanding, but forward would never have
// held it; opening a connection for each of its queries, as their rescues
// would, leaves the pool with more than forward ever opens.
func (p *Pool) neededNow(outstanding float64) int { // sweeper only (p.sizer)
	u := p.learned.mode.usual.Load()
	if u == 0 || p.sizer.arrivals == 0 {
		return neededInOrder(outstanding)
	}
	hold := time.Duration(u + p.dialTime.Load())
	return neededInOrder(min(outstanding, p.sizer.arrivals*hold.Seconds()))
}

// neededInOrder is the most connections an in-order upstream needs with
// inflight queries outstanding on average (Little's law: the arrival rate times
// the answer time, slow answers included): one per query, with headroom for
// the bursts of a random arrival, plus spares.
func neededInOrder(inflight float64) int {
	n := inOrderHeadroom*inflight + arrivalBurst(inflight) + inOrderSpares
	return int(math.Ceil(min(n, AutoMaxConnsInOrder)))
}

// arrivalBurst is how far above n, their mean, random (Poisson) arrivals
// may come: three standard deviations.
func arrivalBurst(n float64) float64 { return 3 * math.Sqrt(n) }

// wanted is how many connections taking queries the load wants now: in order,
// the busy ones and the spares, within what Little's law allows; otherwise
// enough to hold what is outstanding at three-quarters full. None while nothing
// is outstanding.
func (p *Pool) wanted(busy, inflight, needed int) int {
	if busy == 0 {
		return 0
	}
	if p.oneEach() {
		n := busy + inOrderSpares
		if p.cfg.MaxConns == 0 {
			n = min(n, needed)
		}
		return min(n, p.capConns())
	}
	perConn := max(p.cfg.MaxInflight*3/4, 1)
	return min((inflight+perConn-1)/perConn, p.capConns())
}
