package dotforward

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coredns/coredns/plugin/metadata"

	"github.com/dotforward/dotforward/dot"
	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// The handler tests below assert structure, not wall-clock thresholds: which
// upstream's answer the client got (dotforward/upstream), how many queries each
// fake upstream received, and the hedge counters. They run in testing/synctest
// bubbles over in-memory TLS connections (startPipe, newPipeForward): hedge
// delays, slow answers and timeouts pass on the bubble's virtual clock, exactly
// and at once, so a loaded machine cannot reorder them.

// slowNames holds back the names that start with "slow" for d.
func slowNames(d time.Duration) func(dns.Question) time.Duration {
	return func(q dns.Question) time.Duration {
		if strings.HasPrefix(q.Name, "slow") {
			return d
		}
		return 0
	}
}

func allSlow(d time.Duration) func(dns.Question) time.Duration {
	return func(dns.Question) time.Duration { return d }
}

// answeredBy serves m and returns the answer and the dotforward/upstream metadata.
func answeredBy(t *testing.T, f *DoTForward, m *dns.Msg) (*dns.Msg, string) {
	t.Helper()
	ctx := metadata.ContextWithMetadata(context.Background())
	rec, rcode, err := serveCtx(ctx, f, m)
	if rcode != dns.RcodeSuccess || rec.Msg == nil {
		t.Fatalf("Expected an answer to %s, got rcode %s, error %v", m.Question[0].Name, dns.RcodeToString[rcode], err)
	}
	from := "none"
	if fn := metadata.ValueFunc(ctx, "dotforward/upstream"); fn != nil {
		from = fn()
	}
	return rec.Msg, from
}

func hedgesTo(t *testing.T, addr string) float64 {
	t.Helper()
	return metricValue(t, hedgesTotal.WithLabelValues(addr))
}

// TestHedgeSlowNamesAnsweredBySecond: with policy sequential, the slow names of
// the first upstream are answered by the second (the hedge), long before the
// first would have answered; the fast names never reach the second upstream. The
// abandoned exchanges' late answers are dropped and counted as late.
func TestHedgeSlowNamesAnsweredBySecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		a := startPipe(t, cert, dottest.Options{Delay: slowNames(time.Second)})
		b := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "policy sequential\nhedge 100ms 100", a, b)
		// The first query dials; a slow handshake on a loaded machine may be hedged.
		answeredBy(t, f, newMsg("warmup.example.org.", dns.TypeA))
		bBefore, hedgesBefore := b.Queries(), hedgesTo(t, b.Addr)
		winsBefore := metricValue(t, hedgeWinsTotal.WithLabelValues(b.Addr, "hedge"))
		lateBefore := metricValue(t, droppedTotal.WithLabelValues(a.Addr, dot.DropLate.String()))

		for i := range 10 {
			if _, from := answeredBy(t, f, newMsg(fmt.Sprintf("fast%d.example.org.", i), dns.TypeA)); from != a.Addr {
				t.Errorf("Fast name %d: expected the answer of the first upstream %s, got %s's", i, a.Addr, from)
			}
		}
		if got := b.Queries() - bBefore; got != 0 {
			t.Errorf("Expected no fast name hedged, the second upstream got %d queries", got)
		}
		const slow = 5
		for i := range slow {
			if _, from := answeredBy(t, f, newMsg(fmt.Sprintf("slow%d.example.org.", i), dns.TypeA)); from != b.Addr {
				t.Errorf("Slow name %d: expected the hedge's answer from %s, got %s's", i, b.Addr, from)
			}
		}
		if got := b.Queries() - bBefore; got != slow {
			t.Errorf("Expected the %d slow names hedged to the second upstream, it got %d queries", slow, got)
		}
		if got := hedgesTo(t, b.Addr) - hedgesBefore; got != slow {
			t.Errorf("Expected hedges_total{to=%s} +%d, got %+v", b.Addr, slow, got)
		}
		if got := metricValue(t, hedgeWinsTotal.WithLabelValues(b.Addr, "hedge")) - winsBefore; got != slow {
			t.Errorf("Expected hedge_wins_total{winner=hedge} +%d, got %+v", slow, got)
		}
		waitFor(t, "the first upstream's late answers dropped as late", func() bool {
			return metricValue(t, droppedTotal.WithLabelValues(a.Addr, dot.DropLate.String()))-lateBefore == slow
		})
	})
}

