package e2e

import (
	"testing"

	"github.com/miekg/dns"
)

// TestUpstreamAuthentication proves against a real unbound that dotforward sends
// queries only to an upstream it has authenticated: by certificate and server
// name under the configured CA, or by SPKI pin alone (RFC 7858's out-of-band
// key-pinned profile). Each failing case answers SERVFAIL and not a single query
// reaches unbound; there is no plaintext fallback.
func TestUpstreamAuthentication(t *testing.T) {
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{})
	other := newCerts(t) // a CA and key unbound does not use
	port := u.addr[len("127.0.0.1:"):]

	for _, tc := range []struct {
		name string
		o    frontOpts
		ok   bool
	}{
		{"RightCAAndName", frontOpts{Upstreams: []string{u.addr}}, true},
		{"PinOnly", frontOpts{Targets: []string{"tls://" + u.addr}, NoCA: true, Options: []string{"tls_pin " + c.Pin}}, true},
		{"PinAndName", frontOpts{Upstreams: []string{u.addr}, Options: []string{"tls_pin " + other.Pin, "tls_pin " + c.Pin}}, true},
		{"UnknownCA", frontOpts{Upstreams: []string{u.addr}, NoCA: true, Options: []string{"tls " + other.CA}, Failing: true}, false},
		{"SystemRoots", frontOpts{Upstreams: []string{u.addr}, NoCA: true, Failing: true}, false},
		{"WrongName", frontOpts{Targets: []string{"tls://127.0.0.1%wrong.test:" + port}, Failing: true}, false},
		{"WrongPin", frontOpts{Targets: []string{"tls://" + u.addr}, NoCA: true, Options: []string{"tls_pin " + other.Pin}, Failing: true}, false},
		{"RightCAWrongPin", frontOpts{Upstreams: []string{u.addr}, Options: []string{"tls_pin " + other.Pin}, Failing: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := u.stats(t)["num.query.tls"]
			f := startFront(t, c, tc.o)
			const n = 5
			for i := range n {
				r, err := exchange("udp", f.addr, nil, newQuery(hostName(i), dns.TypeA))
				if err != nil {
					t.Fatalf("Query %d: %v", i, err)
				}
				if tc.ok {
					if err := checkAnswer(r, dns.TypeA, hostAddr(i)); err != nil {
						t.Fatalf("Query %d to an authenticated upstream: %v", i, err)
					}
				} else if r.Rcode != dns.RcodeServerFailure {
					t.Fatalf("Query %d to an unauthenticated upstream: rcode %s, want SERVFAIL", i, dns.RcodeToString[r.Rcode])
				}
			}
			got := u.stats(t)["num.query.tls"] - before
			switch {
			case tc.ok && got < n:
				t.Errorf("unbound saw %d queries over TLS, want at least the %d sent", got, n)
			case !tc.ok && got != 0:
				t.Errorf("unbound saw %d queries over TLS from a front that could not authenticate it", got)
			}
		})
	}
}
