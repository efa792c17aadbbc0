package e2e

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// outcome is one query of a background load.
type outcome struct {
	start, end time.Time
	err        error
}

// bgLoad is a background load of checked queries, bounded in count and time,
// recording every query's outcome.
type bgLoad struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	outcomes []outcome
	ok, bad  atomic.Int64
}

// startLoad starts workers goroutines sending checked A queries for the
// h*.e2e.test names to addr over UDP, until stopped, maxQueries were sent or
// budget passed.
func startLoad(t testing.TB, addr string, workers, maxQueries int, budget time.Duration) *bgLoad {
	l := &bgLoad{stop: make(chan struct{})}
	deadline := time.Now().Add(budget)
	var n atomic.Int64
	for w := range workers {
		l.wg.Go(func() {
			for i := w; ; i += workers {
				select {
				case <-l.stop:
					return
				default:
				}
				if n.Add(1) > int64(maxQueries) || time.Now().After(deadline) {
					return
				}
				h := i % hostCount
				o := outcome{start: time.Now()}
				r, err := exchange("udp", addr, nil, newQuery(hostName(h), dns.TypeA))
				if err == nil {
					err = checkAnswer(r, dns.TypeA, hostAddr(h))
				}
				o.end, o.err = time.Now(), err
				l.record(o)
			}
		})
	}
	t.Cleanup(l.halt)
	return l
}

func (l *bgLoad) record(o outcome) {
	if o.err == nil {
		l.ok.Add(1)
	} else {
		l.bad.Add(1)
	}
	l.mu.Lock()
	l.outcomes = append(l.outcomes, o)
	l.mu.Unlock()
}

// halt stops the load and waits for its queries to finish. It may be called twice.
func (l *bgLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// results returns the outcomes so far (all of them once halted).
func (l *bgLoad) results() []outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]outcome(nil), l.outcomes...)
}

// okSince counts the successes among queries started at or after since, and
// reports whether every query started at or after since succeeded.
func okSince(outs []outcome, since time.Time) (ok int, allOK bool) {
	allOK = true
	for _, o := range outs {
		if o.start.Before(since) {
			continue
		}
		if o.err != nil {
			allOK = false
			continue
		}
		ok++
	}
	return ok, allOK
}

// awaitOK waits until the load has at least n successes in total.
func (l *bgLoad) awaitOK(t testing.TB, n int64, timeout time.Duration) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d answered queries", n), timeout, nil, func() error {
		if got := l.ok.Load(); got < n {
			return fmt.Errorf("%d answered, %d failed", got, l.bad.Load())
		}
		return nil
	})
}

// Background loads in the fault tests.
const (
	faultWorkers = 20
	faultMax     = 200000
	faultBudget  = 60 * time.Second
	// resumeTimeout bounds how long traffic may take to recover by itself.
	resumeTimeout = 10 * time.Second
	// resumeRun is how many consecutive successes count as traffic resumed.
	resumeRun = 300
)

// TestUpstreamRestartUnderLoad kills each real DoT server by its PID while queries
// stream through dotforward and starts it again on the same port. Failures are
// confined to the queries in flight when it died and those sent while it was down
// or reconnecting: none fails before the kill, traffic resumes by itself (no
// client action, no front restart) and none fails once it has resumed.
func TestUpstreamRestartUnderLoad(t *testing.T) {
	for _, k := range upstreamKinds {
		t.Run(k.name, func(t *testing.T) {
			c := newCerts(t)
			restartUnderLoad(t, c, k.start(t, c))
		})
	}
}

