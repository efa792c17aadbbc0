package dotforward

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

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
//
// The race itself is part of a query's way through the upstreams (route.go:
// hedged, race, hedgeRun); this file holds what it asks: the delay (fixed, or
// hedge auto's estimator over the upstream's answer times, see answertime.go)
// and the budget. The numbers and why: docs/design.md, "Hedging".

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
	return u.answers.hedge.current()
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
