package dot

import "time"

// A silent connection: its server stopped answering the queries written past
// some count, as a server with a query limit does when it reads the queries
// past the limit and ignores them until it cuts the connection. The sweeper
// looks for one (watchSilence, silentBeyondLocked); what it teaches is the
// query limit's (querylimit.go).

// silentBeyondLocked reports, for a connection to an out-of-order upstream,
// how many queries its server answered if it has stopped answering any
// written after them: a server with a query limit that reads the queries
// past it and ignores them until the slowest of the first ones is answered
// (and then cuts the connection). It does if no query written after the last
// one served has been answered for silentAfter usual answer times while
// other connections read, and at least minSilentBeyond live queries written
// after it, that long before queries answered elsewhere were written, wait.
// Out of order, one slow answer holds up no other, so those would have been
// answered; in order (or not known) they may be behind a slow one, which
// rescue.go handles. 0: it has not. c.mu must be held.
//
// The connection may read meanwhile: the answers to its first queries come
// as slowly as they come (a heavy tail, a storm), and each frees a slot that
// takes a new query, which the server ignores too. Waiting for it to read
// nothing, or for its newest query to be old, waited for its cut (property
// seed 70: the pool's first connection carried 126 ignored queries for
// 1.2 s, and the others theirs until the first cut at 575 ms).
func (c *conn) silentBeyondLocked(now int64) int {
	p := c.pool
	if c.state != stateOpen || p.learned.mode.get() != ModeOutOfOrder || c.lastServed == 0 {
		return 0 // answering in write order (or not known to answer otherwise)
	}
	if c.accepted <= int(p.learned.limit.deepest.Load()) {
		// No query of its is past a limit: the server served as deep on a
		// connection (its unanswered ones are slow names). Where the depth
		// probe keeps connections at that depth (probe.go), their last
		// queries were slow names often, and one query past as many
		// answers as another silent one made a connection silent:
		// property seed 190 (29% of names 52 times slower, no limit)
		// replayed the slow names of a connection after another and timed
		// out 60 of them.
		return 0
	}
	usual := p.learned.mode.usual.Load()
	short := max(usual, int64(minSilentQuiet))
	long := max(silentAfter*usual, int64(minSilentQuiet))
	quiet := now - c.servedAt.Load()
	if quiet < short || now-p.readsGrewAt > long/4 {
		return 0 // answering lately, or the upstream as a whole quiet (a stall)
	}
	// One usual time of quiet is enough where many queries wait, or where
	// another connection fell silent after as many answers (a limit is
	// likely there, and every connection filled past it meanwhile holds
	// queries the server ignores: property seed 19, where the second
	// silence came 200 ms after the first and p99 was 677 ms against the
	// model's 140). There one query past it is enough, not
	// minSilentBeyond: the queries that came on the connection after it
	// reached the limit may be only one to three under a light load, and
	// they waited for the cut, after the slowest of the first ones was
	// answered (property seed 41: three, 575 ms against the model's 355;
	// a slow name of its own, the one query that can be alone past the
	// last served, costs a replay and a dial).
	need := manySilentBeyond
	if h := p.learned.limit.silentServed.Load(); h > 0 && alike(int(c.lastServed), int(h)) {
		need = 1
	}
	byShort, byLong := c.beyondLocked(short, long)
	if byShort >= need || quiet >= long && byLong >= minSilentBeyond {
		return int(c.lastServed)
	}
	return 0
}

// beyondLocked counts c's live queries written after the last one served
// and short (and long, which is no shorter) before a query answered
// elsewhere was: not a storm, which delays every answer alike. c.mu must be
// held.
func (c *conn) beyondLocked(short, long int64) (byShort, byLong int) {
	newest := c.pool.sizer.newestSent
	for cl := range c.calls.all() {
		if cl.tombUntil != 0 || cl.state.Load() != callSent || cl.seq <= c.lastServed {
			continue
		}
		if s := cl.sentAt.Load(); s <= newest-short {
			byShort++
			if s <= newest-long {
				byLong++
			}
		}
	}
	return byShort, byLong
}

