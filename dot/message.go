package dot

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/miekg/dns"
)

// query is one client query prepared for the upstream. It is packed once and shared,
// read-only, by every attempt on every connection: each write puts its own length
// and connection-local ID in front of wire[4:], so wire is never mutated after
// prepare and a replay can reuse it while another writer still reads it.
type query struct {
	wire      []byte // 2-byte length prefix, then the DNS message
	question  []byte // the packed question section, a sub-slice of wire
	name      string // the client's QNAME, to give the answer back in the client's case
	origID    uint16
	opcode    int
	clientOPT bool // the client sent an OPT RR; if not, the answer's OPT is removed

	// room holds wire when it fits: most queries, padded, are 128 or 256 bytes,
	// and then the query and its wire take one allocation instead of two.
	room [2 + 256]byte
	// first is the query's first attempt, in the same allocation; firstUsed is
	// only touched by the goroutine running the exchange.
	first     call
	firstUsed bool
	resent    bool // written a second time (rescued or replayed): never again
}

// Hop-by-hop EDNS options (RFC 7828, RFC 7830): they describe this TLS connection,
// not the client's, so the client's are not forwarded and the upstream's are not
// passed back.
func hopByHop(code uint16) bool {
	return code == dns.EDNS0TCPKEEPALIVE || code == dns.EDNS0PADDING
}

// prepareQuery packs m for the upstream: the client's OPT without hop-by-hop options,
// plus our keepalive and padding options. m itself is not modified. The OPT is
// edited on the wire after one pack, so that the hot path copies no dns.Msg and
// builds no RR.
//
// A transaction signature (TSIG, SIG(0)) in m is removed: it covers the message ID,
// which the pool rewrites, so the upstream could only reject it, and its answer
// would be signed over an ID the client never sent. The query goes unsigned.
func prepareQuery(m *dns.Msg, padBlock int, keepalive bool) (*query, error) {
	if err := CheckQuery(m); err != nil {
		return nil, err
	}
	q := &query{name: m.Question[0].Name, origID: m.Id, opcode: m.Opcode}
	wire, err := packQuery(m, q.room[:])
	if err != nil {
		return nil, err
	}
	wire, q.clientOPT, err = rewriteOPT(wire, padBlock, keepalive)
	if errors.Is(err, errRepack) {
		wire, q.clientOPT, err = repack(m, padBlock, keepalive)
	}
	if err != nil {
		return nil, badQuery(err)
	}
	if len(wire)-2 > dns.MaxMsgSize {
		return nil, errTooLarge // its length prefix would wrap
	}
	binary.BigEndian.PutUint16(wire, uint16(len(wire)-2))
	qlen, err := nameLen(wire[2:], 12)
	if err != nil || 2+12+qlen+4 > len(wire) {
		return nil, errBadQuestion
	}
	q.wire = wire
	q.question = wire[2+12 : 2+12+qlen+4]
	return q, nil
}

// framed reports whether q.wire is a frame whose length prefix is the length of its
// message, a DNS header at least and at most 65,535 octets. prepareQuery makes it
// so; the writer checks it anyway, because a prefix that lied would make the
// upstream read the rest of the query, chosen by the client, as further messages.
func (q *query) framed() bool {
	n := len(q.wire) - 2
	return n >= 12 && n <= dns.MaxMsgSize && int(binary.BigEndian.Uint16(q.wire)) == n
}

// CheckQuery reports why m cannot be forwarded, as far as that is known without
// packing it: not exactly one question, a zone transfer (ErrZoneTransfer), or a
// record miekg/dns cannot pack or a query cannot carry (see checkRecords). The
// error wraps ErrBadQuery. Exchange checks this itself; a caller can check first
// to refuse a query before choosing an upstream.
func CheckQuery(m *dns.Msg) (err error) {
	if len(m.Question) != 1 {
		return questionCount(ErrBadQuery, len(m.Question))
	}
	if t := m.Question[0].Qtype; t == dns.TypeAXFR || t == dns.TypeIXFR {
		return ErrZoneTransfer
	}
	defer func() {
		if r := recover(); r != nil { // a nil pointer of a record type: Header panics
			err = panicked(r)
		}
	}()
	if err = checkRecords(m); err != nil {
		err = wrap(ErrBadQuery, err)
	}
	return err
}

