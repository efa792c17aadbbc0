package dot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// readLoop frames answers and dispatches them until the connection fails or is
// closed; then it closes the socket.
func (c *conn) readLoop() {
	defer c.pool.wg.Done()
	defer c.loopDone()
	defer c.closeSocket()
	c.readFailed(c.readFrames(c.br))
}

// readFrames reads length-prefixed answers from r and dispatches each until r fails.
// The frame buffer is reused: dispatch is done with a frame when it returns (the
// answer is unpacked on this goroutine, and miekg/dns copies what it keeps).
func (c *conn) readFrames(r io.Reader) error {
	var hdr [2]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint16(hdr[:]))
		if cap(buf) < n {
			buf = make([]byte, max(n, 1024))
		}
		frame := buf[:n]
		if _, err := io.ReadFull(r, frame); err != nil {
			return err
		}
		c.reads.Add(1)
		c.dispatch(frame)
	}
}

// readFailed classifies the error that ended the read loop.
func (c *conn) readFailed(err error) {
	c.mu.Lock()
	werr := c.werr
	c.mu.Unlock()
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		c.closeFor(errServerClosed, CloseServer)
	case werr != nil:
		c.closeFor(werr, CloseError)
	default:
		c.closeFor(fmt.Errorf("read: %w", err), CloseError) // no-op if we closed it ourselves
	}
}

var errServerClosed = errors.New("server closed the connection")

// dispatch hands an answer to the call waiting for it, or drops and counts it.
func (c *conn) dispatch(frame []byte) {
	if len(frame) < 12 {
		c.pool.obs.Dropped(DropMalformed)
		return
	}
	id := binary.BigEndian.Uint16(frame)
	c.mu.Lock()
	cl := c.calls.get(id)
	var drop DropReason = -1
	switch {
	case cl == nil || cl.state.Load() != callSent:
		drop = DropUnknownID // never asked, or not yet written: nobody can own it
	case !answers(frame, cl.q.question):
		drop = DropWrongQuestion // the call keeps waiting for its real answer
	case cl.tombUntil != 0:
		drop = DropLate
		switch {
		case cl.evicted:
			drop = DropEvicted // the limit was learned too low: see queryLimit
		case cl.lost:
			drop = DropRescued
			c.judgeLocked(cl, nanotime())
		}
		c.removeLocked(cl)
	default:
		c.removeLocked(cl)
		c.answered++
	}
	// served: the answer to one of our calls, whether or not its caller still
	// waits for it: the upstream read the query and served it.
	served := drop < 0 || drop == DropLate || drop == DropRescued || drop == DropEvicted
	if served {
		now := c.bc.arrival()
		c.served++
		c.answerAt = now
		c.pool.learned.limit.noteServed(c.served)
		if cl.seq > c.lastServed {
			c.lastServed = cl.seq
			c.pool.learned.limit.noteDepth(cl.seq)
			c.servedAt.Store(now)
		}
		c.answers.usual = c.pool.learned.mode.usual.Load()
		c.answers.others = c.calls.len()
		c.answers.sideOnly = cl.orderCheck && c.pool.slowUnknown()
		c.answers.fedOne = c.pool.queueOnOldest()
		slowBefore, waitedBefore, sideBefore := c.answers.busySlow, c.answers.waited, c.answers.side
		invBefore, busyBefore := c.answers.inversions, c.answers.busy
		if c.overtookLocked(cl.seq) {
			c.answers.inversions++
			c.answers.overtook = cl.seq // its overtaken calls' answers count no more (see note)
		}
		sent := cl.sentAt.Load()
		behind := c.answers.queuedBehind(cl.seq, sent, now, int64(cl.seq)-1-cl.readsAt.Load())
		c.answers.note(cl.seq, sent, now, drop < 0)
		c.judgeSerialLocked(c.answers.busySlow-slowBefore+c.answers.waited-waitedBefore+behind, c.answers.busy > busyBefore,
			c.answers.inversions > invBefore, c.answers.side > sideBefore)
		if sent != 0 && drop < 0 && c.pool.learned.mode.get() != ModeInOrder {
			c.answers.noteDepthCost(int64(cl.seq)-1-cl.readsAt.Load(), now-sent) // see depthcost.go
		}
		if cl.orderCheck && (c.answers.busySlow > slowBefore || c.answers.waited > waitedBefore) {
			c.pool.checkConfirmed() // answered after the one before it: in order, as believed
		} else if cl.orderCheck && c.answers.side > sideBefore {
			c.pool.checkContradicted() // answered beside the one before it: not in order
		}
		if sent != 0 && !cl.orderCheck {
			c.pool.noteStormy(now-sent, now, c.answers.usual)
		}
		ordered := c.answers.busySlow > slowBefore && c.answers.orderWeight() > 0 && c.pool.learned.mode.get() == ModeUnknown &&
			c.pool.learned.mode.slowSuffices(c.answers.busySlow, c.answers.busy)
		spacing := c.answers.gapN > 0 && c.pool.spacingWanted()
		waited := c.answers.waited > waitedBefore && c.pool.learned.mode.get() == ModeUnknown &&
			c.pool.learned.mode.waitedSuffices(c.answers.busy)
		c.askLearnLocked(ordered, spacing, waited)
	}
	first := drop < 0 && c.answered == 1
	// A record trial learns from any served query of its own, also one whose
	// caller gave up or whose rescue won; waiting for trialTimeout instead would
	// hold the connection's writes.
	trial := served && cl.trial
	drain := c.drainedLocked()
	c.mu.Unlock()

	if first {
		c.pool.answered() // before the caller hears of it: its next query sees the reset
		c.pool.learned.mode.firstAnswer(max(nanotime()-cl.sentAt.Load(), 1))
	}
	if drop >= 0 {
		c.pool.obs.Dropped(drop)
	} else {
		c.deliver(cl, frame)
	}
	if trial {
		c.trialAnswered(cl)
	}
	if drain >= 0 {
		c.closeFor(errDrained, drain)
	}
	c.pool.slotFreed()
}

