package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// TestSemantics proves, against each real DoT server, that what a client asks and
// what the server answers is carried through dotforward intact: record types,
// rcodes, the client's question case, EDNS, and answers too large for UDP.
func TestSemantics(t *testing.T) {
	for _, k := range upstreamKinds {
		t.Run(k.name, func(t *testing.T) {
			c := newCerts(t)
			s := k.start(t, c)
			f := startFront(t, c, frontOpts{Upstreams: []string{s.addr}})
			checkSemantics(t, f.addr)
		})
	}
}

func checkSemantics(t *testing.T, front string) {
	for _, network := range []string{"udp", "tcp"} {
		t.Run("Records/"+network, func(t *testing.T) {
			for _, q := range []struct {
				name  string
				qtype uint16
				want  []string
			}{
				{aName, dns.TypeA, []string{aAddr}},
				{aName, dns.TypeAAAA, []string{aaaaAddr}},
				{mxName, dns.TypeMX, []string{"10 " + mxHost}},
				{txtName, dns.TypeTXT, []string{`"` + txtText + `"`}},
			} {
				r, err := exchange(network, front, nil, newQuery(q.name, q.qtype))
				if err == nil {
					err = checkAnswer(r, q.qtype, q.want...)
				}
				if err != nil {
					t.Errorf("%s %s over %s: %v", q.name, dns.TypeToString[q.qtype], network, err)
				}
			}
		})
		t.Run("Rcodes/"+network, func(t *testing.T) {
			for _, q := range []struct {
				name  string
				rcode int
			}{{nxName, dns.RcodeNameError}, {failName, dns.RcodeServerFailure}} {
				r, err := exchange(network, front, nil, newQuery(q.name, dns.TypeA))
				if err != nil {
					t.Errorf("%s over %s: %v", q.name, network, err)
					continue
				}
				if r.Rcode != q.rcode {
					t.Errorf("%s over %s: rcode %s, want %s", q.name, network, dns.RcodeToString[r.Rcode], dns.RcodeToString[q.rcode])
				}
			}
		})
	}
	t.Run("QuestionCase", func(t *testing.T) {
		for _, name := range []string{"A.E2e.TeSt.", "a.E2E.TEST.", "H7.e2E.tEsT."} {
			r, err := exchange("udp", front, nil, newQuery(name, dns.TypeA))
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			if len(r.Question) != 1 || r.Question[0].Name != name {
				t.Errorf("Question of the answer to %s is %v, want the client's case kept", name, r.Question)
			}
			if len(r.Answer) == 0 || !strings.EqualFold(r.Answer[0].Header().Name, name) {
				t.Errorf("Answer to %s: %v", name, r.Answer)
			}
		}
	})
	t.Run("EDNS", func(t *testing.T) {
		m := newQuery(aName, dns.TypeA)
		m.SetEdns0(1232, true)
		r, err := exchange("udp", front, nil, m)
		if err == nil {
			err = checkAnswer(r, dns.TypeA, aAddr)
		}
		if err != nil {
			t.Fatalf("EDNS query: %v", err)
		}
		opt := r.IsEdns0()
		if opt == nil {
			t.Fatalf("Answer to an EDNS query has no OPT record")
		}
		if !opt.Do() {
			t.Errorf("Answer to a DO query does not echo the DO bit: %v", opt)
		}
	})
	t.Run("HopByHopOptionsStripped", func(t *testing.T) {
		// Padding and keepalive are options of the DoT hop (RFC 7830, 7828): the
		// servers may put them in their answers, the client must not see them.
		for _, network := range []string{"udp", "tcp"} {
			m := newQuery(aName, dns.TypeA)
			m.SetEdns0(1232, false)
			r, err := exchange(network, front, nil, m)
			if err != nil {
				t.Fatalf("EDNS query over %s: %v", network, err)
			}
			opt := r.IsEdns0()
			if opt == nil {
				t.Fatalf("Answer over %s to an EDNS query has no OPT record", network)
			}
			for _, o := range opt.Option {
				if c := o.Option(); c == dns.EDNS0PADDING || c == dns.EDNS0TCPKEEPALIVE {
					t.Errorf("Answer over %s carries the DoT hop's EDNS option %d: %v", network, c, opt)
				}
			}
		}
	})
	t.Run("LargeOverUDPTruncated", func(t *testing.T) {
		r, err := exchange("udp", front, nil, newQuery(bigName, dns.TypeTXT))
		if err != nil {
			t.Fatalf("%s over UDP without EDNS: %v", bigName, err)
		}
		if !r.Truncated {
			t.Fatalf("%s over UDP without EDNS: TC not set on a %d-record answer", bigName, len(r.Answer))
		}
		if n := r.Len(); n > dns.MinMsgSize {
			t.Errorf("Truncated answer is %d octets, over the %d allowed without EDNS", n, dns.MinMsgSize)
		}
	})
	for _, q := range []struct {
		network string
		name    string
		want    []string
		edns    uint16
	}{
		{"tcp", bigName, bigStrings, 0},
		{"tcp", hugeName, hugeStrings, 0},
		{"udp", hugeName, hugeStrings, 4096},
	} {
		t.Run("Large/"+q.network+"/"+q.name, func(t *testing.T) {
			m := newQuery(q.name, dns.TypeTXT)
			if q.edns > 0 {
				m.SetEdns0(q.edns, false)
			}
			r, err := exchange(q.network, front, nil, m)
			if err != nil {
				t.Fatalf("%s over %s: %v", q.name, q.network, err)
			}
			if r.Truncated {
				t.Fatalf("%s over %s: truncated", q.name, q.network)
			}
			txt := r.Answer
			if len(txt) != 1 {
				t.Fatalf("%s over %s: %d answers, want 1 TXT", q.name, q.network, len(txt))
			}
			if got := txt[0].(*dns.TXT).Txt; !slices.Equal(got, q.want) {
				t.Fatalf("%s over %s: TXT strings differ from the zone's (%d strings, want %d)", q.name, q.network, len(got), len(q.want))
			}
			t.Logf("%s over %s: %d octets intact", q.name, q.network, r.Len())
		})
	}
}
