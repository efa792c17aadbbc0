package dot

import (
	"encoding/binary"
	"time"
)

// How queries are framed into TLS records.
//
// A burst of queries costs the upstream less in shared records than in one record
// each: OpenSSL-based servers such as unbound make two read(2) calls per record.
// But a server may read only the first query of a record and then wait for its
// socket to become readable, which it does not for the queries already in its TLS
// library's buffer. Two kinds are known:
//
//   - a server that reads one record at a time (OpenSSL's default) and waits for
//     readability between queries (dnsdist 1.7 without maxInFlight, at times;
//     systemd-resolved had the same bug as a DoT client). Shared records end with
//     a record of its own for the last query: it stays unread on the socket, so
//     the socket stays readable until the queries before it are served.
//   - a server that also reads ahead, taking every record off the socket at once
//     (OpenSSL does with read_ahead set). Nothing keeps it going but more bytes.
//     The record trial catches it.
//
// The trial uses the queries at hand, so it costs no extra query: the first two
// queries of a batch of three or more go in one record, and nothing more is written
// on that connection until the second is answered (the server read past the first
// query without more bytes coming: records can be shared) or the first is answered
// and the second not within a grace (one query per record). The rest of the batch
// then goes out, and its bytes wake a server that was waiting. A "shared" verdict
// is kept for learnedTTL, a "one per record" one for less (see ownTTL); until
// there is one, each query has a record of its own.

const (
	// trialTimeout bounds how long a trial holds a connection's writes.
	trialTimeout = 250 * time.Millisecond
	// minTrialGrace is the least time the second query gets after the first is
	// answered; it also gets twice as long as the first took. A busy server may
	// be slow to come back to the second query, and a wrong "one per record"
	// costs throughput until the next trial.
	minTrialGrace = 20 * time.Millisecond
	// ownTTL is how long a first "one per record" verdict holds; it doubles
	// with each one in a row, up to learnedTTL. A late second answer may have
	// been a busy server rather than one that does not read it (a loaded
	// machine makes a 20 ms grace pass): the next trial, a second later, can
	// tell, so one late answer costs shared records for a second, not for
	// minutes. A server that really does not read it is held up by trials less
	// and less often: ten in its first ten minutes, each holding one
	// connection's writes for a grace.
	ownTTL = time.Second
)

// verdict returns the record verdict in force.
func (p *Pool) verdict() verdict { return p.learned.records.get(p.clock.Load()) }

// startTrial reports whether the caller is to run the record trial. None runs
// before the first answer (the upstream may be slow), or while the usual
// answer time is a quarter of trialTimeout or more: the trial
// holds the connection's writes until its second query is answered, which
// for so slow an upstream is a hold longer than any gain of shared records
// (and a hold of trialTimeout, then a wrong "one per record", if it is
// slower still). Without a verdict each query has a record of its own.
func (p *Pool) startTrial() bool {
	if u := p.learned.mode.usual.Load(); u == 0 || u >= int64(trialTimeout/4) {
		return false // not yet timed, or too slow
	}
	return p.learned.records.startTrial(p.clock.Load())
}

// endTrial records a trial's verdict (verdictNone: no verdict, another trial is to
// run) and reports a changed one to the observer.
func (p *Pool) endTrial(v verdict) {
	if p.learned.records.end(v, p.clock.Load()) {
		p.obs.SharedRecords(v == verdictShared)
	}
}

// trial runs the record trial on batch, which holds at least three queued calls:
// it writes the first two in one record and waits for the verdict. It returns the
// first write error. The two are done with even if one was not written
// (abandoned, or not framed): the caller writes the rest without them. Taken
// again with the rest, the written one had its seq rewritten after its send,
// while the reader may read it, to the next query's.
func (c *conn) trial(batch []*call) error {
	for len(c.trialc) > 0 {
		<-c.trialc // late reports of an earlier trial, which would fill the channel
	}
	select {
	case <-c.trialStop: // a block found before this trial began
	default:
	}
	batch[0].trial, batch[1].trial = true, true // before the CAS that publishes them to the reader
	n, err := c.writeRecords(batch[:2], oneRecord)
	if err != nil || n < 2 {
		// An abandoned query left nothing to try with: another batch will.
		c.pool.endTrial(verdictNone)
		return err
	}
	c.pool.endTrial(c.trialVerdict(batch[0], batch[1], time.Now()))
	return nil
}

