package dot

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// Tests of what a hostile or broken client query, or an odd upstream answer, must
// not do (issue #12): splice messages the client chose into the shared connection,
// panic, carry a foreign ID or signature, or leave the caller waiting.

// bigOption is a private EDNS option code: forwarded as it is, like any option
// that is not hop-by-hop.
const bigOption = 65001

// bigQuery returns an A query that packs to exactly size octets: with an OPT whose
// one option (bigOption) takes up the room, or, without OPT, with a NULL record in
// the additional section doing so.
func bigQuery(t testing.TB, size int, withOPT bool) *dns.Msg {
	t.Helper()
	m := newQuery("a.example.", dns.TypeA)
	var grow func(n int)
	if withOPT {
		m.SetEdns0(1232, false)
		o := &dns.EDNS0_LOCAL{Code: bigOption}
		m.IsEdns0().Option = []dns.EDNS0{o}
		grow = func(n int) { o.Data = make([]byte, n) }
	} else {
		rr := &dns.NULL{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeNULL, Class: dns.ClassINET}}
		m.Extra = []dns.RR{rr}
		grow = func(n int) { rr.Data = strings.Repeat("x", n) }
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	grow(size - len(b))
	if b, err = m.Pack(); err != nil || len(b) != size {
		t.Fatalf("Big query packs to %d octets (%v), want %d", len(b), err, size)
	}
	return m
}

// checkFrame checks a prepared query's wire: a length prefix that is the message's
// length and at most 65,535, a message that parses, with m's question.
func checkFrame(t testing.TB, wire []byte, m *dns.Msg) *dns.Msg {
	t.Helper()
	n := len(wire) - 2
	if n > dns.MaxMsgSize || int(binary.BigEndian.Uint16(wire)) != n {
		t.Fatalf("Length prefix %d for a %d-octet message", binary.BigEndian.Uint16(wire), n)
	}
	out := new(dns.Msg)
	if err := out.Unpack(wire[2:]); err != nil {
		t.Fatalf("Prepared query does not parse: %v", err)
	}
	if len(out.Question) != 1 || out.Question[0] != m.Question[0] {
		t.Fatalf("Prepared query asks %v, want %v", out.Question, m.Question)
	}
	return out
}

// A query near 64K that fits without our keepalive and padding options is sent
// without them, intact; one that does not fit at all is refused. The length
// prefix never wraps.
func TestPrepareQueryNeverPassesTheLimit(t *testing.T) {
	for _, size := range []int{65000, 65400, 65512, 65520, 65527, 65528, 65532, 65535} {
		for _, withOPT := range []bool{true, false} {
			for _, block := range []int{0, 128, 468} {
				for _, keepalive := range []bool{false, true} {
					name := fmt.Sprintf("size %d OPT %v block %d keepalive %v", size, withOPT, block, keepalive)
					m := bigQuery(t, size, withOPT)
					q, err := prepareQuery(m, block, keepalive)
					if err != nil {
						t.Fatalf("%s: %v; a query that fits must be sent", name, err)
					}
					out := checkFrame(t, q.wire, m)
					if withOPT && len(out.IsEdns0().Option[0].(*dns.EDNS0_LOCAL).Data) != size-42 {
						t.Fatalf("%s: the client's option did not arrive intact", name)
					}
					if !withOPT && len(out.Extra[0].(*dns.NULL).Data) != size-38 {
						t.Fatalf("%s: the client's record did not arrive intact", name)
					}
				}
			}
		}
	}
}

// A message that packs past 65,535 octets (a plugin can build one) is refused.
func TestPrepareQueryRefusesOversized(t *testing.T) {
	for _, withOPT := range []bool{true, false} {
		m := bigQuery(t, dns.MaxMsgSize+5, withOPT)
		if _, err := prepareQuery(m, 128, true); !errors.Is(err, ErrBadQuery) {
			t.Errorf("OPT %v: prepareQuery = %v, want ErrBadQuery", withOPT, err)
		}
	}
}

