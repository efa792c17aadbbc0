package dotforward

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Hedged queries (the hedge option): a query with no answer after the hedge delay
// is also sent to the next upstream of the policy's order, and the first valid
// answer (one whose rcode is not listed in failover) goes to the client. The
// other exchange is abandoned: its context is cancelled, so the pool keeps the
// query's ID reserved until the late answer arrives (which is dropped and counted
// as late) or the read timeout passes.
//
// Invariants:
//   - at most one hedge per query, and never for a message other than a QUERY
//     (an UPDATE or NOTIFY must not be sent twice);
//   - hedges stay within the budget: MAX_PERCENT of the queries plus hedgeBurst,
//     over any run of queries, so an outage cannot double the load on the
//     remaining upstreams;
//   - a race never outlives forward: both exchanges have returned when race does.

// Limits of the auto delay, and how it is derived from an upstream's answer times.
const (
	// hedgeMinDelay: below it, an upstream's normal scatter (scheduling, a GC
	// pause) would be hedged.
	hedgeMinDelay = 5 * time.Millisecond
	// hedgeQuantile and hedgeFactor: the auto delay is twice the 90th percentile
	// of the upstream's recent answer times. A quantile below 1 - (slow share)
	// measures the normal answers even when up to 10 % are slow (the 95th
	// percentile of an upstream with 5 % slow answers lands on the slow ones, and
	// would never hedge them), and twice it leaves the normal answers' own spread
	// unhedged (about 1-3 % of the queries for a unimodal upstream).
	hedgeQuantile = 900 // per mille
	hedgeFactor   = 2
	// hedgeWindow answer times per upstream are kept; every hedgeRecompute new
	// ones the delay is derived again (at 2,000 answers/s, every 16 ms from the
	// last 128 ms).
	hedgeWindow    = 256
	hedgeRecompute = 32
	// hedgeBurst hedges may be sent beyond MAX_PERCENT of the queries, so that
	// slow answers that cluster are not refused for a budget that is met on
	// average. Unused credit beyond it lapses.
	hedgeBurst = 10
	// defaultHedgePercent is MAX_PERCENT when not given.
	defaultHedgePercent = 5
)

// hedgeConfig is the hedge option as parsed: `hedge DELAY|auto [MAX_PERCENT]`.
type hedgeConfig struct {
	delay   time.Duration // the fixed delay; 0 with auto
	auto    bool          // derive each upstream's delay from its answer times
	percent int           // MAX_PERCENT: 1 to 100, default 5
}

// hedger is a dotforward line's hedging: its fixed delay (0: auto, per upstream)
// and its budget.
type hedger struct {
	fixed  time.Duration
	budget hedgeBudget
}

func newHedger(c *hedgeConfig) *hedger {
	return &hedger{fixed: c.delay, budget: hedgeBudget{percent: int64(c.percent)}}
}

// delay is how long a query to u waits for its answer before it is hedged.
func (h *hedger) delay(u *upstream) time.Duration {
	if h.fixed > 0 {
		return h.fixed
	}
	return u.hedgeDelay.current()
}

// hedgeBudget grants hedges as a token bucket filled by queries: each query counted
// earns percent hundredths of a hedge, a hedge costs a whole one, and credit beyond
// hedgeBurst hedges lapses. Over any run of n queries at most
// hedgeBurst + n × percent / 100 hedges are granted. It starts empty: no credit is
// owed before the first queries. Lock-free: one atomic add per query, a CAS per
// hedge.
type hedgeBudget struct {
	percent int64
	queries atomic.Int64 // queries counted; earned credit is queries × percent
	spent   atomic.Int64 // credit spent or lapsed, in hundredths of a hedge
}

// count adds a query to the budget's base.
func (b *hedgeBudget) count() { b.queries.Add(1) }

// take spends one hedge of credit, or reports that none is left.
func (b *hedgeBudget) take() bool {
	earned := b.queries.Load() * b.percent
	for {
		spent := b.spent.Load()
		// Credit beyond the burst lapses: move the base up to it.
		base := max(spent, earned-hedgeBurst*100)
		if earned-base < 100 {
			return false
		}
		if b.spent.CompareAndSwap(spent, base+100) {
			return true
		}
	}
}

// hedgeEstimator derives an upstream's auto hedge delay from its last hedgeWindow
// answer times: hedgeFactor × their hedgeQuantile, within [lo, hi]. Recording a
// sample is lock-free; every hedgeRecompute samples the recording caller sorts a
// copy of the window under the estimator's own mutex (TryLock: a recomputation
// already running makes the next one unnecessary). Until hedgeRecompute samples
// have come, the delay is hi.
type hedgeEstimator struct {
	lo, hi  time.Duration
	gauge   prometheus.Gauge // hedge_delay_seconds of the upstream; nil in tests
	n       atomic.Uint64    // samples recorded so far
	samples [hedgeWindow]atomic.Int64
	delay   atomic.Int64 // ns

	mu      sync.Mutex
	scratch [hedgeWindow]int64 // guarded by mu: the sorted copy
}

func newHedgeEstimator(lo, hi time.Duration, gauge prometheus.Gauge) *hedgeEstimator {
	e := &hedgeEstimator{lo: lo, hi: max(lo, hi), gauge: gauge}
	e.set(e.hi)
	return e
}

// current is the delay to use now. A nil estimator (no hedge auto) returns 0.
func (e *hedgeEstimator) current() time.Duration {
	if e == nil {
		return 0
	}
	return time.Duration(e.delay.Load())
}

// observe records one answer time, or a lower bound of one: the time after which
// an exchange was abandoned without an answer (timed out, or lost to its hedge).
func (e *hedgeEstimator) observe(d time.Duration) {
	if e == nil {
		return
	}
	n := e.n.Add(1)
	e.samples[(n-1)%hedgeWindow].Store(int64(d))
	if n%hedgeRecompute == 0 {
		e.recompute(min(n, hedgeWindow))
	}
}

func (e *hedgeEstimator) recompute(n uint64) {
	if !e.mu.TryLock() {
		return
	}
	defer e.mu.Unlock()
	s := e.scratch[:n]
	for i := range s {
		s[i] = e.samples[i].Load()
	}
	slices.Sort(s)
	e.set(time.Duration(hedgeFactor * quantile(s, hedgeQuantile)))
}

func (e *hedgeEstimator) set(d time.Duration) {
	d = min(max(d, e.lo), e.hi)
	e.delay.Store(int64(d))
	if e.gauge != nil {
		e.gauge.Set(d.Seconds())
	}
}

// quantile is the nearest-rank quantile of sorted (not empty) at permille ‰, in
// integers so that the rank of 90 % of 10 samples is 9, not 10.
func quantile(sorted []int64, permille int) int64 {
	rank := (permille*len(sorted) + 999) / 1000
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// errHedgePanicked is the outcome of a hedge whose exchange panicked.
var errHedgePanicked = errors.New("hedge exchange panicked")

// outcome is one exchange's result: the upstream, and its answer or error.
type outcome struct {
	u   *upstream
	ret *dns.Msg
	err error
}

// wins reports whether o ends the query: an answer whose rcode is not a failover one.
func (f *DoTForward) wins(o outcome) bool { return o.err == nil && !f.failover[o.ret.Rcode] }

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
			u.hedgeDelay.observe(time.Since(start))
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
