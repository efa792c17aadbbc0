package dot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// FuzzReadFrames feeds arbitrary bytes to a connection's response reader with three
// queries outstanding: no panic, every call completes exactly once, and a call that
// gets an answer gets one to its own question.
func FuzzReadFrames(f *testing.F) {
	qs := []*query{mustPrepare(f, "a.example."), mustPrepare(f, "B.example."), mustPrepare(f, "c.example.")}
	f.Add(append(frame(answerFor(f, qs[0], 0)), frame(answerFor(f, qs[1], 1))...))
	f.Add(frame(answerFor(f, qs[2], 2)))
	f.Add(frame(answerFor(f, qs[2], 0)))
	f.Add([]byte{0, 12, 0, 0, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 1, 2, 3})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newBareConn(t, 8)
		calls := make([]*call, len(qs))
		for i, q := range qs {
			calls[i] = newTestCall(q)
			if !c.register(calls[i]) {
				t.Fatal("register failed")
			}
			<-c.writeq
			calls[i].state.Store(callSent)
		}
		c.readFrames(bytes.NewReader(data))
		c.closeFor(errServerClosed, CloseServer)
		for i, cl := range calls {
			if n := cl.completions.Load(); n != 1 {
				t.Fatalf("Call %d completed %d times", i, n)
			}
			r := <-cl.resp
			if r.msg == nil {
				continue // an error: no answer delivered
			}
			if !hasAnswer(data, cl.id, cl.q.question) {
				t.Fatalf("Call %d got an answer, but the input holds none with its ID and question", i)
			}
			if !strings.EqualFold(r.msg.Question[0].Name, cl.q.name) {
				t.Fatalf("Call %d: answer question %q, want %q", i, r.msg.Question[0].Name, cl.q.name)
			}
		}
	})
}

// hasAnswer reports whether the length-prefixed frames in data hold one with ID id
// that answers question.
func hasAnswer(data []byte, id uint16, question []byte) bool {
	for len(data) >= 2 {
		n := int(binary.BigEndian.Uint16(data))
		if 2+n > len(data) {
			return false
		}
		f := data[2 : 2+n]
		if n >= 12 && binary.BigEndian.Uint16(f) == id && answers(f, question) {
			return true
		}
		data = data[2+n:]
	}
	return false
}

// FuzzFinishAnswer checks the hand-rolled answer unpacking against the plain one
// it replaced (dns.Msg.Unpack, then the hop-by-hop options and, for a client
// without EDNS, the OPT removed): for any answer to the question, with and without
// a client OPT, both give the same message and keepalive. The hand-rolled one may
// only be more lenient, with a malformed hop-by-hop option that it drops unread.
func FuzzFinishAnswer(f *testing.F) {
	plain := mustPrepare(f, "WwW.Example.")
	m := newQuery("WwW.Example.", dns.TypeA)
	m.SetEdns0(1232, true)
	withOPT, err := prepareQuery(m, 128, true)
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range seedAnswers(f, m) {
		f.Add(r)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, q := range []*query{plain, withOPT} {
			if !answers(data, q.question) {
				return
			}
			want, wantKA, wantErr := finishAnswerPlain(q, bytes.Clone(data))
			got, gotKA, gotErr := finishAnswer(q, bytes.Clone(data))
			switch {
			case gotErr != nil && !errors.Is(gotErr, ErrMalformed):
				t.Fatalf("Error %v is not ErrMalformed", gotErr)
			case gotErr != nil && wantErr == nil:
				t.Fatalf("finishAnswer failed (%v) where dns.Msg.Unpack did not", gotErr)
			case gotErr != nil || wantErr != nil:
				return
			}
			if got.String() != want.String() || gotKA != wantKA || got.Rcode != want.Rcode {
				t.Fatalf("finishAnswer (clientOPT %v) gave keepalive %d and\n%v\nwant keepalive %d and\n%v", q.clientOPT, gotKA, got, wantKA, want)
			}
		}
	})
}

