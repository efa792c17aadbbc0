package dot

import (
	"errors"
	"fmt"
)

// Sentinel errors returned by Pool.Exchange. Callers test them with errors.Is; the
// returned error may wrap a lower-level cause (a TLS or network error) as well.
var (
	// ErrPoolClosed is returned once Close has been called.
	ErrPoolClosed = errors.New("dot: pool closed")
	// ErrTimeout means no answer arrived within the attempt's read timeout.
	ErrTimeout = errors.New("dot: timeout waiting for answer")
	// ErrConnLost means the connection carrying the query died (server close, TLS or
	// network error, stall) and the query could not be replayed.
	ErrConnLost = errors.New("dot: connection lost")
	// ErrStalled is wrapped by ErrConnLost when the connection read nothing for the
	// stall timeout while queries were outstanding.
	ErrStalled = errors.New("dot: connection stalled")
	// ErrUnavailable means the upstream has no usable connection and is in dial
	// backoff after failures: the caller should try another upstream.
	ErrUnavailable = errors.New("dot: upstream unavailable")
	// ErrDial means a TCP connect or TLS handshake failed. Authentication failures
	// (unknown CA, wrong name, expired certificate, pin mismatch) are dial errors.
	ErrDial = errors.New("dot: dial failed")
	// ErrNoFiles is wrapped by ErrDial when the dial failed locally because the
	// process (EMFILE) or the system (ENFILE) is out of file descriptors: not the
	// upstream's fault, so no strike against it (see fdlimit.go).
	ErrNoFiles = errors.New("dot: the process is out of file descriptors")
	// ErrPinMismatch is wrapped by ErrDial when no certificate in the chain matches
	// a configured SPKI pin.
	ErrPinMismatch = errors.New("dot: no SPKI pin matched")
	// ErrMalformed means the upstream's answer could not be parsed.
	ErrMalformed = errors.New("dot: malformed answer")
	// ErrBadQuery means the query cannot be forwarded: it does not have exactly one
	// question, has a nil record or an OPT where a query cannot have one, cannot be
	// packed into 65,535 octets, or is a zone transfer (see ErrZoneTransfer).
	ErrBadQuery = errors.New("dot: query cannot be forwarded")
	// ErrZoneTransfer wraps ErrBadQuery for AXFR and IXFR: their answers span
	// several messages, which a pipelined connection cannot carry.
	ErrZoneTransfer = fmt.Errorf("%w: zone transfers are not forwarded", ErrBadQuery)
)

// errSaturated is wrapped by ErrUnavailable when every slot is taken and as many
// callers as there are slots already wait.
var errSaturated = errors.New("every connection full and too many callers waiting")

// errUnsent reports that a query's connection died before the query was handed to
// TLS; the caller moves it to another connection without counting an attempt.
var errUnsent = errors.New("dot: connection closed before query was written")

// errBeyondLimit is the cause of a connLostError for a query written on a
// connection beyond the server's query limit, learned after it was written:
// the server will not answer it there (see conn.evictBeyondLocked).
var errBeyondLimit = errors.New("dot: written beyond the server's query limit")

// connLostError is returned for a written query whose connection died.
type connLostError struct {
	cause      error
	replayable bool // the connection had answered before: a replay has a chance
	serverCut  bool // the server closed it (CloseServer): maybe at a query limit not yet learned
	served     int  // the answers the server served on it before its close
}

func (e *connLostError) Error() string { return fmt.Sprintf("%v: %v", ErrConnLost, e.cause) }

func (e *connLostError) Unwrap() []error { return []error{ErrConnLost, e.cause} }
