package dot

import (
	"context"
	"math"
	"slices"
	"sync/atomic"
)

// The dials under way, and the dropping of a waiter's dial that no query
// needs any more.
//
// Where queries go one to a connection (oneEach), a query that finds none
// idle dials one of its own and takes whichever comes first, that dial or a
// busy connection that frees (dialForWaiter, acquireSlow); a dial it leaves
// goes to the next query that finds none idle. forward's query waits for its
// own dial instead, and the connection that freed meanwhile stays idle for
// the next query. So the pool holds no more connections than forward for it,
// but where a connection is idle and no waiting query is owed a dial, a
// waiter's dial still under way serves nobody: done, it is one connection
// more than the load holds. Where idle connections are many more than the
// queries coming could take, it is dropped (its handshake cancelled): a query
// that comes next takes an idle connection, as forward's would, or, finding
// none, dials.
//
// This is where a pause of the upstream ends (property seed 94: in order, a
// 268 ms stall with a 16 ms handshake): during the pause every query that
// came dialled, as forward's did, and as it ended and every busy connection
// freed at once, the queries waiting took those, and the dials of the last
// handshake's time, eight, were each a connection more at the peak: 276
// against forward's 273, whose queries each waited for the one it dialled
// (268 with them dropped). Seed 132's load ended so (1,185 queries at 2,784
// QPS, a 37 ms handshake): 25 dials done after its peak need took none,
// 246 connections against forward's 242.

// dialRun is one dial under way.
type dialRun struct {
	from    int64           // unix ns: when it started
	ctx     context.Context // its handshake's, from the pool's: Close ends every dial, cancel this one
	cancel  context.CancelFunc
	waiter  bool        // started for a query that waits for a connection of its own (startDialLocked)
	dropped atomic.Bool // cancelled by dropSurplusDials: its error is no failure of the upstream
}

// startRunLocked records a dial that starts now. p.mu must be held.
func (p *Pool) startRunLocked(waiter bool) *dialRun {
	run := &dialRun{from: nanotime(), waiter: waiter}
	run.ctx, run.cancel = context.WithCancel(p.ctx)
	p.dialRuns = append(p.dialRuns, run)
	p.oldestDial.Store(p.dialRuns[0].from)
	if waiter {
		p.waiterRuns.Add(1)
	}
	return run
}

// dialDoneLocked takes run out of the dials under way. p.mu must be held.
func (p *Pool) dialDoneLocked(run *dialRun) {
	if i := slices.Index(p.dialRuns, run); i >= 0 {
		p.dialRuns = slices.Delete(p.dialRuns, i, i+1)
	}
	var oldest int64
	if len(p.dialRuns) > 0 {
		oldest = p.dialRuns[0].from
	}
	p.oldestDial.Store(oldest)
	if run.waiter && !run.dropped.Load() {
		p.waiterRuns.Add(-1)
	}
}

// dropSurplusDials cancels the waiters' dials under way beyond those the
// waiting queries are owed (owedDials), the newest first, one for each
// connection idle beyond keep: one, and the burst (arrivalBurst) of the
// queries that come in a dial's time or a usual answer time, the longer
// (turnover). The idle ones serve the arrivals above their mean until busy
// ones free, answers freeing connections about as fast as queries come.
// Dropped with any connection idle, the dials left the pool short of one it
// dialled for later, and some query waited meanwhile: property seeds 11, 29
// and 37 over forward (a connection more at once, or p99 89 ms against 67),
// in 4 strict runs of 4. Asked as a slot frees (slotFreed) and as a waiting
// query leaves (acquireSlow): the reader asks on every answer while a dial
// is under way, so that the lock is taken only once the counts off it (a
// dial under way, more waiters' dials than owed, more idle than keep) call
// for a drop. Taken whenever waiters' dials were more than owed, it changed
// the order goroutines ran in at the same instant, and property seed 2 (in
// order, 0.3 ms handshakes, a connection over forward's 328 or not) failed
// in 7 strict runs of 12 against 3 of 22 on the base, and in 3 replays of 8
// in which no dial was dropped; with the counts first, in 2 replays of 10,
// as on the base.
func (p *Pool) dropSurplusDials() {
	if p.dialing.Load() == 0 || p.waiterRuns.Load() <= int32(p.owedDials()) || !p.oneEach() {
		return
	}
	keep := 1 + int(math.Ceil(arrivalBurst(float64(p.turnover.Load()))))
	if countConns(*p.conns.Load()).idle <= keep {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	surplus := min(int(p.waiterRuns.Load())-p.owedDials(), countConns(*p.conns.Load()).idle-keep)
	for i := len(p.dialRuns) - 1; i >= 0 && surplus > 0; i-- {
		if run := p.dialRuns[i]; run.waiter && !run.dropped.Load() {
			run.dropped.Store(true)
			p.waiterRuns.Add(-1)
			run.cancel()
			surplus--
		}
	}
}
