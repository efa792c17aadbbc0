package dotforward

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"

	"github.com/dotforward/dotforward/dot"
	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func TestServeDNSKeepsIDCaseAndEDNS(t *testing.T) {
	cert := testCert(t)
	var sawDO, sawSize atomic.Int64
	s := startServer(t, cert, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		if o := q.IsEdns0(); o != nil {
			sawSize.Store(int64(o.UDPSize()))
			if o.Do() {
				sawDO.Store(1)
			}
		}
		return dottest.DefaultAnswer(q)
	}})
	f := newForward(t, cert, "", s.Addr)

	m := newMsg("ExAmPlE.oRg.", dns.TypeA)
	m.Id = 4321
	m.SetEdns0(1232, true)
	before := m.String()
	rec, rcode, err := serve(f, m)
	if err != nil || rcode != dns.RcodeSuccess {
		t.Fatalf("Expected success, got rcode %d, error %v", rcode, err)
	}
	if m.String() != before {
		t.Errorf("Expected the request unchanged, got\n%s\nwas\n%s", m, before)
	}
	r := rec.Msg
	if r == nil {
		t.Fatal("Expected an answer written")
	}
	if r.Id != 4321 || r.Question[0].Name != "ExAmPlE.oRg." || r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
		t.Errorf("Expected ID 4321, question ExAmPlE.oRg. and one answer, got\n%s", r)
	}
	o := r.IsEdns0()
	if o == nil || o.UDPSize() != 1232 || !o.Do() {
		t.Errorf("Expected EDNS0 with size 1232 and DO in the answer, got %v", o)
	}
	if sawDO.Load() != 1 || sawSize.Load() != 1232 {
		t.Errorf("Expected the upstream to see DO and size 1232, got DO %d, size %d", sawDO.Load(), sawSize.Load())
	}
}

func TestServeDNSFailsOverToSecondUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		dead := deadPipe(t, cert)
		s := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "policy sequential\nhealth_check 100ms", dead, s)
		waitFor(t, "the first round of probes", f.Ready)
		probes := s.Queries()
		sentBefore := metricValue(t, requestsTotal.WithLabelValues(dead.Addr)) // metrics are keyed by address, which a later test may reuse

		for i := range 3 {
			rec, rcode, err := serve(f, newMsg(fmt.Sprintf("q%d.example.org.", i), dns.TypeA))
			if err != nil || rcode != dns.RcodeSuccess || rec.Msg == nil || len(rec.Msg.Answer) != 1 {
				t.Fatalf("Query %d: expected an answer from the second upstream, got rcode %d, error %v", i, rcode, err)
			}
		}
		if got := s.Queries() - probes; got < 3 {
			t.Errorf("Expected 3 queries at the second upstream, got %d", got)
		}
		if !f.upstreams[0].health.isDown() {
			t.Errorf("Expected the unreachable upstream marked down")
		}
		if got := metricValue(t, requestsTotal.WithLabelValues(dead.Addr)) - sentBefore; got != 0 {
			t.Errorf("Expected no client query sent to the upstream found down at startup, got %v", got)
		}
		if got := metricValue(t, upstreamHealthy.WithLabelValues(dead.Addr)); got != 0 {
			t.Errorf("Expected upstream_healthy 0 for %s, got %v", dead.Addr, got)
		}
	})
}

func TestServeDNSFailsOverOnTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		silent := startPipe(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
		s := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "policy sequential\nread_timeout 200ms", silent, s)
		// The metrics are process-wide and keyed by address: a port reused from an
		// earlier test keeps that test's samples, so count from here.
		timeoutsBefore := metricValue(t, timeoutsTotal.WithLabelValues(silent.Addr))
		samplesBefore := histogramCount(t, silent.Addr)

		rec, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
		if err != nil || rcode != dns.RcodeSuccess || rec.Msg == nil {
			t.Fatalf("Expected an answer from the second upstream, got rcode %d, error %v", rcode, err)
		}
		if silent.Queries() != 1 || s.Queries() != 1 {
			t.Errorf("Expected one query at each upstream, got %d and %d", silent.Queries(), s.Queries())
		}
		if got := metricValue(t, timeoutsTotal.WithLabelValues(silent.Addr)) - timeoutsBefore; got != 1 {
			t.Errorf("Expected timeouts_total 1 for the silent upstream, got %v", got)
		}
		if n := histogramCount(t, silent.Addr) - samplesBefore; n != 1 {
			t.Errorf("Expected the failed exchange in request_duration_seconds, got %d samples", n)
		}
	})
}