func restartUnderLoad(t *testing.T, c *certs, u *dotServer) {
	f := startFront(t, c, frontOpts{Upstreams: []string{u.addr}})
	load := startLoad(t, f.addr, faultWorkers, faultMax, faultBudget)
	load.awaitOK(t, 500, 20*time.Second)

	killAt := time.Now()
	u.kill()
	// Keep it down until clients notice, or at most 2 s if dotforward hides it.
	_ = poll(2*time.Second, nil, func() error {
		if load.bad.Load() == 0 {
			return fmt.Errorf("no failure yet")
		}
		return nil
	})
	u.restart(t)
	back := time.Now()
	t.Logf("%s down for %v", u.name, back.Sub(killAt).Round(time.Millisecond))

	var resumedAt time.Time
	waitFor(t, "traffic to resume after the restart", resumeTimeout, f.p, func() error {
		outs := load.results()
		resumedAt = firstRunStart(outs, back, resumeRun)
		if resumedAt.IsZero() {
			return fmt.Errorf("no run of %d consecutive answers since the restart (%s)", resumeRun, sinceSummary(outs, back))
		}
		return nil
	})
	load.halt()
	outs := load.results()

	// Buckets: answered before the kill; in flight at the kill (at most one per
	// client); started while the server was down or reconnecting.
	var inflight, lost, before, down int
	for _, o := range outs {
		switch {
		case o.end.Before(killAt):
			if o.err != nil {
				before++
			}
		case o.start.Before(killAt):
			inflight++
			if o.err != nil {
				lost++
			}
		case o.start.Before(resumedAt) && o.err != nil:
			down++
		}
	}
	after, allOK := okSince(outs, resumedAt)
	t.Logf("Restart under load: %d queries, %d in flight at the kill, %d of them lost, %d failed while down or reconnecting; traffic resumed %v after the server was back, %d answered after that",
		len(outs), inflight, lost, down, resumedAt.Sub(back).Round(time.Millisecond), after)
	if before != 0 {
		t.Errorf("%d queries failed before the upstream was killed", before)
	}
	if !allOK {
		t.Errorf("Queries failed after traffic resumed: %v", firstErrors(outs, resumedAt))
	}
}

// firstRunStart returns the start of the first run of n consecutive successful
// queries (by start time) among those started after since, or zero.
func firstRunStart(outs []outcome, since time.Time, n int) time.Time {
	sorted := append([]outcome(nil), outs...)
	sortByStart(sorted)
	run := 0
	var runStart time.Time
	for _, o := range sorted {
		if o.start.Before(since) {
			continue
		}
		if o.err != nil {
			run = 0
			continue
		}
		if run == 0 {
			runStart = o.start
		}
		run++
		if run >= n {
			return runStart
		}
	}
	return time.Time{}
}

func sortByStart(outs []outcome) {
	slices.SortFunc(outs, func(a, b outcome) int { return a.start.Compare(b.start) })
}

// firstErrors lists the first few failures of queries started at or after since.
// sinceSummary says how the queries started at or after since fared: how many
// were answered and failed, and the last failures, which say what keeps traffic
// from resuming.
func sinceSummary(outs []outcome, since time.Time) string {
	ok, failed := 0, []string{}
	for _, o := range outs {
		switch {
		case o.start.Before(since):
		case o.err == nil:
			ok++
		default:
			failed = append(failed, fmt.Sprintf("%v after: %v", o.start.Sub(since).Round(time.Millisecond), o.err))
		}
	}
	return fmt.Sprintf("%d answered and %d failed since; the last failures: %v", ok, len(failed), failed[max(0, len(failed)-3):])
}

func firstErrors(outs []outcome, since time.Time) []string {
	var errs []string
	for _, o := range outs {
		if !o.start.Before(since) && o.err != nil && len(errs) < 5 {
			errs = append(errs, fmt.Sprintf("%v after: %v", o.start.Sub(since).Round(time.Millisecond), o.err))
		}
	}
	return errs
}

// sparseProbes spaces dotforward's active health probes far apart. They ride the
// pooled connection whenever no answer came for an interval (default 500 ms), so
// with the default a connection is never idle and idle timeouts never bite.
const sparseProbes = "health_check 60s"

// TestUpstreamIdleCloseShorterThanPool uses servers whose idle timeout is well
// under dotforward's 8 s: unbound with tcp-idle-timeout 1 s, and dnsdist, which
// by default closes a client connection after 2 s without a query. The server
// closes the pooled connection between queries. Queries sent after such a close,
// and queries spaced right around the timeout (when the close may cross the query
// on the wire), are all answered.
func TestUpstreamIdleCloseShorterThanPool(t *testing.T) {
	for _, tc := range []struct {
		name  string
		idle  time.Duration
		start func(t *testing.T, c *certs) *dotServer
	}{
		{"unbound", time.Second, func(t *testing.T, c *certs) *dotServer {
			return startUnbound(t, c, unboundOpts{IdleTimeoutMS: 1000}).dotServer
		}},
		{"dnsdist", 2 * time.Second, func(t *testing.T, c *certs) *dotServer {
			return startDnsdist(t, c, startUnbound(t, c, unboundOpts{}).plain, dnsdistOpts{})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCerts(t)
			idleCloses(t, c, tc.start(t, c), tc.idle)
		})
	}
}