// Through the pool: the server sees the big query intact, exactly once, and
// nothing spliced out of it; the next query on the connection is read as itself.
func TestOversizedQueryIsNotSpliced(t *testing.T) {
	var mu sync.Mutex
	var got [][]byte
	s := dottest.Start(t, dottest.Options{OnQuery: func(wire []byte) {
		mu.Lock()
		got = append(got, wire)
		mu.Unlock()
	}})
	p, _ := newTestPool(t, s, func(c *Config) { c.ReadTimeout = time.Second })
	m := bigQuery(t, 65532, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.Exchange(ctx, m)
	switch {
	case errors.Is(err, ErrBadQuery):
	case err != nil:
		t.Errorf("Big query: %v, want an answer or ErrBadQuery", err)
	case r.Id != m.Id || r.Question[0] != m.Question[0]:
		t.Errorf("Big query's answer: %v", r)
	}
	if _, err := exchange(p, "after.example."); err != nil {
		t.Fatalf("Query after the big one: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 && len(got) != 1 {
		t.Fatalf("Server received %d messages, want the big query (or not) and the next", len(got))
	}
	for i, wire := range got {
		want := m
		if i == len(got)-1 {
			want = newQuery("after.example.", dns.TypeA)
		}
		checkFrame(t, append([]byte{byte(len(wire) >> 8), byte(len(wire))}, wire...), want)
	}
}

// writeRecords never writes a frame whose length prefix would lie: such a call is
// left queued (its caller or the sweeper gives it up).
func TestWriteRecordsSkipsBadFrame(t *testing.T) {
	p, err := New(Config{Addr: "127.0.0.1:853", TLS: &tls.Config{ServerName: "dot.test"}, Observer: newRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	good := mustPrepare(t, "a.example.")
	wrongPrefix := &query{wire: slices.Clone(good.wire)}
	wrongPrefix.wire[1]++
	tooLong := &query{wire: make([]byte, 2+dns.MaxMsgSize+5)}
	binary.BigEndian.PutUint16(tooLong.wire, 4) // what 65,540 wraps to
	for name, q := range map[string]*query{"wrong prefix": wrongPrefix, "too long": tooLong} {
		a, b := net.Pipe()
		b.Close() // a write would fail the TLS handshake at once
		bc := &batchConn{Conn: a}
		c := newConn(p, tls.Client(bc, p.tls), bc)
		cl := newTestCall(q)
		n, _ := c.writeRecords([]*call{cl}, ownRecords)
		if n != 0 || cl.state.Load() != callQueued {
			t.Errorf("%s: wrote %d calls, call state %d; want nothing written", name, n, cl.state.Load())
		}
		a.Close()
	}
}

// Meta records where a query cannot have them, nil records and messages that do
// not pack are bad queries: an error wrapping ErrBadQuery, never a panic.
func TestPrepareQueryRefusesMalformed(t *testing.T) {
	opt := func() dns.RR {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(1232)
		return o
	}
	a := func() dns.RR {
		return &dns.A{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.IPv4(192, 0, 2, 1)}
	}
	optTypedA := func() dns.RR { // Go type A, but it packs as an OPT
		rr := a()
		rr.Header().Rrtype = dns.TypeOPT
		return rr
	}
	tests := map[string]func(m *dns.Msg){
		"OPT in answer, then a record": func(m *dns.Msg) { m.Answer = []dns.RR{opt()}; m.Extra = []dns.RR{a()} },
		"OPT in answer, alone":         func(m *dns.Msg) { m.Answer = []dns.RR{opt()} },
		"OPT in authority":             func(m *dns.Msg) { m.Ns = []dns.RR{opt()}; m.Extra = []dns.RR{opt()} },
		"OPT-typed record in answer":   func(m *dns.Msg) { m.Answer = []dns.RR{optTypedA()} },
		"two OPTs":                     func(m *dns.Msg) { m.Extra = []dns.RR{opt(), opt()} },
		"two OPTs apart":               func(m *dns.Msg) { m.Extra = []dns.RR{opt(), a(), opt()} },
		"two OPTs, one OPT-typed A":    func(m *dns.Msg) { m.Extra = []dns.RR{opt(), optTypedA()} },
		"nil additional":               func(m *dns.Msg) { m.Extra = []dns.RR{nil} },
		"nil additional after OPT":     func(m *dns.Msg) { m.Extra = []dns.RR{opt(), nil} },
		"nil answer":                   func(m *dns.Msg) { m.Answer = []dns.RR{nil} },
		"nil authority":                func(m *dns.Msg) { m.Ns = []dns.RR{nil} },
		"extended rcode without OPT":   func(m *dns.Msg) { m.Rcode = dns.RcodeBadVers },
		"bad owner name":               func(m *dns.Msg) { rr := a(); rr.Header().Name = "a..example."; m.Extra = []dns.RR{rr} },
		"nil *dns.A in additional":     func(m *dns.Msg) { m.Extra = []dns.RR{(*dns.A)(nil)} },
		"nil *dns.OPT in additional":   func(m *dns.Msg) { m.Extra = []dns.RR{(*dns.OPT)(nil)} },
		"nil *dns.TSIG in answer":      func(m *dns.Msg) { m.Answer = []dns.RR{(*dns.TSIG)(nil)} },
		"nil EDNS0 option": func(m *dns.Msg) {
			m.SetEdns0(1232, false)
			m.IsEdns0().Option = []dns.EDNS0{nil}
		},
		"TSIG in authority": func(m *dns.Msg) { m.Ns = []dns.RR{tsigRR(m.Id)} },
		"TSIG-typed A":      func(m *dns.Msg) { rr := a(); rr.Header().Rrtype = dns.TypeTSIG; m.Extra = []dns.RR{rr} },
	}
	for name, edit := range tests {
		m := newQuery("a.example.", dns.TypeA)
		edit(m)
		if err := prepareNoPanic(m); !errors.Is(err, ErrBadQuery) {
			t.Errorf("%s: prepareQuery = %v, want ErrBadQuery", name, err)
		}
	}
}

// prepareNoPanic runs prepareQuery and turns a panic into an error.
func prepareNoPanic(m *dns.Msg) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	_, err = prepareQuery(m, 128, true)
	return err
}

// headerOnly returns a response with the given ID and rcode and no question.
func headerOnly(id uint16, rcode int, edit func(r *dns.Msg)) []byte {
	r := new(dns.Msg)
	r.Id, r.Response, r.Rcode = id, true, rcode
	if edit != nil {
		edit(r)
	}
	b, err := r.Pack()
	if err != nil {
		panic(err)
	}
	return b
}

// An error answer with no question (RFC 7766 allows it; some public resolvers send
// one for a query they refuse) goes to the caller with the caller's ID and question;
// one without an error rcode in its header, or carrying records other than an OPT,
// could be anyone's and is dropped.
func TestHeaderOnlyErrorAnswers(t *testing.T) {
	withEDE := func(r *dns.Msg) {
		r.SetEdns0(1232, false)
		r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeProhibited})
	}
	withAnswer := func(r *dns.Msg) {
		r.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "evil.example.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.IPv4(192, 0, 2, 66)}}
	}
	withAuthority := func(r *dns.Msg) {
		r.Ns = []dns.RR{&dns.NS{Hdr: dns.RR_Header{Name: "example.", Rrtype: dns.TypeNS, Class: dns.ClassINET}, Ns: "ns.evil."}}
	}
	withGlue := func(r *dns.Msg) {
		r.Extra = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "ns.evil.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.IPv4(192, 0, 2, 66)}}
	}
	tests := []struct {
		name    string
		rcode   int
		edit    func(r *dns.Msg)
		deliver bool
	}{
		{"REFUSED", dns.RcodeRefused, nil, true},
		{"FORMERR", dns.RcodeFormatError, nil, true},
		{"NOTIMP", dns.RcodeNotImplemented, nil, true},
		{"SERVFAIL", dns.RcodeServerFailure, nil, true},
		{"REFUSED with an EDE", dns.RcodeRefused, withEDE, true},
		{"NOERROR", dns.RcodeSuccess, nil, false},
		{"NXDOMAIN with an answer", dns.RcodeNameError, withAnswer, false},
		{"REFUSED with authority", dns.RcodeRefused, withAuthority, false},
		{"REFUSED with glue", dns.RcodeRefused, withGlue, false},
		{"BADVERS: NOERROR in the header, 1 in the OPT", dns.RcodeBadVers, nil, false},
		{"NOERROR with an OPT", dns.RcodeSuccess, withEDE, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := newBareConn(t, 8)
			m := newQuery("Www.Example.", dns.TypeAAAA)
			m.Id = 777
			m.SetEdns0(1232, false)
			q, err := prepareQuery(m, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			cl := newTestCall(q)
			c.register(cl)
			<-c.writeq
			cl.state.Store(callSent)
			edit := tc.edit
			if tc.rcode > 0xF && edit == nil {
				edit = func(r *dns.Msg) { r.SetEdns0(1232, false) }
			}
			c.dispatch(headerOnly(cl.id, tc.rcode, edit))
			c.closeFor(errServerClosed, CloseServer)
			r := <-cl.resp
			if !tc.deliver {
				drops := c.pool.obs.(*recorder).drops[DropWrongQuestion]
				if r.msg != nil || drops != 1 {
					t.Fatalf("Delivered %v (%d wrong-question drops), want it dropped", r.msg, drops)
				}
				return
			}
			if r.err != nil {
				t.Fatalf("Got %v, want the error answer", r.err)
			}
			if r.msg.Rcode != tc.rcode || r.msg.Id != 777 || len(r.msg.Question) != 1 || r.msg.Question[0] != m.Question[0] {
				t.Fatalf("Delivered %v, want rcode %d, ID 777, the client's question", r.msg, tc.rcode)
			}
			b, err := r.msg.Pack()
			if err != nil {
				t.Fatalf("The answer does not pack: %v", err)
			}
			if err := new(dns.Msg).Unpack(b); err != nil {
				t.Fatalf("The answer does not unpack: %v", err)
			}
		})
	}
}

// Through the pool, the caller gets a question-less REFUSED at once, not a timeout.
func TestHeaderOnlyRefusedThroughPool(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Raw: func(q *dns.Msg, _ []byte) [][]byte {
		return [][]byte{headerOnly(q.Id, dns.RcodeRefused, nil)}
	}})
	p, rec := newTestPool(t, s, func(c *Config) { c.ReadTimeout = 5 * time.Second })
	m := newQuery("a.example.", dns.TypeA)
	m.Id = 4321
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	r, err := p.Exchange(ctx, m)
	if err != nil {
		t.Fatalf("Exchange: %v after %v, want the REFUSED", err, time.Since(start))
	}
	if r.Rcode != dns.RcodeRefused || r.Id != 4321 || r.Question[0] != m.Question[0] {
		t.Errorf("Got %v, want REFUSED with the client's ID and question", r)
	}
	if d := rec.get(func(r *recorder) int { return len(r.drops) }); d != 0 {
		t.Errorf("Drops %v, want none", rec.drops)
	}
}

