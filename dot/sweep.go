package dot

import (
	"cmp"
	"errors"
	"math"
	"time"
)

// sweep runs on the pool's full sweeps. Under c.mu it times out calls past their
// deadline and reaps expired tombstones (timeouts), starts a drain at MaxAge (and
// calls for a successor shortly before) and judges what the connection's state
// calls for (closeCauseLocked); outside the lock it completes the timed-out
// calls and closes the connection if it must. idle, if not 0 and shorter than
// the connection's idle timeout, replaces it (see sweepAll). It returns the
// earliest deadline of the live calls left (MaxInt64: none), for sweepLoop.
func (c *conn) sweep(now int64, idle time.Duration) (expiry int64) {
	c.mu.Lock()
	if c.state == stateClosed {
		c.mu.Unlock()
		return math.MaxInt64
	}
	expired, oldest, next, expiry := c.timeoutsLocked(now)
	if maxAge := c.pool.cfg.MaxAge; maxAge > 0 {
		age := time.Duration(now - c.born)
		if age > maxAge-min(maxAge/8, c.idle/2, nearEndLead) {
			c.nearEnd.Store(true)
		}
		if age > maxAge {
			c.setDrainingLocked(CloseMaxAge)
		}
	}
	v := c.closeCauseLocked(now, oldest, next, idle)
	silent := 0
	if v.reason < 0 {
		silent = c.silentBeyondLocked(now)
	}
	refuted := c.limitRefutedLocked()
	c.mu.Unlock()
	if silent > 0 {
		c.pool.learnSilence(c, silent)
	}
	if refuted > 0 {
		c.pool.unlearnLimit(refuted)
	}

	c.endExpired(expired, v)
	return expiry
}

// endExpired times out the calls a sweep found past their deadline, closes
// the connection if v says so, and tells the waiting room of the slots
// freed. c.mu must not be held.
func (c *conn) endExpired(expired []*call, v closeCause) {
	for _, cl := range expired {
		c.pool.obs.TimedOut()
		cl.complete(result{err: ErrTimeout})
	}
	if v.reason >= 0 {
		c.closeFor(v.cause, v.reason)
	}
	if len(expired) > 0 {
		c.pool.slotFreed()
	}
}

// expireCalls is sweep's timeouts alone (see expire): it gives up c's live
// calls past their deadline and, if it gave up any, closes c if what is left
// calls for it (closeCauseLocked: in the seeds, every query given up). It
// returns the earliest deadline of the live calls left (MaxInt64: none).
func (c *conn) expireCalls(now int64) int64 {
	c.mu.Lock()
	if c.state == stateClosed {
		c.mu.Unlock()
		return math.MaxInt64
	}
	expired, oldest, next, expiry := c.timeoutsLocked(now)
	if len(expired) == 0 {
		c.mu.Unlock()
		return expiry
	}
	v := c.closeCauseLocked(now, oldest, next, 0)
	c.mu.Unlock()
	c.endExpired(expired, v)
	return expiry
}

// expireAll is expireCalls on every connection; it returns the earliest
// deadline of a live call left (MaxInt64: none).
func (p *Pool) expireAll(now int64, conns []*conn) int64 {
	expiry := int64(math.MaxInt64)
	for _, c := range conns {
		expiry = min(expiry, c.expireCalls(now))
	}
	return expiry
}

// collect returns and clears what c's answers said of the upstream since the
// last collect (see answerLog); from now on answer times count at most alone
// for queries alone on the connection, mean for the mean.
func (c *conn) collect(alone, mean, side int64) answerStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers.aloneCeiling, c.answers.meanCeiling, c.answers.sideSend = alone, mean, side
	return c.answers.collect()
}

// nearEndLead bounds how long before MaxAge a connection's successor is dialled.
const nearEndLead = time.Second