// checkRecords refuses a nil record (miekg/dns panics packing it), a record whose
// type says OPT or TSIG but that is not a *dns.OPT or *dns.TSIG (dns.Msg.IsEdns0
// and IsTsig panic on it), an OPT or TSIG outside the additional section, and more
// than one OPT (RFC 6891 §6.1.1). A query has at most an OPT in the additional
// section, so this costs next to nothing.
func checkRecords(m *dns.Msg) error {
	for _, rr := range m.Answer {
		if err := checkRecord(rr, false); err != nil {
			return err
		}
	}
	for _, rr := range m.Ns {
		if err := checkRecord(rr, false); err != nil {
			return err
		}
	}
	opts := 0
	for _, rr := range m.Extra {
		if err := checkRecord(rr, true); err != nil {
			return err
		}
		if rr.Header().Rrtype == dns.TypeOPT {
			opts++
		}
	}
	if opts > 1 {
		return errTwoOPTs
	}
	return nil
}

func checkRecord(rr dns.RR, additional bool) error {
	if rr == nil {
		return errNilRecord
	}
	ok := true
	switch rr.Header().Rrtype {
	case dns.TypeOPT:
		_, ok = rr.(*dns.OPT)
	case dns.TypeTSIG:
		_, ok = rr.(*dns.TSIG)
	default:
		return nil
	}
	if !ok || !additional {
		return errMetaRecord
	}
	return nil
}

// packQuery packs m into buf behind two bytes of room for the length prefix; the
// options rewriteOPT appends go in buf's spare room, or past it in a new array.
func packQuery(m *dns.Msg, buf []byte) (wire []byte, err error) {
	// miekg/dns panics on records CheckQuery does not look into (a nil EDNS0 option,
	// say): a query is input, and gets an error.
	defer func() {
		if r := recover(); r != nil {
			wire, err = nil, panicked(r)
		}
	}()
	msg, err := m.PackBuffer(buf[2:])
	if err != nil {
		return nil, wrap(ErrBadQuery, err)
	}
	if &msg[0] != &buf[2] { // did not fit: re-home behind a length prefix
		buf = make([]byte, 2+len(msg), 2+len(msg)+256)
		copy(buf[2:], msg)
	}
	return buf[:2+len(msg)], nil
}

// panicked turns a panic of miekg/dns over a query's records into a bad query.
//
//go:noinline
func panicked(r any) error { return fmt.Errorf("%w: miekg/dns panicked: %v", ErrBadQuery, r) }

// errRepack: the query's additional section must be rearranged before rewriteOPT
// can edit it.
var errRepack = errors.New("OPT not last, or a signature to remove")

// repack is the rare path of a client OPT that is not the last additional record,
// or of a signed query: pack a copy whose additional section has no signature and
// the OPT last, and rewrite that. Out of line, so that the copy of the message does
// not weigh on the hot path's stack frame. If the copy still needs rearranging (a
// record whose Go type does not match its type field), the query is refused.
//
//go:noinline
func repack(m *dns.Msg, padBlock int, keepalive bool) ([]byte, bool, error) {
	out := *m
	out.Extra = additionalForUpstream(m.Extra)
	wire, err := packQuery(&out, make([]byte, 2+256))
	if err != nil {
		return nil, false, err
	}
	return rewriteOPT(wire, padBlock, keepalive)
}

// additionalForUpstream returns a copy of extra (checked by checkRecords) without
// transaction signatures and with its OPT, if any, moved to the end.
func additionalForUpstream(extra []dns.RR) []dns.RR {
	out := make([]dns.RR, 0, len(extra))
	var opt dns.RR
	for _, rr := range extra {
		switch rr.Header().Rrtype {
		case dns.TypeOPT:
			opt = rr
		case dns.TypeTSIG:
		case dns.TypeSIG:
			if s, ok := rr.(*dns.SIG); !ok || s.TypeCovered != 0 {
				out = append(out, rr)
			}
		default:
			out = append(out, rr)
		}
	}
	if opt != nil {
		out = append(out, opt)
	}
	return out
}

// signature reports whether a record of type rrtype with rdata is a transaction
// signature: a TSIG (RFC 8945) or a SIG(0) (RFC 2931: a SIG covering type 0).
// Both sign the message ID, which the pool rewrites. A SIG too short to say what
// it covers counts as one, as miekg/dns unpacks it covering type 0.
func signature(rrtype uint16, rdata []byte) bool {
	return rrtype == dns.TypeTSIG || rrtype == dns.TypeSIG && (len(rdata) < 2 || rdata[0]|rdata[1] == 0)
}

