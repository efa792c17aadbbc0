package dot

import (
	"encoding/binary"
	"strings"

	"github.com/miekg/dns"
)

// encodeQuery packs the usual client query, one question and at most an OPT
// without options, into buf behind two bytes of room for the length prefix, and
// returns the offset of the OPT's RDLENGTH in the message (-1: no OPT) for
// addOptions. miekg/dns's Pack builds the same octets at a few times the cost: it
// sizes the message first, walks every section and packs records through an
// interface. ok is false for any other shape, which packQuery then packs; the
// octets are Pack's (FuzzEncodeQuery compares them).
//
// Unlike Pack, it leaves the client's OPT as it was: Pack clears its extended
// RCODE bits (SetExtendedRcode), which are only written here as cleared.
func encodeQuery(m *dns.Msg, buf []byte) (wire []byte, optAt int, ok bool) {
	opt, ok := bareOPT(m)
	if !ok || len(m.Answer)+len(m.Ns) != 0 || m.Rcode < 0 || m.Rcode > 0xF {
		return nil, -1, false
	}
	wire = appendHeader(buf[:2], m, opt != nil)
	q := m.Question[0]
	if wire, ok = appendPlainName(wire, q.Name); !ok {
		return nil, -1, false
	}
	wire = binary.BigEndian.AppendUint16(wire, q.Qtype)
	wire = binary.BigEndian.AppendUint16(wire, q.Qclass)
	if opt == nil {
		return wire, -1, true
	}
	// Root name, type OPT, the client's class (its buffer size) and TTL (its
	// flags) with the extended RCODE cleared, as Pack sets it for an RCODE that
	// fits the header; no options.
	wire = append(wire, 0, 0, 41)
	wire = binary.BigEndian.AppendUint16(wire, opt.Hdr.Class)
	wire = binary.BigEndian.AppendUint32(wire, opt.Hdr.Ttl&0x00FFFFFF)
	wire = append(wire, 0, 0)
	return wire, len(wire) - 2 - 2, true
}

// bareOPT returns the query's OPT when its additional section is that alone,
// named for the root and without options, nil when the section is empty; ok is
// false for any other additional section.
func bareOPT(m *dns.Msg) (opt *dns.OPT, ok bool) {
	switch len(m.Extra) {
	case 0:
		return nil, true
	case 1:
		opt, ok = m.Extra[0].(*dns.OPT)
		ok = ok && opt != nil && opt.Hdr.Rrtype == dns.TypeOPT && opt.Hdr.Name == "." && len(opt.Option) == 0
		return opt, ok
	}
	return nil, false
}

// appendHeader appends m's header as Pack writes it, for one question and an
// additional section of one OPT or none.
func appendHeader(wire []byte, m *dns.Msg, withOPT bool) []byte {
	bits := uint16(m.Opcode)<<11 | uint16(m.Rcode&0xF) |
		bit(m.Response, 1<<15) | bit(m.Authoritative, 1<<10) | bit(m.Truncated, 1<<9) |
		bit(m.RecursionDesired, 1<<8) | bit(m.RecursionAvailable, 1<<7) | bit(m.Zero, 1<<6) |
		bit(m.AuthenticatedData, 1<<5) | bit(m.CheckingDisabled, 1<<4)
	wire = binary.BigEndian.AppendUint16(wire, m.Id)
	wire = binary.BigEndian.AppendUint16(wire, bits)
	wire = append(wire, 0, 1, 0, 0, 0, 0) // one question, no answer or authority
	return binary.BigEndian.AppendUint16(wire, bit(withOPT, 1))
}

// bit is b if set, else 0.
func bit(set bool, b uint16) uint16 {
	if set {
		return b
	}
	return 0
}

// appendPlainName appends name in wire format if it is fully qualified, without
// escapes (which Pack decodes), and every label is 1 to 63 octets: ok is false
// for any other name, Pack's to pack or refuse. Like Pack, it sets no limit on
// the name's length.
func appendPlainName(wire []byte, name string) (_ []byte, ok bool) {
	if name == "." {
		return append(wire, 0), true
	}
	if !strings.HasSuffix(name, ".") || strings.IndexByte(name, '\\') >= 0 {
		return nil, false
	}
	for name != "" {
		dot := strings.IndexByte(name, '.')
		if dot < 1 || dot > 63 { // an empty label, or one too long
			return nil, false
		}
		wire = append(wire, byte(dot))
		wire = append(wire, name[:dot]...)
		name = name[dot+1:]
	}
	return append(wire, 0), true
}
