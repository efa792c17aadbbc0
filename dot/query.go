package dot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"

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

	// room holds wire when it fits: most queries, padded to the default block,
	// are 128 octets, and then the query and its wire take one allocation (of
	// 384 bytes) instead of two. A longer one has an array of its own: room for
	// 256 octets made every query's allocation 512 bytes, a quarter of it unused
	// by most, and the garbage collector's work is in proportion to the bytes.
	room [2 + 128]byte
	// first is the query's first attempt, in the same allocation. firstUsed,
	// more and free are only touched by the goroutine running the exchange:
	// more, a call other than first was made (a move, a replay or a rescue);
	// free, nothing but that goroutine holds q any more (see Pool.recycle).
	first                 call
	firstUsed, more, free bool
	resent                bool  // written a second time (rescued or replayed): never rescued
	replays               int32 // replays after a server cut the connection (see Pool.exchange)
	cutAfter              int32 // the fewest answers after which a server cut a connection q was on; 0: none (see call.within)

	// fl is the flight q leads, if it leads one: identical queries wait for its
	// answer (see coalesce.go). Its zero value is no flight.
	fl flight
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
	return prepareInto(nil, m, padBlock, keepalive)
}

// prepareInto is prepareQuery into a query from free, where a Pool recycles
// them (see Pool.recycle), zeroed; a new one if free is nil. The pool is
// asked here, not by the caller: its answer, an interface, would take room
// in ExchangeDeadline's frame, on the client's query's stack.
func prepareInto(free *sync.Pool, m *dns.Msg, padBlock int, keepalive bool) (q *query, err error) {
	if err := CheckQuery(m); err != nil {
		return nil, err
	}
	// Here rather than in packQuery and repack, whose frames are deeper on the
	// client's query's stack (see ExchangeDeadline).
	defer func() {
		if r := recover(); r != nil {
			q, err = nil, panicked(r)
		}
	}()
	if free != nil {
		q = free.Get().(*query)
	} else {
		q = new(query)
	}
	q.name, q.origID, q.opcode = m.Question[0].Name, m.Id, m.Opcode
	wire, optAt, direct := encodeQuery(m, q.room[:])
	if direct {
		wire, q.clientOPT, err = addOptions(wire, optAt, padBlock, keepalive)
	} else {
		if wire, err = packQuery(m, q.room[:]); err != nil {
			return nil, err
		}
		wire, q.clientOPT, err = rewriteOPT(wire, padBlock, keepalive)
		if errors.Is(err, errRepack) {
			wire, q.clientOPT, err = repack(m, padBlock, keepalive)
		}
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
//
// miekg/dns panics on records CheckQuery does not look into (a nil EDNS0 option,
// say): a query is input, and gets an error. The caller recovers (prepareQuery).
func packQuery(m *dns.Msg, buf []byte) ([]byte, error) {
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
	return addOptions(wire, optAt, block, keepalive)
}

// addOptions appends our options to the query in wire, whose OPT, the last
// record, has its RDLENGTH at optAt in the message (-1: no OPT, so one is added
// if we have options to send); see rewriteOPT. It reports whether the client
// sent an OPT.
func addOptions(wire []byte, optAt int, block int, keepalive bool) ([]byte, bool, error) {
	clientOPT := optAt >= 0
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
		end := len(wire)
		wire = slices.Grow(wire, pad)[:end+pad] // in the query's room when it fits
		clear(wire[end:])
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
