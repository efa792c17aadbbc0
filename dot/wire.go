package dot

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/miekg/dns"
)

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

// signature reports whether a record of type rrtype with rdata is a transaction
// signature: a TSIG (RFC 8945) or a SIG(0) (RFC 2931: a SIG covering type 0).
// Both sign the message ID, which the pool rewrites. A SIG too short to say what
// it covers counts as one, as miekg/dns unpacks it covering type 0.
func signature(rrtype uint16, rdata []byte) bool {
	return rrtype == dns.TypeTSIG || rrtype == dns.TypeSIG && (len(rdata) < 2 || rdata[0]|rdata[1] == 0)
}