// timeoutsLocked reaps expired tombstones and gives up the live calls past their
// deadline, returning those (to be completed outside the lock), the two
// outstanding written queries sent first and the earliest deadline of the live
// calls left (MaxInt64: none). c.mu must be held.
func (c *conn) timeoutsLocked(now int64) (expired []*call, oldest, next *call, expiry int64) {
	expiry = math.MaxInt64
	for cl := range c.calls.all() {
		if cl.tombUntil != 0 && now > cl.tombUntil {
			c.removeLocked(cl)
			continue
		}
		if cl.tombUntil == 0 && now >= cl.deadline {
			c.giveUpLocked(cl, now)
			expired = append(expired, cl)
		} else if cl.tombUntil == 0 {
			expiry = min(expiry, cl.deadline)
		}
		oldest, next = earliest(oldest, next, cl)
	}
	return expired, oldest, next, expiry
}

// closeCause is why the sweeper closes a connection; reason -1: it does not.
type closeCause struct {
	cause  error
	reason CloseReason
}

// closeCauseLocked checks, in order of precedence, for a stall, a drain that
// stopped answering, a finished drain and idleness. c.mu must be held.
func (c *conn) closeCauseLocked(now int64, oldest, next *call, idle time.Duration) closeCause {
	if idle == 0 || idle > c.idle {
		idle = c.idle
	}
	stuck := c.drainStuckLocked(now, oldest)
	switch {
	case c.stalledLocked(now, oldest, next):
		return closeCause{ErrStalled, CloseStall}
	case stuck:
		return closeCause{errDrainStuck, c.drainFor}
	case c.drainedLocked() >= 0:
		return closeCause{errDrained, c.drainFor}
	case c.rescuedOnlyLocked():
		return closeCause{errRescuedOnly, CloseDrain}
	case c.calls.len() == 0 && now-c.lastUsed.Load() > int64(idle):
		return closeCause{errIdle, CloseIdle}
	}
	return closeCause{reason: -1}
}

// stalledLocked: the oldest outstanding query is older than the stall timeout,
// not a single frame was read since it was written, and a later query has gone
// unanswered for half the stall timeout too. Not drainQuiet: an
// out-of-order connection that carried one slow name, then queries whose
// answers all came slowly (a storm), was closed 500 ms into them and they
// were replayed into the same storm (property seed 102,
// TestSlowAnswersAfterASlowNameAreNoStall). A slow answer on a connection
// that is still answering others is not a stall, and neither is one
// unanswered query on an otherwise idle connection: a server may drop a
// query or take long over it, and only a second query tells a dead
// connection from that.
func (c *conn) stalledLocked(now int64, oldest, next *call) bool {
	cfg := &c.pool.cfg
	return next != nil && now-oldest.sentAt.Load() > int64(cfg.StallTimeout) &&
		now-next.sentAt.Load() > int64(cfg.StallTimeout/2) && c.reads.Load() == oldest.readsAt.Load()
}

// drainStuckLocked updates the sweeper's view of the read counter and reports
// whether a draining connection has stopped answering. It gets no new queries, so
// its answers only dry up; if they stop while queries are still out, the server
// has most likely dropped them (or is about to cut the connection): closing it
// replays them elsewhere now, rather than after their read timeout. Not so a
// connection drained at the learned query limit: it holds only queries its
// server answers before its cut, so a quiet one there is merely slow (a slow
// name), and a replay would start its wait again; it gets the stall timeout.
func (c *conn) drainStuckLocked(now int64, oldest *call) bool {
	if r := c.reads.Load(); r != c.sweepReads || c.quietSince == 0 {
		c.sweepReads, c.quietSince = r, now
	}
	quiet := drainQuiet(&c.pool.cfg)
	if c.drainFor == CloseLimit {
		quiet = c.pool.cfg.StallTimeout
	}
	return c.state == stateDraining && oldest != nil && now-c.quietSince > int64(quiet)
}

// earliest returns the two written calls sent first among oldest, next (already
// in order, either may be nil) and cl.
func earliest(oldest, next, cl *call) (*call, *call) {
	s := cl.sentAt.Load()
	switch {
	case s == 0:
		return oldest, next
	case oldest == nil || s < oldest.sentAt.Load():
		return cl, oldest
	case next == nil || s < next.sentAt.Load():
		return oldest, cl
	}
	return oldest, next
}

