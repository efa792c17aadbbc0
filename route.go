package dotforward

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/coredns/coredns/plugin/metadata"
	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// forward tries the upstreams in policy order until one answers with an rcode
// not listed in failover, the attempts run out, the deadline passes or ctx ends.
// Upstreams that fail with a transient error (timeout, lost connection, failed
// dial) are tried again on the next pass; ones that are unavailable or answered
// with a failover rcode are not. If only failover answers came, the last one is
// returned, also when time runs out before another upstream answered.
//
// A message other than a QUERY (UPDATE, NOTIFY) may change state upstream, so it
// is sent at most once: its first answer is returned whatever the rcode, and
// after a failure it goes to another upstream only if the error proves it was
// never written (see unsent), and it is never hedged.
//
// With hedge, an attempt without an answer after the hedge delay races the next
// upstream of the list (see hedged): the route then settles the winner's
// outcome, or both outcomes in list order, as if it had tried them in turn.
func (f *DoTForward) forward(ctx context.Context, r *dns.Msg, deadline time.Time) (*dns.Msg, error) {
	var rt route
	if err := f.startRoute(&rt, r); err != nil {
		return nil, err
	}
	// This frame is on the stack all through the exchange, which runs deep on the
	// client's query's own goroutine: past 4 KB the runtime copies the stack, a
	// few microseconds per query. So the way through the upstreams is kept in rt,
	// and handled by settle and end, out of line.
	for rt.more(f.maxAttempts) {
		if err := expired(ctx, deadline); err != nil {
			rt.lastErr = withLast(err, rt.lastErr)
			break
		}
		if rt.hedging(f.attemptsLeft(rt.attempts)) {
			if ret, done, err := f.hedged(ctx, r, deadline, &rt); done {
				return ret, err
			}
			continue
		}
		u := rt.list[rt.i]
		ret, err := u.exchange(ctx, r, deadline)
		if ret, done, err := f.settle(ctx, &rt, outcome{u: u, ret: ret, err: err}); done {
			return ret, err
		}
	}
	return rt.end(ctx)
}

// attemptsLeft is how many attempts max_connect_attempts still allows after
// attempts (a large number when it is 0: no cap); a hedge is one.
func (f *DoTForward) attemptsLeft(attempts int) int {
	if f.maxAttempts == 0 {
		return math.MaxInt
	}
	return f.maxAttempts - attempts
}

