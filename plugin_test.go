package dotforward

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/dotforward/dotforward/dot"
	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// testCert is shared by every fake upstream of a test so one `tls CA` line trusts them all.
func testCert(t *testing.T) *dottest.Cert {
	t.Helper()
	c, err := dottest.NewCert()
	if err != nil {
		t.Fatalf("Generating a test certificate: %v", err)
	}
	return c
}

// startServer starts a fake DoT upstream with the shared certificate.
func startServer(t *testing.T, cert *dottest.Cert, opts dottest.Options) *dottest.Server {
	t.Helper()
	opts.Cert = cert
	return dottest.Start(t, opts)
}

// deadAddr returns an address on 127.0.0.1 where nothing listens.
func deadAddr(t *testing.T, cert *dottest.Cert) string {
	t.Helper()
	s, err := dottest.New(dottest.Options{Cert: cert})
	if err != nil {
		t.Fatalf("Starting DoT test server: %v", err)
	}
	s.Close()
	return s.Addr
}

// newForward parses a dotforward line for addrs with the given block options,
// trusting cert, starts it and shuts it down when the test ends.
func newForward(t *testing.T, cert *dottest.Cert, options string, addrs ...string) *DoTForward {
	t.Helper()
	ca := writeFile(t, t.TempDir(), "ca.pem", cert.CAPEM)
	to := ""
	for _, a := range addrs {
		to += " tls://" + strings.Replace(a, ":", "%"+dottest.ServerName+":", 1)
	}
	if !strings.Contains(options, "health_check") {
		// Handler tests count the queries upstreams receive: no probes among them.
		options += "\nhealth_check 0"
	}
	input := fmt.Sprintf("dotforward .%s {\ntls %s\n%s\n}", to, ca, options)
	fs, err := parse(caddy.NewTestController("dns", input))
	if err != nil {
		t.Fatalf("Parsing %q: %v", input, err)
	}
	f := fs[0]
	if err := f.OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	t.Cleanup(func() {
		if err := f.OnShutdown(); err != nil {
			t.Errorf("Shutting down: %v", err)
		}
		checkNoPoolGoroutines(t)
	})
	return f
}

func serve(f *DoTForward, m *dns.Msg) (*dnstest.Recorder, int, error) {
	return serveCtx(context.Background(), f, m)
}

func serveCtx(ctx context.Context, f *DoTForward, m *dns.Msg) (*dnstest.Recorder, int, error) {
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	rcode, err := f.ServeDNS(ctx, rec, m)
	return rec, rcode, err
}

func newMsg(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// waitFor and checkNoPoolGoroutines are dottest's, under the names the tests use.
func waitFor(t *testing.T, what string, cond func() bool) { t.Helper(); dottest.WaitFor(t, what, cond) }

func checkNoPoolGoroutines(t *testing.T) { t.Helper(); dottest.CheckNoPoolGoroutines(t) }

func rcodeAnswer(rcode int) func(q *dns.Msg) *dns.Msg {
	return func(q *dns.Msg) *dns.Msg {
		r := new(dns.Msg)
		r.SetRcode(q, rcode)
		return r
	}
}

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
	cert := testCert(t)
	dead := deadAddr(t, cert)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "policy sequential\nhealth_check 100ms", dead, s.Addr)
	waitFor(t, "the first round of probes", f.Ready)
	probes := s.Queries()

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
	if got := metricValue(t, requestsTotal.WithLabelValues(dead)); got != 0 {
		t.Errorf("Expected no client query sent to the upstream found down at startup, got %v", got)
	}
	if got := metricValue(t, upstreamHealthy.WithLabelValues(dead)); got != 0 {
		t.Errorf("Expected upstream_healthy 0 for %s, got %v", dead, got)
	}
}

