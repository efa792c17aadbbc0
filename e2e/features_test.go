package e2e

import (
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestDNSSECRecordsCarried proves that the DO bit reaches CoreDNS's DoT server,
// which signs e2e.test only for DO queries, and that its RRSIGs come back intact:
// they verify against the zone's DNSKEY, also fetched through dotforward.
func TestDNSSECRecordsCarried(t *testing.T) {
	c := newCerts(t)
	up := startCoreDNSUpstream(t, c)
	f := startFront(t, c, frontOpts{Upstreams: []string{up.addr}})

	for _, network := range []string{"udp", "tcp"} {
		plain, err := exchange(network, f.addr, nil, newQuery(aName, dns.TypeA))
		if err != nil {
			t.Fatalf("Query without DO over %s: %v", network, err)
		}
		if hasRRSIG(plain) {
			t.Errorf("Answer to a query without DO over %s carries RRSIGs: the DO bit was set on the way", network)
		}
		key := doQuery(t, network, f.addr, zone, dns.TypeDNSKEY)
		a := doQuery(t, network, f.addr, aName, dns.TypeA)
		verifySigned(t, a, key, dns.TypeA)
		verifySigned(t, key, key, dns.TypeDNSKEY)
	}
	// The dnssec plugin answers a missing name with "black lies": NOERROR and an
	// NSEC denying the type, signed. Both must come back.
	nx := doQuery(t, "udp", f.addr, nxName, dns.TypeA)
	if len(nx.Answer) != 0 || len(nx.Ns) == 0 {
		t.Fatalf("Signed denial for %s: rcode %s, %d answers, %d authority records", nxName, dns.RcodeToString[nx.Rcode], len(nx.Answer), len(nx.Ns))
	}
	var nsec, sig bool
	for _, rr := range nx.Ns {
		switch rr.Header().Rrtype {
		case dns.TypeNSEC:
			nsec = true
		case dns.TypeRRSIG:
			sig = true
		}
	}
	if !nsec || !sig {
		t.Errorf("Signed denial lacks NSEC (%v) or RRSIG (%v) in authority: %v", nsec, sig, nx.Ns)
	}
}

// doQuery sends a DO query and requires an answer with the DO bit echoed.
func doQuery(t *testing.T, network, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := newQuery(name, qtype)
	m.SetEdns0(4096, true)
	r, err := exchange(network, addr, nil, m)
	if err != nil {
		t.Fatalf("DO query %s %s over %s: %v", name, dns.TypeToString[qtype], network, err)
	}
	if opt := r.IsEdns0(); opt == nil || !opt.Do() {
		t.Fatalf("Answer to DO query %s %s over %s has no DO bit: %v", name, dns.TypeToString[qtype], network, opt)
	}
	return r
}

// verifySigned checks that r's records of qtype carry an RRSIG that verifies with
// a DNSKEY from key.
func verifySigned(t *testing.T, r, key *dns.Msg, qtype uint16) {
	t.Helper()
	var set []dns.RR
	var sig *dns.RRSIG
	for _, rr := range r.Answer {
		if s, ok := rr.(*dns.RRSIG); ok && s.TypeCovered == qtype {
			sig = s
		} else if rr.Header().Rrtype == qtype {
			set = append(set, rr)
		}
	}
	if len(set) == 0 || sig == nil {
		t.Fatalf("%s answer has %d records and RRSIG %v; want both", dns.TypeToString[qtype], len(set), sig)
	}
	for _, rr := range key.Answer {
		if k, ok := rr.(*dns.DNSKEY); ok && k.KeyTag() == sig.KeyTag {
			if err := sig.Verify(k, set); err != nil {
				t.Fatalf("RRSIG over %s does not verify: %v", dns.TypeToString[qtype], err)
			}
			return
		}
	}
	t.Fatalf("No DNSKEY with tag %d for the RRSIG over %s", sig.KeyTag, dns.TypeToString[qtype])
}

// TestDOBitReachesUnbound counts, with unbound's own statistics, the queries that
// arrive with the DO bit: exactly those the client sent with it.
func TestDOBitReachesUnbound(t *testing.T) {
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{})
	f := startFront(t, c, frontOpts{Upstreams: []string{u.addr}})

	const n = 5
	before := u.stats(t)["num.query.edns.DO"]
	for i := range n {
		if _, err := exchange("udp", f.addr, nil, newQuery(hostName(i), dns.TypeA)); err != nil {
			t.Fatalf("Query without DO: %v", err)
		}
	}
	if d := u.stats(t)["num.query.edns.DO"] - before; d != 0 {
		t.Fatalf("%d queries reached unbound with DO set, but the client sent none", d)
	}
	for i := range n {
		m := newQuery(hostName(n+i), dns.TypeA)
		m.SetEdns0(1232, true)
		if _, err := exchange("udp", f.addr, nil, m); err != nil {
			t.Fatalf("Query with DO: %v", err)
		}
	}
	if d := u.stats(t)["num.query.edns.DO"] - before; d != n {
		t.Fatalf("%d queries reached unbound with DO set, want the %d the client sent", d, n)
	}
}

