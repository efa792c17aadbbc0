package dot

import (
	"math"
	"sync/atomic"
	"time"
)

// answerLog is what one connection's answers say about the upstream: where each
// falls in the connection's write order, and how long it took. The reader notes
// every answer (note, under conn.mu); the sweeper collects the counts.
type answerLog struct {
	lastSeq      uint32 // the latest-written call answered so far (write order, from 1)
	lastAt       int64  // unix ns of the previous answer
	lastSent     int64  // unix ns when the previous answer's call was written
	aloneCeiling int64  // alone samples above this (if set, see ceiling) are cut to it: one slow answer does not make the upstream slow
	sideSend     int64  // a busy answer to a call written this soon after the previous one shows, if no later than it, side-by-side service (see noteBusy; 0: none)
	meanCeiling  int64  // likewise for the mean answer time: what it measures is how long most queries wait
	usual        int64  // the pool's usual answer time, as the reader last read it (0: none yet): what waited measures against (see waitedBehind)
	sideOnly     bool   // the answer being noted is an order check's, the upstream slow and unknown as it came: it counts only if side by side (see noteBusy)
	fedOne       bool   // the pool kept one query waiting on its oldest connection as the answer came (queueOnOldest): see servedAfter
	others       int    // the calls outstanding on the connection besides the one answered, as the reader last counted them (see orderWeight)
	// overtook: the latest-written call whose answer was counted as an
	// inversion for overtaking calls written before it (conn.overtookLocked):
	// the answer to a call written before it is no inversion again (0: none)
	overtook uint32
	// newestSent is the write time (unix ns) of the latest-written call
	// answered on the connection: written under conn.mu, read by the sweeper
	// without it, to tell a query waiting behind another (a later one was
	// answered) from a slow one (see conn.stuckLocked).
	newestSent atomic.Int64
	// lastAlone: the answer time (ns) of the latest call answered alone on
	// the connection, uncut (see queuedBehind; 0: none yet)
	lastAlone int64
	// spell: the latest answers to calls alone on the connection, uncut by
	// aloneCeiling: a slow spell's answers are what it shows (see spell.go)
	spell spellSamples

	answerStats // since the sweeper last collected them
}

// answerStats are what answers showed since they were last collected.
type answerStats struct {
	evidence
	aloneSum int64 // answer times (ns) of calls written with nothing outstanding before them
	aloneN   int
	sum      int64 // answer times (ns) of every answer delivered, cut at meanCeiling
	n        int
	// gapSum: how long after the previous answer each busy answer came
	// (ns; busy: its call was written before that answer came), gapN of
	// them: the spacing of a busy connection's answers (see
	// serveMode.spacing)
	gapSum int64
	gapN   int
	// depth: out of order, each delivered answer's time against the
	// depth its call was written at (see depthcost.go)
	depth depthFit
}

// evidence counts what answers showed of how the upstream serves a connection.
type evidence struct {
	inversions float64 // answers to a call written before one already answered (once per overtake: see answerLog.overtook): out of order
	rescued    float64 // rescues answered sooner than their stuck query had already waited: in order
	busy       float64 // answers to calls that were waiting when the previous answer came
	busySlow   float64 // of those, the ones that came serialGap or more after that answer: in order, slow
	// queued: of the busy answers, those that came within serialGap of the
	// previous one although written minRescueDelay or more after it: they
	// waited behind it (an answer slow in itself comes as long after its own
	// write as the previous one did)
	queued float64
	// side: of the busy answers, those to a call written within sideSend
	// of the previous one that came no more than serialGap later than the
	// send gap, and within sideWait usual times of its write: served side
	// by side with it (in order, the gap would be its own service time).
	// One held longer came right after a slow answer it queued behind
	// (in order, a cached name behind a miss): no sign of side by side.
	// An in-order upstream whose service is short beside its round trip
	// answers side by side too, and pipelining then costs it little.
	side float64
	// waited: of the busy answers, those that came like an answer of
	// their own (within twice the usual time of the previous one) after
	// waiting waitedFactor usual times for it: they were served after
	// it, not beside it (see noteBusy)
	waited float64
}

// serialGap: a call that waited behind another answer and came this long or
// more after it was served after that one, not with it.
const serialGap = time.Millisecond