func TestServeDNSFailsOverOnTimeout(t *testing.T) {
	cert := testCert(t)
	silent := startServer(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "policy sequential\nread_timeout 200ms", silent.Addr, s.Addr)

	rec, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
	if err != nil || rcode != dns.RcodeSuccess || rec.Msg == nil {
		t.Fatalf("Expected an answer from the second upstream, got rcode %d, error %v", rcode, err)
	}
	if silent.Queries() != 1 || s.Queries() != 1 {
		t.Errorf("Expected one query at each upstream, got %d and %d", silent.Queries(), s.Queries())
	}
	if got := metricValue(t, timeoutsTotal.WithLabelValues(silent.Addr)); got != 1 {
		t.Errorf("Expected timeouts_total 1 for the silent upstream, got %v", got)
	}
	if n := histogramCount(t, silent.Addr); n != 1 {
		t.Errorf("Expected the failed exchange in request_duration_seconds, got %d samples", n)
	}
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
	cert := testCert(t)
	dead1, dead2 := deadAddr(t, cert), deadAddr(t, cert)
	f := newForward(t, cert, "health_check 100ms", dead1, dead2)
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
}

func TestServeDNSFailfast(t *testing.T) {
	cert := testCert(t)
	f := newForward(t, cert, "failfast_all_unhealthy_upstreams\nhealth_check 100ms", deadAddr(t, cert))
	waitFor(t, "the first round of probes", f.Ready)
	if rcode, _, err := serveRcode(f); rcode != dns.RcodeServerFailure || !errors.Is(err, ErrNoHealthy) {
		t.Errorf("Expected SERVFAIL with ErrNoHealthy once every upstream is down, got rcode %d, error %v", rcode, err)
	}
}

func serveRcode(f *DoTForward) (int, *dns.Msg, error) {
	rec, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
	return rcode, rec.Msg, err
}

func TestServeDNSMaxConcurrent(t *testing.T) {
	cert := testCert(t)
	release := make(chan struct{})
	s := startServer(t, cert, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		if q.Question[0].Name == "slow.example.org." {
			<-release
		}
		return dottest.DefaultAnswer(q)
	}})
	defer close(release)
	f := newForward(t, cert, "max_concurrent 1", s.Addr)

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
}

func TestServeDNSCancel(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
	f := newForward(t, cert, "read_timeout 1m\ntimeout 1m", s.Addr)

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
}

func TestServeDNSDeadline(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
	f := newForward(t, cert, "read_timeout 1m\ntimeout 300ms", s.Addr)
	_, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
	if rcode != dns.RcodeServerFailure || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Expected SERVFAIL at the overall deadline, got rcode %d, error %v", rcode, err)
	}
	if f.upstreams[0].health.fails.Load() != 0 {
		t.Errorf("Expected our own deadline not to count against the upstream")
	}
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

func TestReadyAndChain(t *testing.T) {
	cert := testCert(t)
	a := startServer(t, cert, dottest.Options{})
	b := startServer(t, cert, dottest.Options{})
	ca := writeFile(t, t.TempDir(), "ca.pem", cert.CAPEM)
	to := func(s *dottest.Server) string {
		return "tls://" + strings.Replace(s.Addr, ":", "%"+dottest.ServerName+":", 1)
	}
	input := fmt.Sprintf("dotforward example.org %s {\ntls %s\nhealth_check 0\n}\ndotforward . %s {\ntls %s\nhealth_check 0\n}", to(a), ca, to(b), ca)
	fs, err := parse(caddy.NewTestController("dns", input))
	if err != nil || len(fs) != 2 {
		t.Fatalf("Parsing two lines: %d instances, error %v", len(fs), err)
	}
	fs[0].Next, fs[1].Next = fs[1], test.NextHandler(dns.RcodeServerFailure, nil)
	if err := fs[0].OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	if fs[0].Ready() {
		t.Errorf("Expected not ready while the chained line has not started")
	}
	if err := fs[1].OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	if !fs[0].Ready() {
		t.Errorf("Expected ready once both lines started")
	}
	for _, name := range []string{"www.example.org.", "www.example.net."} {
		if _, rcode, err := serve(fs[0], newMsg(name, dns.TypeA)); rcode != dns.RcodeSuccess {
			t.Errorf("%s: expected an answer, got rcode %d, error %v", name, rcode, err)
		}
	}
	if a.Queries() != 1 || b.Queries() != 1 {
		t.Errorf("Expected one query at each line's upstream, got %d and %d", a.Queries(), b.Queries())
	}
	for _, f := range fs {
		if err := f.OnShutdown(); err != nil {
			t.Errorf("Shutting down: %v", err)
		}
	}
	if fs[0].Ready() {
		t.Errorf("Expected not ready after OnShutdown")
	}
	checkNoPoolGoroutines(t)
}

