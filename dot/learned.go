package dot

import (
	"math"
	"slices"
	"sync/atomic"
	"time"
)

// learned is what a pool learns of its upstream from how it behaves. Each item
// expires, so that a change of the upstream's behaviour is noticed. What the hot
// path reads of it are atomics.
type learned struct {
	limit   queryLimit
	records recordVerdict
	mode    serveMode
}

// learnedTTL is how long what the pool learns of its upstream holds, at most.
const learnedTTL = 10 * time.Minute

// verdict is what the pool knows of how its upstream reads TLS records (see
// records.go).
type verdict int32

const (
	verdictNone    verdict = iota // no verdict yet, or it expired: one query per record
	verdictTrial                  // a connection is finding out: one query per record
	verdictShared                 // the upstream reads every query of a record
	verdictOwn                    // it reads only the first until more bytes come: a record each
	verdictStopped                // a trial was stopped by a block (see conn.stopTrial): one query per record, no trial for ownTTL
)

// recordVerdict holds the record verdict and when it expires, on the pool's clock.
type recordVerdict struct {
	v        atomic.Int32 // a verdict
	until    atomic.Int64 // pool clock until which verdictShared, verdictOwn or verdictStopped holds
	reported atomic.Int32 // the last verdict reported to the observer
	ownRun   atomic.Int32 // verdictOwn verdicts in a row
}

// get returns the verdict in force; an expired one is verdictNone.
func (r *recordVerdict) get(now int64) verdict {
	v := verdict(r.v.Load())
	if v >= verdictShared && now > r.until.Load() {
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
	case verdictStopped:
		// No verdict, but no trial either for a while: one started
		// again at once, in the same stall, held the writes again until
		// the next block, tick after tick (TestLivenessInOrderMaxConns).
		ttl = ownTTL
	}
	r.until.Store(now + int64(ttl))
	r.v.Store(int32(v))
	if v == verdictNone || v == verdictStopped {
		return false
	}
	return verdict(r.reported.Swap(int32(v))) != v
}

// Mode is how the upstream serves the queries of one connection, as the pool
// learned it from the order and timing of their answers.
type Mode int32

// Modes.
const (
	// ModeUnknown: not learned yet, or the evidence expired. The pool treats
	// the upstream as ModeOutOfOrder: few, full connections.
	ModeUnknown Mode = iota
	// ModeOutOfOrder: an answer overtook a query written before it, so the
	// upstream serves a connection's queries concurrently. A few deep
	// connections carry any load, and batch best.
	ModeOutOfOrder
	// ModeInOrder: the upstream answers a connection's queries one at a time,
	// in order, and a query waits for every one written before it. Each query
	// goes to a connection with nothing outstanding if there is one, and the
	// pool opens as many connections as the load needs.
	ModeInOrder
	modeCount
)

var modeNames = [...]string{"unknown", "out_of_order", "in_order"}

func (m Mode) String() string {
	if m < 0 || m >= modeCount {
		return "unknown"
	}
	return modeNames[m]
}

