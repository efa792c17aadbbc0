package dot

import (
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
// is kept for learnedTTL, a "one per record" one for less (see onePerTTL); until
// there is one, each query has a record of its own.

// packing is what a pool knows about how its upstream reads TLS records.
type packing int32

const (
	packUnknown packing = iota // no verdict yet, or it expired: one query per record
	packTrial                  // a connection is finding out: one query per record
	packShared                 // the upstream reads every query of a record
	packOnePer                 // it reads only the first until more bytes come
)

const (
	// trialTimeout bounds how long a trial holds a connection's writes.
	trialTimeout = 250 * time.Millisecond
	// minTrialGrace is the least time the second query gets after the first is
	// answered; it also gets twice as long as the first took. A busy server may
	// be slow to come back to the second query, and a wrong "one per record"
	// costs throughput until the next trial.
	minTrialGrace = 20 * time.Millisecond
	// onePerTTL is how long a first "one per record" verdict holds; it doubles
	// with each one in a row, up to learnedTTL. A late second answer may have
	// been a busy server rather than one that does not read it: a later trial
	// can tell, and a server that really does not read it is held up by trials
	// less and less often.
	onePerTTL = 30 * time.Second
)

// packing returns the pool's current verdict; an expired one is packUnknown.
func (p *Pool) packing() packing {
	s := packing(p.pack.Load())
	if (s == packShared || s == packOnePer) && p.clock.Load() > p.packUntil.Load() {
		return packUnknown
	}
	return s
}

// startTrial reports whether the caller is to run the trial: there is no verdict
// and no other connection is running one.
func (p *Pool) startTrial() bool {
	s := p.pack.Load()
	return packing(s) != packTrial && p.packing() == packUnknown && p.pack.CompareAndSwap(s, int32(packTrial))
}

// endTrial records a trial's verdict, or clears the trial (packUnknown) so that
// another one runs. A changed verdict is reported to the observer.
func (p *Pool) endTrial(v packing) {
	ttl := learnedTTL
	switch v {
	case packShared:
		p.onePerStreak.Store(0)
	case packOnePer:
		ttl = min(onePerTTL<<min(p.onePerStreak.Add(1)-1, 10), learnedTTL)
	}
	p.packUntil.Store(p.clock.Load() + int64(ttl))
	p.pack.Store(int32(v))
	if v == packUnknown {
		return
	}
	if prev := packing(p.lastVerdict.Swap(int32(v))); prev != v {
		p.obs.SharedRecords(v == packShared)
	}
}

// trial runs the record trial on batch, which holds at least three queued calls:
// it writes the first two in one record and waits for the verdict. It returns how
// many calls of batch it wrote, and the first write error.
func (c *conn) trial(batch []*call) (int, error) {
	for len(c.trialc) > 0 {
		<-c.trialc // late reports of an earlier trial, which would fill the channel
	}
	batch[0].trial, batch[1].trial = true, true // before the CAS that publishes them to the reader
	n, err := c.writeRecords(batch[:2], oneRecord)
	if err != nil || n < 2 {
		// An abandoned query left nothing to try with: another batch will.
		c.pool.endTrial(packUnknown)
		return n, err
	}
	c.pool.endTrial(c.trialVerdict(batch[0], batch[1], time.Now()))
	return n, nil
}

// trialVerdict waits for the answers to the trial's queries first and second, as
// the reader reports them on trialc (where a late answer to an earlier trial's
// query may also turn up).
func (c *conn) trialVerdict(first, second *call, start time.Time) packing {
	t := time.NewTimer(trialTimeout)
	defer t.Stop()
	firstIn := false // after it, the timer is the second query's grace
	for {
		select {
		case cl := <-c.trialc:
			if cl == second {
				return packShared
			}
			if cl == first && !firstIn {
				firstIn = true
				t.Reset(min(max(minTrialGrace, 2*time.Since(start)), trialTimeout))
			}
		case <-t.C:
			return packOnePer
		case <-c.done:
			return packUnknown
		}
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
