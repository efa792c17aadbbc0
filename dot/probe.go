package dot

import "math"

// The depth probe: how a slow out-of-order upstream whose query limit is not
// known is pipelined without betting many queries on a limit nothing has
// shown yet.
//
// A query written past a server's query limit is ignored until the server's
// slowest answer before it and its cut; the pool sees it only as a silence
// (sweep.go), a usual answer time or more after the queries before it were
// answered, and replays it then: two answer times late at least, and more
// (the silence, the replay). Against a fast upstream that costs a few
// milliseconds, and the reach (twice the most answers one connection served,
// and unprovenDepth more) lets its connections fill as deep as its load
// needs. Against a slow one it costs more than a dial: forward, one query a
// connection, never sends one past a limit. Filled in turn to the reach, every
// connection of property seed 19 (out of order, 98 ms answers, cut after 22
// queries) took 46 to 48 queries after out of order was learned at 142 ms, 26
// of them ignored, connection after connection until two silences taught the
// limit: about 100 queries replayed, p99 367 to 480 ms against the model's
// 140.
//
// So while such an upstream's limit is not known, a connection takes queries
// only up to the deepest write order the server served on any connection
// (queryLimit.deepest: a server with a limit served none past it), in turn
// over the connections open; a query that finds none with room goes to one
// connection at a time that may go past it, the probe, probeStep queries past
// it at first and twice as far after each probe the server served to its
// end; one that finds the probe as deep as it may go takes a connection at
// the depth that has nothing outstanding, one query at a time, as forward
// sends them (a server with a limit closes it after its last answer, so no
// query goes past the limit unseen, and each answer there deepens the depth
// served), and with none such waits for one of its own, dialled for it, as
// forward's would (pickIdle). A probe past a
// limit costs its queries past the limit; one that drains (silent, learnSilence)
// or is not served within probeWait after its latest query ends, and the next
// goes probeStep past the deepest again: its silence after as many answers
// teaches the limit (two like silences). Seed 19 then took at most 21
// queries a connection and none past its limit (p99 140 ms, the model's).
//
// The probe takes only what the connections within the deepest cannot: taken
// first, it went 8 past seed 19's limit (its second probe, after a first
// that went from 17 to 21), and 7 queries ignored there, replayed onto the
// next probe past the same limit, took p99 to 175-194 ms. Taken last, it
// grows the depth only as fast as the load overflows, so a limitless slow
// upstream (TestUniformlySlowSteadyLoadLearnedSideBySide: 300 ms answers)
// is carried on more connections than the out-of-order cap while its depth
// is proven. So the probe hands back to the reach once the server served
// unprovenDepth past the depth it first found (probedTo): as deep as the
// reach bets with nothing served beyond, where seed 19's limit (5 past the 17
// it first found) stopped every probe. Kept on, the probe held 5 or 6
// connections in 2 of 5 runs of that test under the race detector, and
// TestTurnsUpstreamEndsOnFewConnections (50 clients, whose answers took the
// 14 ms of 50 turns as out of order was learned) held 21 to 77 in its last
// second in the runs that reverted the probe (bbd9f7f). The idle connections
// at the depth taking one query each spare dials: with a dial for each such
// query instead, that test made 74 to 126 dials, 50 (its clients') with it.
const (
	// probeStep is how far past the deepest write order served a first
	// probe goes: as many unanswered queries as make a connection silent
	// (minSilentBeyond), so that a probe past a limit shows it.
	probeStep = minSilentBeyond
	// probeWait, in usual answer times, is how long after the probe's last
	// query the probe may go unserved before another connection probes: its
	// queries past the deepest may be slow names, and a limit would have
	// shown as a silence by then (silentAfter).
	probeWait = 2 * silentAfter
	// maxProbeStep caps how far past the deepest one probe goes.
	maxProbeStep = 1024
)

// depthProbe is the probe's state. Guarded by Pool.mu.
type depthProbe struct {
	c      *conn // the probe; nil: none
	target int32 // the most queries it takes: the deepest served when it started, and step
	step   int32 // how far past the deepest the next probe goes; 0: probeStep
	last   int64 // unix ns of its latest query
}

// probedReach reports the most queries a connection takes while the upstream
// is slow, out of order and its query limit not known (0 otherwise, when the
// reach of the other modes holds): the deepest write order it served. Not
// once the server served unprovenDepth past the deepest as the probe first
// engaged (probedTo).
func (p *Pool) probedReach() int32 {
	if !p.probeApplies() {
		return 0
	}
	l := &p.learned.limit
	deep := l.deepest.Load()
	bet := l.probedTo.Load()
	if bet == 0 {
		l.probedTo.CompareAndSwap(0, deep+unprovenDepth)
		bet = l.probedTo.Load()
	}
	if deep >= bet {
		return 0 // served as deep as the reach bets unproven: see probedTo
	}
	return max(deep, 1)
}

// probeApplies reports whether the upstream is one the probe is for: slow,
// out of order, its query limit not known, MaxConns auto.
func (p *Pool) probeApplies() bool {
	if p.cfg.MaxConns > 0 || p.learned.mode.get() != ModeOutOfOrder || p.learned.limit.get() != 0 || p.noDepthProbe.Load() {
		return false
	}
	return p.learned.mode.usual.Load() >= int64(unknownSlow)
}

