package dot

// The depth cost: what a query's place on its connection costs it, out of
// order. An out-of-order upstream is believed to serve any number of a
// connection's queries side by side, so that a few connections filled in turn
// carry any load (pickInTurn). A server that works on at most k queries of a
// connection at once and queues the rest in order (dnsdist's maxInFlight, a
// per-connection worker limit) answers overtaking ones among its k and is
// learned out of order too; then each query written behind d others waits
// about d/k service times more, where forward's, one to a connection, waits
// none (mixed property seed 29: k = 4, 128 a connection, p99 about 350 ms
// against the model's 66).
//
// So every answer delivered while the mode is not in order is noted with the
// depth its call was written at (the calls outstanding on its connection
// then: its write order less the frames read, see call.readsAt) and its
// answer time, and the sweeper fits, minDepthFit answers at a time, the
// answer time's growth per query ahead (a least-squares slope, with its
// standard error: depthFit.slope). Where answer times do not grow with the
// depth (unbound's queries wait, if at all, for what every connection
// shares), the slope stands within a few standard errors of none and
// nothing changes. Where two fits in a row show it, queueBound gives a
// connection no more queries than make the last wait depthFloor more
// (depthBound), and a query that finds every connection full goes as
// pickIdle sends it, an idle connection or a dial of its own, as forward's.
// Mixed seed 85 (2 at once, a limit of 28) then passed in 5 strict runs
// of 5, failing in every one before (p99 2.0 s against 459 ms); 29 went from
// a p99 of 350-390 ms to 90-180 (its queues formed in the 10-20 ms before
// the first fits, on the oldest connections, and nothing moves them), 78's
// from 0.9-1.2 s to 47-67 ms (the model's 34); 88 (8 at once, storms) still
// fails.
//
// Not from one fit: the answers of a load that ends come late, written
// deep (TestRegimeSwitchingUpstream: a twentieth of the names 300 ms slow),
// and one fit of them showed a cost that opened 13-18 connections where 4
// carry it. Nor with the times cut at the mean's ceiling (which kept that
// test at 4 too): the deep answers' waits were cut with them, and the slope
// came out a tenth of what the queue cost (seed 29: 79 µs a query where 4 at
// once of 11 ms answers cost about 2.7 ms).
//
// It adds nothing to the hot path but one atomic load in queueBound; the
// reader adds a load of the mode and five sums per answer.

// depthFit is what a sweep's answers say of answer time against depth: the
// sums for a least-squares line (depth in queries ahead, time in ns).
type depthFit struct {
	n                     int
	sd, st, sdd, sdt, stt float64
}

// add notes one answer: written behind d others, answered after t ns.
func (f *depthFit) add(d, t int64) {
	x, y := float64(d), float64(t)
	f.n++
	f.sd += x
	f.st += y
	f.sdd += x * x
	f.sdt += x * y
	f.stt += y * y
}

// merge adds o's sums to f's.
func (f *depthFit) merge(o depthFit) {
	f.n += o.n
	f.sd += o.sd
	f.st += o.st
	f.sdd += o.sdd
	f.sdt += o.sdt
	f.stt += o.stt
}

// minDepthFit: a sweep fits the slope only from this many answers, and
// minDepthSpread queries' spread of depth (a standard deviation) or more:
// answers all written at one depth say nothing of its cost.
const (
	minDepthFit    = 32
	minDepthSpread = 2
)

// slope returns the answer time's growth per query ahead (ns, 0 if none),
// and whether the answers suffice to tell.
func (f *depthFit) slope() (int64, bool) {
	if f.n < minDepthFit {
		return 0, false
	}
	n := float64(f.n)
	vd := f.sdd/n - (f.sd/n)*(f.sd/n)
	if vd < minDepthSpread*minDepthSpread {
		return 0, false
	}
	cov := f.sdt/n - (f.sd/n)*(f.st/n)
	b := cov / vd
	// The residual variance about the line: a slope within
	// minDepthSignificance standard errors of none is none (a heavy tail's
	// slow names fall at any depth, and a few at the deep end tilt the line).
	vt := f.stt/n - (f.st/n)*(f.st/n)
	res := max(vt-b*cov, 0)
	if b <= 0 || b*b*n*vd < minDepthSignificance*minDepthSignificance*res {
		return 0, true
	}
	return int64(b), true
}

// minDepthSignificance: the standard errors a fitted slope must stand
// above none to count (see slope).
const minDepthSignificance = 3

// learnDepthCost folds a sweep's answers into the fit under way and, once
// it holds minDepthFit answers, its slope into the depth cost (smoothed as
// the answer times are; 1 ns: none shown), and starts the next. A learn
// comes at every tick while queries are out, a few answers each: fitted a
// learn at a time, the answers seldom sufficed. The first cost shown is taken
// as it is: smoothed from none, it took eight fits to bound a queue that
// grew by every query meanwhile.
func (m *serveMode) learnDepthCost(f depthFit) {
	if m.fit.merge(f); m.fit.n < minDepthFit {
		return
	}
	c, ok := m.fit.slope()
	m.fit = depthFit{}
	if !ok {
		return
	}
	if c == 0 {
		m.depthShown = 0
	} else {
		m.depthShown++
	}
	if m.depthCost.Load() <= 1 {
		if m.depthShown >= minDepthShown || c == 0 {
			m.depthCost.Store(max(c, 1))
		}
		return
	}
	ewma(&m.depthCost, c, 1)
}

// minDepthShown: the depth cost is first taken from this many fits in a row
// that show one: the answers of a load that ends come late, written deep,
// and one fit of them shows a cost where none is.
const minDepthShown = 2

// depthFloor: the wait depthBound lets the last query of a connection have
// behind the ones before it: 2 x minWatchInterval, so that a busy machine's
// ticks and batches, which make deep queries wait about that much anyway,
// bound nothing (a real unbound at full load: see docs/design.md). One usual
// answer time instead (depthFloor at least) did no better on mixed seed 29.
const depthFloor = 2 * minWatchInterval

// depthBound returns how many queries a connection takes out of order: all
// its slots, or, where a depth cost was shown, as many as make the last one
// wait depthFloor more than one alone (minQueueDepth at least).
func (p *Pool) depthBound(slots int32) int32 {
	c := p.learned.mode.depthCost.Load()
	if c <= 1 {
		return slots
	}
	d := int64(depthFloor) / c
	if d >= int64(slots) {
		return slots
	}
	return int32(max(d, minQueueDepth))
}

// noteDepthCost notes an answer after t ns to a call written behind d
// others. conn.mu must be held.
func (l *answerLog) noteDepthCost(d, t int64) {
	l.depth.add(max(d, 0), t)
}