// hasSignature reports whether m carries a TSIG or SIG(0) record anywhere.
func hasSignature(m *dns.Msg) bool {
	for _, s := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range s {
			if t := rr.Header().Rrtype; t == dns.TypeTSIG || t == dns.TypeSIG {
				return true
			}
		}
	}
	return false
}

// tsigRR returns a TSIG record like one a signer adds (SetTsig leaves the MAC to
// the transport; here it is filled in, as on the wire).
func tsigRR(origID uint16) *dns.TSIG {
	return &dns.TSIG{
		Hdr:       dns.RR_Header{Name: "key.example.", Rrtype: dns.TypeTSIG, Class: dns.ClassANY},
		Algorithm: dns.HmacSHA256, TimeSigned: uint64(time.Now().Unix()), Fudge: 300,
		MACSize: 32, MAC: strings.Repeat("ab", 32), OrigId: origID,
	}
}

// A TSIG-signed query cannot be forwarded signed through an ID-rewriting pool: the
// signature is removed and the query goes upstream unsigned, OPT handled as usual,
// wherever the client (or a plugin such as cache) put the OPT.
func TestTSIGQueryGoesUnsigned(t *testing.T) {
	tests := map[string]func(m *dns.Msg){
		"SetTsig, no OPT": func(m *dns.Msg) { m.SetTsig("key.example.", dns.HmacSHA256, 300, time.Now().Unix()) },
		"OPT, then SetTsig": func(m *dns.Msg) {
			m.SetEdns0(1232, true)
			m.SetTsig("key.example.", dns.HmacSHA256, 300, time.Now().Unix())
		},
		"TSIG, then OPT":      func(m *dns.Msg) { m.Extra = []dns.RR{tsigRR(m.Id)}; m.SetEdns0(1232, true) },
		"OPT, then full TSIG": func(m *dns.Msg) { m.SetEdns0(1232, true); m.Extra = append(m.Extra, tsigRR(m.Id)) },
		"SIG(0)": func(m *dns.Msg) {
			m.SetEdns0(1232, true)
			m.Extra = append(m.Extra, &dns.SIG{RRSIG: dns.RRSIG{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSIG, Class: dns.ClassANY},
				Algorithm: dns.ECDSAP256SHA256, SignerName: "key.example.", Signature: "AAAA"}})
		},
	}
	var mu sync.Mutex
	var got []*dns.Msg
	s := dottest.Start(t, dottest.Options{OnQuery: func(wire []byte) {
		m := new(dns.Msg)
		err := m.Unpack(wire)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			t.Errorf("Upstream got a query that does not parse: %v", err)
			return
		}
		got = append(got, m)
	}})
	p, _ := newTestPool(t, s, nil)
	for name, edit := range tests {
		m := newQuery("a.example.", dns.TypeA)
		m.Id = 999
		edit(m)
		clientOPT := m.IsEdns0() != nil
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := p.Exchange(ctx, m)
		cancel()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		mu.Lock()
		up := got[len(got)-1]
		mu.Unlock()
		if hasSignature(up) || up.IsEdns0() == nil || (clientOPT && !up.IsEdns0().Do()) {
			t.Errorf("%s: upstream got\n%v\nwant no signature, our OPT with the client's DO bit", name, up)
		}
		if r.Id != 999 || hasSignature(r) || (r.IsEdns0() != nil) != clientOPT {
			t.Errorf("%s: answer\n%v\nwant ID 999, no signature, an OPT as the client sent", name, r)
		}
	}
}

