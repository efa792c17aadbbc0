package dot

// Before the pool knows how the upstream serves a connection: while the mode
// is unknown and the upstream is slow or not yet timed, each query has a
// connection of its own, as forward gives it (slowUnknown), within a bound
// that keeps a black hole from costing the pool what it costs forward
// (untimedRoom).

const (
	// untimedMaxConns: before the first answer, the most connections a
	// query each once untimedShare of the read timeout has passed since the
	// pool's first query (see untimedRoom).
	untimedMaxConns = 256
	// untimedShare: before the first answer, the pool dials a connection
	// per query, as forward does, beyond untimedMaxConns (up to the in-order
	// cap) for the first 1/untimedShare of the read timeout after its first
	// query (see untimedRoom).
	untimedShare = 8
)

// slowUnknown reports whether the mode is unknown and the upstream slow (its
// usual answer time is unknownSlow or more) or not yet timed. A query put behind another
// may then wait a whole answer time for it, and nothing shows yet that it need
// not; forward would have given it a connection of its own. A burst shares
// a connection while the upstream is not yet timed, and order checks go
// behind another query now and then (see pickIdle): their answers show how
// the upstream serves a connection. A fast upstream is pipelined from its
// first answer on.
func (p *Pool) slowUnknown() bool {
	if p.cfg.MaxConns > 0 || p.learned.mode.get() != ModeUnknown {
		return false
	}
	switch u := p.learned.mode.usual.Load(); {
	case u == 0:
		// Before the first connection too: a query that comes while its
		// dial is under way dials one of its own, unless it is of the
		// burst that started it (see firstDialBurst). Shared, the dial of
		// an upstream that
		// shakes hands slowly gathered every query of the handshake's time
		// on one connection, and an in-order upstream served them one
		// after the other (issue 21, seeds 79, 149). A pool that has
		// opened untimedMaxConns without an answer is likelier in front of
		// a black hole than a slow upstream, unless the load is high
		// enough to need them within a plausible answer time: see
		// untimedRoom.
		return p.untimedRoom()
	default:
		return u >= int64(unknownSlow) || p.lightQueueDear(u)
	}
}

// lightQueueDear reports whether an upstream answering in u, sooner than
// unknownSlow, is served a query a connection all the same (slowUnknown):
// u is half unknownSlow or more and queueDials dials or more, and fewer than
// lightTurnover queries come in an answer time (turnover). There a fast
// upstream's dearQueue bet (the oldest connection holds a second query, whose
// answer shows the mode) puts a query a whole answer time behind another,
// queueDials handshakes and more, where forward's, on a connection of its
// own, waits one handshake; and so few queries are out that the mode is
// learned late or never, and the bet is lost again at each queue (past the
// CI range, property seeds 470, 472, 544 and 600: 6-9 ms answers, 0.2-1.2 ms
// handshakes, 20-523 QPS; p99 17 ms against forward's 9.4, or a connection
// more than forward's at a storm's peak, in every run;
// TestLightLoadSlowishUpstreamQueuesNothing). A query a connection costs
// forward's few connections there. Under a heavier load the bet pays: an
// out-of-order upstream learned so goes back to a few connections (served
// a query a connection, TestFastOutOfOrderSteadyLoadLearnedSideBySide held
// 12 after 2 s against 4), and queries come close enough for the queue's
// answers to teach in order within a few answer times.
func (p *Pool) lightQueueDear(u int64) bool {
	d := p.dialTime.Load()
	return 2*u >= int64(unknownSlow) && d != 0 && u >= queueDials*d && p.turnover.Load() < lightTurnover
}

const (
	// queueDials: a query a connection while the mode is unknown where an
	// answer time is this many dials or more, under a light load (see
	// lightQueueDear).
	queueDials = 4
	// lightTurnover: a load under which fewer than this many queries come
	// in a usual answer time is light (see lightQueueDear).
	lightTurnover = 5
)

// untimedRoom reports, before the first answer, whether a query may still
// have a connection of its own (slowUnknown). Before an answer, a slow
// upstream and a black hole look the same: forward holds a connection for
// each query outstanding, arrivals × the time since the first query, and in
// front of a black hole arrivals × the read timeout, without bound. The pool
// holds as many as forward while its first query has waited less than
// 1/untimedShare of the read timeout (up to the in-order cap, the most it
// holds for an upstream answering in order): an upstream that answers
// within that is merely slow, and a load that needs more connections than
// untimedMaxConns in that time gets them (issue 21, steady property seed
// 30: 169.5 ms answers at 4,865 QPS need 838 connections; capped at 256 at
// 54 ms, the rest queued in turn, p99 500 ms against forward's 182, 1,232
// connections against 838). Past that time, and still no answer, the pool
// is likelier in front of a black hole: it keeps untimedMaxConns at most
// (its connections and waiting room stay bounded, as the out-of-order cap
// keeps them), and a black hole costs it at most 1/untimedShare of what it
// costs forward.
func (p *Pool) untimedRoom() bool {
	n := len(*p.conns.Load())
	switch {
	case n < untimedMaxConns:
		return true
	case n >= AutoMaxConnsInOrder:
		return false
	}
	since := p.untimedSince.Load()
	return since != 0 && nanotime()-since < int64(p.cfg.ReadTimeout/untimedShare)
}