// sideWait: a busy answer counts as side by side (see evidence.side) only
// if it came within this many usual answer times of its write. In order, a
// call written within sideSend (a quarter of the usual time) after the one
// before is answered a service time after that one, 1.75 usual times or
// more after its own write: with 2 here, an in-order upstream's two answers
// read together late (this process off the CPU for a service time: one read,
// one arrival, no gap between them) counted as side by side, and
// minSideEvidence such reads learned an in-order upstream out of order (one query
// a connection becomes up to MaxInflight on few). Side by side, the
// call is answered in about its own answer time, read together with the one
// before or not (TestAnswersReadLateShowNoSideBySide).
const sideWait = 1.5

// note records the answer to the call written seq-th on the connection, sent at
// sentAt (0 if unknown), arriving at now; delivered if its caller was still
// waiting (not a late answer).
func (l *answerLog) note(seq uint32, sentAt, now int64, delivered bool) {
	if seq == 0 {
		return // never written: cannot be an answer
	}
	if sentAt > l.newestSent.Load() {
		l.newestSent.Store(sentAt)
	}
	if sentAt != 0 && delivered {
		t := now - sentAt
		if l.meanCeiling > 0 {
			t = min(t, l.meanCeiling)
		}
		l.sum += t
		l.n++
	}
	switch {
	case seq < l.lastSeq:
		if seq > l.overtook {
			l.inversions++
		}
		return // the in-order bookkeeping below stays with the latest answer
	case seq == l.lastSeq+1 && sentAt != 0 && sentAt >= l.lastAt:
		t := now - sentAt
		l.spell.add(sentAt, t)
		l.lastAlone = t
		if l.aloneCeiling > 0 {
			t = min(t, l.aloneCeiling)
		}
		l.aloneSum += t
		l.aloneN++
	case seq == l.lastSeq+1 && sentAt != 0:
		l.gapSum += now - l.lastAt
		l.gapN++
		l.noteBusy(now-l.lastAt, sentAt-l.lastSent, l.lastAt-sentAt)
	}
	l.lastSeq, l.lastAt, l.lastSent = seq, now, sentAt
}

// noteBusy records an answer to a call that was waiting when the previous
// answer came, gap after that answer, written sendGap after the previous
// answer's call (meaningless if that was not written: lastSent 0).
//
// An upstream that serves a connection's queries one at a time answers such a
// call a whole service time after the one before, however soon after it the
// call was written: the gap exceeds the send gap (busySlow). One that serves
// them side by side, each in the same time, answers them as far apart as they
// were written: a uniformly slow upstream gives gaps equal to the send gaps,
// which is no evidence of anything. A slow gap weighs more the longer it is
// (slowWeight): a query waiting a whole 100 ms service time behind another is
// what in order costs, and one such sample says as much as many of a
// millisecond; so an upstream that answers a few queries a second is learned
// in order from a few answers, not from seconds of them. (An answer that
// took longer than the usual answer time is no such evidence: a concurrent
// upstream's slow names are slow in themselves, and the hedge sends the next
// query just as long after.) Apart from the gap, an answer that waited
// long for the previous one and then came one service time after it is
// counted as waited (see waitedBehind). wait is how long before the
// previous answer the call was written.
//
// An order check put behind another while the upstream is slow and unknown
// (sideOnly) counts only if served side by side. Its wait is none of the
// pool's cost: the pool put it there on purpose, and gives every other query
// a connection of its own, as forward does. Counted as a slow gap (one
// answer time behind another weighs minSlowEvidence), one check made the
// upstream in order, whose rescues and dials then cost connections forward
// does not open (property seed 64, pareto answers of 124 ms at 1,730 QPS:
// in order learned from a check at 682 ms, 397 connections at once against
// forward's 395; failing 1 replay in 10 with this, 6 without).
func (l *answerLog) noteBusy(gap, sendGap, wait int64) {
	if l.lastSent == 0 {
		sendGap = 0
	}
	excess := gap - max(sendGap, 0)
	side := l.sideSend > 0 && sendGap < l.sideSend && excess < int64(serialGap) && float64(wait+gap) <= sideWait*float64(l.usual)
	if l.sideOnly {
		if side {
			l.busy++
			l.side++
		}
		return
	}
	if l.waitedBehind(gap, sendGap, wait) {
		l.waited++
	}
	switch {
	case gap >= int64(serialGap) && excess >= int64(serialGap):
		w := slowWeight(min(excess, l.ownSpan()))
		l.busy += w
		l.busySlow += max(w, l.orderWeight())
	case gap < int64(serialGap) && sendGap >= int64(minRescueDelay):
		l.busy++
		l.queued++
	case side:
		l.busy++
		l.side++
	default:
		l.busy++
	}
}