// expired returns the reason to stop trying: ctx ended or the deadline passed.
func expired(ctx context.Context, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// route is one query's way through the upstreams (see forward): which are left to
// try, in policy order, and what the tries so far brought.
type route struct {
	list     []*upstream // the candidates left; list[i] is tried next
	i        int
	attempts int      // exchanges made, hedges included
	once     bool     // not a QUERY: sent at most once (see forward)
	hedge    bool     // the query's one hedge may still be sent
	held     *dns.Msg // the last failover answer
	heldFrom *upstream
	tried    *upstream // the last upstream tried
	lastErr  error
}

// startRoute sets rt out for r: the candidates, and whether it may be hedged
// (counted in the hedge budget if so).
func (f *DoTForward) startRoute(rt *route, r *dns.Msg) error {
	list, err := f.candidates()
	if err != nil {
		return err
	}
	once := r.Opcode != dns.OpcodeQuery
	*rt = route{list: list, once: once, hedge: f.hedge != nil && !once, lastErr: ErrNoHealthy}
	if rt.hedge {
		f.hedge.budget.count()
	}
	return nil
}

// candidates returns the upstreams to try, in policy order, without the down
// ones. When all are down it returns the one that failed least recently, or
// ErrNoHealthy with failfast_all_unhealthy_upstreams.
func (f *DoTForward) candidates() ([]*upstream, error) {
	// A single upstream needs no copy: forward removing it from the list writes
	// nothing into the array.
	ordered := f.upstreams
	if len(ordered) != 1 {
		ordered = f.policy.List(f.upstreams) // a fresh slice, ours to change
	}
	down := 0
	for _, u := range ordered {
		if u.Down() {
			down++
		}
	}
	if down == 0 {
		return ordered, nil
	}
	if down < len(ordered) {
		up := make([]*upstream, 0, len(ordered)-down)
		for _, u := range ordered {
			if !u.Down() {
				up = append(up, u)
			}
		}
		return up, nil
	}
	healthcheckBroken.Inc()
	if f.failfast {
		return nil, ErrNoHealthy
	}
	// Every upstream is down: try the one whose last failure is oldest, the best
	// bet, once. Its pool fails at once while in dial backoff, so the query costs
	// nothing when it is really gone.
	best := ordered[0]
	for _, u := range ordered[1:] {
		if u.health.lastFailure() < best.health.lastFailure() {
			best = u
		}
	}
	return []*upstream{best}, nil
}

// more reports whether another attempt is due: an upstream is left and the
// attempts allow it (max, 0 for no cap). It wraps i around the list.
func (rt *route) more(max int) bool {
	if len(rt.list) == 0 || (max != 0 && rt.attempts >= max) {
		return false
	}
	rt.i %= len(rt.list)
	return true
}

// hedging reports whether the next attempt may race a hedge: hedging is on and
// not yet spent, and another upstream and attempt are left.
func (rt *route) hedging(left int) bool {
	return rt.hedge && len(rt.list) >= 2 && left >= 2
}

// settle takes the outcome of one exchange, which went to list[i]: a hedge's two
// outcomes are settled in list order, the hedge having gone to list[i+1], and
// settling the first either moves i on or removes list[i]. done reports that
// the query is over, with ret or err; otherwise the route moves on.
func (f *DoTForward) settle(ctx context.Context, rt *route, o outcome) (ret *dns.Msg, done bool, err error) {
	rt.attempts++
	rt.i %= len(rt.list)
	rt.tried = o.u
	switch {
	case o.err == nil && (rt.once || !f.failover[o.ret.Rcode]):
		setUpstream(ctx, o.u)
		return o.ret, true, nil
	case o.err == nil:
		rt.held, rt.heldFrom = o.ret, o.u
	case errors.Is(o.err, dot.ErrBadQuery):
		setUpstream(ctx, o.u)
		return nil, true, o.err
	default:
		rt.lastErr = upstreamError(o.u.addr, o.err)
		if rt.once && !unsent(o.err) {
			setUpstream(ctx, o.u)
			return nil, true, rt.lastErr
		}
		if retryable(o.err) {
			rt.i++
			return nil, false, nil
		}
	}
	rt.list = append(rt.list[:rt.i], rt.list[rt.i+1:]...)
	return nil, false, nil
}

// end is the route's result when no attempt ended it: the last failover answer
// if one came, else the last error.
func (rt *route) end(ctx context.Context) (*dns.Msg, error) {
	if rt.held != nil {
		setUpstream(ctx, rt.heldFrom)
		return rt.held, nil
	}
	setUpstream(ctx, rt.tried)
	return nil, rt.lastErr
}

// outcome is one exchange's result: the upstream, and its answer or error.
type outcome struct {
	u   *upstream
	ret *dns.Msg
	err error
}

// wins reports whether o ends the query: an answer whose rcode is not a failover one.
func (f *DoTForward) wins(o outcome) bool { return o.err == nil && !f.failover[o.ret.Rcode] }

// retryable reports whether an upstream that failed with err may be tried again
// for the same query.
func retryable(err error) bool {
	return !errors.Is(err, dot.ErrUnavailable) && !errors.Is(err, dot.ErrPoolClosed) && !errors.Is(err, ErrNotStarted)
}

// unsent reports whether err proves the query was never written to the upstream:
// the pool was unavailable (in backoff, or saturated), closed or not started
// before the query got a connection. A query lost with its connection wraps
// dot.ErrConnLost, also when the pool closed under it: it may have been written.
func unsent(err error) bool {
	if errors.Is(err, dot.ErrConnLost) {
		return false
	}
	return errors.Is(err, dot.ErrUnavailable) || errors.Is(err, dot.ErrPoolClosed) || errors.Is(err, ErrNotStarted)
}

// setUpstream publishes the dotforward/upstream metadata: the upstream whose answer
// the client gets or, when none does, the last one tried. It is set once per query,
// when the outcome is known, so that it never names a later upstream than the one
// that answered.
func setUpstream(ctx context.Context, u *upstream) {
	if u != nil {
		metadata.SetValueFunc(ctx, "dotforward/upstream", u.addrFunc)
	}
}

// withLast and upstreamError build errors out of line, keeping the hot path's stack
// frames small: CoreDNS runs each query on a new goroutine, and a deep frame makes
// it grow (copy) its stack, which costs microseconds per query.
//
//go:noinline
func withLast(err, last error) error { return fmt.Errorf("%w (last error: %w)", err, last) }

//go:noinline
func upstreamError(addr string, err error) error { return fmt.Errorf("%s: %w", addr, err) }

// hedged sends r to the route's next upstream and races it against the one
// after it in the list. The route settles the winner's outcome alone, or both
// outcomes in list order when neither won, which is what it would have got from
// trying them in turn. The route's hedge is spent once one was sent.
func (f *DoTForward) hedged(ctx context.Context, r *dns.Msg, deadline time.Time, rt *route) (ret *dns.Msg, done bool, err error) {
	var outs [2]outcome
	u, v := rt.list[rt.i], rt.list[(rt.i+1)%len(rt.list)]
	n, sent := f.race(ctx, r, deadline, u, v, &outs)
	if sent {
		rt.hedge = false
	}
	for _, o := range outs[:n] {
		if ret, done, err := f.settle(ctx, rt, o); done {
			return ret, done, err
		}
	}
	return nil, false, nil
}

// race sends r to u and, if no answer came within the hedge delay, to v as well
// (when v is up and the budget allows). It puts the first valid answer's outcome
// in outs; if neither exchange won, both outcomes, u's first; n says how many,
// and sent whether the hedge went out. Both exchanges have returned when race
// does.
func (f *DoTForward) race(ctx context.Context, r *dns.Msg, deadline time.Time, u, v *upstream, outs *[2]outcome) (n int, sent bool) {
	firstCtx, cancelFirst := context.WithCancel(ctx)
	defer cancelFirst()
	h := &hedgeRun{f: f, v: v, r: ownOPT(r), deadline: deadline, parent: ctx, cancelFirst: cancelFirst, done: make(chan outcome, 1)}
	// The hedge starts in the timer's goroutine; the first exchange runs in ours,
	// so the common case (an answer before the delay) costs no goroutine.
	t := time.AfterFunc(f.hedge.delay(u), h.run)
	start := time.Now()
	ret, err := u.exchange(firstCtx, r, deadline)
	first := outcome{u: u, ret: ret, err: err}
	outs[0] = first
	if t.Stop() {
		return 1, false // answered (or failed) before the delay
	}
	if f.wins(first) {
		h.stop() // the hedge, if it went out, has lost
	}
	second := <-h.done // bounded: the hedge ends at its deadline, or at once when stopped
	switch {
	case second.u == nil: // not sent: v was down or the budget spent
		return 1, false
	case f.wins(first):
		u.obs.hedgeWinFirst.Inc()
		return 1, true
	case f.wins(second):
		v.obs.hedgeWinHedge.Inc()
		if errors.Is(first.err, context.Canceled) && ctx.Err() == nil {
			// Cut short by the hedge's answer: no answer after this long is a
			// lower bound of u's answer time, which keeps the estimate honest
			// about the slow answers it no longer sees.
			u.answers.cutShort(time.Since(start))
		}
		outs[0] = second
		return 1, true
	}
	outs[1] = second
	return 2, true
}

// ownOPT returns a shallow copy of r with a copy of its OPT record, made before
// the first exchange packs r: miekg/dns writes the OPT's extended rcode bits when
// it packs a message, and the hedge packs its message on another goroutine while
// the first exchange may be packing r. Everything else packing only reads.
func ownOPT(r *dns.Msg) *dns.Msg {
	i := slices.IndexFunc(r.Extra, func(rr dns.RR) bool { _, ok := rr.(*dns.OPT); return ok })
	if i < 0 {
		return r
	}
	c := *r
	c.Extra = slices.Clone(r.Extra)
	opt := *r.Extra[i].(*dns.OPT)
	c.Extra[i] = &opt
	return &c
}

// errHedgePanicked is the outcome of a hedge whose exchange panicked.
var errHedgePanicked = errors.New("hedge exchange panicked")

// hedgeRun is the hedge of one race. run is called by the race's timer; stop by
// the race when the first exchange won.
type hedgeRun struct {
	f           *DoTForward
	v           *upstream
	r           *dns.Msg
	deadline    time.Time
	parent      context.Context
	cancelFirst context.CancelFunc
	done        chan outcome // receives the hedge's outcome, or a zero one if none was sent

	mu      sync.Mutex
	stopped bool
	cancel  context.CancelFunc // the hedge's, once sent
}

// run sends the hedge unless the race was decided meanwhile, v is down or the
// budget is spent. A valid answer cancels the first exchange; any other outcome
// leaves it running, so that a failover answer or an error of the hedge never
// wins over a later valid answer of the first upstream.
func (h *hedgeRun) run() {
	h.mu.Lock()
	send := !h.stopped && !h.v.Down()
	if send && !h.f.hedge.budget.take() {
		hedgeBudgetExhausted.Inc()
		send = false
	}
	if !send {
		h.mu.Unlock()
		h.done <- outcome{}
		return
	}
	ctx, cancel := context.WithCancel(h.parent)
	h.cancel = cancel
	h.mu.Unlock()
	// The race waits for this outcome, and a panic here, outside the query's
	// goroutine, is not recovered by CoreDNS: it becomes an error outcome.
	o := outcome{u: h.v, err: errHedgePanicked}
	defer func() {
		if p := recover(); p != nil {
			log.Errorf("Hedge to %s panicked: %v", h.v.addr, p)
		}
		cancel()
		h.done <- o
	}()

	h.v.obs.hedges.Inc()
	ret, err := h.v.exchange(ctx, h.r, h.deadline)
	o = outcome{u: h.v, ret: ret, err: err}
	if h.f.wins(o) {
		h.cancelFirst()
	}
}

// stop abandons the hedge: it is not sent if it has not been yet, and cancelled
// if it has.
func (h *hedgeRun) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	if h.cancel != nil {
		h.cancel()
	}
}