// serveMode is the learned Mode and the evidence behind it. The sweeper owns
// everything but the atomics, which the hot path and the watch read.
//
// Every belief is held by decayed counts of what answers keep showing, and
// left only on evidence at least as strong as what made it: no one reading
// flips a mode, and nothing bars one for a time (see update).
type serveMode struct {
	mode  atomic.Int32 // a Mode
	usual atomic.Int64 // ns: the upstream's usual answer time to a query alone on its connection; 0: none yet
	mean  atomic.Int64 // ns: the mean answer time of all queries, smoothed
	// spacing: ns, how far apart a busy connection's answers come (each
	// after the one before, its call written before that one came),
	// smoothed; 0: none yet. In order, a query waits a spacing for each one
	// written before it on its connection (see Pool.queueDepth)
	spacing atomic.Int64
	// depthCost: ns, how much longer out of order a query's answer takes
	// for each query written before it and outstanding on its connection,
	// smoothed; 0 or 1: none shown (see depthcost.go)
	depthCost  atomic.Int64
	fit        depthFit    // the answers fitted toward the next depth cost (see learnDepthCost)
	depthShown int         // the fits in a row that showed a depth cost (see learnDepthCost)
	rescue     atomic.Bool // rescues won lately: a hint of in-order before the evidence suffices
	// spreadless: gainless is set (a query a connection was left as
	// sparing no wait), for the hot path (see dearQueue)
	spreadless atomic.Bool
	waits      atomic.Bool // answers or rescues showed queries waiting behind others lately (see rescue.go)
	// firstOnly: usual rests on the connections' first answers alone (the
	// pool's first, or their median: see firstAnswer), which the first
	// learn that times a query alone replaces rather than joins: one slow
	// first answer (a cold cache upstream) is not the usual time
	firstOnly atomic.Bool
	// firsts: while firstOnly, each connection's first answer time (its
	// first query went alone), firstCount of them (see firstAnswer).
	firsts     [firstAnswers]atomic.Int64
	firstCount atomic.Int32
	// slowKept and busyKept: the decayed counts of slow gaps and busy
	// answers (acc.busySlow, acc.busy) that the next update keeps, in
	// thousandths: what a connection's new ones add to (see slowSuffices)
	slowKept, busyKept atomic.Int64
	// waitedKept: likewise of the waited answers (acc.waited), and
	// waitedSince: the waited answers noted on every connection since the
	// last update (see waitedSuffices)
	waitedKept, waitedSince atomic.Int64

	until        int64    // unix ns until which mode holds without new evidence
	inverted     int64    // unix ns of the last answer out of order seen
	acc          evidence // decayed: each update keeps 7/8 of it (inversions unused)
	inOrderUsual int64    // ns: the least usual answer time since the mode last became in-order
	crowded      float64  // decayed: updates in order whose queries alone were answered fourfold slower than inOrderUsual
	// sideSlow: the slow gaps decayed as acc.side is, with each update that
	// saw busy answers, not with every one: what side by side is weighed
	// against (see decide), or a quiet spell in order, fading the slow gaps
	// and not the side-by-side answers, would tip the balance with no new
	// evidence
	sideSlow float64
	// gainless: ns, the mean answer time a query a connection when that
	// was last left (in order as crowded, or in order or slow and unknown
	// for side-by-side answers): in order again only if the mean answer
	// time on few connections is gainFactor times that (0: none measured)
	gainless int64
}

// Thresholds of the mode decision (see serveMode.update).
const (
	minRescueEvidence = 2 // rescues won (decayed count) that make an upstream in-order
	minSlowEvidence   = 8 // busy answers at least serialGap apart (decayed count)...
	minSideEvidence   = 3 // busy answers served side by side (decayed count)...
	// sideShare: ...this share of the slow gaps or more: queries written
	// together are served together often enough that more connections
	// would not spare them a wait. In order took slow gaps three times the
	// rest (slowShare); side-by-side answers half as many as the slow gaps
	// leave it.
	sideShare = 0.5
	slowShare = 0.75 // ...that are this share of the busy answers
	// minWaitedEvidence: busy answers that waited behind the previous one
	// (decayed count, see waitedBehind), waitedShare of the busy answers
	// or more, make an upstream in-order. Four, not minSlowEvidence's
	// eight: each is a query shown waiting a service time behind another,
	// and while a fast upstream's burst is pipelined before in order is
	// learned, its queue grows by its arrivals every service time, each
	// of them then waiting the whole queue (issue 21, property seed 78:
	// in order learned 56 ms into a burst of 3-4 ms answers, 40 with four).
	minWaitedEvidence = 4
	waitedShare       = 0.25
	// gainFactor: after a query a connection was left (see gainless), slow
	// gaps or waited answers make it in order again only while the mean
	// answer time is this many times what it was then: more connections
	// would halve it.
	gainFactor = 2
	// minCrowdedEvidence: in order, this many (decayed count) full sweeps in
	// which queries alone on their connection were answered crowdedFactor
	// times (and crowdedMargin) slower than when the mode was learned make
	// the upstream unknown again.
	minCrowdedEvidence = 4
	crowdedFactor      = 4
	crowdedMargin      = 2 * time.Millisecond
	// outOfOrderQuiet: no evidence of in-order counts until this long after
	// the last answer out of order.
	outOfOrderQuiet = time.Second
)