func TestShutdownDuringQuery(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
	f := newForward(t, cert, "read_timeout 1m\ntimeout 1m", s.Addr)
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
}

func TestMetrics(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "", s.Addr)
	to := s.Addr
	// Counters are global and keyed by address, which an earlier test (or an
	// earlier -count round) may have used: compare increments.
	counters := map[string]prometheus.Metric{
		"requests_total":                 requestsTotal.WithLabelValues(to),
		"responses_total NOERROR":        responsesTotal.WithLabelValues(to, "NOERROR"),
		"dials_total ok":                 dialsTotal.WithLabelValues(to, "ok"),
		"handshakes_total resumed=false": handshakesTotal.WithLabelValues(to, "false"),
		"conn_closes_total shutdown":     connClosesTotal.WithLabelValues(to, "shutdown"),
	}
	before := map[string]float64{}
	for name, c := range counters {
		before[name] = metricValue(t, c)
	}
	samplesBefore := histogramCount(t, to)
	for range 3 {
		if _, rcode, err := serve(f, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
			t.Fatalf("Expected an answer, got rcode %d, error %v", rcode, err)
		}
	}
	checks := []struct {
		name string
		c    prometheus.Metric
		want float64
	}{
		{"requests_total", counters["requests_total"], 3},
		{"responses_total NOERROR", counters["responses_total NOERROR"], 3},
		{"inflight", inflight.WithLabelValues(to), 0},
		{"conns_open", connsOpen.WithLabelValues(to), 1},
		{"dials_total ok", counters["dials_total ok"], 1},
		{"handshakes_total resumed=false", counters["handshakes_total resumed=false"], 1},
		{"upstream_healthy", upstreamHealthy.WithLabelValues(to), 1},
	}
	for _, c := range checks {
		if got := metricValue(t, c.c) - before[c.name]; got != c.want {
			t.Errorf("Expected %s %v, got %v", c.name, c.want, got)
		}
	}
	if n := histogramCount(t, to) - samplesBefore; n != 3 {
		t.Errorf("Expected 3 request_duration_seconds samples, got %d", n)
	}
	if err := f.OnShutdown(); err != nil {
		t.Fatalf("Shutting down: %v", err)
	}
	if got := metricValue(t, connsOpen.WithLabelValues(to)); got != 0 {
		t.Errorf("Expected conns_open 0 after shutdown, got %v", got)
	}
	if got := metricValue(t, counters["conn_closes_total shutdown"]) - before["conn_closes_total shutdown"]; got != 1 {
		t.Errorf("Expected one close for shutdown, got %v", got)
	}
	// Every metric the README lists is registered under coredns_dotforward_.
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatalf("Gathering metrics: %v", err)
	}
	have := map[string]bool{}
	for _, mf := range families {
		have[mf.GetName()] = true
	}
	for _, name := range []string{"requests_total", "responses_total", "request_duration_seconds", "inflight",
		"conns_open", "dials_total", "handshakes_total", "conn_closes_total", "upstream_healthy",
		"healthcheck_broken_total", "max_concurrent_rejects_total"} {
		if !have["coredns_dotforward_"+name] {
			t.Errorf("Expected coredns_dotforward_%s registered", name)
		}
	}
}

