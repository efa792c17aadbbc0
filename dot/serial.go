package dot

// A connection's own order verdict (serial): what its answers alone say of
// how the server behind it serves it, whatever the address's mode says.
//
// The mode (learned.go) is one for the whole address, but a load balancer
// sends each connection to one of its backends, some in order, some out of
// order, and one answer that overtook on one connection makes the address
// out of order: pickInTurn then fills the oldest connection in turn, which
// may be one an in-order backend serves a query after the other (mixed
// property seed 62: the first connection, in order, took 452 of 455 queries,
// p99 392 ms against forward's 3). So each connection weighs its own
// answers, per answer, as the reader notes them: slow gaps in write order,
// queries that waited behind the one before (answerLog.noteBusy's busySlow
// and waited, weighed as there) and queries whose answer time grew with the
// calls written before them (queuedBehind) add to its weight; an answer
// that shows none fades it; an answer side by side with the one before
// clears it. A connection whose weight reaches minSerialEvidence, and no
// answer of whose ever overtook, is serial: out of order, it takes a query
// only with nothing outstanding, as the in-order mode would give it one,
// and a query that finds every other connection full goes as pickIdle
// sends it (an idle connection, or a dial of its own), as forward's would.
// The mode in order or unknown, the verdict changes nothing: pickIdle gives
// a query a connection each already, or the address's evidence is still
// forming from the queues the verdict would forbid.
//
// A connection that overtakes keeps being used deep: it is never serial
// (unbound's connections, whose answers come tens of microseconds apart,
// show no slow gap either). A check of a few loads and float operations
// per answer, under conn.mu; pick loads one flag per connection.

const (
	// minSerialEvidence: the weight (slow gaps, waited answers and answers
	// queued behind of the connection's own, faded) that makes a
	// connection serial.
	minSerialEvidence = 4
	// serialFade: an answer that shows no wait behind the one before keeps
	// this share of the connection's weight.
	serialFade = 7.0 / 8
	// maxSerialWeight: the most weight a connection holds, so that a
	// verdict a server's switch in place made wrong fades within a few
	// busy answers that show no wait.
	maxSerialWeight = 2 * minSerialEvidence
)

// queuedBehind is the weight (1 or 0) of in-order evidence of the answer to
// the call written seq-th on the connection, sent at sentAt, arriving at
// now, written behind depth calls outstanding (two or more): it is the next
// in write order after the previous answer, came one service time after it
// (half to twice the connection's latest answer of a call alone, and half a
// serialGap at least: a fast upstream's answers after a pause of its own
// come tens of microseconds apart), and took three quarters of what depth+1
// such services take, and a serialGap more than alone. In order, a call
// written behind depth others waits for each; out of order, its answer time
// does not grow with the depth. Asked before note.
func (l *answerLog) queuedBehind(seq uint32, sentAt, now, depth int64) float64 {
	t0 := l.lastAlone
	if t0 == 0 || sentAt == 0 || depth < 2 || seq != l.lastSeq+1 || sentAt >= l.lastAt {
		return 0
	}
	gap, t := now-l.lastAt, now-sentAt
	if gap < max(t0/2, int64(serialGap/2)) || gap > 2*t0 || 4*t < 3*(depth+1)*t0 || t-t0 < int64(serialGap) {
		return 0
	}
	return 1
}

// judgeSerialLocked folds one served answer into c's own order verdict:
// ev is the weight of in-order evidence it showed (slow gap, waited, queued
// behind), busy whether it was a busy answer, overtook whether it came after
// an answer to a call written after it (or overtook one), side whether it
// came side by side with the one before. c.mu must be held.
//
// One answer of its own out of order and a connection is never serial: a
// server that works on k of a connection's queries at once (dnsdist's
// maxInFlight) overtakes among its k and queues the rest in order, and
// taken for serial after its queue showed waits, it was given one query at
// a time where k cost nothing, and the pool opened connections past
// forward's (mixed property seed 78: 28 against 22, 18 replays of 20
// failing, 8 without this verdict). Side by side clears the weight only:
// an in-order server whose service is short beside its round trip answers
// so too.
func (c *conn) judgeSerialLocked(ev float64, busy, overtook, side bool) {
	switch {
	case overtook:
		c.serialWeight = 0
		if !c.overtaken.Load() {
			c.overtaken.Store(true)
		}
	case side:
		c.serialWeight = 0
	case ev > 0:
		c.serialWeight = min(c.serialWeight+ev, maxSerialWeight)
	case busy || !c.serial.Load():
		// An answer that showed no wait fades the weight, busy or
		// not: evidence must come close together (a fast out-of-order
		// upstream's hiccups, each a slow gap now and then, never add
		// up). Not a serial connection's answers alone: it takes one
		// query at a time, and they say nothing of its order.
		c.serialWeight *= serialFade
	}
	if s := c.serialWeight >= minSerialEvidence && !c.overtaken.Load(); s != c.serial.Load() {
		c.serial.Store(s)
	}
}
