package dot

import (
	"cmp"
	"context"
	"errors"
	"math"
	"slices"
	"time"
)

// Rescues.
//
// A connection is blocked when it has read nothing for the rescue delay and a
// query written on it has waited that long with an older one still
// outstanding, and something shows that it waits behind that one rather than
// being slow itself: the mode is in order, answers lately came queued behind
// others, the answer to a query written after it (on any connection) has come
// back, or it has waited four mean answer times (see stuckWatch). An in-order upstream serves it
// only after the older one, which is slow (or the connection is dying); an
// upstream whose every answer is slow blocks nothing, and rescuing its queries
// would only send them twice. A blocked connection takes no new
// query until it reads again, and the queries stuck on it are rescued: each
// caller is told (a notice on its call's resp, errRescued) and sends its query
// once more, on another connection with nothing outstanding (dialled if need
// be). The call stays live where it was, and the first answer of the two wins;
// the other attempt is given up, and its late answer dropped and counted
// (DropRescued). Only a plain QUERY not yet sent twice is rescued, once (a
// rescued query is not replayed, nor rescued again; a replayed one is not
// rescued). Queries not yet written move to another connection at no cost.
//
// What rescues cost is bounded: a budget of rescueShare of the answers (with a
// burst of maxRescueBurst), of which a rescue takes more while the mode is not
// known to be in order (rescueCost). A rescue that wins by a rescue delay or
// more is evidence that the upstream serves a connection's queries in order
// (see conn.judgeLocked).

const (
	// minRescueDelay is the least a query waits, with nothing read, before it
	// is rescued: more than this machine's scheduling hiccups.
	minRescueDelay = 10 * time.Millisecond
	// rescueFactor: a query is rescued after this many times the usual
	// answer time, if that is longer than minRescueDelay.
	rescueFactor = 8
	// rescueShare caps rescues as a share of the answers, maxRescueBurst the
	// rescues at once.
	rescueShare    = 0.25
	maxRescueBurst = 64
	// judgeFactor and minJudgeLate: a rescue wins by far when its original
	// comes this many mean answer times after it, and this long at least
	// (see conn.judgeLocked).
	judgeFactor  = 4
	minJudgeLate = 50 * time.Millisecond
)

// rescueCost is what a rescue costs of the budget in each mode. In order, a
// half: half the answers may be rescues, and a burst of twice maxRescueBurst
// (a queue that formed before the mode was learned goes out at once, one
// query a connection, as forward would have sent it). Unknown, four: a connection that
// reads nothing may as well be the upstream pausing (the pool finds out from
// the rescues, see judgeLocked). Out of order, ten: a query waits for nobody,
// and one that takes long is most likely slow itself, so that sending it again
// doubles the work for nothing; a few rescues still find out if the upstream
// changed.
//
// A query queued behind another while the mode was unknown is rescued no
// sooner, nor more cheaply, than any other: rescued after minRescueDelay at
// in order's cost, and owed a dial, such queries made property seeds 119 and
// 149 open 10-13 connections more than forward (2 replays of 2 each) and
// fixed none. In seed 77 the queue that formed on the first 12 connections
// in its first 80 ms was rescued as in order was learned (80 ms), into a
// storm (85-316 ms, answers 5.5 times as long) that forward's queries, sent
// at 5-80 ms, missed: 45-94 of that queue were in service at the pool's
// peak against forward's 21, the whole surplus. What helps there is not
// queueing them, not rescuing them sooner.
var rescueCost = [modeCount]float64{ModeUnknown: 4, ModeOutOfOrder: 10, ModeInOrder: 0.5}

// judgeLocked judges the original of a rescue that won (at cl.wonAt), on its
// connection c, when its late answer comes or when the sweeper finds it still
// unanswered: if that is well after the rescue's answer, the original was
// stuck behind another query, which is evidence that the upstream serves a
// connection's queries in order. Well after: minJudgeLate, a rescue delay and
// four mean answer times. The original was not slow itself (the rescue was
// not), the upstream did not just pause (then both come at once), and it was
// not merely queued at a busy upstream that serves its connections in turn, a
// fresh one (the rescue's) first: such an upstream (unbound at full load) lets
// a connection wait a few tens of milliseconds at most. Each is judged once. A
// record trial's query is not: it may have been stuck because the upstream did
// not read it (see records.go). c.mu must be held.
func (c *conn) judgeLocked(cl *call, now int64) {
	p := c.pool
	if cl.wonAt == 0 {
		return
	}
	late := max(int64(minJudgeLate), p.rescueDelay(), judgeFactor*p.learned.mode.mean.Load())
	if now-cl.wonAt >= late {
		if !cl.trial {
			p.rescuesWon.Add(1)
		}
		cl.wonAt = 0
	}
}

