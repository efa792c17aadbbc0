package dotforward

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are labelled by upstream ("to", its IP:port) only: no per-name or
// per-type labels, whose cardinality a resolver's clients control.
var (
	requestsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "requests_total",
		Help:      "Counter of queries sent to each upstream, retries included, and of queries that waited for an identical one's exchange with it (see coalesced_total).",
	}, []string{"to"})
	responsesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "responses_total",
		Help:      "Counter of answers received from each upstream, by rcode.",
	}, []string{"to", "rcode"})
	requestDuration = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace:                   plugin.Namespace,
		Subsystem:                   "dotforward",
		Name:                        "request_duration_seconds",
		Buckets:                     plugin.TimeBuckets,
		NativeHistogramBucketFactor: plugin.NativeHistogramBucketFactor,
		Help:                        "Histogram of the time each exchange with an upstream took, failed ones included.",
	}, []string{"to"})
	inflight = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "inflight",
		Help:      "Gauge of queries waiting for an answer from each upstream.",
	}, []string{"to"})
	connsOpen = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "conns_open",
		Help:      "Gauge of open TLS connections to each upstream.",
	}, []string{"to"})
	sharedRecords = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "shared_records",
		Help:      "Gauge: 1 once an upstream has shown it reads every query of a TLS record, 0 while each query gets a record of its own.",
	}, []string{"to"})
	upstreamMode = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "upstream_mode",
		Help:      "Gauge: 1 for how the pool learned each upstream serves the queries of a connection (mode: unknown, out_of_order, in_order), 0 for the other modes.",
	}, []string{"to", "mode"})
	connConcurrency = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "conn_concurrency",
		Help:      "Gauge of the queries the pool puts on one connection to each upstream at once: 1 for an in-order upstream and for one not learned yet that answers slowly (10 ms or more), max_inflight otherwise.",
	}, []string{"to"})
	connsWanted = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "conns_wanted",
		Help:      "Gauge of the connections taking queries that the load on each upstream wants.",
	}, []string{"to"})
	connsTaking = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "conns_taking",
		Help:      "Gauge of the open connections to each upstream that take new queries: not draining, not blocked behind a slow answer (those near their end included).",
	}, []string{"to"})
	rescuesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "rescues_total",
		Help:      "Counter of queries sent again on another connection because they were stuck behind a slow answer; the first answer wins, the other is dropped (dropped_total reason rescued).",
	}, []string{"to"})
	dialsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "dials_total",
		Help:      "Counter of TCP+TLS connection attempts to each upstream, by result (ok, error).",
	}, []string{"to", "result"})
	handshakesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "handshakes_total",
		Help:      "Counter of completed TLS handshakes with each upstream, by whether the session was resumed.",
	}, []string{"to", "resumed"})
	connClosesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "conn_closes_total",
		Help:      "Counter of closed connections to each upstream, by reason.",
	}, []string{"to", "reason"})
	replaysTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "replays_total",
		Help:      "Counter of unanswered queries re-sent on another connection after theirs died.",
	}, []string{"to"})
	coalescedTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "coalesced_total",
		Help:      "Counter of queries answered by another identical query's exchange with each upstream, which they waited for instead of sending their own.",
	}, []string{"to"})
	timeoutsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "timeouts_total",
		Help:      "Counter of attempts that got no answer within read_timeout.",
	}, []string{"to"})
	droppedTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "dropped_total",
		Help:      "Counter of upstream messages discarded, by reason.",
	}, []string{"to", "reason"})
	upstreamHealthy = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "upstream_healthy",
		Help:      "Gauge of each upstream's health: 1 if queries are sent to it, 0 if it is down.",
	}, []string{"to"})
	healthcheckFailures = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "healthcheck_failures_total",
		Help:      "Counter of failed health probes of each upstream; a probe skipped while the pool waits out its reconnect backoff is not one.",
	}, []string{"to"})
	healthcheckBroken = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "healthcheck_broken_total",
		Help:      "Counter of queries that found every upstream down.",
	})
	hedgesTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "hedges_total",
		Help:      "Counter of hedged queries: queries also sent to this upstream because the one before it had not answered within the hedge delay.",
	}, []string{"to"})
	hedgeWinsTotal = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "hedge_wins_total",
		Help:      "Counter of hedged queries answered by a valid answer of this upstream, by which exchange it came from (first: the hedged one, hedge: the hedge).",
	}, []string{"to", "winner"})
	hedgeDelaySeconds = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "hedge_delay_seconds",
		Help:      "Gauge of the delay after which a query to this upstream is hedged (hedge auto: derived from its recent answer times).",
	}, []string{"to"})
	hedgeBudgetExhausted = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "hedge_budget_exhausted_total",
		Help:      "Counter of hedges not sent because the hedge budget (MAX_PERCENT of the queries) was spent.",
	})
	maxConcurrentRejects = promauto.NewCounter(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "dotforward",
		Name:      "max_concurrent_rejects_total",
		Help:      "Counter of queries refused because max_concurrent queries were being served.",
	})
)