var errDrained = errors.New("connection drained")

// askLearnLocked has the sweeper learn at its next tick, or at once, from
// the answer just noted: ordered, its slow gap in write order brings the
// evidence to in order (slowSuffices); spacing, it times the spacing
// (spacingWanted); waited, its wait behind the query before it brings the
// waited answers to in order (waitedSuffices). c.mu must be held.
func (c *conn) askLearnLocked(ordered, spacing, waited bool) {
	if (c.answers.busySlow >= minSlowEvidence || c.answers.waited >= minWaitedEvidence || ordered || spacing || waited) && !c.pool.learnDue.Load() {
		// Enough to learn in order from, or the first busy answers
		// timing the spacing (see spacingWanted): at the next tick,
		// not the next full sweep. The sweeper is woken for the
		// spacing (timed, it bounds the queues: see queueDepth) and
		// for a deep queue's slow gaps in write order that bring the
		// evidence to in order (see orderWeight, slowSuffices), whose
		// queue grows by every arrival until it is learned; not for a
		// connection's counts alone: learnt more often, the evidence,
		// which decays by update, decayed sooner (property seed 168:
		// in order learned at 1.44 s, not 0.73). Waited answers count
		// across connections (waitedSuffices), while the mode is
		// unknown.
		c.pool.learnDue.Store(true)
		if ordered || spacing {
			c.pool.kickLearn(c.answerAt)
		}
	}
	if waited && !c.pool.learned.mode.spreadless.Load() {
		// Woken for waited answers that suffice, even with a learn
		// already due (not where a query a connection was left as
		// sparing no wait: in order then needs a gain too, see decide,
		// and a learn that cannot learn it only decays the evidence
		// sooner). Until in order is learned, dearQueue puts the
		// next arrival on the oldest connection, behind the query this
		// answer let begin. That one is answered a whole answer time
		// late, its connection busy for it meanwhile, and the query
		// after it found none idle and dialled one past forward's
		// (property steady seed 51: 17 connections against 16, in
		// order learned at the next tick, 1.2 ms after this answer;
		// TestFastInOrderLearnedWithNoQueryQueued). At most once a
		// minWatchInterval (waitedKick): a learn may refuse what one
		// connection's share let through (decide weighs all), and the
		// kept evidence lets the next waited answer through again, so
		// each waited answer could wake a learn of its own.
		c.pool.learnDue.Store(true)
		if c.pool.waitedKick(c.answerAt) {
			c.pool.kickLearn(c.answerAt)
		}
	}
}