// rescuedOnlyLocked reports whether an in-order upstream's connection has
// nothing outstanding but queries answered elsewhere (rescued, or given up):
// the upstream serves them one at a time, for nobody, and the connection
// takes no query until they are all answered. Closing it ends that work.
// While the mode is unknown and the upstream slow (slowUnknown), a connection
// whose every query was given up (timed out) is closed too, as forward closes
// one on a read timeout: it takes no query until its late answers come,
// which may be never. Asked as a caller gives a call up (conn.release) and
// on the full sweeps (a rescue won, a call timed out there, or the mode
// changed). c.mu must be held.
func (c *conn) rescuedOnlyLocked() bool {
	slow := c.pool.slowUnknown()
	if c.calls.len() == 0 || !slow && c.pool.learned.mode.get() != ModeInOrder {
		return false
	}
	for cl := range c.calls.all() {
		if cl.tombUntil == 0 || !cl.lost && !slow {
			return false // live, or given up by its caller: its late answer is awaited and counted
		}
	}
	return true
}

var (
	errRescuedOnly = errors.New("in order, only queries answered elsewhere outstanding")
	errIdle        = errors.New("connection idle")
	errDrainStuck  = errors.New("draining connection stopped answering")
)

// drainQuiet is how long a draining connection may go without any answer while
// queries are outstanding: a quarter of the stall timeout, at most 500ms.
func drainQuiet(cfg *Config) time.Duration { return min(cfg.StallTimeout/4, 500*time.Millisecond) }

// sweepLoop drives, from one timer, the watch for blocked connections and the
// sizing (every tick: fast while queries are outstanding) and the full sweep of
// timeouts, tombstone expiry, stall, idle and drain checks and learning (every
// sweepInterval).
func (p *Pool) sweepLoop() {
	defer p.wg.Done()
	full := p.sweepInterval()
	t := time.NewTimer(full)
	defer t.Stop()
	var next int64                  // unix ns of the next full sweep
	due := nanotime() + int64(full) // when the timer should fire
	expiry := int64(math.MaxInt64)  // unix ns of the earliest deadline of a live call at the last sweep (see expire)
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
			t.Stop() // no stale tick after this (Go 1.23 timers)
			// A woken tick is due at its wake, not at the timer's
			// time: held up since (a GC, a descheduled thread), it
			// runs late, and servedBy must not date the reads it sees
			// grow by its own time (TestUnknownModeHeldUpPoolDialsNone,
			// where the held query woke the idle sweeper: 1 run in
			// about 1,000 under -race, 13 dials). kickedAt is stored
			// before the wake, so it is never older than this one.
			due = min(due, p.kickedAt.Load())
		}
		if hold := p.tickHold.Load(); hold != nil {
			(*hold)()
		}
		now := nanotime()
		p.clock.Store(now)
		late := max(now-due, 0)
		if late > int64(lateTick) {
			p.noteHoldUp(now, late)
		}
		// Reads of every connection ever open, closed ones included: a
		// total of the open ones alone lost each closing connection's
		// reads, and against a server that cuts connections every few
		// dozen answers the answers counted per tick, and the arrivals
		// worked out from them, were a fifth of the real ones (7-8
		// queries a dial where about 40 came, TestRegimeChurn).
		closed := p.closedReads.Load()
		conns := *p.conns.Load()
		busy, reads := p.watch(now, late, conns)
		reads += closed
		if reads > p.sizer.total {
			p.readsGrewAt = now // before size, which takes the new total
			p.servingAt.Store(p.servedBy(now, late, conns))
		}
		sweep := now >= next
		if sweep {
			next = now + int64(full)
			expiry = p.sweepAll(now, conns)
		} else if now >= expiry {
			expiry = p.expireAll(now, conns) // see expire
		} else if busy {
			p.watchSilence(now, conns)
		}
		if sweep || p.rescuesWon.Load() >= minRescueEvidence || p.learnDue.Swap(false) {
			// At once on rescues that won, or on answers that showed
			// in order (see reader.go): the mode decides where the next
			// queries go, and a queue on few connections grows meanwhile.
			p.learn(now, conns)
		}
		p.size(now, reads, conns, sweep)
		if sweep {
			p.rescueSpells(now, conns) // after the sizing, whose decisions it is no part of
		}
		d := full
		switch {
		case busy:
			d = min(max(time.Duration(p.rescueDelay()/4), minWatchInterval), full, p.silenceWatch())
		}
		d = expire(d, now, expiry)
		p.idleTicks.Store(!busy) // before the reset: a query registered from now on kicks
		t.Reset(d)
		due = nanotime() + int64(d)
	}
}

