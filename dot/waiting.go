package dot

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// The waiting room: a query that pick finds no connection with room for
// waits here, as one of a bounded number of waiters, for a slot, a dial, its
// deadline or (a rescue) its original's answer; what frees capacity wakes
// every waiter, and each picks again.

// acquire registers cl on a usable connection (see pick), dialing one when all
// are busy and the pool has room, and waiting (bounded by ctx and cl's deadline)
// when every connection is full.
func (p *Pool) acquire(ctx context.Context, cl *call) (*conn, error) {
	// The common case without acquireOr's frame: the caller runs on CoreDNS's
	// per-query goroutine, whose stack a deeper call chain would grow (copy).
	if c := p.pick(cl); c != nil {
		return c, nil
	}
	return p.acquireSlow(ctx, cl, nil, nil)
}

// errOtherFirst: acquireOr's other channel delivered before a connection was found.
var errOtherFirst = errors.New("dot: the other attempt completed first")

// acquireOr is acquire that, while it waits, also listens on other (if not
// nil): if that delivers first, it stores the result in got and fails with
// errOtherFirst.
func (p *Pool) acquireOr(ctx context.Context, cl *call, other <-chan result, got *result) (*conn, error) {
	p.rescueCalls.Add(1)
	if c := p.pick(cl); c != nil {
		return c, nil
	}
	return p.acquireSlow(ctx, cl, other, got)
}

// acquireSlow is acquireOr once pick found no connection with room.
func (p *Pool) acquireSlow(ctx context.Context, cl *call, other <-chan result, got *result) (*conn, error) {
	// Count ourselves as a waiter before taking the wake channel, and pick again
	// after: a slot freed in between is then either seen by pick or wakes us. The
	// waiters are bounded in proportion to the slots, whatever they wait for (a
	// slot, a dial, a draining connection's replacement): past that the pool is
	// overloaded, or a black hole is eating every slot, and waiting would only pile
	// up goroutines and memory, so the caller fails at once and can go elsewhere.
	// A query sharing the first dial leaves p.sharers after p.waiters (deferred
	// first, run last): see endShare. Then, no longer owed a dial, the query
	// may leave one surplus: see dropSurplusDials.
	defer p.endSpared(cl)
	defer p.dropSurplusDials()
	defer p.endShare(cl)
	if p.waiters.Add(1) > int32(maxWaitersPerSlot*p.capConns()*p.cfg.MaxInflight) {
		p.waiters.Add(-1)
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, errSaturated)
	}
	cl.seated = false
	defer p.stopWaiting(cl)
	if cl.avoid != nil {
		p.rescuers.Add(1)
		defer p.rescuers.Add(-1)
	}
	p.enterOrder(cl)
	defer p.leaveOrder(cl)
	w := slotWait{ctx: ctx, cl: cl, other: other, got: got}
	defer w.stop()
	for {
		wake, err := p.needConn(cl.avoid == nil)
		if err != nil {
			return nil, err
		}
		if c := p.pick(cl); c != nil {
			return c, nil
		}
		if cl.avoid != nil {
			p.dialForRescue(cl.avoid) // a rescue waits for a connection with nothing outstanding
		}
		cl.waited = true
		if len(*p.conns.Load()) == 0 && p.learned.mode.usual.Load() != 0 {
			// Every connection was lost: the waiters share the next one.
			// Before the first answer, only a burst shares the first one
			// (see firstDialBurst).
			cl.sharesNext = true
		}
		if err := w.wait(wake, p.recheckAfter()); err != nil {
			return nil, err
		}
	}
}

// stopWaiting counts cl, leaving acquireSlow, out of p.waiters, unless it
// was as it took its connection (seatWithin).
func (p *Pool) stopWaiting(cl *call) {
	if !cl.seated {
		p.waiters.Add(-1)
	}
}

// slotWait is acquireSlow's waiting, in a frame of its own: pick, deep enough,
// runs on the caller's stack without the select's.
type slotWait struct {
	ctx   context.Context
	cl    *call
	other <-chan result
	got   *result
	timer *time.Timer
	again *time.Timer // fires when the waiter looks again for itself (recheckAfter)
}

// wait waits for wake, other, the context or the call's deadline, and at most
// recheck if it is not 0.
//
//go:noinline
func (w *slotWait) wait(wake <-chan struct{}, recheck time.Duration) error {
	if w.timer == nil {
		w.timer = time.NewTimer(time.Until(time.Unix(0, w.cl.deadline)))
	}
	var again <-chan time.Time
	if recheck > 0 {
		if w.again == nil {
			w.again = time.NewTimer(recheck)
		} else {
			w.again.Reset(recheck)
		}
		again = w.again.C
	}
	select {
	case <-wake:
		return nil
	case <-again:
		return nil
	case *w.got = <-w.other:
		return errOtherFirst
	case <-w.ctx.Done():
		return w.ctx.Err()
	case <-w.timer.C:
		if w.cl.callerDeadline {
			return context.DeadlineExceeded // the caller's deadline, not ours
		}
		return fmt.Errorf("%w: no free connection", ErrTimeout)
	}
}

func (w *slotWait) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.again != nil {
		w.again.Stop()
	}
}

// recheckAfter is how long a query that waits with no dial under way for it
// (dialForWaiter could not start one: the dials are capped) waits before it
// looks again: a dial's time; at least minWatchInterval, so that a stall with
// many waiting does not spin them. 0 while every waiting query has a dial
// under way (its end wakes them) and none waits in place of a dial for an
// order check (checkOwesWaiter), which looks again to see whether it still
// does.
func (p *Pool) recheckAfter() time.Duration {
	if !p.oneEach() || p.learned.mode.usual.Load() == 0 || int(p.dialing.Load()) >= p.owedDials() && p.sparedWaiters.Load() == 0 {
		return 0
	}
	return max(time.Duration(p.dialTime.Load()), minWatchInterval)
}

