package dot

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func TestPrepareQueryPadsToBlock(t *testing.T) {
	tests := []struct {
		name  string
		qname string
		block int
		edns  bool
	}{
		{"short name, no client EDNS", "a.example.", 128, false},
		{"client EDNS", "a.example.", 128, true},
		{"long name", "a-rather-long-label-to-push-the-size-up.another-long-label.example.org.", 128, true},
		{"block 468", "b.example.", 468, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := newQuery(tc.qname, dns.TypeA)
			if tc.edns {
				m.SetEdns0(4096, true)
			}
			q, err := prepareQuery(m, tc.block, true)
			if err != nil {
				t.Fatalf("prepareQuery: %v", err)
			}
			msg := q.wire[2:]
			if len(msg)%tc.block != 0 {
				t.Errorf("Packed length %d is not a multiple of %d", len(msg), tc.block)
			}
			// The padded message must still parse, with one padding option last.
			out := new(dns.Msg)
			if err := out.Unpack(msg); err != nil {
				t.Fatalf("Padded query does not unpack: %v", err)
			}
			opt := out.IsEdns0()
			if opt == nil || len(opt.Option) == 0 {
				t.Fatal("Padded query has no OPT options")
			}
			if _, ok := opt.Option[len(opt.Option)-1].(*dns.EDNS0_PADDING); !ok {
				t.Errorf("Last option is %T, want padding", opt.Option[len(opt.Option)-1])
			}
		})
	}
}

// Padding and keepalive are hop-by-hop: the client's are not forwarded, ours are
// added; other options, the buffer size and the DO bit pass through.
func TestPrepareQueryHopByHop(t *testing.T) {
	m := newQuery("a.example.", dns.TypeA)
	m.SetEdns0(1400, true)
	opt := m.IsEdns0()
	opt.Option = append(opt.Option,
		&dns.EDNS0_PADDING{Padding: make([]byte, 40)},
		&dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE, Timeout: 99},
		&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(198, 51, 100, 0)},
	)
	q, err := prepareQuery(m, 128, true)
	if err != nil {
		t.Fatal(err)
	}
	out := new(dns.Msg)
	if err := out.Unpack(q.wire[2:]); err != nil {
		t.Fatal(err)
	}
	o := out.IsEdns0()
	if o.UDPSize() != 1400 || !o.Do() {
		t.Errorf("Upstream OPT size %d DO %v, want the client's 1400 and DO", o.UDPSize(), o.Do())
	}
	var pads, kas, subnets int
	for _, e := range o.Option {
		switch e := e.(type) {
		case *dns.EDNS0_PADDING:
			pads++
		case *dns.EDNS0_TCP_KEEPALIVE:
			kas++
			if e.Timeout != 0 {
				t.Errorf("Forwarded the client's keepalive timeout %d", e.Timeout)
			}
		case *dns.EDNS0_SUBNET:
			subnets++
		}
	}
	if pads != 1 || kas != 1 || subnets != 1 {
		t.Errorf("Options: %d padding, %d keepalive, %d subnet; want 1 of each", pads, kas, subnets)
	}
	if len(m.IsEdns0().Option) != 3 {
		t.Errorf("The client's query was modified: %v", m.IsEdns0().Option)
	}
}

func TestPrepareQueryRejects(t *testing.T) {
	noQ := new(dns.Msg)
	two := newQuery("a.example.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	for name, m := range map[string]*dns.Msg{
		"no question":   noQ,
		"two questions": two,
		"AXFR":          newQuery("example.", dns.TypeAXFR),
		"IXFR":          newQuery("example.", dns.TypeIXFR),
	} {
		if _, err := prepareQuery(m, 128, true); err == nil {
			t.Errorf("%s: prepareQuery accepted it", name)
		}
	}
}

func TestEDNSPassesThrough(t *testing.T) {
	var got *dns.OPT
	var mu sync.Mutex
	s := dottest.Start(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		mu.Lock()
		got = q.IsEdns0()
		mu.Unlock()
		return dottest.DefaultAnswer(q)
	}})
	p, _ := newTestPool(t, s, func(c *Config) { c.PadBlock = -1; c.NoKeepalive = true })
	m := newQuery("a.example.", dns.TypeA)
	m.SetEdns0(4096, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.Exchange(ctx, m)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got == nil || got.UDPSize() != 4096 || !got.Do() || len(got.Option) != 0 {
		t.Errorf("Upstream saw OPT %v, want size 4096, DO, no options (padding and keepalive off)", got)
	}
	if o := r.IsEdns0(); o == nil || o.UDPSize() != 4096 || !o.Do() {
		t.Errorf("Answer OPT %v, want the server's echo", o)
	}
}

// An OPT that is not the last additional record is moved last, and the query
// still carries everything it had.
func TestPrepareQueryOPTNotLast(t *testing.T) {
	m := newQuery("a.example.", dns.TypeA)
	m.SetEdns0(2048, true)
	m.Extra = append(m.Extra, &dns.A{Hdr: dns.RR_Header{Name: "glue.example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 5}, A: net.IPv4(192, 0, 2, 9)})
	q, err := prepareQuery(m, 128, true)
	if err != nil {
		t.Fatal(err)
	}
	out := new(dns.Msg)
	if err := out.Unpack(q.wire[2:]); err != nil {
		t.Fatalf("Rewritten query does not unpack: %v", err)
	}
	if len(out.Extra) != 2 {
		t.Fatalf("Additional section %v, want the A record and the OPT", out.Extra)
	}
	if _, ok := out.Extra[1].(*dns.OPT); !ok || out.IsEdns0().UDPSize() != 2048 || !q.clientOPT {
		t.Errorf("OPT not moved last intact: %v", out.Extra)
	}
	if len(q.wire[2:])%128 != 0 {
		t.Errorf("Length %d not padded to 128", len(q.wire[2:]))
	}
}

// FuzzRewriteOPT checks that rewriting any message either fails cleanly or yields
// a message that unpacks, is padded, and keeps the question.
func FuzzRewriteOPT(f *testing.F) {
	for _, edns := range []bool{false, true} {
		m := newQuery("fuzz.example.", dns.TypeTXT)
		if edns {
			m.SetEdns0(1232, true)
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: []byte{0, 0}})
		}
		b, _ := m.Pack()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		in := new(dns.Msg)
		if in.Unpack(msg) != nil {
			return
		}
		wire := append([]byte{0, 0}, msg...)
		out, _, err := rewriteOPT(wire, 128, true)
		if err != nil {
			return
		}
		got := new(dns.Msg)
		if err := got.Unpack(out[2:]); err != nil {
			t.Fatalf("Rewritten message does not unpack: %v", err)
		}
		if (len(out)-2)%128 != 0 && len(out)-2 < dns.MaxMsgSize-128 {
			t.Fatalf("Rewritten length %d not padded", len(out)-2)
		}
		if len(got.Question) != len(in.Question) {
			t.Fatalf("Question count changed: %d → %d", len(in.Question), len(got.Question))
		}
	})
}
