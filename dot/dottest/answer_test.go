package dottest

import (
	"encoding/binary"
	"reflect"
	"testing"

	"github.com/miekg/dns"
)

// The answer built on the wire is DefaultAnswer's, field for field, once both are
// unpacked: what a test sees does not depend on which of the two built it.
func TestAppendAnswerIsDefaultAnswer(t *testing.T) {
	queries := map[string]*dns.Msg{}
	add := func(name string, edit func(m *dns.Msg)) {
		m := new(dns.Msg)
		m.SetQuestion("Www.Example.ORG.", dns.TypeA)
		m.Id = 0xBEEF
		edit(m)
		queries[name] = m
	}
	add("A", func(m *dns.Msg) {})
	add("AAAA", func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA })
	add("A class CH", func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS })
	add("no RD, CD", func(m *dns.Msg) { m.RecursionDesired, m.CheckingDisabled = false, true })
	add("AD and Z asked", func(m *dns.Msg) { m.AuthenticatedData, m.Zero = true, true })
	add("EDNS", func(m *dns.Msg) { m.SetEdns0(1232, false) })
	add("EDNS DO", func(m *dns.Msg) { m.SetEdns0(4096, true) })
	add("EDNS options", func(m *dns.Msg) {
		m.SetEdns0(1232, true)
		o := m.IsEdns0()
		o.Option = append(o.Option, &dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE},
			&dns.EDNS0_PADDING{Padding: make([]byte, 37)})
	})
	add("escaped name", func(m *dns.Msg) { m.Question[0].Name = `a\.b\000.example.` })
	add("root", func(m *dns.Msg) { m.Question[0].Name = "." })
	for name, q := range queries {
		wire, err := q.Pack()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, ok := AppendAnswer([]byte{0xAA}, wire)
		if !ok {
			t.Errorf("%s: not answered on the wire", name)
			continue
		}
		if got[0] != 0xAA || int(binary.BigEndian.Uint16(got[1:])) != len(got)-3 {
			t.Errorf("%s: % x: not appended behind dst with its length prefix", name, got)
			continue
		}
		var fast dns.Msg
		if err := fast.Unpack(got[3:]); err != nil {
			t.Errorf("%s: the wire answer does not unpack: %v", name, err)
			continue
		}
		var unpacked dns.Msg
		if err := unpacked.Unpack(wire); err != nil {
			t.Fatal(err)
		}
		want := DefaultAnswer(&unpacked)
		if w, _ := want.Pack(); want.Unpack(w) != nil {
			t.Fatal("DefaultAnswer does not round-trip")
		}
		if !reflect.DeepEqual(&fast, want) {
			t.Errorf("%s: wire answer\n%v\nDefaultAnswer\n%v", name, &fast, want)
		}
	}
}

// What the wire cannot answer as DefaultAnswer would goes to DefaultAnswer.
func TestAppendAnswerRefuses(t *testing.T) {
	base := func() *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion("example.org.", dns.TypeA)
		return m
	}
	pack := func(m *dns.Msg) []byte {
		w, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	cases := map[string][]byte{}
	m := base()
	m.Opcode = dns.OpcodeNotify
	cases["NOTIFY"] = pack(m)
	m = base()
	m.Response = true
	cases["a response"] = pack(m)
	m = base()
	m.Question = append(m.Question, m.Question[0])
	cases["two questions"] = pack(m)
	m = base()
	m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "example.org.", Rrtype: dns.TypeA, Class: dns.ClassINET}}}
	cases["an answer record"] = pack(m)
	m = base()
	m.SetEdns0(100, false)
	cases["buffer under 512"] = pack(m)
	w := pack(base())
	cases["cut question"] = w[:len(w)-2]
	cases["trailing bytes"] = append(append([]byte{}, w...), 0)
	cases["compressed name"] = append(append([]byte{}, w[:12]...), 0xC0, 12, 0, 1, 0, 1)
	m = base()
	m.SetEdns0(1232, false)
	w = pack(m)
	binary.BigEndian.PutUint16(w[len(w)-2:], 4) // RDLENGTH 4, options missing
	cases["OPT cut"] = append(w, 0, 12, 0, 9)   // an option claiming 9 bytes it lacks
	for name, q := range cases {
		if got, ok := AppendAnswer(nil, q); ok || len(got) != 0 {
			t.Errorf("%s: answered on the wire: % x", name, got)
		}
	}
}