// waitedBehind reports whether a busy answer that came gap after the
// previous answer, its call written sendGap after the previous one's and
// wait before the previous answer came, waited behind that one.
//
// In order, such a call is served only once the previous one is: its answer
// comes its own service time after that one (a usual time, give or take),
// however long it waited before. Out of order, its answer comes its own
// answer time after its write: after waiting waitedFactor usual times it is
// a slow answer, and it comes within twice the usual time of the one before
// only by chance, or as far apart as the two were written when both are as
// slow (side by side: a slow spell, which this does not count). Answers that
// come together (sooner than minServiceGap, or a quarter of the usual time,
// apart) show no service time of their own: the server, or this process,
// paused, and every query waited alike, on every connection. So queries
// that wait behind slow ones show in order even while the queue is fed as
// fast as it is served, where the gaps alone (busySlow) show nothing: they
// are then as long as the send gaps. Half a usual time's wait suffices for an
// answer that came about one usual time after the previous (servedAfter).
func (l *answerLog) waitedBehind(gap, sendGap, wait int64) bool {
	if l.servedAfter(gap, sendGap, wait) {
		return true
	}
	u := l.usual
	if u == 0 || wait < waitedFactor*u || wait < int64(serialGap) || gap > 2*u || gap < max(u/4, int64(minServiceGap)) {
		return false
	}
	return l.lastSent != 0 && sendGap > 0 && abs(gap-sendGap) > u/8
}