// TestHedgeBudget: with every query slow on the first upstream, the hedges stay
// within MAX_PERCENT of the queries plus the burst.
func TestHedgeBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		a := startPipe(t, cert, dottest.Options{Delay: allSlow(200 * time.Millisecond)})
		b := startPipe(t, cert, dottest.Options{})
		const percent, queries, workers = 10, 200, 20
		f := newPipeForward(t, cert, fmt.Sprintf("policy sequential\nhedge 5ms %d", percent), a, b)
		exhausted := metricValue(t, hedgeBudgetExhausted)

		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := w; i < queries; i += workers {
					if _, rcode, err := serve(f, newMsg(fmt.Sprintf("q%d.example.org.", i), dns.TypeA)); rcode != dns.RcodeSuccess {
						t.Errorf("Query %d: expected an answer, got rcode %d, error %v", i, rcode, err)
					}
				}
			})
		}
		wg.Wait()
		hedges := b.Queries()
		limit := int64(hedgeBurst + queries*percent/100)
		if hedges > limit {
			t.Errorf("Expected at most %d hedges (%d %% of %d queries + a burst of %d), got %d", limit, percent, queries, hedgeBurst, hedges)
		}
		if hedges < queries*percent/100/2 {
			t.Errorf("Expected about %d hedges (%d %% of %d queries, every one slow), got %d", queries*percent/100, percent, queries, hedges)
		}
		if got := metricValue(t, hedgeBudgetExhausted) - exhausted; got < float64(queries-limit) {
			t.Errorf("Expected at least %d hedges refused for the budget, got %v", queries-limit, got)
		}
	})
}