// observer feeds one upstream's metrics. It implements dot.Observer for the
// pool's connection events and is called by upstream for each exchange. The
// label values are bound once so the hot path does no label lookups, except
// for the rcode and reason labels.
type observer struct {
	to            string
	requests      prometheus.Counter
	duration      prometheus.Observer
	inflight      prometheus.Gauge
	connsOpen     prometheus.Gauge
	dialsOK       prometheus.Counter
	dialsError    prometheus.Counter
	handshakesNew prometheus.Counter
	handshakesRes prometheus.Counter
	replays       prometheus.Counter
	coalesced     prometheus.Counter
	timeouts      prometheus.Counter
	healthy       prometheus.Gauge
	hcFailures    prometheus.Counter
	noError       prometheus.Counter // the common rcode, bound in advance
	rescues       prometheus.Counter
	wanted        prometheus.Gauge
	taking        prometheus.Gauge // conns_taking: connections taking queries (near their end included), as dot.Stats.Taking
	mode          atomic.Int32     // the last mode ModeLearned reported, plus one (0: none yet)

	// Bound by bindHedging, for lines with hedge only; nil otherwise.
	hedges        prometheus.Counter
	hedgeWinFirst prometheus.Counter
	hedgeWinHedge prometheus.Counter
	hedgeDelay    prometheus.Gauge
}

var (
	_ dot.Observer         = (*observer)(nil)
	_ dot.CoalesceObserver = (*observer)(nil)
	_ dot.SizeObserver     = (*observer)(nil)
)

func newObserver(to string) *observer {
	return &observer{
		to:            to,
		requests:      requestsTotal.WithLabelValues(to),
		duration:      requestDuration.WithLabelValues(to),
		inflight:      inflight.WithLabelValues(to),
		connsOpen:     connsOpen.WithLabelValues(to),
		dialsOK:       dialsTotal.WithLabelValues(to, "ok"),
		dialsError:    dialsTotal.WithLabelValues(to, "error"),
		handshakesNew: handshakesTotal.WithLabelValues(to, "false"),
		handshakesRes: handshakesTotal.WithLabelValues(to, "true"),
		replays:       replaysTotal.WithLabelValues(to),
		coalesced:     coalescedTotal.WithLabelValues(to),
		timeouts:      timeoutsTotal.WithLabelValues(to),
		healthy:       upstreamHealthy.WithLabelValues(to),
		hcFailures:    healthcheckFailures.WithLabelValues(to),
		noError:       responsesTotal.WithLabelValues(to, rcodeLabel(dns.RcodeSuccess)),
		rescues:       rescuesTotal.WithLabelValues(to),
		wanted:        connsWanted.WithLabelValues(to),
		taking:        connsTaking.WithLabelValues(to),
	}
}

// bindHedging binds the hedge metrics' label values.
func (o *observer) bindHedging() {
	o.hedges = hedgesTotal.WithLabelValues(o.to)
	o.hedgeWinFirst = hedgeWinsTotal.WithLabelValues(o.to, "first")
	o.hedgeWinHedge = hedgeWinsTotal.WithLabelValues(o.to, "hedge")
	o.hedgeDelay = hedgeDelaySeconds.WithLabelValues(o.to)
}

// Dialed implements dot.Observer. A failed dial opened no connection, so only
// successful ones count in conns_open (Closed takes them off again).
func (o *observer) Dialed(_ time.Duration, resumed bool, err error) {
	if err != nil {
		o.dialsError.Inc()
		return
	}
	o.dialsOK.Inc()
	o.connsOpen.Inc()
	if resumed {
		o.handshakesRes.Inc()
	} else {
		o.handshakesNew.Inc()
	}
}