// get returns the mode in force.
func (m *serveMode) get() Mode { return Mode(m.mode.Load()) }

// update folds what the answers showed since the last update (e, and alone:
// the mean answer time of queries alone on their connection, 0 if none) into
// the mode. It reports the mode and whether it changed.
//
// An answer out of order makes the upstream out-of-order at once (an in-order
// server never does that). With none for outOfOrderQuiet, rescues that won by
// far (see conn.judgeLocked) make it in-order, and so do answers that keep
// coming a full serialGap apart (minSlowEvidence of them, slowShare of those
// queued behind another), and so do queries that waited behind a slow answer
// and came one service time after it (minWaitedEvidence, waitedShare of the
// busy answers, see waitedBehind): the pool serves worse than in order would,
// queries waiting behind others on few connections while the answers come one
// service time apart, whatever the mode was.
//
// In order, a query has a connection to itself and is answered in about the
// usual time. If that time stays crowdedFactor times (and crowdedMargin) what
// it was since the mode was learned for minCrowdedEvidence sweeps, the
// upstream is rather a busy one whose queries wait for its CPU, not for each
// other, and more connections only make it busier (unbound at full load
// serves its connections in turn: the more, the longer each waits): the mode
// is unknown again, and the mean answer time in order is kept (gainless).
// Slow gaps make it in order again once the mean answer time on few
// connections is gainFactor times that: more connections would then shorten
// the waits, which is the test of in-order measured anew at every sweep,
// rather than a bar for a time. One slow reading (a handshake storm on a
// loaded machine) leaves nothing. Order checks answered side by side with the
// query before them (minSideEvidence, sideShare of the slow gaps) make an
// upstream taken for in order, or slow and unknown, out of order, keeping the
// mean answer time as gainless too: a query a connection spares them no wait
// (unbound's one thread serving its connections in turn). Slow gaps, waited
// answers or rescues that win make it in order again as above. A mode holds
// learnedTTL past its last evidence, then is unknown again.
func (m *serveMode) update(e evidence, alone, now int64) (Mode, bool) {
	m.decay(e)
	if e.inversions > 0 {
		m.inverted = now
	}
	old := m.get()
	next := m.decide(old, e, alone, now)
	if next != old && next != ModeInOrder {
		// What was evidence of in-order says nothing of the new upstream.
		m.acc, m.crowded, m.sideSlow = evidence{}, 0, 0
	}
	m.mode.Store(int32(next))
	m.spreadless.Store(m.gainless != 0)
	m.rescue.Store(m.acc.rescued >= 0.5)
	m.waits.Store(m.acc.rescued >= 0.5 || m.acc.queued >= 0.5)
	m.slowKept.Store(int64(m.acc.busySlow * 7 / 8 * 1000))
	m.busyKept.Store(int64(m.acc.busy * 7 / 8 * 1000))
	m.waitedKept.Store(int64(m.acc.waited * 7 / 8 * 1000))
	m.waitedSince.Store(0)
	return next, next != old
}

// slowSuffices reports whether slow gaps weighing slow, among busy answers
// weighing busy, seen since the last update, make the slow gaps suffice to
// learn in order (see decide): an update now would learn it. Asked by
// readers, to learn at once rather than at the sweeper's next tick; an
// update asked for sooner than that with too little would only decay the
// evidence sooner (it decays by update, not by time).
func (m *serveMode) slowSuffices(slow, busy float64) bool {
	slow += float64(m.slowKept.Load()) / 1000
	busy += float64(m.busyKept.Load()) / 1000
	return slow >= minSlowEvidence && slow >= slowShare*busy
}