// rewriteOPT edits the packed query in wire (behind its 2-byte length prefix) for
// the upstream: the client's hop-by-hop options are removed from its OPT (or an
// OPT is added if it had none and we have options to send), then our keepalive
// option and a padding option sized to a multiple of block (RFC 8467) are
// appended. It reports whether the client sent an OPT.
//
// A query that our options would push past 65,535 octets is sent without them
// rather than refused: it fits as the client sent it, the keepalive is only a
// hint, and padding a message that size hides nothing. The caller refuses one
// that does not fit even so.
func rewriteOPT(wire []byte, block int, keepalive bool) ([]byte, bool, error) {
	optAt, err := findOPT(wire[2:])
	if err != nil {
		return nil, false, err
	}
	clientOPT := optAt >= 0
	if clientOPT {
		if wire, err = cutClientOptions(wire, optAt); err != nil {
			return nil, false, err
		}
	}
	ours := 0 // the octets our options add, padding aside
	if keepalive {
		ours += 4
	}
	if block > 0 {
		ours += 4
	}
	if !clientOPT && ours > 0 {
		ours += 11
	}
	if len(wire)-2+ours > dns.MaxMsgSize {
		block, keepalive = 0, false
	}
	if !clientOPT && block == 0 && !keepalive {
		return wire, false, nil
	}
	if !clientOPT {
		// Root name, type OPT, a 1232-byte buffer, no extended flags, no rdata yet.
		wire = append(wire, 0, 0, 41, 1232>>8, 1232&0xff, 0, 0, 0, 0, 0, 0)
		optAt = len(wire) - 2 - 2
		msg := wire[2:]
		binary.BigEndian.PutUint16(msg[10:], binary.BigEndian.Uint16(msg[10:])+1)
	}
	if keepalive {
		wire = append(wire, 0, dns.EDNS0TCPKEEPALIVE, 0, 0)
	}
	if block > 0 {
		wire = append(wire, 0, dns.EDNS0PADDING, 0, 0)
		n := len(wire) - 2
		pad := (block - n%block) % block
		if n+pad > dns.MaxMsgSize {
			pad = 0 // padding never pushes the query past the limit
		}
		binary.BigEndian.PutUint16(wire[len(wire)-2:], uint16(pad))
		wire = append(wire, make([]byte, pad)...)
	}
	binary.BigEndian.PutUint16(wire[2+optAt:], uint16(len(wire)-2-optAt-2))
	return wire, clientOPT, nil
}

// findOPT returns the offset of the RDLENGTH of msg's OPT, or -1 if it has none.
// It fails with errRepack if the OPT is not the last record or a transaction
// signature is to be removed (both in the additional section), and with
// errMetaRecord for an OPT or signature elsewhere, or a second OPT: the packed
// message is what the upstream would see, so it is checked whatever the dns.Msg
// claimed.
func findOPT(msg []byte) (int, error) {
	if len(msg) < 12 {
		return -1, errTruncatedMsg
	}
	additional := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:])) // index of the first
	optAt, i := -1, 0
	var notLast, signed, misplaced bool
	err := walkRRs(msg, func(rrtype uint16, rdlenAt int, rdata []byte) {
		inAdditional := i >= additional
		i++
		switch {
		case rrtype == dns.TypeOPT:
			misplaced = misplaced || !inAdditional || optAt >= 0
			optAt = rdlenAt
		case signature(rrtype, rdata):
			misplaced = misplaced || !inAdditional
			signed = true
		case optAt >= 0:
			notLast = true
		}
	})
	switch {
	case err != nil:
		return -1, err
	case misplaced:
		return -1, errMetaRecord
	case notLast || signed:
		return -1, errRepack
	}
	return optAt, nil
}

// cutClientOptions removes the hop-by-hop options from the client's OPT, the last
// record of the message in wire, whose RDLENGTH is at optAt (in the message). The
// RDLENGTH is left for the caller to set.
func cutClientOptions(wire []byte, optAt int) ([]byte, error) {
	msg := wire[2:]
	// The OPT is last, so its options run to the end: compact the ones we keep.
	out := optAt + 2
	for off := out; off < len(msg); {
		if off+4 > len(msg) {
			return nil, errTruncatedMsg
		}
		end := off + 4 + int(binary.BigEndian.Uint16(msg[off+2:]))
		if end > len(msg) {
			return nil, errTruncatedMsg
		}
		if !hopByHop(binary.BigEndian.Uint16(msg[off:])) {
			out += copy(msg[out:], msg[off:end])
		}
		off = end
	}
	return wire[:2+out], nil
}

// nameLen returns the length of the (possibly compressed) name at msg[off:].
func nameLen(msg []byte, off int) (int, error) {
	start := off
	for off < len(msg) {
		c := int(msg[off])
		switch {
		case c == 0:
			return off + 1 - start, nil
		case c&0xC0 == 0xC0: // compression pointer ends the name
			if off+2 > len(msg) {
				return 0, errTruncatedMsg
			}
			return off + 2 - start, nil
		case c&0xC0 != 0:
			return 0, errBadLabel
		}
		off += 1 + c
	}
	return 0, errTruncatedMsg
}