// Closed implements dot.Observer.
func (o *observer) Closed(reason dot.CloseReason) {
	o.connsOpen.Dec()
	connClosesTotal.WithLabelValues(o.to, reason.String()).Inc()
}

// Dropped implements dot.Observer.
func (o *observer) Dropped(reason dot.DropReason) {
	droppedTotal.WithLabelValues(o.to, reason.String()).Inc()
}

// Replayed implements dot.Observer.
func (o *observer) Replayed() { o.replays.Inc() }

// Coalesced implements dot.CoalesceObserver.
func (o *observer) Coalesced() { o.coalesced.Inc() }

// TimedOut implements dot.Observer.
func (o *observer) TimedOut() { o.timeouts.Inc() }

// Failed implements dot.Observer. Failures are health's (see events), not a
// metric of their own: they show in dials_total, conn_closes_total and
// upstream_healthy.
func (o *observer) Failed(error) {}

// SharedRecords implements dot.Observer: it logs what the pool learned of how the
// upstream reads TLS records, which an operator may want to know when an upstream
// costs more than expected.
func (o *observer) SharedRecords(shared bool) {
	if shared {
		sharedRecords.WithLabelValues(o.to).Set(1)
		log.Infof("Upstream %s reads every query of a TLS record: bursts of queries share records", o.to)
		return
	}
	sharedRecords.WithLabelValues(o.to).Set(0)
	log.Infof("Upstream %s did not show it reads past the first query of a TLS record: one query per record", o.to)
}

// ModeLearned implements dot.SizeObserver: it sets the mode gauges and logs
// a change of mode, which explains how many connections the pool opens. A
// change of the queries per connection alone (an upstream not yet learned
// that answers slowly gets one query per connection, see dot's slowUnknown)
// sets conn_concurrency and is not logged: it follows the answer times.
func (o *observer) ModeLearned(m dot.Mode, perConn int) {
	connConcurrency.WithLabelValues(o.to).Set(float64(perConn))
	if o.mode.Swap(int32(m)+1) == int32(m)+1 {
		return // the same mode
	}
	for _, mode := range []dot.Mode{dot.ModeUnknown, dot.ModeOutOfOrder, dot.ModeInOrder} {
		v := 0.0
		if mode == m {
			v = 1
		}
		upstreamMode.WithLabelValues(o.to, mode.String()).Set(v)
	}
	switch {
	case m == dot.ModeInOrder:
		log.Infof("Upstream %s answers the queries of a connection one at a time, in order: one query per connection, as many connections as the load needs", o.to)
	case m == dot.ModeOutOfOrder:
		log.Infof("Upstream %s answers the queries of a connection out of order: up to %d queries per connection, few connections", o.to, perConn)
	case perConn == 1:
		log.Infof("Upstream %s has not shown lately how it serves a connection, and answers slowly: one query per connection, as forward sends them, until it shows", o.to)
	default:
		log.Infof("Upstream %s has not shown lately how it serves a connection: up to %d queries per connection, few connections", o.to, perConn)
	}
}

// Sized implements dot.SizeObserver.
func (o *observer) Sized(wanted, taking int) {
	o.wanted.Set(float64(wanted))
	o.taking.Set(float64(taking))
}

// Rescued implements dot.SizeObserver.
func (o *observer) Rescued() { o.rescues.Inc() }

// begin counts a query sent to the upstream.
func (o *observer) begin() {
	o.requests.Inc()
	o.inflight.Inc()
}

// end records an exchange's duration and, when an answer came, its rcode.
func (o *observer) end(took time.Duration, ret *dns.Msg) {
	o.inflight.Dec()
	o.duration.Observe(took.Seconds())
	switch {
	case ret == nil:
	case ret.Rcode == dns.RcodeSuccess:
		o.noError.Inc()
	default:
		responsesTotal.WithLabelValues(o.to, rcodeLabel(ret.Rcode)).Inc()
	}
}

func (o *observer) setHealthy(up bool) {
	if up {
		o.healthy.Set(1)
	} else {
		o.healthy.Set(0)
	}
}

// HealthCheckFailed counts a failed health probe.
func (o *observer) HealthCheckFailed() { o.hcFailures.Inc() }

// rcodeLabel names an rcode as dns.RcodeToString does, with the number for
// codes it does not know, so the label set stays bounded by the 12-bit space.
func rcodeLabel(rc int) string {
	if s, ok := dns.RcodeToString[rc]; ok {
		return s
	}
	return strconv.Itoa(rc)
}