// waitedSuffices counts one more waited answer since the last update, among
// busy answers weighing busy on its connection, and reports whether the
// waited answers would make an update learn in order now (see decide). Asked
// by readers while the mode is unknown, to learn at the sweeper's next tick
// rather than at the next full sweep. Counted across the connections, not on
// one: a fast upstream's queues that form while the mode is unknown are one
// or two deep, on a connection or two, and no one connection's answers
// reached minWaitedEvidence before the full sweep (property seed 198: two
// connections with two waited answers each at 54 ms, in order learned at
// the full sweep at 102 ms, meanwhile 13 queries queued behind a slow name,
// each to hold a connection for its own slow answer as it was rescued;
// learned at the next tick, 55 ms). The busy answers of other connections
// are left out: the share is only the first bar, decide weighs all.
func (m *serveMode) waitedSuffices(busy float64) bool {
	waited := float64(m.waitedSince.Add(1)) + float64(m.waitedKept.Load())/1000
	busy += float64(m.busyKept.Load()) / 1000
	return waited >= minWaitedEvidence && waited >= waitedShare*busy
}

// decay folds e into the decayed evidence.
func (m *serveMode) decay(e evidence) {
	a := &m.acc
	a.rescued = a.rescued*7/8 + e.rescued
	a.busy = a.busy*7/8 + e.busy
	a.busySlow = a.busySlow*7/8 + e.busySlow
	a.queued = a.queued*7/8 + e.queued
	a.waited = a.waited*7/8 + e.waited
	if e.busy > 0 {
		// Side-by-side evidence comes only from order checks while queries
		// go one to a connection, a few a second: it fades with each
		// update that saw busy answers, not with time, or it would never
		// add up; and so do the slow gaps it is weighed against.
		a.side = a.side*7/8 + e.side
		m.sideSlow = m.sideSlow*7/8 + e.busySlow
	}
}

// decide is update's decision, from the mode old.
func (m *serveMode) decide(old Mode, e evidence, alone, now int64) Mode {
	a, usual := &m.acc, m.usual.Load()
	slowGaps := a.busySlow >= minSlowEvidence && a.busySlow >= slowShare*a.busy
	waited := a.waited >= minWaitedEvidence && a.waited >= waitedShare*a.busy
	gain := old == ModeInOrder || m.mean.Load() >= gainFactor*m.gainless
	switch {
	case e.inversions > 0:
		m.until, m.gainless = now+int64(learnedTTL), 0
		return ModeOutOfOrder
	case old != ModeOutOfOrder && a.side >= minSideEvidence && a.side >= sideShare*m.sideSlow:
		// Order checks answered side by side with the query before them
		// (a slow upstream answering the queries of a connection each in
		// the same time: none waited for the one before), which an
		// upstream serving a connection's queries one at a time never
		// does. Slow gaps among them are waits for its turn among the
		// connections (unbound's one thread serving hundreds in turn),
		// which more connections lengthen: few, full ones serve it
		// better, and in order comes back only where the mean answer time
		// is gainFactor times what it was a query a connection (gainless).
		m.until, m.gainless = now+int64(learnedTTL), m.mean.Load()
		return ModeOutOfOrder
	case old == ModeInOrder && m.crowdedBy(alone) >= minCrowdedEvidence:
		m.gainless = m.mean.Load()
		return ModeUnknown
	case now-m.inverted < int64(outOfOrderQuiet):
	case a.rescued >= minRescueEvidence || (slowGaps || waited) && gain:
		if e.rescued > 0 || e.busySlow > 0 || e.waited > 0 || old != ModeInOrder {
			m.until = now + int64(learnedTTL)
		}
		if old != ModeInOrder || m.inOrderUsual == 0 || usual != 0 && usual < m.inOrderUsual {
			m.inOrderUsual = usual // 0 until a query alone on its connection was answered
		}
		return ModeInOrder
	}
	if now > m.until {
		return ModeUnknown
	}
	return old
}