// TestCacheAndPrometheusInFront is the integration of the plugin chain: cache and
// prometheus in front of dotforward, a real unbound behind it. A repeated name is
// served from the cache (unbound's counter for its query type does not move), and
// /metrics shows both the dotforward and the cache metrics.
func TestCacheAndPrometheusInFront(t *testing.T) {
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{})
	f := startFront(t, c, frontOpts{Upstreams: []string{u.addr}, Cache: true, Prometheus: true})

	const key = "num.query.type.MX" // no health probe or readiness query uses MX
	before := u.stats(t)[key]
	for _, network := range []string{"udp", "tcp"} {
		r, err := exchange(network, f.addr, nil, newQuery(mxName, dns.TypeMX))
		if err == nil {
			err = checkAnswer(r, dns.TypeMX, "10 "+mxHost)
		}
		if err != nil {
			t.Fatalf("MX over %s: %v", network, err)
		}
	}
	first := u.stats(t)[key]
	if first-before != 1 {
		t.Fatalf("unbound saw %d MX queries for the first two asks, want 1 (the second from the cache)", first-before)
	}
	const repeats = 20
	for i := range repeats {
		network := []string{"udp", "tcp"}[i%2]
		r, err := exchange(network, f.addr, nil, newQuery(mxName, dns.TypeMX))
		if err == nil {
			err = checkAnswer(r, dns.TypeMX, "10 "+mxHost)
		}
		if err != nil {
			t.Fatalf("Repeat %d over %s: %v", i, network, err)
		}
	}
	if d := u.stats(t)[key] - first; d != 0 {
		t.Fatalf("A cached name reached unbound %d times", d)
	}

	text := scrape(t, f.metrics)
	to := label("to", u.addr)
	for _, m := range []struct {
		name   string
		labels []string
		min    float64
	}{
		{"coredns_dotforward_requests_total", []string{to}, 1},
		{"coredns_dotforward_responses_total", []string{to, label("rcode", "NOERROR")}, 1},
		{"coredns_dotforward_request_duration_seconds_count", []string{to}, 1},
		{"coredns_dotforward_conns_open", []string{to}, 1},
		{"coredns_dotforward_handshakes_total", []string{to}, 1},
		{"coredns_cache_hits_total", nil, repeats + 1},
		{"coredns_cache_misses_total", nil, 1},
	} {
		v, ok := metricSum(text, m.name, m.labels...)
		if !ok || v < m.min {
			t.Errorf("%s{%s} = %v (present %v), want at least %v", m.name, strings.Join(m.labels, ","), v, ok, m.min)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", grepLines(text, "coredns_dotforward_", "coredns_cache_"))
	}
}

// grepLines returns the lines of text that contain any of subs.
func grepLines(text string, subs ...string) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		for _, s := range subs {
			if strings.Contains(line, s) {
				b.WriteString(line)
				break
			}
		}
	}
	return b.String()
}
