package dot

import "time"

// Observer receives a pool's events. Implementations must be cheap and safe for
// concurrent use: they are called on the hot path, outside the pool's locks.
type Observer interface {
	// Dialed reports a finished dial: how long TCP connect plus TLS handshake took,
	// whether the TLS session was resumed, and the error if it failed.
	Dialed(took time.Duration, resumed bool, err error)
	// Closed reports a connection closing and why.
	Closed(reason CloseReason)
	// Dropped reports an upstream message that was discarded and why.
	Dropped(reason DropReason)
	// Replayed reports a written-but-unanswered query re-sent after its connection died.
	Replayed()
	// TimedOut reports an attempt that got no answer within the read timeout.
	TimedOut()
	// Failed reports a failure of the upstream itself, as opposed to one slow or
	// lost query: a dial or TLS handshake failed, a connection died before its
	// first answer, or a connection stalled. It feeds health checking.
	Failed(err error)
	// SharedRecords reports what the pool learned of how the upstream reads TLS
	// records, when that changes: true, it reads every query of a record, so a burst
	// of queries shares records; false, it reads only the first query of a record
	// until more bytes come (or did not answer the trial in time), so each query
	// gets a record of its own.
	SharedRecords(shared bool)
}

// SizeObserver is an Observer that also hears how the pool sizes itself to its
// upstream (see Mode). The pool looks for it once, in New; an Observer without
// these methods just does not hear of it.
type SizeObserver interface {
	Observer
	// ModeLearned reports a change of what the pool learned of how the upstream
	// serves a connection, or of the queries it aims to put on one connection
	// at once: 1 in order, and while the mode is unknown and the upstream
	// answers slowly (forward's shape), MaxInflight otherwise.
	ModeLearned(m Mode, perConn int)
	// Sized reports, when either changes, how many connections taking queries
	// the load wants and how many take queries (not draining, not blocked
	// behind a slow answer; near their end included), as Stats.Taking counts them.
	Sized(wanted, taking int)
	// Rescued reports a query sent again on another connection because it
	// was stuck behind a slow answer on its own (see rescue.go).
	Rescued()
}

// sizeObserver returns o's SizeObserver, or o with no-op sizing events.
func sizeObserver(o Observer) SizeObserver {
	if so, ok := o.(SizeObserver); ok {
		return so
	}
	return noSizing{o}
}

// noSizing gives an Observer no-op sizing events.
type noSizing struct{ Observer }

func (noSizing) ModeLearned(Mode, int) {}
func (noSizing) Sized(int, int)        {}
func (noSizing) Rescued()              {}

// CloseReason says why a connection closed.
type CloseReason int

// Connection close reasons.
const (
	CloseIdle   CloseReason = iota // no queries for the idle timeout
	CloseServer                    // the server closed it (EOF)
	CloseError                     // a read, write or protocol error
	CloseStall                     // nothing read for the stall timeout with queries outstanding
	CloseMaxAge                    // drained after reaching MaxAge
	CloseDrain                     // drained on the server's keepalive timeout 0 or too many tombstones
	ClosePool                      // the pool was closed
	CloseLimit                     // drained at the query limit learned from the server's cuts
	closeReasonCount
)

var closeReasonNames = [...]string{"idle", "server_close", "error", "stall", "max_age", "drain", "shutdown", "query_limit"}

func (r CloseReason) String() string {
	if r < 0 || r >= closeReasonCount {
		return "unknown"
	}
	return closeReasonNames[r]
}

// DropReason says why an upstream message was discarded.
type DropReason int

// Reasons for discarding an upstream message.
const (
	DropUnknownID     DropReason = iota // no query outstanding with that ID
	DropWrongQuestion                   // ID matched but the question did not
	DropMalformed                       // too short or unparsable
	DropLate                            // answer to a query that already timed out
	DropRescued                         // answer to a query already answered on another connection (see Rescued)
	DropEvicted                         // answer to a query sent elsewhere past a newly learned query limit (see evictBeyondLocked)
	dropReasonCount
)

var dropReasonNames = [...]string{"unknown_id", "wrong_question", "malformed", "late", "rescued", "evicted"}

func (r DropReason) String() string {
	if r < 0 || r >= dropReasonCount {
		return "unknown"
	}
	return dropReasonNames[r]
}

type nopObserver struct{}

func (nopObserver) Dialed(time.Duration, bool, error) {}
func (nopObserver) Closed(CloseReason)                {}
func (nopObserver) Dropped(DropReason)                {}
func (nopObserver) Replayed()                         {}
func (nopObserver) TimedOut()                         {}
func (nopObserver) Failed(error)                      {}
func (nopObserver) SharedRecords(bool)                {}