// TestHedgeExclusions: no hedge for a message other than QUERY, with one
// upstream, when the next upstream is down (at the start of the query or when the
// delay passes), or when max_connect_attempts leaves no attempt for it. Each case
// first shows that a plain query of the same set-up is hedged, where it can be.
func TestHedgeExclusions(t *testing.T) {
	slowA := dottest.Options{Delay: allSlow(time.Second)}
	t.Run("NOTIFY", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			a, b := startPipe(t, cert, slowA), startPipe(t, cert, dottest.Options{})
			f := newPipeForward(t, cert, "policy sequential\nhedge 100ms 100", a, b)
			if _, from := answeredBy(t, f, newMsg("example.org.", dns.TypeA)); from != b.Addr || b.Queries() != 1 {
				t.Fatalf("Expected a QUERY hedged to %s, got the answer of %s, %d queries there", b.Addr, from, b.Queries())
			}
			if _, from := answeredBy(t, f, new(dns.Msg).SetNotify("example.org.")); from != a.Addr {
				t.Errorf("Expected the NOTIFY answered by the first upstream %s, got %s", a.Addr, from)
			}
			if got := b.Queries(); got != 1 {
				t.Errorf("Expected the NOTIFY never hedged, the second upstream got %d messages in all", got)
			}
		})
	})
	t.Run("one upstream", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			a := startPipe(t, cert, slowA)
			f := newPipeForward(t, cert, "hedge 100ms 100", a)
			answeredBy(t, f, newMsg("example.org.", dns.TypeA))
			if a.Queries() != 1 || hedgesTo(t, a.Addr) != 0 {
				t.Errorf("Expected one query and no hedge, got %d queries, %v hedges", a.Queries(), hedgesTo(t, a.Addr))
			}
		})
	})
	t.Run("next down", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			a, b := startPipe(t, cert, slowA), startPipe(t, cert, dottest.Options{})
			f := newPipeForward(t, cert, "policy sequential\nhedge 100ms 100", a, b)
			if _, from := answeredBy(t, f, newMsg("example.org.", dns.TypeA)); from != b.Addr {
				t.Fatalf("Expected a query hedged to %s, got the answer of %s", b.Addr, from)
			}
			f.upstreams[1].health.setDown(dot.ErrDial)
			if _, from := answeredBy(t, f, newMsg("example.org.", dns.TypeA)); from != a.Addr {
				t.Errorf("Expected the answer of %s with the second upstream down, got %s's", a.Addr, from)
			}
			if got := b.Queries(); got != 1 {
				t.Errorf("Expected no hedge to the upstream that is down, it got %d queries in all", got)
			}
		})
	})
	t.Run("next down when the delay passes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			var f *DoTForward
			a := startPipe(t, cert, dottest.Options{Delay: func(q dns.Question) time.Duration {
				if q.Name == "warm.example.org." {
					return 0
				}
				f.upstreams[1].health.setDown(dot.ErrDial) // before the 100ms hedge delay passes
				return 500 * time.Millisecond
			}})
			b := startPipe(t, cert, dottest.Options{})
			f = newPipeForward(t, cert, "policy sequential\nhedge 100ms 100", a, b)
			// The connection to the first upstream is open before the query that
			// counts: a handshake slower than the hedge delay would hedge it before
			// the first upstream could mark the second one down.
			answeredBy(t, f, newMsg("warm.example.org.", dns.TypeA))
			if _, from := answeredBy(t, f, newMsg("example.org.", dns.TypeA)); from != a.Addr || b.Queries() != 0 {
				t.Errorf("Expected the first upstream's answer and no hedge, got %s's answer, %d queries at the second", from, b.Queries())
			}
		})
	})
	t.Run("next up after a down one", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			a, b, c := startPipe(t, cert, slowA), startPipe(t, cert, dottest.Options{}), startPipe(t, cert, dottest.Options{})
			f := newPipeForward(t, cert, "policy sequential\nhedge 100ms 100", a, b, c)
			f.upstreams[1].health.setDown(dot.ErrDial)
			if _, from := answeredBy(t, f, newMsg("example.org.", dns.TypeA)); from != c.Addr || b.Queries() != 0 {
				t.Errorf("Expected the hedge to go to the next upstream up, %s; got the answer of %s, %d queries at the one down", c.Addr, from, b.Queries())
			}
		})
	})
	t.Run("one attempt allowed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			a, b := startPipe(t, cert, slowA), startPipe(t, cert, dottest.Options{})
			f := newPipeForward(t, cert, "policy sequential\nhedge 100ms 100\nmax_connect_attempts 1", a, b)
			if _, from := answeredBy(t, f, newMsg("example.org.", dns.TypeA)); from != a.Addr || b.Queries() != 0 {
				t.Errorf("Expected no hedge with max_connect_attempts 1, got the answer of %s, %d queries at the second", from, b.Queries())
			}
		})
	})
}