// metricValue reads a counter or gauge.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatalf("Reading a metric: %v", err)
	}
	if m.Counter != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func histogramCount(t *testing.T, to string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := requestDuration.WithLabelValues(to).(prometheus.Metric).Write(&m); err != nil {
		t.Fatalf("Reading the histogram: %v", err)
	}
	return m.GetHistogram().GetSampleCount()
}

func TestDownAfterMaxFailsUpAtAnswer(t *testing.T) {
	u := testUpstreams(1)[0]
	if u.Down() {
		t.Fatal("Expected a new upstream up")
	}
	u.health.failure(dot.ErrDial)
	if u.Down() {
		t.Errorf("Expected an upstream up after 1 of max_fails 2 failures")
	}
	u.health.failure(dot.ErrDial)
	if !u.Down() {
		t.Errorf("Expected an upstream down after exactly max_fails 2 failures")
	}
	u.health.answered()
	if u.Down() || u.health.fails.Load() != 0 {
		t.Errorf("Expected an answer to bring the upstream back, fails reset")
	}
	// Errors of single exchanges are not health failures: the pool reports the
	// upstream's own failures separately.
	for _, err := range []error{dot.ErrTimeout, dot.ErrUnavailable, dot.ErrConnLost} {
		u.failed(err, time.Millisecond)
	}
	if u.Down() || u.health.fails.Load() != 0 {
		t.Errorf("Expected exchange errors not to count as health failures")
	}

	never := newUpstream(dot.Config{Addr: "192.0.2.9:853"}, 0, healthCheck{})
	for range 10 {
		never.health.failure(dot.ErrDial)
	}
	if never.Down() {
		t.Errorf("Expected max_fails 0 never to mark an upstream down")
	}
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

func TestMetadataUpstream(t *testing.T) {
	cert := testCert(t)
	dead := deadAddr(t, cert)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "policy sequential", dead, s.Addr)
	ctx := metadata.ContextWithMetadata(context.Background())
	if _, rcode, err := serveCtx(ctx, f, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
		t.Fatalf("Expected an answer, got rcode %d, error %v", rcode, err)
	}
	fn := metadata.ValueFunc(ctx, "dotforward/upstream")
	if fn == nil || fn() != s.Addr {
		t.Errorf("Expected dotforward/upstream metadata %s, the upstream that answered", s.Addr)
	}
}

// TestLatencyPolicyPrefersFasterUpstream sends sequential queries to a slow and a
// fast upstream: once both are measured, the fast one takes nearly all of them.
func TestLatencyPolicyPrefersFasterUpstream(t *testing.T) {
	cert := testCert(t)
	slow := startServer(t, cert, dottest.Options{Delay: func(dns.Question) time.Duration { return 30 * time.Millisecond }})
	fast := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "policy latency", slow.Addr, fast.Addr)
	const n = 200
	for i := range n {
		if _, rcode, err := serve(f, newMsg(fmt.Sprintf("q%d.example.org.", i), dns.TypeA)); rcode != dns.RcodeSuccess {
			t.Fatalf("Query %d: expected an answer, got rcode %d, error %v", i, rcode, err)
		}
	}
	// Expected: the slow one once or twice while unmeasured, then one query in 20
	// exploring (about 10); the bound leaves room for a loaded machine.
	if got := fast.Queries(); got < n*3/4 {
		t.Errorf("Expected the fast upstream to take most of %d queries, got %d (slow: %d)", n, got, slow.Queries())
	}
	if slow.Queries() == 0 {
		t.Errorf("Expected exploration to send some queries to the slow upstream")
	}
}

// A panic in the pool, which CoreDNS recovers per query, must not leave the query
// counted in flight: the latency policy and the inflight gauge read that count.
// A nil message, a caller's bug that CoreDNS never makes, is the one input left
// that makes the pool panic (hostile records are refused as errors).
func TestExchangePanicLeavesNothingInFlight(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "", s.Addr)
	u := f.upstreams[0]
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Expected the pool to panic on a nil message")
			}
		}()
		u.exchange(context.Background(), nil, time.Now().Add(time.Second))
	}()
	if n := u.inflight.Load(); n != 0 {
		t.Errorf("Expected no query in flight after the panic, got %d", n)
	}
	if g := metricValue(t, inflight.WithLabelValues(s.Addr)); g != 0 {
		t.Errorf("Expected the inflight gauge 0 after the panic, got %v", g)
	}
	if n := histogramCount(t, s.Addr); n != 1 {
		t.Errorf("Expected the panicked exchange in request_duration_seconds, got %d samples", n)
	}
}