// seedAnswers returns answers to m of the shapes upstreams send: records in every
// section, the question in another case, a CNAME chain, padding and keepalive, an
// extended rcode, compression pointers everywhere.
func seedAnswers(t testing.TB, m *dns.Msg) [][]byte {
	var out [][]byte
	add := func(edit func(r *dns.Msg)) {
		r := new(dns.Msg)
		r.SetReply(m)
		r.Compress = true
		edit(r)
		b, err := r.Pack()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	rr := func(s string) dns.RR {
		r, err := dns.NewRR(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	add(func(r *dns.Msg) {
		r.Answer = []dns.RR{rr("WwW.Example. 300 IN A 192.0.2.1"), rr("WwW.Example. 300 IN A 192.0.2.2")}
		r.SetEdns0(1232, true)
		o := r.IsEdns0()
		o.Option = append(o.Option, &dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE, Timeout: 100},
			&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeStaleAnswer, ExtraText: "stale"},
			&dns.EDNS0_PADDING{Padding: make([]byte, 300)})
	})
	add(func(r *dns.Msg) {
		r.Question[0].Name = "www.example."
		r.Answer = []dns.RR{rr("www.example. 60 IN CNAME a.example.net."), rr("a.example.net. 60 IN A 192.0.2.3")}
		r.Ns = []dns.RR{rr("example.net. 60 IN NS ns.example.net.")}
		r.Extra = []dns.RR{rr("ns.example.net. 60 IN AAAA 2001:db8::1")}
	})
	add(func(r *dns.Msg) {
		r.Rcode = dns.RcodeBadCookie // extended: only with an OPT
		r.SetEdns0(1232, false)
		r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
	})
	add(func(r *dns.Msg) {
		r.Rcode = dns.RcodeNameError
		r.Ns = []dns.RR{rr("example. 300 IN SOA ns.example. host.example. 1 2 3 4 5")}
		r.SetEdns0(512, true)
		r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_LOCAL{Code: dns.EDNS0TCPKEEPALIVE, Data: []byte{0, 0}})
	})
	add(func(r *dns.Msg) {
		r.Answer = []dns.RR{rr(`WwW.Example. 60 IN TXT "v=spf1 -all" "x"`), rr("WwW.Example. 60 IN MX 10 mail.WwW.Example.")}
		r.Extra = []dns.RR{rr("mail.WwW.Example. 60 IN A 192.0.2.9")}
		r.SetEdns0(1232, true)
	})
	add(func(r *dns.Msg) { // signed: the TSIG before the OPT, a SIG(0) after it
		r.Answer = []dns.RR{rr("WwW.Example. 60 IN A 192.0.2.1")}
		r.Extra = []dns.RR{tsigRR(r.Id)}
		r.SetEdns0(1232, false)
		r.Extra = append(r.Extra, &dns.SIG{RRSIG: dns.RRSIG{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSIG, Class: dns.ClassANY},
			Algorithm: dns.ECDSAP256SHA256, SignerName: "key.example.", Signature: "AAAA"}})
	})
	add(func(r *dns.Msg) { // an error with the header alone, and an extended error
		r.Question = nil
		r.Rcode = dns.RcodeRefused
		r.SetEdns0(1232, false)
		r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeProhibited})
	})
	return out
}

// finishAnswerPlain is what finishAnswer did before it unpacked by hand: the oracle
// of FuzzFinishAnswer.
func finishAnswerPlain(q *query, frame []byte) (*dns.Msg, int, error) {
	r := new(dns.Msg)
	if err := r.Unpack(frame); err != nil {
		return nil, -1, err
	}
	r.Id = q.origID
	n := len(q.question)
	r.Question = []dns.Question{{Name: q.name, Qtype: binary.BigEndian.Uint16(q.question[n-4:]), Qclass: binary.BigEndian.Uint16(q.question[n-2:])}}
	r.Answer, r.Ns, r.Extra = withoutSignatures(r.Answer), withoutSignatures(r.Ns), withoutSignatures(r.Extra)
	keepalive := -1 // the last 2-byte keepalive option in an additional OPT
	kept := r.Extra[:0]
	for _, rr := range r.Extra {
		opt, ok := rr.(*dns.OPT)
		if !ok {
			kept = append(kept, rr)
			continue
		}
		var options []dns.EDNS0
		for _, o := range opt.Option {
			if c := o.Option(); c != dns.EDNS0TCPKEEPALIVE && c != dns.EDNS0PADDING {
				options = append(options, o)
			}
		}
		opt.Option = options
		if q.clientOPT {
			kept = append(kept, rr)
		} else {
			r.Rcode &= 0xF
		}
	}
	r.Extra = kept
	if len(kept) == 0 {
		r.Extra = nil
	}
	if ka := additionalKeepalives(frame); len(ka) > 0 {
		keepalive = int(binary.BigEndian.Uint16(ka[len(ka)-1]))
	}
	return r, keepalive, nil
}

// withoutSignatures returns rrs without TSIG and SIG(0) records, nil if none is left.
func withoutSignatures(rrs []dns.RR) []dns.RR {
	var out []dns.RR
	for _, rr := range rrs {
		switch rr := rr.(type) {
		case *dns.TSIG:
		case *dns.SIG:
			if rr.TypeCovered != 0 {
				out = append(out, rr)
			}
		default:
			out = append(out, rr)
		}
	}
	return out
}

// additionalKeepalives returns the timeouts of the 2-byte keepalive options in the
// OPT records of frame's additional section (miekg/dns unpacks an empty option and
// a zero timeout alike, so this reads the wire).
func additionalKeepalives(frame []byte) [][]byte {
	var out [][]byte
	additional := int(binary.BigEndian.Uint16(frame[6:])) + int(binary.BigEndian.Uint16(frame[8:]))
	i := -1
	walkRRs(frame, func(rrtype uint16, _ int, rdata []byte) {
		i++
		for i >= additional && rrtype == dns.TypeOPT && len(rdata) >= 4 {
			code, n := binary.BigEndian.Uint16(rdata), int(binary.BigEndian.Uint16(rdata[2:]))
			if 4+n > len(rdata) {
				return
			}
			if code == dns.EDNS0TCPKEEPALIVE && n == 2 {
				out = append(out, rdata[4:6])
			}
			rdata = rdata[4+n:]
		}
	})
	return out
}

