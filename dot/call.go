package dot

import (
	"sync/atomic"

	"github.com/miekg/dns"
)

// Call states. The writer moves a call from queued to sent just before copying it
// into the write buffer; a caller or the sweeper giving up moves it from queued to
// abandoned. Whichever CAS wins decides whether the query may be on the wire.
const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

// call is one attempt of a query on one connection.
type call struct {
	q        *query
	deadline int64       // unix ns after which the attempt times out; immutable
	resp     chan result // cap 2: at most one rescue notice, then exactly one completion (see conn)
	state    atomic.Int32
	sentAt   atomic.Int64 // unix ns when the batch holding it was flushed; 0 before
	readsAt  atomic.Int64 // the connection's frames read when it was flushed
	id       uint16       // connection-local ID, set under conn.mu by register
	seq      uint32       // its place in the connection's write order (from 1), set by the writer before it is sent
	nth      int          // its place among the calls the connection accepted (from 1), set under conn.mu by register
	seated   bool         // the query's goroutine only, no lock (seatWithin, stopWaiting): it counted out of p.waiters as it took its connection
	trial    bool         // the call is one of a record trial's two queries (see records.go)

	callerDeadline bool // deadline is the caller's, not ReadTimeout
	rescuable      bool // a plain QUERY sent for the first time: may be rescued (see rescue.go); immutable
	// orderCheck: it went behind another query on purpose (see
	// orderCheckConn). Set by the caller before it registers, read by the
	// caller when it is rescued (see acquireRescue) and by the reader
	// under conn.mu, which the register published it under (see
	// answerLog.sideOnly). Here, beside the bools, it takes
	// what was padding (TestQueryAndAnswerAllocateOnceEach).
	orderCheck bool
	// spell: it was rescued for a slow spell (see spell.go). Set with
	// rescued, under conn.mu, before the notice is sent; the caller reads
	// it after receiving that. Here, beside the bools, it takes what was
	// padding.
	spell bool
	// spared: it found no connection idle and took an order check's due
	// in place of a dial (checkOwesWaiter), and waits, for one wake or
	// recheck, for a connection to free. The caller's only.
	spared bool
	avoid  *conn // a rescue's blocked connection, which pick skips; immutable
	// within: a replay of a query whose connection the server cut after
	// this many answers goes only to a connection that took fewer queries
	// (conn.taken), as long as one takes it (see Pool.pick); 0: anywhere.
	// Only where queries are pipelined (pickInTurn): one to a connection,
	// none is outstanding when a server cuts it after an answer.
	within int32
	// waited: it waited for a connection (acquireSlow), so that its pick is
	// no arrival, which a burst is made of; firstDial: it is of a burst that
	// shares the pool's first dial, waits for that connection and counts in
	// Pool.sharers meanwhile; burstStart: it came before the pool had a
	// connection and dialled, so that its next pick is no member of its burst
	// (see firstDialBurst, joinFirst); startsFirst: that dial was the
	// pool's first, which its burst shares (joinsFirst); sharesNext: it
	// waited while every connection was lost, after an answer, and shares
	// the next one. The caller's only.
	waited, firstDial, burstStart, sharesNext, startsFirst bool

	// Guarded by conn.mu: rescued is set when the caller is told (on resp) to send
	// the query again elsewhere; lost, when the caller gave it up because the
	// query's other attempt was answered first; wonAt, when that was its rescue;
	// evicted (with lost), when it was sent again elsewhere because it went
	// past a newly learned query limit (conn.evictBeyondLocked).
	rescued, lost, evicted bool
	// ticket: its place in the waiting room's order while it waits
	// (waitOrder); 0 while it does not. The caller's only. Here, beside the
	// bools, it takes what was padding: a query stays within its size class
	// (TestQueryAndAnswerAllocateOnceEach).
	ticket uint32
	wonAt  int64

	completions atomic.Int32 // how often complete ran: the tests hold it to exactly 1

	// tombUntil, guarded by conn.mu, is non-zero once the caller gave up on the sent
	// query: its ID stays reserved until the late answer arrives or this time passes.
	tombUntil int64
}

// complete delivers the call's result. The ownership rule makes this happen once;
// resp has room for it and for one rescue notice, so the send never blocks.
func (cl *call) complete(r result) {
	cl.completions.Add(1)
	cl.resp <- r
}

// result completes a call: an answer, unpacked for the caller, or an error.
type result struct {
	msg *dns.Msg
	err error
}