// TestHedgeFailoverAnswers: a failover answer of the hedge does not win over a
// later valid answer of the first upstream; when both give failover answers, the
// failover logic goes on as without hedging, and neither upstream is asked twice.
func TestHedgeFailoverAnswers(t *testing.T) {
	servfail := rcodeAnswer(dns.RcodeServerFailure)
	t.Run("valid first after failover hedge", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			a := startPipe(t, cert, dottest.Options{Delay: allSlow(300 * time.Millisecond)})
			b := startPipe(t, cert, dottest.Options{Handler: servfail})
			f := newPipeForward(t, cert, "policy sequential\nfailover SERVFAIL\nhedge 50ms 100", a, b)
			wins := metricValue(t, hedgeWinsTotal.WithLabelValues(a.Addr, "first"))
			ret, from := answeredBy(t, f, newMsg("example.org.", dns.TypeA))
			if ret.Rcode != dns.RcodeSuccess || from != a.Addr {
				t.Errorf("Expected the first upstream's NOERROR, got %s from %s", dns.RcodeToString[ret.Rcode], from)
			}
			if b.Queries() != 1 {
				t.Errorf("Expected the query hedged to the second upstream, it got %d", b.Queries())
			}
			if got := metricValue(t, hedgeWinsTotal.WithLabelValues(a.Addr, "first")) - wins; got != 1 {
				t.Errorf("Expected hedge_wins_total{winner=first} +1, got %+v", got)
			}
		})
	})
	t.Run("both failover", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			cert := testCert(t)
			a := startPipe(t, cert, dottest.Options{Handler: servfail, Delay: allSlow(300 * time.Millisecond)})
			b := startPipe(t, cert, dottest.Options{Handler: servfail})
			f := newPipeForward(t, cert, "policy sequential\nfailover SERVFAIL\nhedge 50ms 100", a, b)
			hedges := hedgesTo(t, b.Addr)
			ret, _ := answeredBy(t, f, newMsg("example.org.", dns.TypeA))
			if ret.Rcode != dns.RcodeServerFailure {
				t.Errorf("Expected the SERVFAIL held, got %s", dns.RcodeToString[ret.Rcode])
			}
			if a.Queries() != 1 || b.Queries() != 1 || hedgesTo(t, b.Addr)-hedges != 1 {
				t.Errorf("Expected one query at each upstream, the second's a hedge; got %d and %d, %v hedges", a.Queries(), b.Queries(), hedgesTo(t, b.Addr)-hedges)
			}
		})
	})
}

// TestHedgeAuto: hedge auto starts at read_timeout/2, then follows the first
// upstream's answer times (fast: the lower bound), exports the delay, and
// hedges the slow names to the second upstream.
func TestHedgeAuto(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		a := startPipe(t, cert, dottest.Options{Delay: slowNames(time.Second)})
		b := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "policy sequential\nhedge auto 100\nread_timeout 3s", a, b)
		u := f.upstreams[0]
		if d := u.answers.hedge.current(); d != 1500*time.Millisecond {
			t.Errorf("Expected the delay at read_timeout/2 before any answer, got %v", d)
		}
		for i := range hedgeRecompute {
			answeredBy(t, f, newMsg(fmt.Sprintf("fast%d.example.org.", i), dns.TypeA))
		}
		d := u.answers.hedge.current()
		if d < hedgeMinDelay || d >= 1500*time.Millisecond {
			t.Errorf("Expected a delay from the fast answers, within [%v, 1.5s), got %v", hedgeMinDelay, d)
		}
		if g := metricValue(t, hedgeDelaySeconds.WithLabelValues(a.Addr)); g != d.Seconds() {
			t.Errorf("Expected hedge_delay_seconds %v, got %v", d.Seconds(), g)
		}
		bBefore := b.Queries()
		for i := range 3 {
			if _, from := answeredBy(t, f, newMsg(fmt.Sprintf("slow%d.example.org.", i), dns.TypeA)); from != b.Addr {
				t.Errorf("Slow name %d: expected the hedge's answer from %s, got %s's", i, b.Addr, from)
			}
		}
		if got := b.Queries() - bBefore; got != 3 {
			t.Errorf("Expected the 3 slow names hedged, the second upstream got %d", got)
		}
	})
}

