package dot

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"reflect"
	"testing"

	"github.com/miekg/dns"
)

func TestAnswersMatchesQuestionOnTheWire(t *testing.T) {
	q, err := prepareQuery(newQuery("MiXed.Example.", dns.TypeAAAA), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	reply := func(name string, qtype uint16, qr bool) []byte {
		r := newQuery(name, qtype)
		r.Response = qr
		b, err := r.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		resp []byte
		want bool
	}{
		{"same", reply("MiXed.Example.", dns.TypeAAAA, true), true},
		{"other case", reply("mixed.EXAMPLE.", dns.TypeAAAA, true), true},
		{"other name", reply("mixes.example.", dns.TypeAAAA, true), false},
		{"other type", reply("mixed.example.", dns.TypeA, true), false},
		{"not a response", reply("mixed.example.", dns.TypeAAAA, false), false},
		{"truncated", reply("mixed.example.", dns.TypeAAAA, true)[:15], false},
		{"longer name", reply("mixed.example.org.", dns.TypeAAAA, true), false},
	}
	for _, tc := range tests {
		if got := answers(tc.resp, q.question); got != tc.want {
			t.Errorf("%s: answers = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The answer goes back without hop-by-hop options, and without an OPT at all if
// the client sent none.
func TestFinishAnswerStripsHopByHop(t *testing.T) {
	for _, clientEDNS := range []bool{true, false} {
		m := newQuery("a.example.", dns.TypeA)
		if clientEDNS {
			m.SetEdns0(1232, false)
		}
		q, err := prepareQuery(m, 128, true)
		if err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		r.SetReply(m)
		r.SetEdns0(1232, false)
		r.IsEdns0().Option = append(r.IsEdns0().Option,
			&dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE, Timeout: 50},
			&dns.EDNS0_PADDING{Padding: make([]byte, 20)},
			&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeOther},
		)
		wire, _ := r.Pack()
		got, keepalive, err := finishAnswer(q, wire)
		if err != nil {
			t.Fatal(err)
		}
		if keepalive != 50 {
			t.Errorf("Keepalive = %d, want 50", keepalive)
		}
		opt := got.IsEdns0()
		switch {
		case !clientEDNS && opt != nil:
			t.Errorf("Client without EDNS got an OPT: %v", opt)
		case clientEDNS && (opt == nil || len(opt.Option) != 1):
			t.Errorf("Client with EDNS got OPT %v, want only the EDE option", opt)
		}
	}
}

// Address records and an OPT left without options are built in the answer's own
// allocation while it has room, and from there on by miekg/dns: either way each
// record is the one dns.Msg.Unpack gives, with an address of its own.
func TestFinishAnswerRecordsInRoom(t *testing.T) {
	m := newQuery("WwW.Example.", dns.TypeA)
	m.SetEdns0(1232, true)
	q, err := prepareQuery(m, 128, true)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	r.SetReply(m)
	r.Compress = true
	for i := range 3 { // one more of each than the answer has room for
		r.Answer = append(r.Answer,
			&dns.A{Hdr: dns.RR_Header{Name: "WwW.Example.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, byte(i+1))},
			&dns.AAAA{Hdr: dns.RR_Header{Name: "a.example.", Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 30}, AAAA: net.ParseIP(fmt.Sprintf("2001:db8::%d", i+1))})
	}
	r.SetEdns0(1232, true) // the keepalive and padding go: an OPT without options is left
	o := r.IsEdns0()
	o.Option = append(o.Option, &dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE, Timeout: 100}, &dns.EDNS0_PADDING{Padding: make([]byte, 40)})
	wire, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := finishAnswerPlain(q, bytes.Clone(wire))
	if err != nil {
		t.Fatal(err)
	}
	got, ka, err := finishAnswer(q, bytes.Clone(wire))
	if err != nil || ka != 100 {
		t.Fatalf("finishAnswer: keepalive %d, %v", ka, err)
	}
	if len(got.Answer) != 6 || len(got.Extra) != 1 {
		t.Fatalf("got %d answers and %d additional records, want 6 and 1:\n%v", len(got.Answer), len(got.Extra), got)
	}
	for i := range want.Answer {
		if !reflect.DeepEqual(got.Answer[i], want.Answer[i]) {
			t.Errorf("answer %d: %#v, want %#v", i, got.Answer[i], want.Answer[i])
		}
	}
	if g, w := got.Extra[0].(*dns.OPT), want.Extra[0].(*dns.OPT); g.Hdr.Rdlength != 0 || g.Option != nil || g.String() != w.String() {
		t.Errorf("OPT %#v, want %v without options", g, w)
	}
	got.Answer[0].(*dns.A).A[3] = 99 // the addresses are the records' own
	if a := got.Answer[2].(*dns.A).A; !a.Equal(net.IPv4(192, 0, 2, 2)) {
		t.Errorf("the second A's address changed with the first's: %v", a)
	}
}

// TestHeaderAsUnpack: the answer's header is read as miekg/dns reads it, for
// every combination of the flag bits and rcode.
func TestHeaderAsUnpack(t *testing.T) {
	msg := make([]byte, 12)
	binary.BigEndian.PutUint16(msg, 0xbeef)
	for bits := range 1 << 16 {
		binary.BigEndian.PutUint16(msg[2:], uint16(bits))
		var want, got dns.Msg
		if err := want.Unpack(msg); err != nil {
			t.Fatalf("bits %#04x: miekg/dns: %v", bits, err)
		}
		header(&got, msg)
		if got.MsgHdr != want.MsgHdr {
			t.Fatalf("bits %#04x: got %+v, want %+v", bits, got.MsgHdr, want.MsgHdr)
		}
	}
}