func TestServeDNSFailoverRcodes(t *testing.T) {
	tests := []struct {
		name      string
		options   string
		first     int
		second    int
		want      int
		secondHit int64
	}{
		{name: "failover SERVFAIL", options: "failover SERVFAIL", first: dns.RcodeServerFailure, second: dns.RcodeSuccess, want: dns.RcodeSuccess, secondHit: 1},
		{name: "no failover: SERVFAIL is an answer", options: "", first: dns.RcodeServerFailure, second: dns.RcodeSuccess, want: dns.RcodeServerFailure, secondHit: 0},
		{name: "rcode not listed", options: "failover REFUSED", first: dns.RcodeServerFailure, second: dns.RcodeSuccess, want: dns.RcodeServerFailure, secondHit: 0},
		{name: "all fail over: last answer", options: "failover SERVFAIL REFUSED", first: dns.RcodeServerFailure, second: dns.RcodeRefused, want: dns.RcodeRefused, secondHit: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cert := testCert(t)
			a := startServer(t, cert, dottest.Options{Handler: rcodeAnswer(tc.first)})
			b := startServer(t, cert, dottest.Options{Handler: rcodeAnswer(tc.second)})
			f := newForward(t, cert, "policy sequential\n"+tc.options, a.Addr, b.Addr)

			rec, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
			if err != nil || rcode != dns.RcodeSuccess {
				t.Fatalf("Expected the answer written, got rcode %d, error %v", rcode, err)
			}
			if rec.Msg == nil || rec.Msg.Rcode != tc.want {
				t.Errorf("Expected rcode %s, got %v", dns.RcodeToString[tc.want], rec.Msg)
			}
			if a.Queries() != 1 || b.Queries() != tc.secondHit {
				t.Errorf("Expected 1 and %d queries, got %d and %d", tc.secondHit, a.Queries(), b.Queries())
			}
		})
	}
}

func TestServeDNSAllFail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		dead1, dead2 := deadPipe(t, cert), deadPipe(t, cert)
		f := newPipeForward(t, cert, "health_check 100ms", dead1, dead2)
		waitFor(t, "the first round of probes", f.Ready)

		rec, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
		if rcode != dns.RcodeServerFailure || !errors.Is(err, dot.ErrUnavailable) {
			t.Errorf("Expected SERVFAIL and the pools' ErrUnavailable, got rcode %d, error %v", rcode, err)
		}
		if rec.Msg != nil {
			t.Errorf("Expected nothing written (the server writes SERVFAIL), got %v", rec.Msg)
		}

		// Both are down: each query tries the one that failed least recently, and fails.
		broken := metricValue(t, healthcheckBroken)
		if rcode, _, err := serveRcode(f); rcode != dns.RcodeServerFailure || err == nil {
			t.Errorf("Expected SERVFAIL with every upstream down, got rcode %d, error %v", rcode, err)
		}
		if got := metricValue(t, healthcheckBroken); got != broken+1 {
			t.Errorf("Expected healthcheck_broken_total to grow by 1, got %v → %v", broken, got)
		}
	})
}

func TestServeDNSFailfast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		f := newPipeForward(t, cert, "failfast_all_unhealthy_upstreams\nhealth_check 100ms", deadPipe(t, cert))
		waitFor(t, "the first round of probes", f.Ready)
		if rcode, _, err := serveRcode(f); rcode != dns.RcodeServerFailure || !errors.Is(err, ErrNoHealthy) {
			t.Errorf("Expected SERVFAIL with ErrNoHealthy once every upstream is down, got rcode %d, error %v", rcode, err)
		}
	})
}

func serveRcode(f *DoTForward) (int, *dns.Msg, error) {
	rec, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
	return rcode, rec.Msg, err
}

func TestServeDNSMaxConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		release := make(chan struct{})
		s := startPipe(t, cert, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
			if q.Question[0].Name == "slow.example.org." {
				<-release
			}
			return dottest.DefaultAnswer(q)
		}})
		defer close(release)
		f := newPipeForward(t, cert, "max_concurrent 1", s)

		done := make(chan int, 1)
		go func() {
			_, rcode, _ := serve(f, newMsg("slow.example.org.", dns.TypeA))
			done <- rcode
		}()
		waitFor(t, "the slow query upstream", func() bool { return s.Queries() == 1 })

		rejects := metricValue(t, maxConcurrentRejects)
		_, rcode, err := serve(f, newMsg("fast.example.org.", dns.TypeA))
		if rcode != dns.RcodeRefused || !errors.Is(err, ErrLimitExceeded) {
			t.Errorf("Expected REFUSED and ErrLimitExceeded beyond max_concurrent, got rcode %d, error %v", rcode, err)
		}
		if got := metricValue(t, maxConcurrentRejects); got != rejects+1 {
			t.Errorf("Expected max_concurrent_rejects_total to grow by 1, got %v → %v", rejects, got)
		}
		release <- struct{}{}
		if rcode := <-done; rcode != dns.RcodeSuccess {
			t.Errorf("Expected the slow query answered, got rcode %d", rcode)
		}
		if _, rcode, err := serve(f, newMsg("fast.example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
			t.Errorf("Expected a query to pass once the slot is free, got rcode %d, error %v", rcode, err)
		}
	})
}

func TestServeDNSCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		s := startPipe(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
		f := newPipeForward(t, cert, "read_timeout 1m\ntimeout 1m", s)

		ctx, cancel := context.WithCancel(context.Background())
		type result struct {
			rcode int
			err   error
		}
		done := make(chan result, 1)
		go func() {
			_, rcode, err := serveCtx(ctx, f, newMsg("example.org.", dns.TypeA))
			done <- result{rcode, err}
		}()
		waitFor(t, "the query upstream", func() bool { return s.Queries() == 1 })
		cancel()
		// The read timeout and the deadline are a minute away: only the
		// cancellation can end the query before this bound.
		select {
		case r := <-done:
			if r.rcode != dns.RcodeServerFailure || !errors.Is(r.err, context.Canceled) {
				t.Errorf("Expected SERVFAIL with context.Canceled, got rcode %d, error %v", r.rcode, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Expected ServeDNS to return after cancellation")
		}
	})
}

func TestServeDNSDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		s := startPipe(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
		f := newPipeForward(t, cert, "read_timeout 1m\ntimeout 300ms", s)
		_, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
		if rcode != dns.RcodeServerFailure || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Expected SERVFAIL at the overall deadline, got rcode %d, error %v", rcode, err)
		}
		if f.upstreams[0].health.fails.Load() != 0 {
			t.Errorf("Expected our own deadline not to count against the upstream")
		}
	})
}

func TestServeDNSMatch(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	ca := writeFile(t, t.TempDir(), "ca.pem", cert.CAPEM)
	input := fmt.Sprintf("dotforward example.org tls://%s {\ntls %s\nexcept internal.example.org\nhealth_check 0\n}",
		strings.Replace(s.Addr, ":", "%"+dottest.ServerName+":", 1), ca)
	fs, err := parse(caddy.NewTestController("dns", input))
	if err != nil {
		t.Fatalf("Parsing: %v", err)
	}
	f := fs[0]
	f.Next = test.NextHandler(dns.RcodeNameError, nil)
	if err := f.OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	defer f.OnShutdown()

	tests := []struct {
		name      string
		forwarded bool
	}{
		{"example.org.", true},
		{"www.Example.ORG.", true},
		{"internal.example.org.", false},
		{"a.internal.example.org.", false},
		{"example.net.", false},
	}
	for _, tc := range tests {
		before := s.Queries()
		_, rcode, _ := serve(f, newMsg(tc.name, dns.TypeA))
		forwarded := s.Queries() == before+1
		if forwarded != tc.forwarded || (!forwarded && rcode != dns.RcodeNameError) {
			t.Errorf("%s: expected forwarded=%v, got forwarded=%v, rcode %d", tc.name, tc.forwarded, forwarded, rcode)
		}
	}
}

func TestServeDNSRefusesUnforwardable(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "", s.Addr)

	two := newMsg("example.org.", dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "example.net.", Qtype: dns.TypeA, Qclass: dns.ClassINET})
	tests := []struct {
		name string
		m    *dns.Msg
		want int
	}{
		{"AXFR", newMsg("example.org.", dns.TypeAXFR), dns.RcodeNotImplemented},
		{"IXFR", newMsg("example.org.", dns.TypeIXFR), dns.RcodeNotImplemented},
		{"two questions", two, dns.RcodeFormatError},
	}
	for _, tc := range tests {
		if _, rcode, err := serve(f, tc.m); rcode != tc.want || err == nil {
			t.Errorf("%s: expected rcode %s and an error, got %d, %v", tc.name, dns.RcodeToString[tc.want], rcode, err)
		}
	}
	if s.Queries() != 0 {
		t.Errorf("Expected nothing sent upstream, got %d queries", s.Queries())
	}
}