// A non-QUERY message (UPDATE, NOTIFY) is not idempotent: once it may have been
// written, no other upstream gets it, whatever went wrong. Only an error that
// proves it was never written (an unreachable upstream) lets it go elsewhere.
func TestNonQueryOpcodesAreNotSentTwice(t *testing.T) {
	opcodes := []struct {
		name string
		msg  func() *dns.Msg
	}{
		{"UPDATE", func() *dns.Msg { return new(dns.Msg).SetUpdate("example.org.") }},
		{"NOTIFY", func() *dns.Msg { return new(dns.Msg).SetNotify("example.org.") }},
	}
	upstreams := []struct {
		name    string
		opts    dottest.Options
		options string
		rcode   int // what ServeDNS returns
		answer  int // the rcode written, when ServeDNS returns success
	}{
		{name: "silent", opts: dottest.Options{Drop: func(dns.Question) bool { return true }}, rcode: dns.RcodeServerFailure},
		// Raw writes no bytes, which counts as the first answer: CloseAfter 1 then
		// closes the connection right after reading the query.
		{name: "closes after reading", opts: dottest.Options{CloseAfter: 1, Raw: func(*dns.Msg, []byte) [][]byte { return nil }}, rcode: dns.RcodeServerFailure},
		{name: "failover rcode", opts: dottest.Options{Handler: rcodeAnswer(dns.RcodeServerFailure)}, options: "failover SERVFAIL", answer: dns.RcodeServerFailure},
	}
	for _, op := range opcodes {
		for _, up := range upstreams {
			t.Run(op.name+" "+up.name, func(t *testing.T) {
				cert := testCert(t)
				a := startServer(t, cert, up.opts)
				b := startServer(t, cert, up.opts)
				f := newForward(t, cert, "policy sequential\nread_timeout 200ms\n"+up.options, a.Addr, b.Addr)
				rec, rcode, err := serve(f, op.msg())
				if rcode != up.rcode {
					t.Errorf("Expected rcode %s, got %s (error %v)", dns.RcodeToString[up.rcode], dns.RcodeToString[rcode], err)
				}
				if up.rcode == dns.RcodeSuccess && (rec.Msg == nil || rec.Msg.Rcode != up.answer) {
					t.Errorf("Expected the upstream's %s answer written, got %v", dns.RcodeToString[up.answer], rec.Msg)
				}
				if got := a.Queries() + b.Queries(); got != 1 {
					t.Errorf("Expected the %s sent once, the upstreams got it %d times (%d and %d)", op.name, got, a.Queries(), b.Queries())
				}
			})
		}
		t.Run(op.name+" unreachable first", func(t *testing.T) {
			cert := testCert(t)
			dead := deadAddr(t, cert)
			b := startServer(t, cert, dottest.Options{})
			f := newForward(t, cert, "policy sequential", dead, b.Addr)
			rec, rcode, err := serve(f, op.msg())
			if rcode != dns.RcodeSuccess || rec.Msg == nil {
				t.Fatalf("Expected the second upstream's answer, got rcode %d, error %v", rcode, err)
			}
			if b.Queries() != 1 {
				t.Errorf("Expected the %s at the second upstream once, got %d", op.name, b.Queries())
			}
		})
	}
}