func idleCloses(t *testing.T, c *certs, u *dotServer, idle time.Duration) {
	f := startFront(t, c, frontOpts{Upstreams: []string{u.addr}, Prometheus: true, Options: []string{sparseProbes}})
	to := label("to", u.addr)
	ask := func(i int) {
		t.Helper()
		h := i % hostCount
		r, err := exchange("udp", f.addr, nil, newQuery(hostName(h), dns.TypeA))
		if err == nil {
			err = checkAnswer(r, dns.TypeA, hostAddr(h))
		}
		if err != nil {
			t.Errorf("Query %d after an idle gap: %v", i, err)
		}
	}
	// Await the server's close as dotforward sees it, then ask again.
	for i := range 2 {
		closes, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_conn_closes_total", to)
		waitFor(t, u.name+" to close the idle connection", 10*time.Second, f.p, func() error {
			if n, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_conn_closes_total", to); n <= closes {
				return fmt.Errorf("%v connection closes, still %v", n, closes)
			}
			return nil
		})
		ask(i)
	}
	// Pace queries right around the server's timeout: a deliberate load shape,
	// not a wait for a condition.
	for i, pct := range []time.Duration{90, 100, 100, 110} {
		timer := time.NewTimer(idle * pct / 100)
		<-timer.C
		ask(10 + i)
	}
	text := scrape(t, f.metrics)
	closes, _ := metricSum(text, "coredns_dotforward_conn_closes_total", to)
	if closes < 2 {
		t.Errorf("Only %v connection closes seen; %s's idle timeout did not bite", closes, u.name)
	}
	t.Logf("Idle closes by %s, then queries: all answered; dotforward close counts:\n%s", u.name, grepLines(text, "coredns_dotforward_conn_closes_total{"))
}

// TestUpstreamKeepaliveTimeout gives unbound an RFC 7828 keepalive timeout of
// 1.5 s, and dotforward an idle timeout of 60 s: dotforward must learn unbound's
// timeout from its answers and close the idle connection itself, before unbound
// does, so that no query is ever written into a connection the server is closing.
func TestUpstreamKeepaliveTimeout(t *testing.T) {
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{KeepaliveMS: 1500})
	f := startFront(t, c, frontOpts{Upstreams: []string{u.addr}, Prometheus: true, Options: []string{"expire 60s", sparseProbes}})
	to := label("to", u.addr)
	for i := range 3 {
		r, err := exchange("udp", f.addr, nil, newQuery(hostName(i), dns.TypeA))
		if err == nil {
			err = checkAnswer(r, dns.TypeA, hostAddr(i))
		}
		if err != nil {
			t.Fatalf("Query %d: %v", i, err)
		}
		waitFor(t, "the idle connection to close", 15*time.Second, f.p, func() error {
			if n, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_conns_open", to); n != 0 {
				return fmt.Errorf("%v connections open", n)
			}
			return nil
		})
	}
	text := scrape(t, f.metrics)
	idle, _ := metricSum(text, "coredns_dotforward_conn_closes_total", to, label("reason", "idle"))
	server, _ := metricSum(text, "coredns_dotforward_conn_closes_total", to, label("reason", "server_close"))
	if idle < 3 || server != 0 {
		t.Fatalf("Closes: %v idle by dotforward, %v by unbound; want dotforward to close all 3 first:\n%s",
			idle, server, grepLines(text, "coredns_dotforward_conn_closes_total"))
	}
	t.Logf("dotforward closed all %v idle connections before unbound's 1.5 s keepalive timeout", idle)
}

// TestTwoUpstreamsOneNeverUp forwards to two upstreams of which one never listens
// (its dials are refused): every query is answered through the other.
func TestTwoUpstreamsOneNeverUp(t *testing.T) {
	c := newCerts(t)
	b := startUnbound(t, c, unboundOpts{})
	dead := addr(freePort(t)) // nothing listens here
	f := startFront(t, c, frontOpts{Upstreams: []string{dead, b.addr}})
	res := runLoad("udp", f.addr, loadQueries/2, loadWorkers, loadBudget)
	requireAllAnswered(t, "one upstream refusing connections", res, loadQueries/2)
}