// crowdedBy folds a sweep's answer time of queries alone on their connection
// (0: none) into the crowded count and returns it.
func (m *serveMode) crowdedBy(alone int64) float64 {
	if alone == 0 || m.inOrderUsual == 0 {
		return m.crowded
	}
	m.crowded *= 7.0 / 8
	if alone > crowdedFactor*m.inOrderUsual && alone > m.inOrderUsual+int64(crowdedMargin) {
		m.crowded++
	}
	return m.crowded
}

// learnTimes folds a sweep's answer times into the usual answer time (of
// queries alone on their connection) and the mean answer time, each an average
// over about eight sweeps with samples.
func (m *serveMode) learnTimes(st answerStats) {
	if st.aloneN > 0 && m.firstOnly.Swap(false) {
		m.usual.Store(max(st.aloneSum/int64(st.aloneN), 1))
	} else {
		ewma(&m.usual, st.aloneSum, st.aloneN)
	}
	ewma(&m.mean, st.sum, st.n)
	ewma(&m.spacing, st.gapSum, st.gapN)
	m.learnDepthCost(st.depth)
}

func ewma(v *atomic.Int64, sum int64, n int) {
	if n == 0 {
		return
	}
	sample, old := sum/int64(n), v.Load()
	if old == 0 {
		v.Store(max(sample, 1)) // 1 ns at least: 0 is "no sample yet"
		return
	}
	v.Store(old + (sample-old)/8)
}

// ceiling is what an answer time counts at most toward the average v: twice
// the average and a millisecond, none before the first sample.
func ceiling(v *atomic.Int64) int64 {
	if a := v.Load(); a != 0 {
		return 2*a + int64(time.Millisecond)
	}
	return math.MaxInt64
}

// firstAnswers is how many connections' first answers firstAnswer weighs
// before the first full sweep averages every answer alone.
const firstAnswers = 4

// firstAnswer notes a connection's first answer time (its first query went
// alone). The pool's first answer sets usual at once, not at the next full
// sweep: until then the upstream is untimed (see slowUnknown). While usual
// rests on that answer alone (firstOnly), the median of the first answers
// noted replaces it once that median is unknownSlow or more: one quick first
// answer from a slow upstream made it look fast until the first full sweep,
// and the pool queued queries behind one another where forward dialled
// (issue 21, property seed 131: a 9.3 ms first answer of a 36 ms lognormal,
// queues 10 deep). Below unknownSlow the pool's first answer stands: a fast
// upstream's first answers differ by chance only, and a median there moved
// the early picks of seed 28 (3.2 ms raised to 6.9) and cost it a connection
// over forward's 12 at a later storm in 3 replays of 4. A median of three or
// more below unknownSlow replaces a usual at or above it (a slow first answer,
// or the slower of two). The window ends at the first learn that times a query
// alone (learnTimes), the sweeper's or one a reader asked for.
func (m *serveMode) firstAnswer(took int64) {
	if m.usual.CompareAndSwap(0, took) {
		m.firstOnly.Store(true)
	}
	if !m.firstOnly.Load() {
		return
	}
	i := int(m.firstCount.Add(1) - 1)
	if i >= firstAnswers {
		return
	}
	m.firsts[i].Store(took)
	var v [firstAnswers]int64
	k := 0
	for j := range i + 1 {
		if t := m.firsts[j].Load(); t != 0 { // 0: another reader's, not yet stored
			v[k] = t
			k++
		}
	}
	slices.Sort(v[:k])
	// usual is read before firstOnly: a sweep that averages the answers
	// between them changes usual, and the swap below fails rather than
	// replace the average.
	u, med := m.usual.Load(), v[k/2]
	if !m.firstOnly.Load() {
		return
	}
	if med >= int64(unknownSlow) || k >= 3 && u >= int64(unknownSlow) {
		// Of two answers the upper median is the slower: one cold-cache
		// answer among fast ones raised usual ({3, 40} ms: 40). A median
		// of three or more puts it back below unknownSlow, and it takes
		// the place of a slow first answer of the pool's too.
		m.usual.CompareAndSwap(u, med)
	}
}