// A failover answer in hand is the client's answer when time runs out on a later
// upstream, rather than a SERVFAIL of our own.
func TestFailoverAnswerKeptAtDeadline(t *testing.T) {
	tests := []struct {
		name    string
		options string
		cancel  bool
	}{
		{name: "deadline", options: "timeout 300ms\nread_timeout 1m"},
		{name: "cancelled", options: "timeout 1m\nread_timeout 1m", cancel: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cert := testCert(t)
			a := startServer(t, cert, dottest.Options{Handler: rcodeAnswer(dns.RcodeRefused)})
			b := startServer(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
			f := newForward(t, cert, "policy sequential\nfailover REFUSED\n"+tc.options, a.Addr, b.Addr)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				rec   *dnstest.Recorder
				rcode int
				err   error
			}
			done := make(chan result, 1)
			go func() {
				rec, rcode, err := serveCtx(ctx, f, newMsg("example.org.", dns.TypeA))
				done <- result{rec, rcode, err}
			}()
			if tc.cancel {
				waitFor(t, "the query at the second upstream", func() bool { return b.Queries() == 1 })
				cancel()
			}
			r := <-done // bounded by the 300ms timeout, or by the cancellation
			if r.rcode != dns.RcodeSuccess || r.err != nil {
				t.Fatalf("Expected the first upstream's REFUSED answer written, got rcode %d, error %v", r.rcode, r.err)
			}
			if r.rec.Msg == nil || r.rec.Msg.Rcode != dns.RcodeRefused {
				t.Errorf("Expected a REFUSED answer, got %v", r.rec.Msg)
			}
		})
	}
}

// dotforward/upstream names the upstream whose answer the client gets, not the
// last one tried.
func TestMetadataNamesTheAnsweringUpstream(t *testing.T) {
	cert := testCert(t)
	a := startServer(t, cert, dottest.Options{Handler: rcodeAnswer(dns.RcodeRefused)})
	b := startServer(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
	f := newForward(t, cert, "policy sequential\nfailover REFUSED\nread_timeout 200ms\nmax_connect_attempts 2", a.Addr, b.Addr)
	ctx := metadata.ContextWithMetadata(context.Background())
	rec, rcode, err := serveCtx(ctx, f, newMsg("example.org.", dns.TypeA))
	if rcode != dns.RcodeSuccess || rec.Msg == nil || rec.Msg.Rcode != dns.RcodeRefused {
		t.Fatalf("Expected the first upstream's REFUSED answer, got rcode %d, error %v", rcode, err)
	}
	if b.Queries() != 1 {
		t.Fatalf("Expected the query tried at the second upstream, got %d queries there", b.Queries())
	}
	fn := metadata.ValueFunc(ctx, "dotforward/upstream")
	if fn == nil || fn() != a.Addr {
		got := "none"
		if fn != nil {
			got = fn()
		}
		t.Errorf("Expected dotforward/upstream %s (whose answer was returned), got %s", a.Addr, got)
	}
}

// CoreDNS's server refuses queries of a class other than IN unless a plugin of the
// server block is listed in dnsserver.EnableChaos, as forward is: through a real
// server, a CH query reaches the upstream and its answer the client.
func TestServerForwardsChaosClass(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "", s.Addr)
	cfg := &dnsserver.Config{Zone: ".", Transport: "dns", ListenHosts: []string{"127.0.0.1"}, Port: "0"}
	cfg.AddPlugin(func(plugin.Handler) plugin.Handler { return f })
	srv, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg})
	if err != nil {
		t.Fatalf("Creating a CoreDNS server: %v", err)
	}
	for _, class := range []uint16{dns.ClassCHAOS, dns.ClassANY} {
		m := newMsg("version.bind.", dns.TypeTXT)
		m.Question[0].Qclass = class
		before := s.Queries()
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		srv.ServeDNS(context.Background(), rec, m)
		if rec.Msg == nil || rec.Msg.Rcode != dns.RcodeSuccess {
			t.Errorf("Class %s: expected the upstream's NOERROR answer, got %v", dns.ClassToString[class], rec.Msg)
		}
		if got := s.Queries() - before; got != 1 {
			t.Errorf("Class %s: expected the query forwarded once, the upstream got %d", dns.ClassToString[class], got)
		}
	}
}
