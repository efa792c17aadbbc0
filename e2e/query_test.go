package e2e

import (
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// queryTimeout bounds one client exchange in the Go clients.
const queryTimeout = 5 * time.Second

// newQuery returns a recursive query for name/qtype without EDNS.
func newQuery(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// exchange sends m over network ("udp", "tcp" or "tcp-tls") to addr.
func exchange(network, addr string, tlsConf *tls.Config, m *dns.Msg) (*dns.Msg, error) {
	c := &dns.Client{Net: network, TLSConfig: tlsConf, Timeout: queryTimeout, UDPSize: 4096}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// dotExchange sends m to a DoT server that presents a certificate from c.
func dotExchange(c *certs, addr string, m *dns.Msg) (*dns.Msg, error) {
	return exchange("tcp-tls", addr, &tls.Config{RootCAs: c.pool, ServerName: serverName}, m)
}

// checkAnswer returns nil if r is a NOERROR answer whose records of type qtype
// are exactly want (in presentation form of their data, any order).
func checkAnswer(r *dns.Msg, qtype uint16, want ...string) error {
	if r == nil {
		return fmt.Errorf("no answer")
	}
	if r.Rcode != dns.RcodeSuccess {
		return fmt.Errorf("rcode %s, want NOERROR", dns.RcodeToString[r.Rcode])
	}
	got := rdata(r, qtype)
	slices.Sort(got)
	w := slices.Clone(want)
	slices.Sort(w)
	if !slices.Equal(got, w) {
		return fmt.Errorf("%s answer %q, want %q", dns.TypeToString[qtype], got, w)
	}
	return nil
}

// rdata returns the data of r's answer records of type qtype, in presentation form.
func rdata(r *dns.Msg, qtype uint16) []string {
	var out []string
	for _, rr := range r.Answer {
		if rr.Header().Rrtype != qtype {
			continue
		}
		s := rr.String()
		hdr := rr.Header().String()
		out = append(out, strings.TrimPrefix(s, hdr))
	}
	return out
}

// txtData returns the concatenated strings of r's TXT answers.
func txtData(r *dns.Msg) []string {
	var out []string
	for _, rr := range r.Answer {
		if t, ok := rr.(*dns.TXT); ok {
			out = append(out, strings.Join(t.Txt, ""))
		}
	}
	return out
}

// hasRRSIG reports whether r's answer section carries an RRSIG.
func hasRRSIG(r *dns.Msg) bool {
	for _, rr := range r.Answer {
		if rr.Header().Rrtype == dns.TypeRRSIG {
			return true
		}
	}
	return false
}
