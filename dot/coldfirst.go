package dot

// coldFirst reports whether pickInTurn gives a query an idle connection of
// the cold start (one whose dial started before the pool's first answer,
// conn.cold) rather than put it behind a busy one: the mode is unknown, the
// cap auto, a query alone takes longer than a dial (u > d: one put behind a
// busy connection waits longer than a dial of its own would take) and less
// than unknownSlow (slower, each query has a connection of its own anyway,
// and no query waits on the oldest, which fedOne and learn count on), and more
// of the cold start's connections are open than an out-of-order upstream is
// given.
//
// Before its first answer the pool dials one connection per query, as
// forward does, so at a steady rate it opens about what forward opens: the
// rate times an answer's and a dial's time. A first answer under unknownSlow
// then had pickInTurn queue every query on the oldest connection (the
// queueDepth bound is none where a dial is shorter than two spacings), while
// the cold start's connections sat idle: against an in-order upstream
// (dnsdist's DoT in front of a 5 ms backend, 2,000 QPS) the queue grew to
// 40-60 queries before in order was learned, and their rescues took 29-30
// connections where forward held 13 (make bench's dnsdist-slow: 34-45
// against 19-22; TestFastInOrderSteadyLoadNoMoreConnectionsThanForward).
// Those connections are open already: taking one costs no dial, and forward
// would take it.
//
// The oldest connection with room still takes one waiting query
// (minQueueDepth in all): its answers are what the mode is learned from (see
// fedOne). Not where the cold start opened no more than the out-of-order
// cap: at a low rate the queue that forms while the mode is learned is short,
// and spread over the few connections, queries went behind slow names on
// each (property seeds 196 and 198: in order learned at 256 ms rather than
// 55, 20-22 connections against forward's 15 and 21).
func (p *Pool) coldFirst() bool {
	m := &p.learned.mode
	u, d := m.usual.Load(), p.dialTime.Load()
	return p.cfg.MaxConns == 0 && m.get() == ModeUnknown && d > 0 && u > d && u < int64(unknownSlow) &&
		p.coldConns.Load() > AutoMaxConnsOutOfOrder
}