// A signature in the upstream's answer is never the caller's (it covers the
// connection-local ID): it is dropped, and the answer packs and parses with the
// caller's ID and OPT.
func TestSignatureInAnswerIsDropped(t *testing.T) {
	sig0 := &dns.SIG{RRSIG: dns.RRSIG{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSIG, Class: dns.ClassANY},
		Algorithm: dns.ECDSAP256SHA256, SignerName: "key.example.", Signature: "AAAA"}}
	s := dottest.Start(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		r := dottest.DefaultAnswer(q)
		switch q.Question[0].Name {
		case "after-opt.example.":
			r.Extra = append(r.Extra, tsigRR(q.Id))
		case "before-opt.example.":
			r.Extra = append([]dns.RR{tsigRR(q.Id)}, r.Extra...)
		case "sig0.example.":
			r.Extra = append(r.Extra, sig0)
		}
		return r
	}})
	p, _ := newTestPool(t, s, nil)
	for _, name := range []string{"after-opt.example.", "before-opt.example.", "sig0.example."} {
		m := newQuery(name, dns.TypeA)
		m.Id = 31337
		m.SetEdns0(1232, true)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := p.Exchange(ctx, m)
		cancel()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		b, err := r.Pack()
		if err != nil {
			t.Fatalf("%s: the answer does not pack: %v", name, err)
		}
		out := new(dns.Msg)
		if err := out.Unpack(b); err != nil {
			t.Fatalf("%s: the answer does not parse: %v", name, err)
		}
		if out.Id != 31337 || hasSignature(out) || out.IsEdns0() == nil || len(out.Extra) != 1 || len(out.Answer) != 1 {
			t.Errorf("%s: answer\n%v\nwant ID 31337, the A record, the OPT, no signature", name, out)
		}
	}
}