// heldAtDepth reports whether a connection that took accepted queries was
// held at the depth by the probe: the probe is on (not handed back) and it
// took no more than the deepest write order served. Such a connection takes
// one query at a time there and then sits idle, so that a server's idle
// timeout cuts them all after as many answers, the depth, some within
// answerCutWithin of their last answer: two such cuts within a dial's time
// of each other taught a limit at the depth the server did not have (steady
// property seed 45: idle timeout 144 ms, answers 276 ms, a limit of 13 with
// 14 served, the queries past it evicted and replayed, p99 640 ms against
// the model's 375). Such a cut teaches no limit (learnLimit): a limit at the
// depth shows on the probe, which goes past it and is cut busy.
func (p *Pool) heldAtDepth(accepted int) bool {
	if !p.probeApplies() {
		return false
	}
	l := &p.learned.limit
	deep, bet := l.deepest.Load(), l.probedTo.Load()
	return bet != 0 && deep < bet && accepted <= int(deep)
}

// pickProbe registers cl on the probe (starting one if none is under way),
// while it has room before its target; else it returns nil.
func (p *Pool) pickProbe(cl *call) *conn {
	c := p.probeConn(cl, nanotime())
	if c == nil || !c.accepts(c.avail(), cl) || cl.within != 0 && c.taken.Load() >= cl.within {
		return nil
	}
	if !c.registerWithin(cl, p.cfg.MaxInflight) {
		return nil
	}
	p.mu.Lock()
	if p.probe.c == c {
		p.probe.last = nanotime()
	}
	p.mu.Unlock()
	return c
}

// probeConn returns the probe if it has room before its target, ending it
// if the server served it to its target (the next goes twice as far) or it
// failed (drains, or was not served within probeWait: the next goes
// probeStep past the deepest), and starting one on the oldest connection
// that takes queries if none is under way.
func (p *Pool) probeConn(cl *call, now int64) *conn {
	deep := p.learned.limit.deepest.Load()
	u := p.learned.mode.usual.Load()
	p.mu.Lock()
	defer p.mu.Unlock()
	pr := &p.probe
	if pr.step == 0 {
		pr.step = probeStep
	}
	if c := pr.c; c != nil {
		past := c.taken.Load() > deep // it holds queries past the deepest
		switch {
		case deep >= pr.target:
			pr.step = min(2*pr.step, maxProbeStep)
		case past && (!c.avail().takes() || now-pr.last > probeWait*u):
			pr.step = probeStep
		case !c.avail().takes():
			// Closed or draining with nothing past the deepest (idle,
			// its server's idle timeout): no failure.
		case !past:
			// Served past where it started, nothing past the deepest
			// now: it goes its step past the deepest again.
			pr.target = deep + pr.step
			return c
		case c.taken.Load() < pr.target:
			return c
		default:
			return nil // full: its answers show whether it goes deeper
		}
		pr.c = nil
	}
	for _, c := range *p.conns.Load() {
		if c.accepts(c.avail(), cl) && c.load.Load() < int32(p.cfg.MaxInflight) {
			pr.c, pr.target, pr.last = c, deep+pr.step, now
			return c
		}
	}
	return nil
}

// noteDepth is told that a connection's server served its served-th query
// (write order): no limit of the server's is below it.
func (l *queryLimit) noteDepth(served uint32) {
	for v := int32(min(served, math.MaxInt32)); ; {
		if o := l.deepest.Load(); o >= v || l.deepest.CompareAndSwap(o, v) {
			return
		}
	}
}

// retireOne drains the oldest connection, the probe not, that took reach
// queries or more (the deepest served) and has none outstanding, as a
// connection opens (Pool.dial): it takes no query until the probe shows that
// the server serves deeper, and the new one takes those it could not. Retired
// as the query that found no room dialled, a connection whose replacement
// could not be opened (out of file descriptors) was missed: the pool held 1
// where 2 could be (TestOutOfFilesCapsWithoutStrike). Kept open, such connections counted
// beside the new ones: TestUniformlySlowSteadyLoadLearnedSideBySide held 5 to
// 8 connections in 11 runs of 40 (4 with none retired), and property seed 65
// (out of order, 94 ms answers, no limit) 228 against the model's 205 in a
// client's stall. Drained, the first held 5 in 3 runs of 29, 4 in the others.
func (p *Pool) retireOne(reach int32) {
	p.mu.Lock()
	probe := p.probe.c
	p.mu.Unlock()
	for _, c := range *p.conns.Load() {
		if c == probe || c.taken.Load() < reach || c.load.Load() != 0 || !c.avail().takes() {
			continue
		}
		c.mu.Lock()
		if c.calls.len() == 0 {
			c.setDrainingLocked(CloseIdle) // closed at once, empty (see closeCauseLocked)
		}
		c.mu.Unlock()
		return
	}
}

// probing reports whether c is the depth probe. Its silence drains it (and
// ends it, see probeConn) but teaches no limit, nor counts toward one: a
// probe sits at the deepest write order served, and every probe after it
// too, so that a second probe whose few queries past it were slow names was
// silent after as many answers as the first, and the two taught a limit
// the server does not have (property seed 190: 29% of names 52 times slower,
// 108 connections closed at the limit in one run, p99 1.83 s against the
// model's 1.36 s in some). A limit the probe found costs its step's queries
// at most each time a probe goes past it, which the probe does only when the
// connections within the deepest are full.
func (p *Pool) probing(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.probe.c == c
}