// needConn is acquire's slow path: it starts a dial if allowed and dial (a
// rescue dials as dialForRescue says) and returns the channel that is closed
// when the pool's capacity may have changed. While the upstream is in backoff
// (its first strike's retry taken) and has no usable connection, it fails at
// once so the caller can try another upstream.
func (p *Pool) needConn(dial bool) (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrPoolClosed
	}
	if dial && !p.hasRoomLocked() {
		p.startDialLocked(0, false)
	}
	if p.dials == 0 && !p.hasUsableLocked() && !p.redial.mayDial(time.Now()) {
		if p.redial.cause != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, p.redial.cause)
		}
		return nil, ErrUnavailable
	}
	if p.dials == 0 && !p.hasUsableLocked() && p.fds.blocks(time.Now()) {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, p.fds.cause)
	}
	return p.wake, nil
}

// hasRoomLocked reports whether a usable connection that is not blocked has a
// free slot.
func (p *Pool) hasRoomLocked() bool {
	for _, c := range *p.conns.Load() {
		if c.avail().takes() && c.load.Load() < int32(p.cfg.MaxInflight) {
			return true
		}
	}
	return false
}

func (p *Pool) hasUsableLocked() bool {
	s := countConns(*p.conns.Load())
	return s.open() > 0
}

// slotFreed wakes callers waiting for capacity, if there are any, and, where
// queries go one to a connection, drops the waiters' dials that the slot
// leaves surplus (see dropSurplusDials).
func (p *Pool) slotFreed() {
	p.dropSurplusDials()
	if p.waiters.Load() == 0 {
		return
	}
	p.mu.Lock()
	p.wakeLocked()
	p.mu.Unlock()
}

func (p *Pool) wakeLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// maxWaitersPerSlot bounds the callers waiting for a slot of a saturated pool.
const maxWaitersPerSlot = 4

// seatWithin registers cl on c within limit (see registerWithin). A waiter
// in the order (ticket) counts out of p.waiters before it registers, not as
// acquireSlow unwinds after: counted till then, it was still owed a dial
// (owedDials), and a query that found no connection idle meanwhile dialled
// one more than the waiting queries (under -race, a dial more than the
// arrivals about twice a run of TestSlowUpstreamGetsForwardsConnectionsBeforeItsFirstAnswer,
// and at the load's end, 401 dials for 400 queries). Counted out first, a
// register that fails leaves the count a query short for a moment: a query
// that asks then waits without a dial of its own until it looks again,
// never dials one more. Queries that have not waited, a fast upstream's,
// only test the ticket.
func (p *Pool) seatWithin(c *conn, cl *call, limit int) bool {
	if cl.ticket == 0 {
		return c.registerWithin(cl, limit)
	}
	p.waiters.Add(-1)
	if c.registerWithin(cl, limit) {
		cl.seated = true
		p.endSpared(cl) // with its count: spared but out of waiters, it made owedDials one short
		return true
	}
	p.waiters.Add(1)
	return false
}

// dialForWaiter is for a query that found no connection it should go on
// (pickIdle): it reports whether a dial is under way for it (waitForDial;
// noDial if none may start), one per waiting query (those in acquireSlow,
// this one included when it waits again; rescues not: they yield to these,
// see pickIdle), starting a dial if there are fewer, so that the query may
// wait. It takes whichever comes first, the
// dial or a busy connection that frees (acquireSlow), as forward does.
//
// It used to bet on a busy connection whose answer was due before a dial
// would be done (freeingSoon) and dial nothing: that saved a connection when
// the answer came when due, and cost up to a dial's time more when it was a
// slow one (property seeds 33, 37, 92 and 196 over forward's p99: 92 in 6 of
// 6 strict runs, 0 of 6 without the bet), while the connection counts the bet
// was for stayed as they were without it (12-14 seeds over the model's per
// strict run either way).
//
// It starts none, and the caller looks again (lookAgain), if it would start
// one but the connections changed since the caller's look (looked, its
// snapshot of p.conns): a dial that ended in between added one, idle, and
// counts under way no more. Asked before the dials under way (every change
// sent the query round again, even where it was owed one of them), the
// pool's cold start against a fast upstream opened many more connections
// (BenchmarkPoolExchange: 20-63 in 5 of 6 rounds, against 1-4 on the base). Asked
// of the dials alone, a query that started the pool's first dial and found
// it done by then dialled a second connection for itself, the first one
// idle (under -race, TestOneUnansweredQueryIsNoStall and the root package's
// TestProbesReusePooledConnection: 2 handshakes for one query at a time in
// about 1 run in 4,000). Only a waiter's path asks: a query that found a
// connection idle, a fast upstream's every query, never comes here.
// pickIdle's last look passes no snapshot (nil): sent round again there, the
// query would leave pickIdle with no dial under way and wait for its
// recheck, if the connections changed on each of its looks (a server that
// cuts connections).
func (p *Pool) dialForWaiter(cl *call, looked *[]*conn) waiterDial {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dials > 0 && p.owedDials() <= p.dials || p.checkOwesWaiter(cl) {
		return waitForDial
	}
	if looked != nil && p.conns.Load() != looked {
		return lookAgain
	}
	if p.startDialLocked(0, true) {
		return waitForDial
	}
	return noDial
}

// waiterDial is what dialForWaiter tells a query that found no connection idle.
type waiterDial int

const (
	noDial      waiterDial = iota // no dial may start: the query goes on a busy connection
	waitForDial                   // a dial is under way for it, or a check spares it one: it waits
	lookAgain                     // the connections changed since it looked: it looks again
)
