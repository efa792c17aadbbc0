package dot

import (
	"bytes"
	"testing"

	"github.com/miekg/dns"
)

// packedForUpstream is what prepareQuery made of a query before encodeQuery: Pack,
// then rewriteOPT (or repack). m is packed as a copy: Pack edits the client's OPT.
func packedForUpstream(m *dns.Msg, block int, keepalive bool) (wire []byte, clientOPT bool, err error) {
	m = m.Copy()
	if err := CheckQuery(m); err != nil {
		return nil, false, err
	}
	defer func() {
		if r := recover(); r != nil {
			wire, clientOPT, err = nil, false, panicked(r)
		}
	}()
	if wire, err = packQuery(m, make([]byte, 2+128)); err != nil {
		return nil, false, err
	}
	wire, clientOPT, err = rewriteOPT(wire, block, keepalive)
	if err == errRepack {
		wire, clientOPT, err = repack(m, block, keepalive)
	}
	return wire, clientOPT, err
}

// samePrepared fails t unless prepareQuery's frame of m is, octet for octet,
// packedForUpstream's (the length prefix aside, which prepareQuery adds), or
// both refuse m.
func samePrepared(t *testing.T, m *dns.Msg, block int, keepalive bool) {
	t.Helper()
	want, wantOPT, wantErr := packedForUpstream(m, block, keepalive)
	q, err := prepareQuery(m, block, keepalive)
	switch {
	case (err != nil) != (wantErr != nil):
		t.Fatalf("%v: prepareQuery's error %v, Pack's %v", m.Question, err, wantErr)
	case err != nil:
		return
	case len(want)-2 > dns.MaxMsgSize:
		t.Fatalf("%v: prepared although Pack's frame is %d octets", m.Question, len(want)-2)
	case !bytes.Equal(q.wire[2:], want[2:]) || q.clientOPT != wantOPT:
		t.Fatalf("%v (block %d, keepalive %v): prepared\n%x (client OPT %v), Pack and rewriteOPT\n%x (%v)",
			m.Question, block, keepalive, q.wire[2:], q.clientOPT, want[2:], wantOPT)
	}
}

// The usual queries take encodeQuery's way, and come out as Pack's would have.
func TestEncodeQueryUsualQueries(t *testing.T) {
	edns := func(m *dns.Msg) *dns.Msg { m.SetEdns0(1232, true); return m }
	queries := []*dns.Msg{
		newQuery("www.example.org.", dns.TypeA),
		newQuery(".", dns.TypeNS),
		newQuery("MiXed.Case.Example.", dns.TypeAAAA),
		edns(newQuery("www.example.org.", dns.TypeA)),
		edns(newQuery("a.very.long.name.with.many.labels.under.example.org.", dns.TypeTXT)),
	}
	flags := edns(newQuery("flags.example.", dns.TypeMX))
	flags.Id, flags.Opcode, flags.Rcode = 0xBEEF, dns.OpcodeNotify, dns.RcodeRefused
	flags.Response, flags.Authoritative, flags.Truncated, flags.RecursionAvailable = true, true, true, true
	flags.Zero, flags.AuthenticatedData, flags.CheckingDisabled = true, true, true
	flags.IsEdns0().Hdr.Ttl |= 0x7F000000 // extended RCODE bits, which Pack clears
	queries = append(queries, flags)
	for _, m := range queries {
		if _, _, ok := encodeQuery(m, make([]byte, 2+128)); !ok {
			t.Errorf("%v: not encoded directly", m.Question)
		}
		for _, block := range []int{0, 128, 468} {
			samePrepared(t, m, block, true)
			samePrepared(t, m, block, false)
		}
	}
}

// FuzzEncodeQuery builds queries around the shapes encodeQuery takes and the
// ones it leaves to Pack (escapes, empty labels, unqualified names, extended
// RCODEs, an OPT with options or another name, more records), and checks the
// prepared frame against Pack's.
func FuzzEncodeQuery(f *testing.F) {
	f.Add("www.example.org.", uint16(1), uint16(0x0100), uint8(0), int16(0), uint8(1), uint32(0x8000), uint8(1), true)
	f.Add(".", uint16(0), uint16(0xFFFF), uint8(15), int16(15), uint8(1), uint32(0xFF00FFFF), uint8(2), false)
	f.Add(`a\.b.c\065.`, uint16(7), uint16(0), uint8(3), int16(0), uint8(0), uint32(0), uint8(0), true)
	f.Add("a..b.", uint16(7), uint16(0), uint8(0), int16(0), uint8(0), uint32(0), uint8(1), true)
	f.Add("unqualified", uint16(7), uint16(0), uint8(0), int16(16), uint8(1), uint32(0), uint8(1), true)
	f.Add(".leading.", uint16(7), uint16(0), uint8(0), int16(0x123), uint8(2), uint32(0), uint8(1), true)
	f.Add("x.", uint16(7), uint16(0), uint8(0), int16(-1), uint8(3), uint32(0), uint8(1), true)
	f.Add("", uint16(7), uint16(0), uint8(0), int16(0), uint8(4), uint32(0), uint8(1), true)
	blocks := []int{0, 128, 468, 7}
	f.Fuzz(func(t *testing.T, name string, id, flags uint16, opcode uint8, rcode int16, extra uint8, ttl uint32, block uint8, keepalive bool) {
		m := new(dns.Msg)
		m.SetQuestion(name, uint16(ttl>>16))
		m.Question[0].Qclass = uint16(ttl)
		m.Id, m.Opcode, m.Rcode = id, int(opcode), int(rcode)
		m.Response, m.Authoritative, m.Truncated = flags&1 != 0, flags&2 != 0, flags&4 != 0
		m.RecursionDesired, m.RecursionAvailable, m.Zero = flags&8 != 0, flags&16 != 0, flags&32 != 0
		m.AuthenticatedData, m.CheckingDisabled = flags&64 != 0, flags&128 != 0
		addExtra(m, extra, ttl)
		samePrepared(t, m, blocks[int(block)%len(blocks)], keepalive)
	})
}

// addExtra gives m an additional section (and maybe an answer) of a kind chosen
// by kind: none, a bare OPT, an OPT with options, an OPT not named for the
// root, an OPT and an A record.
func addExtra(m *dns.Msg, kind uint8, ttl uint32) {
	opt := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT, Class: uint16(ttl >> 3), Ttl: ttl}}
	a := &dns.A{Hdr: dns.RR_Header{Name: "glue.example.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: []byte{192, 0, 2, 1}}
	switch kind % 6 {
	case 1:
		m.Extra = []dns.RR{opt}
	case 2:
		opt.Option = []dns.EDNS0{&dns.EDNS0_PADDING{Padding: make([]byte, ttl%9)},
			&dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708"}}
		m.Extra = []dns.RR{opt}
	case 3:
		opt.Hdr.Name = "example."
		m.Extra = []dns.RR{opt}
	case 4:
		m.Extra = []dns.RR{a, opt}
	case 5:
		m.Answer = []dns.RR{a}
	}
}
