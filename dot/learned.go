package dot

import (
	"sync/atomic"
	"time"
)

// learned is what a pool learns of its upstream from how it behaves. Each item
// expires, so that a change of the upstream's behaviour is noticed. Its fields
// are atomics: the hot path reads them without a lock.
type learned struct {
	limit   queryLimit
	records recordVerdict
}

// learnedTTL is how long what the pool learns of its upstream holds, at most.
const learnedTTL = 10 * time.Minute

// queryLimit is the number of queries the server serves on one connection before
// it cuts it, learned from its cuts; 0 when none holds.
type queryLimit struct {
	n     atomic.Int32
	until atomic.Int64 // unix ns until which n holds
}

// minLearnedLimit is the fewest answers after which a server's cut teaches a
// query limit: fewer is more likely a fault than a policy, and a tiny limit would
// mean a handshake every few queries.
const minLearnedLimit = 16

// get returns the limit in force, or 0.
func (l *queryLimit) get() int32 {
	if nanotime() > l.until.Load() {
		return 0
	}
	return l.n.Load()
}

// learn is told that the server cut a connection after answering answered
// queries. It returns the new limit if it lowered the one in force, else 0.
// Either way the limit is kept for learnedTTL more: a cut may have been a one-off
// (a restart), and a needlessly low limit costs handshakes.
func (l *queryLimit) learn(answered int) int32 {
	defer l.until.Store(nanotime() + int64(learnedTTL))
	limit := int32(answered - answered/10) // a margin for servers that count bytes
	if old := l.get(); old != 0 && limit >= old {
		return 0
	}
	l.n.Store(limit)
	return limit
}

// learnLimit is told how a connection ended. A server that closes a busy
// connection after answering many queries teaches the pool its query limit. It
// runs before the dead connection's queries are moved or replayed, so that the
// connections they go to already respect the limit.
func (p *Pool) learnLimit(reason CloseReason, answered, outstanding int) {
	if reason != CloseServer || outstanding == 0 || answered < minLearnedLimit {
		return
	}
	if limit := p.learned.limit.learn(answered); limit != 0 {
		// The connections opened with this one are as old and about to be cut
		// too: they take no more queries than the limit either, so that the
		// dead connection's replays do not land on them and die again.
		for _, c := range *p.conns.Load() {
			c.setQueryLimit(int(limit))
		}
	}
}

// verdict is what the pool knows of how its upstream reads TLS records (see
// records.go).
type verdict int32

const (
	verdictNone   verdict = iota // no verdict yet, or it expired: one query per record
	verdictTrial                 // a connection is finding out: one query per record
	verdictShared                // the upstream reads every query of a record
	verdictOwn                   // it reads only the first until more bytes come: a record each
)

// recordVerdict holds the record verdict and when it expires, on the pool's clock.
type recordVerdict struct {
	v        atomic.Int32 // a verdict
	until    atomic.Int64 // pool clock until which verdictShared or verdictOwn holds
	reported atomic.Int32 // the last verdict reported to the observer
	ownRun   atomic.Int32 // verdictOwn verdicts in a row
}

// get returns the verdict in force; an expired one is verdictNone.
func (r *recordVerdict) get(now int64) verdict {
	v := verdict(r.v.Load())
	if (v == verdictShared || v == verdictOwn) && now > r.until.Load() {
		return verdictNone
	}
	return v
}

// startTrial reports whether the caller is to run the trial: there is no verdict
// and no other connection is running one.
func (r *recordVerdict) startTrial(now int64) bool {
	v := r.v.Load()
	return verdict(v) != verdictTrial && r.get(now) == verdictNone && r.v.CompareAndSwap(v, int32(verdictTrial))
}

// end records a trial's verdict, or clears the trial (verdictNone) so that another
// one runs. A "shared" verdict holds for learnedTTL, an "own" one for ownTTL,
// doubling with each in a row. It reports whether the verdict differs from the
// last one reported.
func (r *recordVerdict) end(v verdict, now int64) bool {
	ttl := learnedTTL
	switch v {
	case verdictShared:
		r.ownRun.Store(0)
	case verdictOwn:
		ttl = min(ownTTL<<min(r.ownRun.Add(1)-1, 10), learnedTTL)
	}
	r.until.Store(now + int64(ttl))
	r.v.Store(int32(v))
	return v != verdictNone && verdict(r.reported.Swap(int32(v))) != v
}