// TestHedgeEstimator feeds synthetic answer times: the delay is twice their 90th
// percentile within the bounds, and follows the distribution when it shifts.
func TestHedgeEstimator(t *testing.T) {
	const lo, hi = 5 * time.Millisecond, time.Second
	e := newHedgeEstimator(lo, hi, nil)
	feed := func(n int, sample func(i int) time.Duration) {
		for i := range n {
			e.observe(sample(i))
		}
	}
	if got := e.current(); got != hi {
		t.Errorf("Expected the upper bound before any sample, got %v", got)
	}
	feed(hedgeRecompute-1, func(int) time.Duration { return time.Millisecond })
	if got := e.current(); got != hi {
		t.Errorf("Expected the upper bound before %d samples, got %v", hedgeRecompute, got)
	}
	feed(1, func(int) time.Duration { return time.Millisecond })
	if got := e.current(); got != lo {
		t.Errorf("Expected the lower bound once %d samples of 1 ms came, got %v", hedgeRecompute, got)
	}
	// From here every feed is a multiple of hedgeRecompute samples: the delay is
	// derived from exactly the last hedgeWindow ones.

	// 1..256 ms in random order: the 90th percentile (nearest rank) is 231 ms.
	perm := rand.Perm(hedgeWindow)
	feed(hedgeWindow, func(i int) time.Duration { return time.Duration(perm[i]+1) * time.Millisecond })
	if got, want := e.current(), 2*231*time.Millisecond; got != want {
		t.Errorf("Expected twice the 90th percentile of 1..256 ms, %v, got %v", want, got)
	}
	// A bimodal upstream, 5 % of the answers after 300 ms: the delay follows the
	// fast ones, so the slow ones are hedged.
	feed(hedgeWindow, func(i int) time.Duration {
		if i%20 == 0 {
			return 300 * time.Millisecond
		}
		return time.Duration(10+i%10) * time.Millisecond
	})
	if got, want := e.current(), 2*19*time.Millisecond; got != want {
		t.Errorf("Expected twice the fast answers' 90th percentile, %v, got %v", want, got)
	}
	// Bounds.
	feed(hedgeWindow, func(int) time.Duration { return time.Millisecond })
	if got := e.current(); got != lo {
		t.Errorf("Expected the lower bound %v for 1 ms answers, got %v", lo, got)
	}
	feed(hedgeWindow, func(int) time.Duration { return 900 * time.Millisecond })
	if got := e.current(); got != hi {
		t.Errorf("Expected the upper bound %v for 900 ms answers, got %v", hi, got)
	}
	// A shift down and up again: within one window the delay follows.
	for _, ms := range []int{20, 100, 20} {
		feed(hedgeWindow, func(int) time.Duration { return time.Duration(ms) * time.Millisecond })
		if got, want := e.current(), time.Duration(2*ms)*time.Millisecond; got != want {
			t.Errorf("After %d ms answers: expected %v, got %v", ms, want, got)
		}
	}
	// A shift is followed before the window has turned over: once more than 10 %
	// of the window is slower, the 90th percentile is a slow sample.
	feed(hedgeWindow/8+hedgeRecompute, func(int) time.Duration { return 200 * time.Millisecond })
	if got := e.current(); got != 400*time.Millisecond {
		t.Errorf("Expected the delay to follow a shift to 200 ms within an eighth of the window, got %v", got)
	}
}

func TestQuantile(t *testing.T) {
	s := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		permille int
		want     int64
	}{{900, 9}, {950, 10}, {500, 5}, {1, 1}, {1000, 10}, {0, 1}} {
		if got := quantile(s, tc.permille); got != tc.want {
			t.Errorf("quantile(1..10, %d‰) = %d, want %d", tc.permille, got, tc.want)
		}
	}
	var big []int64
	for i := range 1000 {
		big = append(big, int64(i+1))
	}
	if got := quantile(big, 950); got != 950 {
		t.Errorf("p95 of 1..1000 = %d, want 950", got)
	}
}

