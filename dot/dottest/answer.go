package dottest

import (
	"encoding/binary"

	"github.com/miekg/dns"
)

// AppendAnswer appends to dst DefaultAnswer's answer to query (a DNS message
// without length prefix) framed with its length prefix, built on the wire as a
// real server does: no dns.Msg, and the A record's owner a pointer to the
// question. It reports false, appending nothing, for a query it does not take on
// the wire (not a plain query with one question and at most an OPT in the
// additional section): the caller answers that one through DefaultAnswer.
//
// The answer unpacks to DefaultAnswer's (TestAppendAnswerIsDefaultAnswer): the
// server's share of a benchmark is what an upstream's is, not miekg/dns's.
func AppendAnswer(dst, query []byte) ([]byte, bool) {
	if len(query) < 12 || query[2]&0xF8 != 0 || // a query, opcode QUERY
		binary.BigEndian.Uint16(query[4:]) != 1 ||
		binary.BigEndian.Uint16(query[6:]) != 0 || binary.BigEndian.Uint16(query[8:]) != 0 {
		return dst, false
	}
	qend, ok := questionEnd(query)
	if !ok {
		return dst, false
	}
	opt, ok := queryOPT(query, qend)
	if !ok {
		return dst, false
	}
	start := len(dst)
	dst = append(dst, 0, 0)                              // the length prefix, set below
	dst = append(dst, query[0], query[1])                // ID
	dst = append(dst, 0x80|query[2]&0x01, query[3]&0x10) // as SetReply: QR; RD and CD kept, the rest clear
	dst = append(dst, 0, 1, 0, 0, 0, 0, 0, 0)            // QDCOUNT 1; the other counts below
	dst = append(dst, query[12:qend]...)                 // the question as asked
	if binary.BigEndian.Uint16(query[qend-4:]) == dns.TypeA {
		dst[start+2+7] = 1 // ANCOUNT
		dst = append(dst, 0xC0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 1)
	}
	if opt != nil { // the query's buffer size and DO bit, no options
		dst[start+2+11] = 1 // ARCOUNT
		dst = append(dst, 0, 0, 41, opt[0], opt[1], 0, 0, opt[4]&0x80, 0, 0, 0)
	}
	binary.BigEndian.PutUint16(dst[start:], uint16(len(dst)-start-2))
	return dst, true
}

// questionEnd returns the offset just past query's one question, whose name must
// be uncompressed.
func questionEnd(query []byte) (int, bool) {
	off := 12
	for off < len(query) {
		n := int(query[off])
		switch {
		case n == 0:
			off++
			if off+4 > len(query) {
				return 0, false
			}
			return off + 4, true
		case n > 63 || off+1+n > 12+255:
			return 0, false // a pointer, an extended label type, a name too long
		}
		off += 1 + n
	}
	return 0, false
}

// queryOPT returns the CLASS and TTL fields (6 bytes) of the query's OPT, nil if it
// has none; false if the query has anything else after its question.
func queryOPT(query []byte, qend int) ([]byte, bool) {
	switch binary.BigEndian.Uint16(query[10:]) {
	case 0:
		return nil, qend == len(query)
	case 1:
	default:
		return nil, false
	}
	rr := query[qend:]
	if len(rr) < 11 || rr[0] != 0 || binary.BigEndian.Uint16(rr[1:]) != dns.TypeOPT ||
		11+int(binary.BigEndian.Uint16(rr[9:])) != len(rr) || binary.BigEndian.Uint16(rr[3:]) < dns.MinMsgSize {
		return nil, false // miekg/dns reads a buffer size under 512 as 512
	}
	for opts := rr[11:]; len(opts) > 0; { // well-formed options, as Unpack wants them
		if len(opts) < 4 || 4+int(binary.BigEndian.Uint16(opts[2:])) > len(opts) {
			return nil, false
		}
		opts = opts[4+int(binary.BigEndian.Uint16(opts[2:])):]
	}
	return rr[3:9], true
}