// CheckQuery is the check the plugin runs before choosing an upstream: it refuses
// what prepareQuery refuses without packing, zone transfers as ErrZoneTransfer.
func TestCheckQuery(t *testing.T) {
	signed := newQuery("a.example.", dns.TypeA)
	signed.SetTsig("key.example.", dns.HmacSHA256, 300, time.Now().Unix())
	twoOPTs := newQuery("a.example.", dns.TypeA)
	twoOPTs.SetEdns0(1232, false)
	twoOPTs.Extra = append(twoOPTs.Extra, twoOPTs.Extra[0])
	nilRR := newQuery("a.example.", dns.TypeA)
	nilRR.Answer = []dns.RR{(*dns.MX)(nil)}
	tests := []struct {
		name string
		m    *dns.Msg
		want error // nil: accepted
	}{
		{"plain", newQuery("a.example.", dns.TypeA), nil},
		{"signed (the signature is removed later)", signed, nil},
		{"no question", new(dns.Msg), ErrBadQuery},
		{"AXFR", newQuery("example.", dns.TypeAXFR), ErrZoneTransfer},
		{"IXFR", newQuery("example.", dns.TypeIXFR), ErrZoneTransfer},
		{"two OPTs", twoOPTs, ErrBadQuery},
		{"nil *dns.MX", nilRR, ErrBadQuery},
	}
	for _, tc := range tests {
		err := CheckQuery(tc.m)
		switch {
		case tc.want == nil && err != nil:
			t.Errorf("%s: %v, want it accepted", tc.name, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if !errors.Is(ErrZoneTransfer, ErrBadQuery) {
		t.Error("ErrZoneTransfer does not wrap ErrBadQuery")
	}
}