// FuzzPrepareQuery feeds prepareQuery any client query miekg/dns can parse (CoreDNS
// hands a plugin nothing else): it either refuses it with ErrBadQuery or prepares a
// frame whose length prefix is right, whose message parses and asks the client's
// question, and that carries at most our one OPT, last, and no signature.
func FuzzPrepareQuery(f *testing.F) {
	for _, m := range seedQueries(f) {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint8(1), true)
	}
	blocks := []int{0, 128, 468}
	f.Fuzz(func(t *testing.T, data []byte, block uint8, keepalive bool) {
		m := new(dns.Msg)
		if m.Unpack(data) != nil {
			return
		}
		q, err := prepareQuery(m, blocks[int(block)%len(blocks)], keepalive)
		if err != nil {
			if !errors.Is(err, ErrBadQuery) {
				t.Fatalf("Error %v is not ErrBadQuery", err)
			}
			return
		}
		n := len(q.wire) - 2
		if n > dns.MaxMsgSize || int(binary.BigEndian.Uint16(q.wire)) != n || !q.framed() {
			t.Fatalf("Length prefix %d for a %d-octet message", binary.BigEndian.Uint16(q.wire), n)
		}
		out := new(dns.Msg)
		if err := out.Unpack(q.wire[2:]); err != nil {
			t.Fatalf("Prepared query does not parse: %v", err)
		}
		if len(out.Question) != 1 || out.Question[0] != m.Question[0] {
			t.Fatalf("Prepared query asks %v, the client %v", out.Question, m.Question)
		}
		checkUpstreamRecords(t, out)
	})
}

// checkUpstreamRecords checks the records of a query as prepared for the upstream:
// an OPT only as the last additional record, no transaction signature.
func checkUpstreamRecords(t *testing.T, out *dns.Msg) {
	t.Helper()
	sections := [][]dns.RR{out.Answer, out.Ns, out.Extra}
	for i, s := range sections {
		for j, rr := range s {
			if _, ok := rr.(*dns.OPT); ok && (i != 2 || j != len(s)-1) {
				t.Fatalf("OPT in section %d at %d of %d", i, j, len(s))
			}
			if sig, ok := rr.(*dns.SIG); ok && sig.TypeCovered == 0 {
				t.Fatalf("SIG(0) forwarded: %v", rr)
			}
			if _, ok := rr.(*dns.TSIG); ok {
				t.Fatalf("TSIG forwarded: %v", rr)
			}
		}
	}
}

// seedQueries returns client queries of the shapes that need care: a big OPT
// option near the size limit, two OPTs, an OPT in the answer or authority section
// or not last, signed queries (TSIG before and after the OPT, SIG(0)).
func seedQueries(t testing.TB) []*dns.Msg {
	plain := func() *dns.Msg { return newQuery("Fuzz.Example.", dns.TypeTXT) }
	withOPT := func() *dns.Msg {
		m := plain()
		m.SetEdns0(1232, true)
		m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: []byte{0, 0}},
			&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"})
		return m
	}
	opt := func() *dns.OPT {
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(4096)
		return o
	}
	glue := &dns.A{Hdr: dns.RR_Header{Name: "glue.example.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: []byte{192, 0, 2, 1}}
	sig0 := &dns.SIG{RRSIG: dns.RRSIG{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeSIG, Class: dns.ClassANY},
		Algorithm: dns.ECDSAP256SHA256, SignerName: "key.example.", Signature: "AAAA"}}
	var out []*dns.Msg
	add := func(m *dns.Msg) { out = append(out, m) }
	add(plain())
	add(withOPT())
	add(bigQuery(t, 65532, true))
	add(bigQuery(t, 65535, true))
	add(bigQuery(t, 65530, false))
	m := withOPT()
	m.Extra = append(m.Extra, opt())
	add(m)
	m = plain()
	m.Answer = []dns.RR{opt()}
	m.Extra = []dns.RR{glue}
	add(m)
	m = plain()
	m.Ns = []dns.RR{opt()}
	add(m)
	m = withOPT()
	m.Extra = append(m.Extra, glue)
	add(m)
	m = withOPT()
	m.Extra = append(m.Extra, tsigRR(m.Id))
	add(m)
	m = plain()
	m.Extra = []dns.RR{tsigRR(m.Id), opt()}
	add(m)
	m = withOPT()
	m.Extra = append(m.Extra, sig0)
	add(m)
	m = plain()
	m.Answer = []dns.RR{tsigRR(m.Id)}
	add(m)
	return out
}