// servedAfter reports whether a busy answer that came gap after the
// previous answer, having waited wait for it, came one service time after
// it (within three quarters and one and a half usual answer times) after
// waiting at least half a usual time (and serialGap): the sign of in order
// that waitedBehind's waitedFactor misses in a fast upstream fed about as
// fast as it serves, whose queues are one or two deep. Out of order, an
// answer comes its own answer time after its write: to come so long after
// the previous one as well it took one and a quarter usual times or more,
// which an upstream whose answer times spread little never takes, and one
// whose answer times spread widely soon shows out of order by an answer
// that overtakes (overtookLocked). A gap as long as the send gap is no
// sign: two slow answers side by side. serialGap bounds both times from
// below: a fast upstream's (unbound, 0.1 ms) gaps say nothing at this
// scale, and a busy machine's hiccups are longer (property seed 198: in
// order, 1.9 ms answers, 21 % of names 93 times slower, queues of one or
// two behind each answer; in order learned at 171 ms from rescues, the
// queries queued behind the slow names meanwhile held a connection each
// for its own slow answer, 17-19 connections against forward's 15; with
// this and waitedSuffices, learned at 55 ms).
//
// Where the pool keeps one query waiting on its oldest connection and gives
// the rest idle connections (fedOne, see queueOnOldest), each waiting query is
// written right after the answer before it, so the send gaps are the service
// gaps, which the rule above takes for two slow answers side by side. Such
// an answer counts if it took seven quarters of the usual time or more in
// all, while queries alone on the other connections were answered in one:
// out of order, that is a slow answer, and two of them side by side would
// be a slow spell, which slows the queries alone as well (make bench's
// dnsdist-slow shape: never learned in order otherwise, its queries spread
// over the cold start's connections; TestLivenessDialsFailWhileWaiting).
func (l *answerLog) servedAfter(gap, sendGap, wait int64) bool {
	u := l.usual
	if u == 0 || wait < u/2 || wait < int64(serialGap) || gap < int64(serialGap) || gap < 3*u/4 || gap > 3*u/2 {
		return false
	}
	return l.lastSent != 0 && (abs(gap-sendGap) > u/8 || l.fedOne && wait+gap >= 7*u/4)
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// minServiceGap: a busy answer that came sooner than this after the
// previous one came with it (the server wrote both at once, after a pause of
// its own or of this process): no service time of its own shows between
// them, so it shows nothing of waiting behind it (see waitedBehind).
const minServiceGap = 50 * time.Microsecond

// waitedFactor: a busy answer that waited this many usual answer times for
// the previous one, and came like an answer of its own after it, waited
// behind it (see waitedBehind).
const waitedFactor = 2

// slowWeight is what a slow gap of excess (the gap beyond the send gap)
// weighs as evidence of in order: one per slowWeightUnit, one at least and
// minSlowEvidence at most (so that one gap suffices only when it is
// minSlowEvidence units long).
func slowWeight(excess int64) float64 {
	return min(max(float64(excess)/float64(slowWeightUnit), 1), minSlowEvidence)
}

// ownSpan bounds the part of a slow gap that weighs as evidence of in
// order: slowGapSpan usual answer times (no bound while none is known). In
// order, the gap behind the previous answer is the query's own service time,
// about a usual time; what it has beyond is the name's own slowness, which an
// out-of-order upstream shows alike when its answers happen to come in write
// order (property seed 70: out of order, lognormal answers of 23 ms usual;
// two queries written together on the cold start's connection were answered
// 63 ms apart in write order, one gap that weighed minSlowEvidence alone, and
// one gap more learned in order at 119 ms; order checks, one query in 256,
// then corrected it only by luck, 1 run in 10 never, one connection more than
// forward's).
func (l *answerLog) ownSpan() int64 {
	if l.usual == 0 {
		return math.MaxInt64
	}
	return slowGapSpan * l.usual
}

// slowGapSpan: see ownSpan.
const slowGapSpan = 1

// slowWeightUnit: a slow gap weighs one per this much of it (see slowWeight).
const slowWeightUnit = 8 * time.Millisecond

// orderWeight is what a slow gap weighs at least, as evidence of in order,
// when l.others calls were still outstanding on the connection as it came:
// log2(others+1), minSlowEvidence at most. Out of order, the next answer is
// the next call in write order about once in as many times as calls are
// outstanding (fewer, where some came after the previous answer); in order,
// always. So a queue that formed before the mode was known, its answers
// coming one service time apart and in order, shows it within two or three
// answers, not eight: a slow handshake at 2,755 QPS put 41 queries on the
// pool's first connection, its pareto answers came 8-12 ms apart (each gap
// weighing about one), and in order was learned 70 ms after its first
// answer, the queue meanwhile growing on the others (issue 21, seed 29).
//
// Only where the upstream is fast (its usual answer time under unknownSlow):
// its queries are pipelined while the mode is unknown, and the queue that
// grows meanwhile is what in order costs. A slow one gets a query a
// connection anyway; learned in order sooner, its first connection's queue
// was rescued one query at a time as the rescues found connections, more of
// them than forward opened (property seed 119: 129-131 against 127). The
// order's weight beyond the gap's is no busy answer more: counted in busy,
// it thinned the share of waited answers (property seed 13: in order
// learned at 465 ms, not 210).
func (l *answerLog) orderWeight() float64 {
	if l.others < minOrderedQueue || l.usual == 0 || l.usual >= int64(unknownSlow) {
		return 0
	}
	return min(math.Log2(float64(l.others+1)), minSlowEvidence)
}

// minOrderedQueue: orderWeight counts only behind this many outstanding
// calls. Behind fewer, answers in write order are no rarity out of order
// either (calls written apart are answered apart), and weighed so they had
// in order learned before a stall at a loaded client, whose queries then
// each dialled: property seeds 39 and 53 opened more connections than
// forward in 4 and 3 strict runs of 4 (0 and 1 of 8 with this bound; none
// of 15 before orderWeight).
const minOrderedQueue = 8

// collect returns and clears what was noted since the last collect.
func (l *answerLog) collect() answerStats {
	st := l.answerStats
	l.answerStats = answerStats{}
	return st
}

// add adds o's counts to st's.
func (st *answerStats) add(o answerStats) {
	st.inversions += o.inversions
	st.busy += o.busy
	st.busySlow += o.busySlow
	st.queued += o.queued
	st.side += o.side
	st.waited += o.waited
	st.aloneSum += o.aloneSum
	st.aloneN += o.aloneN
	st.sum += o.sum
	st.n += o.n
	st.gapSum += o.gapSum
	st.gapN += o.gapN
	st.depth.merge(o.depth)
}