// watchSilence looks for silent connections (see silentBeyondLocked) on the
// ticks between full sweeps: the queries a silent connection holds wait for
// its cut, and a full sweep comes only every sweepInterval (property seed 70,
// whose storm grows answer times 7.8 times from 480 ms: the limit learned
// at 320 ms on the full sweeps, at 263-320 ms on the ticks; 3 replays of 12
// answered under 0.98 of the model's queries, against 1 of 20). Only a
// connection that served nothing newer for minSilentQuiet is locked: one
// answering the queries written on it is not silent.
func (p *Pool) watchSilence(now int64, conns []*conn) {
	if p.learned.mode.get() != ModeOutOfOrder {
		return
	}
	for _, c := range conns {
		if c.load.Load() < minSilentBeyond || now-c.servedAt.Load() < int64(minSilentQuiet) {
			continue
		}
		c.mu.Lock()
		silent := 0
		if c.state == stateOpen {
			silent = c.silentBeyondLocked(now)
		}
		c.mu.Unlock()
		if silent > 0 {
			p.learnSilence(c, silent)
		}
	}
}

const (
	// silentAfter: a connection is silent (see silentBeyondLocked) after
	// this many usual answer times without an answer to a query written
	// after the last one served, and minSilentQuiet at least.
	silentAfter    = 2
	minSilentQuiet = 50 * time.Millisecond
	// minSilentBeyond is the fewest unanswered queries past the last one
	// served that show a silent connection: one or two may be slow names
	// (one is enough after as many answers as the last silent connection's).
	minSilentBeyond = 4
	// manySilentBeyond: as many unanswered queries past the last one
	// served show a silent connection after one usual answer time of
	// quiet: each would have been answered by then about half the time.
	manySilentBeyond = 16
)

// learnSilence is told that c's server stopped answering the queries written
// after its served-th (see silentBeyondLocked): a query limit that cuts the
// connection only after its slowest answer. It learns from it as from a cut,
// and sends c's queries past it elsewhere at once whether or not the pool
// learned a limit (a small one needs two like cuts): c drains.
//
// One silent connection may be one whose queries were all slow names: it
// teaches only if another one fell silent after as many answers (give or
// take one) before, or once the server cuts it with queries it ignored
// still out (see cutConfirmsLocked). What other connections served does not
// refute it (see refutesLimit): served is the write order of the last query
// answered, not a count, and an upstream that turned in order while the
// pool held it out of order falls silent so on every connection; the limit,
// once taught, moves the queries off all of them (TestRegimeSwitchingUpstream
// timed queries out while a limit refuted so moved them off the silent one
// alone). Before that, a silent connection's own queries past it go elsewhere all the same:
// if they were slow names, that costs their wait so far and a connection; if
// not, they would wait for its cut (property seed 63: p99 580 ms against 446
// ms, where 1.2 times the model's and 5 ms is 533 ms).
func (p *Pool) learnSilence(c *conn, served int) {
	c.markSilent(served)
	if p.probing(c) || !p.silenceAlike(c, served) {
		c.setQueryLimit(served, served)
		return
	}
	if limit := p.limitSilent(served); limit != 0 {
		p.applyLimit(limit, served)
		return
	}
	c.setQueryLimit(served, served)
}

// limitSilent learns the limit two like silences show. Not through limitCut:
// a silence is no cut, and a restart makes none, so neither the cuts around
// it nor limitCut's rule for small ones (two like cuts) bear on it. Through
// limitCut, the idle timeout's cuts of the connections of a burst 9 ms
// before made the second silence look part of a restart, and a third was
// needed besides (property seed 19: silences after 22 answers at 342, 442
// and 542 ms, the limit learned at the third and 953 ignored queries evicted
// then, p99 677 ms against the model's 140).
func (p *Pool) limitSilent(served int) int32 {
	if served < 2 {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.learned.limit.learn(served)
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
	l.silentAlike = l.silentConn != nil && alike(served, int(l.silentServed.Load()))
	l.silentConn = c
	l.silentServed.Store(int64(served))
	return l.silentAlike
}

// markSilent records that c fell silent after served answers (see
// learnSilence).
func (c *conn) markSilent(served int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.silentAt == 0 {
		c.silentAt = served
	}
}