// errRescued is a rescue notice: the call is stuck behind a slow answer and the
// caller is to send the query again elsewhere. The call stays live.
var errRescued = errors.New("dot: query stuck behind a slow answer")

// rescueDelay is how long a query may wait with nothing read before it is
// rescued. In order it is minRescueDelay: a query behind another waits for
// the rest of that one's answer time and then its own, so that sending it on
// an idle connection at once is never slower, and the usual answer time
// (which scales the delay otherwise, for an upstream that may only be slow)
// would make the wait behind a slow in-order upstream's queue last seconds.
func (p *Pool) rescueDelay() int64 {
	m := &p.learned.mode
	if m.get() == ModeInOrder {
		return int64(minRescueDelay)
	}
	return max(int64(minRescueDelay), rescueFactor*m.usual.Load())
}

// blockWatch is the sweeper's view of one connection's reads, for telling when
// it is blocked. Sweeper only.
type blockWatch struct {
	reads int64 // the connection's frames read at the last tick
	since int64 // unix ns since when reads has not moved
}

// quietFor is how long c has read nothing with queries outstanding, at now:
// since its last read or since it took its first query after an idle spell,
// whichever is later. Counted from the last read alone, a connection idle
// longer than the rescue delay was quiet at the first tick after it took two
// queries, none of them due, and the next query dialled
// (TestIdleConnectionNotQuietOnItsNextBurst). Only while the rescue delay is
// at its floor (fromBusy): the upstream is fast, and a hiccup of this
// process, not a slow answer, is what holds a new burst's first queries.
// Above the floor, the idle spell counts as it did: an in-order upstream with
// a slow name (seed 198, 1.9 ms answers, 21% of names 93x slower) then has
// its new queries sent beside the slow one early enough to learn its order
// from them. Sweeper only.
func (c *conn) quietFor(now int64, fromBusy bool) int64 {
	if !fromBusy {
		return now - c.watch.since
	}
	return now - max(c.watch.since, c.busyAt.Load())
}

// watch runs on every tick. It finds blocked connections and rescues the calls
// stuck on them (see rescueStuck), and reports whether any connection has
// calls outstanding and how many frames all have read. late is how much later
// than due the tick came: the time this process did not run is not counted as
// time a connection read nothing.
func (p *Pool) watch(now, late int64, conns []*conn) (busy bool, total int64) {
	z := &p.sizer
	idle := 0 // connections taking queries with nothing outstanding
	for _, c := range conns {
		w, r := &c.watch, c.reads.Load()
		total += r
		z.newestSent = max(z.newestSent, c.answers.newestSent.Load())
		if r != w.reads || w.since == 0 {
			w.reads, w.since = r, now
		} else {
			w.since = min(w.since+late, now)
		}
		busy = busy || c.load.Load() > 0
		if c.load.Load() == 0 {
			c.quietAt.Store(0) // waiting for nothing: a new query waits behind nobody
			if c.avail().takes() {
				idle++
			}
		}
	}
	mode := p.learned.mode.get()
	w := stuckWatch{now: now, delay: p.rescueDelay(), cost: rescueCost[mode], tokens: &z.tokens, after: z.newestSent,
		overdue: judgeFactor * p.learned.mode.mean.Load(), checkDelay: p.checkRescueDelay()}
	if idle >= checkRescueIdle {
		w.checkDelay = w.delay // an order check's rescue goes there (see acquireRescue)
	}
	if mode == ModeInOrder || p.learned.mode.waits.Load() {
		w.after = math.MaxInt64 // every query waits behind those before it
	}
	fromBusy := mode != ModeInOrder && w.delay == int64(minRescueDelay)
	for _, c := range conns {
		// In order, a query behind others waits for all of them however
		// briskly they are answered: a queue that formed before the mode
		// was learned is rescued whether or not its connection reads (not
		// an order check, two deep: it waits one answer at most).
		quiet := c.quietFor(now, fromBusy)
		if !(c.load.Load() >= 2 && quiet >= w.delay || mode == ModeInOrder && c.load.Load() >= 3) {
			continue
		}
		// A connection whose answers wait unread in its socket is not stuck
		// behind a slow one: its reader is behind, and rescues would only
		// make this process busier. Asked last: it costs a syscall (ioctl),
		// on every tick for every connection if asked first.
		if c.bc.unread() {
			continue
		}
		if quiet >= w.delay {
			c.quietAt.Store(c.watch.reads + 1)
		}
		c.rescueStuck(&w)
	}
	p.watchOrderedQueues(&w, conns)
	return busy, total
}

const (
	// unknownSlow: while the mode is unknown, an upstream whose usual
	// answer time is this or more gets a query a connection (see slowUnknown).
	unknownSlow = 10 * time.Millisecond
)

