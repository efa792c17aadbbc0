package dot

// A hold-up of the pool's own process (a GC, a descheduled thread), as a
// late sweeper tick measures it: the answers read after it are dated by
// their arrival (servedBy), and a query's time in service leaves it out
// (noteHoldUp, overdue).

// servedBy is what servingAt says at a tick that saw the reads grow: the
// tick's own time, or, at a tick that runs late (past lateTick), the latest
// arrival of an answer that served a connection's next query (servedAt),
// read since the last stamp. A tick runs late when the pool's process was
// held up (a GC, a descheduled thread on a loaded machine), and the reads it
// sees grow were mostly read before the hold-up: stamped with the tick's
// time, the upstream looked served just now while a query written before the
// hold-up, its answer unread in the socket, looked overdue (overdueAfter),
// and each query of the hold-up's backlog dialled one of its own (make
// bench's unbound regime: bursts of 7-40 dials within a millisecond; with
// the time the tick was due instead, still 5-9 after ticks 4 ms late, the
// due time 4.4-5 ms back, inside the hold-up;
// TestUnknownModeHeldUpPoolDialsNone). A tick on time stamps its own time as
// before: every tick stamped with the latest answer's arrival broke property
// seed 142 (3 replays of 3), where overdueAfter passes over a slow name; in a
// synctest bubble no tick runs late.
func (p *Pool) servedBy(now, late int64, conns []*conn) int64 {
	if late <= int64(lateTick) {
		return now
	}
	at := p.servingAt.Load()
	for _, c := range conns {
		at = max(at, c.servedAt.Load())
	}
	if at == 0 {
		return now // nothing served yet: as a tick on time
	}
	return min(at, now)
}

// lateTick: a sweeper tick that runs later than this after it was due was
// held up (see servedBy). Above the few tens of microseconds a tick runs
// late on an idle machine, and well under a hold-up that makes an answer
// overdue (2 × minWatchInterval).
const lateTick = minWatchInterval / 5

// noteHoldUp records a hold-up of the pool's process that a sweeper tick
// late by late, at now, measured (see lateTick): it ended by now at the
// latest and lasted about late, and no query was served in it by the pool's
// reckoning (see overdue). The length is stored before the end, so that a
// query that reads the new end reads a length at least as recent.
func (p *Pool) noteHoldUp(now, late int64) {
	p.heldFor.Store(late)
	p.heldUntil.Store(now)
}