// trialVerdict waits for the answers to the trial's queries first and second, as
// the reader reports them on trialc (where a late answer to an earlier trial's
// query may also turn up).
func (c *conn) trialVerdict(first, second *call, start time.Time) verdict {
	t := time.NewTimer(trialTimeout)
	defer t.Stop()
	firstIn := false // after it, the timer is the second query's grace
	for {
		select {
		case cl := <-c.trialc:
			if cl == second {
				return verdictShared
			}
			if cl == first && !firstIn {
				firstIn = true
				t.Reset(min(max(minTrialGrace, 2*time.Since(start)), trialTimeout))
			}
		case <-t.C:
			return verdictOwn
		case <-c.trialStop:
			return verdictStopped
		case <-c.done:
			return verdictNone
		}
	}
}

// stopTrial ends the record trial holding c's writes, if one does, without a
// verdict: the sweeper found c blocked behind a slow answer (rescueStuck).
// The trial's answers then wait for that one, so their timing tells nothing
// of how the upstream reads records, and the hold (trialTimeout) would keep
// every query put on c unwritten meanwhile. Those were moved off c each
// tick as never written, came back to it (the least loaded blocked one,
// when every connection was blocked at the cap), and after a move per
// connection the cap allows failed as lost: 12 of 37 queries of property
// seed 97 in a stall, where forward answered them. Another trial runs on a
// batch ownTTL later (verdictStopped).
func (c *conn) stopTrial() {
	select {
	case c.trialStop <- struct{}{}:
	default: // one is pending already
	}
}

// trialAnswered tells the trial waiting on this connection, if any, that its
// query cl was answered.
func (c *conn) trialAnswered(cl *call) {
	select {
	case c.trialc <- cl:
	default: // full of reports nobody waited for
	}
}

// framing says how writeRecords puts queries into TLS records.
type framing int

const (
	ownRecords    framing = iota // each query in a record of its own
	sharedRecords                // all but the last share records, the last has its own
	oneRecord                    // all in one record: the record trial
)

// writeRecords frames the calls of batch still queued (one abandoned by its caller
// is skipped) and writes them with one syscall, in records as f says. In shared
// records the last query has a record of its own: a server that serves the queries
// left in its TLS buffer only when its socket is readable (dnsdist 1.7) finds that
// record unread on the socket until it has served the others. The shared query
// wire is never written to: our length and ID go in front of a copy. It returns
// how many calls it wrote (moved to the front of batch) and the first write
// error, which is sticky.
func (c *conn) writeRecords(batch []*call, f framing) (int, error) {
	var werr error
	write := func(p []byte) {
		if _, err := c.tc.Write(p); err != nil && werr == nil {
			werr = err
		}
	}
	n, last := 0, 0
	buf := c.wbuf[:0]
	c.bc.begin()
	for _, cl := range batch {
		if !cl.q.framed() {
			continue // never sent: left queued, its caller or the sweeper gives it up
		}
		cl.seq = c.wseq + 1 // before the CAS that lets the reader see the call
		if !cl.state.CompareAndSwap(callQueued, callSent) {
			continue
		}
		c.wseq++
		last = len(buf)
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(cl.q.wire)-2))
		buf = binary.BigEndian.AppendUint16(buf, cl.id)
		buf = append(buf, cl.q.wire[4:]...)
		if f == ownRecords {
			write(buf)
			buf = buf[:0]
		}
		batch[n] = cl
		n++
	}
	switch {
	case n == 0 || f == ownRecords:
	case f == sharedRecords && last > 0:
		write(buf[:last])
		write(buf[last:])
	default:
		write(buf)
	}
	c.wbuf = buf[:0]
	if n == 0 {
		return 0, c.bc.flush()
	}
	// Frames read before the write cannot be answers to it: whatever is read from
	// now on counts as "read since it was sent". The times are taken before the
	// flush so that the reader finds them when the answers come.
	reads, now := c.reads.Load(), time.Now()
	for _, cl := range batch[:n] {
		cl.readsAt.Store(reads)
		cl.sentAt.Store(now.UnixNano())
	}
	c.wroteAt.Store(now.UnixNano())
	err := c.bc.flush() // bounded by WriteTimeout (see batchConn.armLocked)
	if werr != nil {
		err = werr
	}
	return n, err
}