// stuckWatch is what one tick's watch tells rescueStuck.
type stuckWatch struct {
	now, delay int64
	// after: a call written before this (unix ns) waits behind another, not
	// for its own answer: a call written later was answered (MaxInt64 in
	// order: every call waits for those before it).
	after int64
	// overdue: a call written this long ago (ns) with nothing read for the
	// rescue delay waits behind another: were it served beside the others,
	// it would have been answered in about the mean answer time (0: no mean
	// yet, no such inference).
	overdue int64
	cost    float64  // of a rescue, in tokens
	tokens  *float64 // the rescue budget
	// checkDelay: the rescue delay of an order check (see acquireRescue):
	// delay while checkRescueIdle connections are idle, else checkRescueDelay
	checkDelay int64
}

// delayOf is how long cl waits behind another before it is rescued.
func (w *stuckWatch) delayOf(cl *call) int64 {
	if cl.orderCheck {
		return max(w.delay, w.checkDelay)
	}
	return w.delay
}

// waits reports whether something shows that a call written at sent, waited
// outstanding for now-sent = age, waits behind another.
func (w *stuckWatch) waits(age, sent int64) bool {
	return sent < w.after || w.overdue > 0 && age >= w.overdue
}

// rescueStuck is called on a connection that has read nothing for delay. It marks c
// blocked if a written call has waited delay behind an older one still
// outstanding, written before w.after. Then such calls that may be rescued get
// a rescue notice, oldest first, as far as tokens allow, and the calls not yet
// written move to another connection at no cost (errUnsent), rather than go
// out behind the slow one, if the pool may have another.
func (c *conn) rescueStuck(w *stuckWatch) {
	now, delay := w.now, w.delay
	c.mu.Lock()
	stuck := c.stuckLocked(w)
	if len(stuck) == 0 || c.state == stateClosed {
		c.mu.Unlock()
		return
	}
	c.blockedAt.Store(c.reads.Load() + 1)
	c.stopTrial()
	var moved []*call
	for cl := range c.calls.all() {
		if c.pool.capConns() > 1 && cl.state.CompareAndSwap(callQueued, callAbandoned) {
			c.removeLocked(cl)
			moved = append(moved, cl)
		}
	}
	slices.SortFunc(stuck, func(a, b *call) int { return cmp.Compare(a.seq, b.seq) })
	for _, cl := range stuck {
		if !cl.rescuable || cl.rescued || cl.deadline-now < delay || *w.tokens < w.cost {
			continue
		}
		w.tellLocked(cl)
	}
	c.mu.Unlock()
	for _, cl := range moved {
		cl.complete(result{err: errUnsent})
	}
}

// tellLocked tells cl's caller to rescue it, if the notice has room (the
// caller has not been completed: a live call is completed only under its
// connection's mu, which must be held), and pays the rescue from the budget.
// It reports whether cl was told.
func (w *stuckWatch) tellLocked(cl *call) bool {
	select {
	case cl.resp <- result{err: errRescued}:
		cl.rescued = true
		*w.tokens -= w.cost
		return true
	default:
		return false
	}
}

// stuckLocked returns the live calls written delay ago or more, and before
// w.after, while a call written before them (live or a tombstone) is still
// outstanding; it judges the originals of rescues that won on the way.
func (c *conn) stuckLocked(w *stuckWatch) []*call {
	now := w.now
	var head uint32 // the oldest written call's seq
	for cl := range c.calls.all() {
		if cl.state.Load() == callSent && (head == 0 || cl.seq < head) { // seq is set before the state
			head = cl.seq
		}
	}
	var stuck []*call
	for cl := range c.calls.all() {
		if cl.tombUntil != 0 {
			c.judgeLocked(cl, now)
		} else if s := cl.sentAt.Load(); cl.state.Load() == callSent && cl.seq != head && now-s >= w.delayOf(cl) && w.waits(now-s, s) {
			stuck = append(stuck, cl)
		}
	}
	return stuck
}

// rescue sends q once more, on another connection than c, for its call cl that
// is stuck there, and returns the first answer of the two attempts (see firstOfTwo).
// While it waits for a connection, an answer to cl still wins; if none can take
// it, cl is simply awaited.
func (p *Pool) rescue(ctx context.Context, q *query, deadline time.Time, c *conn, cl *call) (result, bool) {
	r := p.newCall(ctx, q, deadline)
	r.avoid, r.rescuable = c, false
	if cl.spell && cl.deadline < r.deadline {
		r.deadline, r.callerDeadline = cl.deadline, cl.callerDeadline // see spell.go
	}
	var got result
	rc, err := p.acquireRescue(ctx, r, cl, &got)
	if err != nil {
		p.respChans.Put(r.resp)
		if errors.Is(err, errOtherFirst) {
			return got, true
		}
		return c.await(ctx.Done(), cl)
	}
	q.resent = true
	p.sizeObs.Rescued()
	defer p.respChans.Put(r.resp)
	return p.firstOfTwo(ctx.Done(), attempt{c, cl}, attempt{rc, r})
}