// TestHedgeBudgetGrants: over any run of queries at most hedgeBurst plus
// MAX_PERCENT of them are granted; the budget starts empty and unused credit
// beyond the burst lapses.
func TestHedgeBudgetGrants(t *testing.T) {
	b := &hedgeBudget{percent: 5}
	if b.take() {
		t.Error("Expected no hedge before any query was counted")
	}
	granted := 0
	for range 10000 { // every query wants a hedge
		b.count()
		if b.take() {
			granted++
		}
	}
	if granted != 500 {
		t.Errorf("Expected 5 %% of 10000 queries granted, got %d", granted)
	}
	for range 100000 { // a long quiet spell: credit for 5000 hedges earned
		b.count()
	}
	burst := 0
	for range 2 * hedgeBurst { // bounded: a broken budget grants every take
		if b.take() {
			burst++
		}
	}
	if burst != hedgeBurst {
		t.Errorf("Expected the unused credit to lapse beyond a burst of %d, got %d", hedgeBurst, burst)
	}
	// Concurrent takers never overdraw.
	b = &hedgeBudget{percent: 10}
	for range 1000 {
		b.count()
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	got := 0
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if b.take() {
					mu.Lock()
					got++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if got != hedgeBurst {
		t.Errorf("Expected %d hedges granted to concurrent takers (the burst cap), got %d", hedgeBurst, got)
	}
}

// BenchmarkServeDNSHedge is BenchmarkServeDNS with hedge on and two upstreams:
// the cost of the race's machinery (a timer, a cancellable context, the hedge's
// state) when no hedge fires.
func BenchmarkServeDNSHedge(b *testing.B) {
	cert, err := dottest.NewCert()
	if err != nil {
		b.Fatalf("Generating a test certificate: %v", err)
	}
	s1 := dottest.Start(b, dottest.Options{Cert: cert})
	s2 := dottest.Start(b, dottest.Options{Cert: cert})
	ca := writeFile(b, b.TempDir(), "ca.pem", cert.CAPEM)
	to := func(s *dottest.Server) string {
		return "tls://" + strings.Replace(s.Addr, ":", "%"+dottest.ServerName+":", 1)
	}
	benchServe(b, fmt.Sprintf("dotforward . %s %s {\ntls %s\npolicy sequential\nhedge 1s\n}", to(s1), to(s2), ca))
}

// A panic in the hedge's goroutine, which CoreDNS does not recover, becomes an
// error outcome: the race waiting for it goes on, and the process lives.
func TestHedgePanicBecomesAnOutcome(t *testing.T) {
	v := testUpstreams(1)[0] // its hedge metrics are not bound: counting the hedge panics
	f := &DoTForward{hedge: &hedger{budget: hedgeBudget{percent: 100}}}
	f.hedge.budget.count()
	h := &hedgeRun{f: f, v: v, r: newMsg("example.org.", dns.TypeA), parent: context.Background(),
		cancelFirst: func() {}, done: make(chan outcome, 1)}
	h.run()
	if o := <-h.done; o.u != v || !errors.Is(o.err, errHedgePanicked) {
		t.Errorf("Expected errHedgePanicked from %s, got %v from %v", v.addr, o.err, o.u)
	}
}

// TestHedgeOfAnEDNSQuery: the first exchange and the hedge pack the same client
// message on two goroutines, and packing writes its OPT's extended rcode bits:
// the hedge must pack a copy of its own (under -race, sharing it is a data race).
// The client's OPT, DO bit included, reaches it in the hedge's answer.
func TestHedgeOfAnEDNSQuery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		a := startPipe(t, cert, dottest.Options{Delay: slowNames(time.Second)})
		b := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "policy sequential\nhedge 20ms 100", a, b)
		answeredBy(t, f, newMsg("warmup.example.org.", dns.TypeA))
		for i := range 3 {
			m := newMsg(fmt.Sprintf("slow-edns%d.example.org.", i), dns.TypeA)
			m.SetEdns0(1232, true)
			ret, from := answeredBy(t, f, m)
			if from != b.Addr {
				t.Errorf("Query %d: expected the hedge's answer from %s, got %s's", i, b.Addr, from)
			}
			if ret.IsEdns0() == nil {
				t.Errorf("Query %d: expected an OPT in the answer to a query with one", i)
			}
		}
	})
}
