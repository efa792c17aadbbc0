package dot

import (
	"encoding/binary"
	"net"

	"github.com/miekg/dns"
)

// answers reports whether resp (a DNS message without length prefix) is a response
// carrying exactly the question q asked: QR set, one question, the same name
// compared case-insensitively, the same type and class; or an error without a
// question (see errorWithoutQuestion). It works on the wire, so the reader can drop
// mismatches without unpacking (RFC 7766 §7).
func answers(resp, question []byte) bool {
	if len(resp) < 12+len(question) || resp[2]&0x80 == 0 || binary.BigEndian.Uint16(resp[4:]) != 1 {
		return errorWithoutQuestion(resp)
	}
	got := resp[12 : 12+len(question)]
	for i, b := range question {
		if c := got[i]; c != b && lower(c) != lower(b) {
			return false
		}
	}
	// Case folding must not make a label length equal a letter: lengths are < 64 and
	// letters are >= 65, so the names' label structure is compared exactly. Type and
	// class are the last 4 bytes and are not letters either in a valid question, but
	// compare them exactly anyway.
	n := len(question)
	return got[n-4] == question[n-4] && got[n-3] == question[n-3] && got[n-2] == question[n-2] && got[n-1] == question[n-1]
}

// errorWithoutQuestion reports whether resp is an error answer without a question
// section. RFC 7766 §7 matches the question only if the response has one, and
// servers do answer a query they refuse or cannot parse with the header alone. Such
// an answer is taken, on its ID, only if it can carry nothing but the error: QR set,
// a non-zero rcode in the header, no answer or authority records, and in the
// additional section at most an OPT (with an extended error, say). A NOERROR
// without a question could be the answer to any query, and is dropped.
//
//go:noinline
func errorWithoutQuestion(resp []byte) bool {
	if len(resp) < 12 || resp[2]&0x80 == 0 || resp[3]&0x0F == 0 {
		return false
	}
	if resp[4]|resp[5]|resp[6]|resp[7]|resp[8]|resp[9] != 0 { // QDCOUNT, ANCOUNT, NSCOUNT
		return false
	}
	switch binary.BigEndian.Uint16(resp[10:]) {
	case 0:
		return true
	case 1: // the root name, then type OPT
		return len(resp) >= 12+11 && resp[12] == 0 && binary.BigEndian.Uint16(resp[13:]) == dns.TypeOPT
	}
	return false
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// finishAnswer unpacks an upstream answer for the caller: the caller's ID and
// question (also for an error answer that came without one), hop-by-hop options
// and transaction signatures removed, and no OPT at all if the client sent none. It also returns the server's RFC 7828 keepalive timeout in units of 100ms,
// or -1 if the answer carried none.
//
// frame must have passed answers(frame, q.question), and it is edited in place.
// The sections are unpacked here rather than by dns.Msg.Unpack, with miekg/dns
// doing each record's rdata: the question is the caller's (already matched on the
// wire), one allocation holds the message, its question and up to four records,
// an owner name that points at the question reuses the caller's name, and
// hop-by-hop options are cut on the wire, so that the upstream's padding is never
// copied. About half the allocations of a full unpack, on every query.
func finishAnswer(q *query, frame []byte) (*dns.Msg, int, error) {
	return finishAnswerFor(q, q, frame)
}

// finishAnswerFor is finishAnswer for q of the answer to asked: q itself, or the
// leader of the flight q joined, whose upstream question is q's but for the name's
// case (see coalesce.go). Owner names the upstream spelled as asked's question get
// q's spelling, as it would have spelled them had q been asked.
func finishAnswerFor(q, asked *query, frame []byte) (*dns.Msg, int, error) {
	a := new(answerMsg)
	r := &a.msg
	header(r, frame) // the sections are built below
	n := len(q.question)
	a.question[0] = dns.Question{
		Name:   q.name,
		Qtype:  binary.BigEndian.Uint16(q.question[n-4:]),
		Qclass: binary.BigEndian.Uint16(q.question[n-2:]),
	}
	r.Question = a.question[:]
	r.Id = q.origID
	u := unpacker{
		room:      a,
		msg:       frame,
		off:       12,
		name:      q.name,
		clientOPT: q.clientOPT,
		keepalive: -1,
	}
	if binary.BigEndian.Uint16(frame[4:]) != 0 { // else an error without a question
		u.off += n
		u.sameName = string(frame[12:12+n]) == string(asked.question)
	}
	if asked.name != q.name {
		u.echo = asked.name
	}
	if err := u.sections(r, a.rrs[:0]); err != nil {
		return nil, -1, wrap(ErrMalformed, err)
	}
	return r, u.keepalive, nil
}

// header sets r's header from the first 12 octets of msg as miekg/dns's Unpack
// does, without its walk of a message cut after the header (a tenth of
// finishAnswer's time).
func header(r *dns.Msg, msg []byte) {
	bits := binary.BigEndian.Uint16(msg[2:])
	r.Id = binary.BigEndian.Uint16(msg)
	r.Response = bits&(1<<15) != 0
	r.Opcode = int(bits>>11) & 0xF
	r.Authoritative = bits&(1<<10) != 0
	r.Truncated = bits&(1<<9) != 0
	r.RecursionDesired = bits&(1<<8) != 0
	r.RecursionAvailable = bits&(1<<7) != 0
	r.Zero = bits&(1<<6) != 0
	r.AuthenticatedData = bits&(1<<5) != 0
	r.CheckingDisabled = bits&(1<<4) != 0
	r.Rcode = int(bits & 0xF)
}

// answerMsg holds an answer, its one question and, when they are few, its records
// in one allocation: the sections' slices, and the first address records
// themselves with their addresses (see unpacker.address).
type answerMsg struct {
	msg      dns.Msg
	question [1]dns.Question
	rrs      [4]dns.RR

	a         [2]dns.A
	ip4       [2][net.IPv4len]byte
	aaaa      [2]dns.AAAA
	ip6       [2][net.IPv6len]byte
	nA, nAAAA int // the records of a and aaaa in use
	opt       dns.OPT
	optUsed   bool
}

// unpacker walks the records of an answer after its question.
type unpacker struct {
	room      *answerMsg // the answer's allocation, with room for address records
	msg       []byte
	off       int
	name      string // the caller's QNAME
	sameName  bool   // the answer's question is byte for byte the one asked: a pointer to it is name
	echo      string // the asked name, if spelled otherwise than name: an owner spelled so is name
	clientOPT bool
	keepalive int // the server's keepalive timeout (100ms units), or -1
}

// sections unpacks the answer, authority and additional sections into r, using
// room for the records if they fit.
func (u *unpacker) sections(r *dns.Msg, room []dns.RR) error {
	var counts [3]int
	for i := range counts {
		counts[i] = int(binary.BigEndian.Uint16(u.msg[6+2*i:]))
	}
	// The counts come from the upstream: a record takes at least 11 bytes, which
	// bounds what is allocated for them whatever they claim.
	rrs := room
	if n := min(counts[0]+counts[1]+counts[2], (len(u.msg)-u.off)/11); n > cap(room) {
		rrs = make([]dns.RR, 0, n)
	}
	var ends [3]int
	var opt *dns.OPT
	for i, count := range counts {
		// A message may end before its counts say; miekg/dns stops there too.
		for j := 0; j < count && u.off < len(u.msg); j++ {
			rr, err := u.record(i == 2)
			if err != nil {
				return err
			}
			if rr == nil {
				continue // an OPT the client does not get, or a signature
			}
			if o, ok := rr.(*dns.OPT); ok && i == 2 {
				opt = o
			}
			rrs = append(rrs, rr)
		}
		ends[i] = len(rrs)
	}
	r.Answer = section(rrs[:ends[0]])
	r.Ns = section(rrs[ends[0]:ends[1]])
	r.Extra = section(rrs[ends[1]:ends[2]])
	if opt != nil {
		r.Rcode |= opt.ExtendedRcode()
	}
	return nil
}

// section returns s with its capacity cut, so that appending to one section never
// writes into the next; nil if empty, as miekg/dns has it.
func section(s []dns.RR) []dns.RR {
	if len(s) == 0 {
		return nil
	}
	return s[:len(s):len(s)]
}

// record unpacks the record at u.off. In the additional section an OPT loses its
// hop-by-hop options (their keepalive is noted) and is dropped, as nil, if the
// client sent no OPT. A transaction signature is dropped in any section: it signs
// the connection-local ID, not the caller's, and the client's own signature never
// went upstream (see prepareQuery).
func (u *unpacker) record(additional bool) (dns.RR, error) {
	var h dns.RR_Header
	var err error
	if h.Name, err = u.owner(); err != nil {
		return nil, err
	}
	m, off := u.msg, u.off
	if off+10 > len(m) {
		return nil, errTruncatedMsg
	}
	h.Rrtype = binary.BigEndian.Uint16(m[off:])
	h.Class = binary.BigEndian.Uint16(m[off+2:])
	h.Ttl = binary.BigEndian.Uint32(m[off+4:])
	h.Rdlength = binary.BigEndian.Uint16(m[off+8:])
	rd := off + 10
	end := rd + int(h.Rdlength)
	if end > len(m) {
		return nil, errTruncatedMsg
	}
	u.off = end
	if signature(h.Rrtype, m[rd:end]) {
		return nil, nil
	}
	if additional && h.Rrtype == dns.TypeOPT {
		n, err := u.cutHopByHop(m[rd:end])
		if err != nil || !u.clientOPT {
			return nil, err
		}
		h.Rdlength = uint16(n)
		end = rd + n
	}
	if rr := u.inRoom(h, m[rd:end]); rr != nil {
		return rr, nil
	}
	// Like dns.UnpackRR, the rdata cannot be read past its end.
	rr, _, err := dns.UnpackRRWithHeader(h, m[:end], rd)
	return rr, err
}

// inRoom returns an A or AAAA record, or an OPT without options, built in the
// answer's own allocation while it has room, or nil: the record miekg/dns would
// unpack (an address a slice of its own, RDLENGTH exactly the address's),
// without the allocations it makes for one (the record, the address, and the
// header that escapes in dns.UnpackRRWithHeader).
func (u *unpacker) inRoom(h dns.RR_Header, rdata []byte) dns.RR {
	a := u.room
	switch {
	case h.Rrtype == dns.TypeOPT && len(rdata) == 0 && !a.optUsed:
		a.optUsed = true
		a.opt.Hdr = h
		return &a.opt
	case h.Rrtype == dns.TypeA && len(rdata) == net.IPv4len && a.nA < len(a.a):
		rr, ip := &a.a[a.nA], a.ip4[a.nA][:]
		a.nA++
		copy(ip, rdata)
		rr.Hdr, rr.A = h, ip
		return rr
	case h.Rrtype == dns.TypeAAAA && len(rdata) == net.IPv6len && a.nAAAA < len(a.aaaa):
		rr, ip := &a.aaaa[a.nAAAA], a.ip6[a.nAAAA][:]
		a.nAAAA++
		copy(ip, rdata)
		rr.Hdr, rr.AAAA = h, ip
		return rr
	}
	return nil
}

// owner returns the owner name at u.off and moves past it. The common owner, a
// pointer to the question, is the caller's name when the answer's question is the
// asked one byte for byte: no string is built.
func (u *unpacker) owner() (string, error) {
	m, off := u.msg, u.off
	if u.sameName && off+2 <= len(m) && m[off] == 0xC0 && m[off+1] == 12 {
		u.off += 2
		return u.name, nil
	}
	name, next, err := dns.UnpackDomainName(m, off)
	u.off = next
	if u.sameName && u.echo != "" && name == u.echo {
		name = u.name // the upstream echoed the leader's spelling: the waiter gets its own
	}
	return name, err
}

// cutHopByHop compacts the OPT rdata in place without keepalive and padding options
// and returns its new length. The keepalive's timeout, if it carries one, is noted:
// an explicit 0 asks us to close (RFC 7828 §3.3.2); an empty option, which a
// server must not send, is ignored.
func (u *unpacker) cutHopByHop(rdata []byte) (int, error) {
	out := 0
	for off := 0; off < len(rdata); {
		if off+4 > len(rdata) {
			return 0, errTruncatedMsg
		}
		code := binary.BigEndian.Uint16(rdata[off:])
		n := int(binary.BigEndian.Uint16(rdata[off+2:]))
		end := off + 4 + n
		if end > len(rdata) {
			return 0, errTruncatedMsg
		}
		switch {
		case code == dns.EDNS0TCPKEEPALIVE && n == 2:
			u.keepalive = int(binary.BigEndian.Uint16(rdata[off+4:]))
		case !hopByHop(code):
			out += copy(rdata[out:], rdata[off:end])
		}
		off = end
	}
	return out, nil
}