// attempt is a call and the connection it is registered on.
type attempt struct {
	c  *conn
	cl *call
}

// errNoneIdle: an order check's rescue, or a slow spell's, found no
// connection idle (see acquireRescue).
var errNoneIdle = errors.New("dot: no connection idle for an order check's rescue")

// checkRescueDelay is how long an order check waits behind the query it was
// put behind, while no connection is idle, before it is rescued as any
// query is (acquireOr, dialling if need be): the rescue delay of an
// upstream not known to be in order. While one is idle, it is rescued after
// the delay of the mode, onto that one (see acquireRescue).
func (p *Pool) checkRescueDelay() int64 {
	return max(int64(minRescueDelay), rescueFactor*p.learned.mode.usual.Load())
}

// acquireRescue finds the rescue r of the stuck call cl a connection (see
// acquireOr). The rescue of an order check (see orderCheckConn) before
// checkRescueDelay takes one only if one is idle at once (the sweeper
// rescues it that early only while checkRescueIdle are, see watch), and otherwise fails
// with errNoneIdle: the check waits where it was put. The upstream serves it
// there whatever the pool does; a rescue that dialled, or waited for a
// connection to free, took the connection forward would have given the
// check on top of the one it was put on, both busy for it (property seeds 2
// and 64: order checks rescued right after in order was learned, 1-4
// connections more than forward at its peak). Not rescued at all, a check
// behind a slow in-order upstream's answer waited two answer times (seed
// 47: 282 ms against forward's p99 of 184); not rescued as any query once
// it waited checkRescueDelay, one behind a fast upstream's slow answer
// waited 600 ms (TestRegimeSwitchingUpstream, 2 runs in 30). The rescue of
// a query written in a slow spell takes a connection idle at once or none
// (see spell.go).
func (p *Pool) acquireRescue(ctx context.Context, r, cl *call, got *result) (*conn, error) {
	if !cl.spell && (!cl.orderCheck || nanotime()-cl.sentAt.Load() >= p.checkRescueDelay()) {
		return p.acquireOr(ctx, r, cl.resp, got)
	}
	rc := p.pick(r)
	if rc == nil {
		return nil, errNoneIdle
	}
	p.rescueCalls.Add(1)
	return rc, nil
}

// firstOfTwo waits for the first answer of a stuck attempt and its rescue and gives
// up the other. An error of one leaves the other to answer; if both fail, the
// last error is returned.
func (p *Pool) firstOfTwo(done <-chan struct{}, stuck, resc attempt) (result, bool) {
	pending := [2]*attempt{&stuck, &resc}
	var last result
	for pending[0] != nil || pending[1] != nil {
		var res result
		var i int
		select {
		case res = <-respOf(pending[0]):
		case res = <-respOf(pending[1]):
			i = 1
		case <-done:
			return p.giveUpBoth(pending)
		}
		pending[i] = nil
		if !answered(res) {
			last = res
			continue
		}
		if other := pending[1-i]; other != nil {
			var wonAt int64
			if i == 1 {
				wonAt = nanotime() // the rescue won: judge the original when it comes
			}
			if r, ok := other.c.release(other.cl, true, wonAt); ok && answered(r) {
				p.obs.Dropped(DropRescued) // both were in: the loser's answer goes nowhere
			}
		}
		return res, true
	}
	return last, true
}

// respOf is a pending attempt's result channel, nil (never ready) for none.
func respOf(a *attempt) <-chan result {
	if a == nil {
		return nil
	}
	return a.cl.resp
}

// giveUpBoth ends a rescue whose caller gave up: both pending attempts are given
// up, and an answer that came meanwhile is still preferred.
func (p *Pool) giveUpBoth(pending [2]*attempt) (result, bool) {
	var got result
	found := false
	for _, a := range pending {
		if a == nil {
			continue
		}
		if r, ok := a.c.release(a.cl, false, 0); ok && (!found || answered(r)) {
			got, found = r, true
		}
	}
	return got, found
}

// answered reports whether a call's result is the upstream's answer (malformed
// or not), as opposed to a failure of the attempt.
func answered(r result) bool { return r.err == nil || errors.Is(r.err, ErrMalformed) }

// checkRescueIdle: an order check is rescued before checkRescueDelay only
// while this many connections are idle. In order, it is served on the
// connection it was put on whatever the pool does, an answer time after the
// query before it: rescued onto the only idle connection, both were busy
// for it, and the next arrival dialled one forward never opened (steady seed
// 51: in order, 9.5 ms answers at 1,361 QPS paced, 16 connections; a check
// rescued 10 ms after its write, its own answer due 11 ms later, and a 17th
// dial 11 ms after the rescue).
const checkRescueIdle = 2