// walkRRs calls fn for every resource record after msg's question section with its
// type, the offset of its RDLENGTH field and its rdata. It fails on a malformed or
// trailing-garbage message.
func walkRRs(msg []byte, fn func(rrtype uint16, rdlenAt int, rdata []byte)) error {
	if len(msg) < 12 {
		return errTruncatedMsg
	}
	off := 12
	for range binary.BigEndian.Uint16(msg[4:]) {
		n, err := nameLen(msg, off)
		if err != nil {
			return err
		}
		off += n + 4
	}
	rrs := int(binary.BigEndian.Uint16(msg[6:])) + int(binary.BigEndian.Uint16(msg[8:])) + int(binary.BigEndian.Uint16(msg[10:]))
	for range rrs {
		n, err := nameLen(msg, off)
		if err != nil {
			return err
		}
		off += n
		if off+10 > len(msg) {
			return errTruncatedMsg
		}
		rrtype := binary.BigEndian.Uint16(msg[off:])
		rdlenAt := off + 8
		end := rdlenAt + 2 + int(binary.BigEndian.Uint16(msg[rdlenAt:]))
		if end > len(msg) {
			return errTruncatedMsg
		}
		fn(rrtype, rdlenAt, msg[rdlenAt+2:end])
		off = end
	}
	if off != len(msg) {
		return errTruncatedMsg
	}
	return nil
}

var (
	errTruncatedMsg = errors.New("message truncated")
	errBadLabel     = errors.New("bad label type")
	errBadQuestion  = fmt.Errorf("%w: bad question", ErrBadQuery)
	errTooLarge     = fmt.Errorf("%w: longer than 65,535 octets", ErrBadQuery)
	errNilRecord    = errors.New("nil record")
	errMetaRecord   = errors.New("OPT or signature misplaced, or its Go type not its type")
	errTwoOPTs      = errors.New("more than one OPT")
)

// wrap, badQuery and questionCount build errors out of line: the hot path's stack
// frames stay small, which keeps CoreDNS's per-request goroutines from growing
// their stacks (a copy that costs several microseconds per query).
//
//go:noinline
func wrap(sentinel, err error) error { return fmt.Errorf("%w: %w", sentinel, err) }

// badQuery wraps err in ErrBadQuery unless it already is one.
//
//go:noinline
func badQuery(err error) error {
	if errors.Is(err, ErrBadQuery) {
		return err
	}
	return wrap(ErrBadQuery, err)
}

//go:noinline
func questionCount(sentinel error, n int) error { return fmt.Errorf("%w: %d questions", sentinel, n) }

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
	a := new(answerMsg)
	r := &a.msg
	if err := r.Unpack(frame[:12]); err != nil { // the header only: sections stay nil
		return nil, -1, wrap(ErrMalformed, err)
	}
	n := len(q.question)
	a.question[0] = dns.Question{
		Name:   q.name,
		Qtype:  binary.BigEndian.Uint16(q.question[n-4:]),
		Qclass: binary.BigEndian.Uint16(q.question[n-2:]),
	}
	r.Question = a.question[:]
	r.Id = q.origID
	u := unpacker{
		msg:       frame,
		off:       12,
		name:      q.name,
		clientOPT: q.clientOPT,
		keepalive: -1,
	}
	if binary.BigEndian.Uint16(frame[4:]) != 0 { // else an error without a question
		u.off += n
		u.sameName = string(frame[12:12+n]) == string(q.question)
	}
	if err := u.sections(r, a.rrs[:0]); err != nil {
		return nil, -1, wrap(ErrMalformed, err)
	}
	return r, u.keepalive, nil
}

// answerMsg holds an answer, its one question and, when they are few, its records
// in one allocation.
type answerMsg struct {
	msg      dns.Msg
	question [1]dns.Question
	rrs      [4]dns.RR
}

// unpacker walks the records of an answer after its question.
type unpacker struct {
	msg       []byte
	off       int
	name      string // the caller's QNAME
	sameName  bool   // the answer's question is byte for byte the caller's: a pointer to it is name
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
	// Like dns.UnpackRR, the rdata cannot be read past its end.
	rr, _, err := dns.UnpackRRWithHeader(h, m[:end], rd)
	return rr, err
}

// owner returns the owner name at u.off and moves past it. The common owner, a
// pointer to the question, is the caller's name when the question is the caller's
// byte for byte: no string is built.
func (u *unpacker) owner() (string, error) {
	m, off := u.msg, u.off
	if u.sameName && off+2 <= len(m) && m[off] == 0xC0 && m[off+1] == 12 {
		u.off += 2
		return u.name, nil
	}
	name, next, err := dns.UnpackDomainName(m, off)
	u.off = next
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