// TestTwoUpstreamsOneStopped forwards to two unbounds and kills one under load:
// every query is still answered correctly, through the other. Started again, the
// stopped one gets queries once more.
func TestTwoUpstreamsOneStopped(t *testing.T) {
	c := newCerts(t)
	a := startUnbound(t, c, unboundOpts{})
	b := startUnbound(t, c, unboundOpts{})
	f := startFront(t, c, frontOpts{Upstreams: []string{a.addr, b.addr}})

	load := startLoad(t, f.addr, faultWorkers, faultMax, faultBudget)
	load.awaitOK(t, 500, 20*time.Second)
	a.kill()
	killed := time.Now()
	load.awaitOK(t, load.ok.Load()+2000, 30*time.Second)
	load.halt()
	outs := load.results()
	after, allOK := okSince(outs, time.Time{})
	if !allOK {
		t.Fatalf("With one of two upstreams stopped, %d queries failed: %v", load.bad.Load(), firstErrors(outs, time.Time{}))
	}
	n, _ := okSince(outs, killed)
	t.Logf("One of two upstreams killed under load: all %d queries answered, %d of them after the kill", after, n)

	a.restart(t)
	before := a.stats(t)["total.num.queries"]
	waitFor(t, "the restarted upstream to get queries again", 20*time.Second, f.p, func() error {
		res := runLoad("udp", f.addr, 50, 5, 10*time.Second)
		if res.ok.Load() != 50 {
			return fmt.Errorf("queries failed: %v", res.errs)
		}
		if d := a.stats(t)["total.num.queries"] - before; d == 0 {
			return fmt.Errorf("no query reached the restarted upstream")
		}
		return nil
	})
}

// cutAfter is the per-connection query limit given to dnsdist: like public
// resolvers that cut busy DoT connections every ~200 KB, it closes each incoming
// connection after this many queries.
const cutAfter = 100

// startCuttingDnsdist starts dnsdist closing every client connection after
// cutAfter queries. It sets maxInFlight: with dnsdist's default, queries that
// arrive together in one TLS record after the first are left unread until more
// data or a timer comes (dnsdist 1.7), which would blur what this test is about.
func startCuttingDnsdist(t *testing.T, c *certs, backend string) *dotServer {
	t.Helper()
	return startDnsdist(t, c, backend, dnsdistOpts{
		MaxInFlight: 100,
		Extra:       []string{fmt.Sprintf("setMaxTCPQueriesPerConnection(%d)", cutAfter)},
	})
}

// TestServerCutsBusyConnections puts dnsdist with a per-connection query limit in
// front of unbound: under load, dnsdist closes dotforward's connections again and
// again, with queries pipelined behind the cut. Every query is still answered.
func TestServerCutsBusyConnections(t *testing.T) {
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{})
	d := startCuttingDnsdist(t, c, u.plain)
	f := startFront(t, c, frontOpts{Upstreams: []string{d.addr}, Prometheus: true})

	const total = 3000
	res := runLoad("udp", f.addr, total, loadWorkers, loadBudget)
	text := scrape(t, f.metrics)
	to := label("to", d.addr)
	dials, _ := metricSum(text, "coredns_dotforward_dials_total", to, label("result", "ok"))
	t.Logf("%v connections dialed; closes, replays, drops, timeouts:\n%s", dials,
		grepLines(text, "coredns_dotforward_conn_closes_total", "coredns_dotforward_replays_total",
			"coredns_dotforward_dropped_total", "coredns_dotforward_timeouts_total", "coredns_dotforward_responses_total"))
	requireAllAnswered(t, "dnsdist cutting every "+fmt.Sprint(cutAfter)+" queries", res, total)
	// dnsdist ends a cut connection within milliseconds: an attempt that waits out
	// the read timeout is a query the pool lost track of, hidden from the client
	// only by a retry.
	if n, _ := metricSum(text, "coredns_dotforward_timeouts_total", to); n > 0 {
		t.Errorf("%v attempts timed out against a server that answers in milliseconds", n)
	}
	if dials < total/cutAfter {
		t.Errorf("%v connections for %d queries; dnsdist's limit of %d per connection did not bite", dials, total, cutAfter)
	}
}