// waitedKick reports whether a waited answer read at now may wake the
// sweeper: none did within minWatchInterval. Otherwise learnDue has the next
// tick learn, a minWatchInterval at most later while queries are out.
func (p *Pool) waitedKick(now int64) bool {
	last := p.waitedKickAt.Load()
	return now-last >= int64(minWatchInterval) && p.waitedKickAt.CompareAndSwap(last, now)
}

// deliver unpacks an answer for its call and completes it. The reader does this,
// not the caller: the reader's stack has grown once and for all, whereas the caller
// runs on CoreDNS's fresh per-query goroutine, whose stack an unpack this deep would
// grow (copy) on every query.
func (c *conn) deliver(cl *call, frame []byte) {
	c.pool.flights.land(cl.q, frame) // coalesce.go: the waiters' answers, before finishAnswer edits frame
	r, keepalive, err := finishAnswer(cl.q, frame)
	if err != nil {
		c.pool.obs.Dropped(DropMalformed)
	} else if keepalive >= 0 {
		c.keepalive(keepalive)
	}
	cl.complete(result{msg: r, err: err})
	c.lastUsed.Store(c.pool.clock.Load())
}

// overtookLocked reports whether the answer to the call written seq-th on c
// overtook one written before it that is still outstanding (live or a
// tombstone: the server may yet answer it), which an upstream serving a
// connection's queries in order never lets happen: it is out of order, as
// the late answer of the one overtaken shows (see answerLog.note), but
// known now rather than when that answer comes. Against an out-of-order
// server with slow names and a query limit, the queries it ignored past its
// limit were rescued and their rescues won by far (the originals never
// came), which taught in order before any slow answer came
// (TestRegimeQueryLimitSlowTail: 9 rescues won, in order at 82 ms of its
// warm-up in every run). Out of order came back with a slow answer (300 ms)
// only if one overtook a query still outstanding; where none did before the
// load (a third of the runs), the pool served the load in order, a query a
// connection, up to 40 of 41 held by slow names, and runs of fast names
// waited for a handshake each (24 runs of 100 failed).
//
// The answers of the calls it overtook come later, each before the latest
// in write order (an inversion to answerLog.note), and count for nothing
// more: the overtake showed out of order already, and counted again when a
// slow one came a second or more later, it made an upstream learned in order
// since out of order once more, on no new evidence
// (TestOvertakenAnswerCountsNoSecondInversion).
//
// Only an answer past the next in write order can overtake (any call written
// before it and after the latest answered is then unanswered, or its answer
// came unnoted: a tombstone expired), and only while the mode is not out of
// order already: the scan is of every call outstanding. c.mu must be held.
func (c *conn) overtookLocked(seq uint32) bool {
	last := c.answers.lastSeq
	if seq <= last+1 || c.pool.learned.mode.get() == ModeOutOfOrder {
		return false
	}
	for o := range c.calls.all() {
		// seq is set before the state (records.go): read the state first.
		if o.state.Load() == callSent && o.seq > last && o.seq < seq {
			return true
		}
	}
	return false
}