// kickSweeper wakes the sweeper if it ticks slowly (nothing was outstanding):
// a query is now, and a connection it blocks must be seen within a fast tick.
func (p *Pool) kickSweeper() {
	if p.idleTicks.Load() && p.idleTicks.CompareAndSwap(true, false) {
		now := nanotime()
		p.askedAt.Store(now) // see dearQueue
		p.kickedAt.Store(now)
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// kickLearn wakes the sweeper to learn now (see reader.go): its tick while
// queries are outstanding is a quarter of the rescue delay, up to 20 ms while
// a fast upstream's mode is unknown, and a queue on the first connection grew
// meanwhile by every arrival (property seed 29: from 41 queries to 96 between
// the first busy answer and the tick that timed the spacing from it). at
// is the answer's arrival, when the woken tick is due (kickedAt).
func (p *Pool) kickLearn(at int64) {
	p.kickedAt.Store(at)
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// silenceWatch is how often, out of order, the sweeper looks for silent
// connections: within half the shortest quiet that shows one (see
// silentBeyondLocked). On the full sweeps alone, a silence was seen up to a
// sweepInterval late (property seed 19, with 100 ms answers: at 342 ms,
// not 250). Not out of order: the full sweep.
func (p *Pool) silenceWatch() time.Duration {
	if p.learned.mode.get() != ModeOutOfOrder {
		return p.sweepInterval()
	}
	return max(time.Duration(p.learned.mode.usual.Load()/2), minWatchInterval)
}

// minWatchInterval is the fastest the sweeper ticks, while queries are outstanding.
const minWatchInterval = minRescueDelay / 4

// expire shortens the sweeper's next tick, d from now, to come at expiry, the
// earliest deadline of a live call at the last sweep, if that is sooner: there
// the calls past their deadline are given up (expireAll; nothing else of the
// full sweep is done), as forward's read deadline gives up its query, not up
// to a sweepInterval later. Its
// connection, left with nothing live, closes then too (rescuedOnlyLocked), as
// forward closes one on its read timeout: kept open the rest of the interval,
// it was one connection more than forward's while the load dialled (property
// seeds 562 and 568: 151 against 150 and 52 against 51, a read timeout of
// 2 s seen 10-56 ms late). A call registered after that sweep has a deadline
// a read timeout away, past the next full sweep (a twentieth of it), unless
// its caller's comes sooner: that one is given up at the next full sweep, as
// before. Not sooner than minWatchInterval: deadlines come as close together as
// the queries did (a black hole at 3,000 QPS: a third of a millisecond apart),
// and each such sweep visits every call.
func expire(d time.Duration, now, expiry int64) time.Duration {
	if expiry == math.MaxInt64 || expiry <= now {
		return d
	}
	return min(d, max(time.Duration(expiry-now), minWatchInterval))
}

// sweepAll sweeps every connection (see conn.sweep) and returns the earliest
// deadline of a live call left (MaxInt64: none). For an in-order upstream,
// whose load takes a connection per outstanding query, the idle connections
// beyond what the load needed over the last inOrderKeep (keepInOrder) close after
// inOrderIdle already, the newest first (the oldest idle one is taken first):
// the pool keeps what its recent load needed, not its busiest moment since
// IdleTimeout. In another mode the idle ones beyond the cap do (those an
// in-order spell left: more would not be used). A connection that never took
// a query is none of them and, in order, closes at the idle timeout, as
// forward's would (it still counts toward the keep: taken idle ones beyond it
// close first):
// dialled for a query that an older connection served first, it shows the load
// outran the connections then, as forward's did when it dialled (issue 21,
// property seed 131: closed after inOrderIdle, the pool met a storm with 43
// connections against forward's 59 and dialled past forward's peak). Out of
// order, any idle one beyond the cap closes after inOrderIdle: kept, the
// dials of one hiccup of a busy machine held make bench's unbound 15-18
// connections through a round, against its target of 4.
func (p *Pool) sweepAll(now int64, conns []*conn) (expiry int64) {
	n := countConns(conns)
	surplus := n.open()
	if p.oneEach() {
		keep := p.sizer.keepInOrder()
		surplus -= keep
		p.warm.Store(int32(keep))
	} else {
		surplus -= p.capConns()
		p.warm.Store(0)
	}
	expiry = math.MaxInt64
	oneEach := p.oneEach()
	for i := len(conns) - 1; i >= 0; i-- {
		var idle time.Duration
		if c := conns[i]; surplus > 0 && c.load.Load() == 0 && c.avail().open() && (c.taken.Load() > 0 || !oneEach) {
			idle, surplus = inOrderIdle, surplus-1
		}
		expiry = min(expiry, conns[i].sweep(now, idle))
	}
	return expiry
}

// inOrderIdle is how long a surplus connection to an in-order upstream may
// stay idle (see sweepAll).
const inOrderIdle = time.Second

// learn collects what the connections' answers said of the upstream (see
// answerLog) and the rescues that won, and updates the mode and the answer
// times; it reports a change of mode.
func (p *Pool) learn(now int64, conns []*conn) {
	m := &p.learned.mode
	var st answerStats
	side := int64(0) // a fast upstream's gaps are too short to tell side by side from in turn
	if u := m.usual.Load(); u >= int64(unknownSlow) || u >= 4*int64(serialGap) && p.queueOnOldest() {
		// Or one query waits on the oldest connection (queueOnOldest): in
		// order, its answer comes a service time (u) after the one
		// before, which a quarter of u and serialGap never reach.
		side = u / 4
	}
	for _, c := range conns {
		st.add(c.collect(ceiling(&m.usual), ceiling(&m.mean), side))
	}
	st.rescued = float64(p.rescuesWon.Swap(0))
	m.learnTimes(st)
	var alone int64
	if st.aloneN > 0 {
		alone = st.aloneSum / int64(st.aloneN)
	}
	mode, changed := m.update(st.evidence, alone, now)
	if changed && mode == ModeInOrder {
		p.beliefYoung(now) // re-tested soon: see orderCheckRate
		// What the cold start opened counts as used: see takenOpen.
		p.sizer.noteUsed(now, takenOpen(conns))
	}
	// A query a connection in order, and while the mode is unknown and the
	// upstream timed slow (slowUnknown; not the untimed start, which says
	// nothing of the upstream yet): reported when it changes too, so that
	// conn_concurrency says what the pool does.
	perConn := p.cfg.MaxInflight
	if mode == ModeInOrder || m.usual.Load() > 0 && p.slowUnknown() {
		perConn = 1
	}
	if changed || perConn != cmp.Or(p.sizer.perConn, p.cfg.MaxInflight) { // none reported yet: MaxInflight
		p.sizer.perConn = perConn
		p.sizeObs.ModeLearned(mode, perConn)
	}
}

// sweepInterval is the full sweep's period: a twentieth of the shortest timeout,
// between 5ms and 100ms.
func (p *Pool) sweepInterval() time.Duration {
	d := min(p.cfg.ReadTimeout, p.cfg.StallTimeout) / 20
	return min(max(d, 5*time.Millisecond), 100*time.Millisecond)
}