func TestServeDNSBeforeStartup(t *testing.T) {
	fs, err := parse(caddy.NewTestController("dns", "dotforward . "+cf))
	if err != nil {
		t.Fatalf("Parsing: %v", err)
	}
	f := fs[0]
	if f.Ready() {
		t.Errorf("Expected not ready before OnStartup")
	}
	if _, rcode, err := serve(f, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeServerFailure || !errors.Is(err, ErrNotStarted) {
		t.Errorf("Expected SERVFAIL with ErrNotStarted, got rcode %d, error %v", rcode, err)
	}
}

func TestShutdownDuringQuery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		s := startPipe(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
		f := newPipeForward(t, cert, "read_timeout 1m\ntimeout 1m", s)
		done := make(chan error, 1)
		go func() {
			_, _, err := serve(f, newMsg("example.org.", dns.TypeA))
			done <- err
		}()
		waitFor(t, "the query upstream", func() bool { return s.Queries() == 1 })
		if err := f.OnShutdown(); err != nil {
			t.Errorf("Shutting down: %v", err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, dot.ErrPoolClosed) {
				t.Errorf("Expected the in-flight query to fail with ErrPoolClosed, got %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Expected the in-flight query to end when the pool closed")
		}
	})
}

func TestErrorRcode(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{ErrZoneTransfer, dns.RcodeNotImplemented},
		{fmt.Errorf("x: %w", dot.ErrBadQuery), dns.RcodeFormatError},
		{dot.ErrTimeout, dns.RcodeServerFailure},
		{filepath.ErrBadPattern, dns.RcodeServerFailure},
	}
	for i, tc := range tests {
		if got := errorRcode(tc.err); got != tc.want {
			t.Errorf("Test %d: expected rcode %d for %v, got %d", i, tc.want, tc.err, got)
		}
	}
}

// BenchmarkServeDNS measures the handler and pool overhead per query against a
// local fake upstream, queries in parallel.
func BenchmarkServeDNS(b *testing.B) {
	cert, err := dottest.NewCert()
	if err != nil {
		b.Fatalf("Generating a test certificate: %v", err)
	}
	s := dottest.Start(b, dottest.Options{Cert: cert})
	ca := writeFile(b, b.TempDir(), "ca.pem", cert.CAPEM)
	input := fmt.Sprintf("dotforward . tls://%s {\ntls %s\n}", strings.Replace(s.Addr, ":", "%"+dottest.ServerName+":", 1), ca)
	benchServe(b, input)
}

// benchServe starts the dotforward line input and serves example.org A through
// it in parallel, b.N times.
func benchServe(b *testing.B, input string) {
	fs, err := parse(caddy.NewTestController("dns", input))
	if err != nil {
		b.Fatalf("Parsing: %v", err)
	}
	f := fs[0]
	if err := f.OnStartup(); err != nil {
		b.Fatalf("Starting: %v", err)
	}
	defer f.OnShutdown()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		m := newMsg("example.org.", dns.TypeA)
		for pb.Next() {
			if _, rcode, err := serve(f, m); rcode != dns.RcodeSuccess {
				b.Errorf("Expected an answer, got rcode %d, error %v", rcode, err)
				return
			}
		}
	})
}

// TestReload follows caddy's reload order: the new instance starts while the old
// one still runs, then the old one shuts down. The metrics of the shared upstream
// stay consistent and the new instance keeps answering.
func TestReload(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	old := newForward(t, cert, "", s.Addr)
	if _, rcode, err := serve(old, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
		t.Fatalf("Expected an answer from the old instance, got rcode %d, error %v", rcode, err)
	}
	next := newForward(t, cert, "", s.Addr)
	if _, rcode, err := serve(next, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
		t.Fatalf("Expected an answer from the new instance, got rcode %d, error %v", rcode, err)
	}
	if got := metricValue(t, connsOpen.WithLabelValues(s.Addr)); got != 2 {
		t.Errorf("Expected 2 open connections while both instances run, got %v", got)
	}
	if err := old.OnShutdown(); err != nil {
		t.Fatalf("Shutting down the old instance: %v", err)
	}
	if got := metricValue(t, connsOpen.WithLabelValues(s.Addr)); got != 1 {
		t.Errorf("Expected 1 open connection after the old instance shut down, got %v", got)
	}
	if _, rcode, err := serve(next, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeSuccess || !next.Ready() {
		t.Errorf("Expected the new instance ready and answering, got rcode %d, error %v", rcode, err)
	}
}
