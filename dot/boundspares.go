package dot

// The depth bound's spares: while the mode is unknown, a query that finds
// every connection queueDepth deep dials one of its own (dialForWaiter), and
// takes whichever comes first, the dial or a slot that frees. Where the slot
// comes first, the dial opens with nobody waiting for it: a spare, which then
// takes queries under the bound like any connection. Against an upstream
// whose one thread serves every connection in turn, writing each answer as it
// has it (unbound with num-threads 1), a connection more serves no query
// sooner, and the spares piled up: behind 100 µs handshakes, 13-27
// connections at 25,000-30,000 QPS, where one served the load with a lower
// p99 (TestSpacedAnswersUpstreamKeepsFewConnections). Nothing the pool times
// tells that upstream from one that serves each connection on its own (a
// query alone waits a round of the thread's turns, as a busy connection's
// answers come a round apart: queueShared cannot see it), but the spares do:
// the bound bought nothing for their queries.

const (
	// boundSparesOff: this many spares since the last dial of the bound
	// that a query still waited for lift the bound (queueDepth).
	boundSparesOff = 4
	// boundSparesOn: the bound holds again once the spares have decayed
	// below this many.
	boundSparesOn = 1
	// boundSpareDecay: each full sweep takes 1/boundSpareDecay of the spare
	// count: from boundSparesOff to boundSparesOn in about 90 sweeps, 9 s
	// at the usual 100 ms, about the idle timeout after which the spares
	// left idle by the lifted bound have closed.
	boundSpareDecay = 64
)

// noteBoundDialLocked is for a dial that ended, opened or not: if it was one
// started for a query the depth bound turned away (p.boundDials, see
// dialForWaiter) and it opened with no query waiting for it beyond those
// the dials still under way are for, it counts as a spare; one that a query
// still waited for clears the count: the bound spared that query a queue.
func (p *Pool) noteBoundDialLocked(opened bool) {
	if p.boundDials == 0 {
		return
	}
	p.boundDials--
	if !opened {
		return
	}
	if p.owedDials() <= p.dials {
		p.boundSpare++
	} else {
		p.boundSpare = 0
	}
	p.boundOff.Store(p.boundSpare >= boundSparesOff)
}

// decayBoundSparesLocked is a full sweep's decay of the spare count.
func (p *Pool) decayBoundSparesLocked() {
	p.boundSpare -= p.boundSpare / boundSpareDecay
	if p.boundSpare < boundSparesOn {
		p.boundOff.Store(false)
	}
}
