package dot

import (
	"context"
	"errors"
	"time"
)

// Rescues.
//
// A connection is blocked when a query written on it has waited rescueDelay
// with an older one still outstanding and not a single answer read since it was
// written: an in-order upstream serves it only after the older one, which is
// slow (or the connection is dying). A blocked connection takes no new query
// until it reads again, and the queries stuck on it are rescued: each caller is
// told (a notice on its call's resp, errRescued) and sends its query once more,
// on another connection (dialled if need be). The call stays live where it was,
// and the first answer of the two wins; the other attempt is given up, and its
// late answer dropped and counted (DropRescued). Only an unanswered plain
// QUERY on its first attempt is rescued, and a query is never sent more than
// twice (a rescued query is not replayed, nor rescued again).
//
// What a rescue costs is bounded: rescues are at most rescueShare of the
// answers (with a burst of maxRescueBurst), and a connection is not taken for
// blocked while no other connection with queries outstanding reads either,
// which is the upstream (or this machine) pausing, not a slow query.
// A rescue answered sooner than its stuck query had already waited is
// evidence that the upstream serves a connection's queries in order.

const (
	// minRescueDelay is the least a query waits, with nothing read, before it
	// is rescued: more than this machine's scheduling hiccups.
	minRescueDelay = 10 * time.Millisecond
	// rescueFactor: a query is rescued after this many times the usual
	// answer time, if that is longer than minRescueDelay.
	rescueFactor = 8
	// rescueShare caps rescues as a share of the answers, maxRescueBurst the
	// rescues at once.
	rescueShare    = 0.25
	maxRescueBurst = 64
)

// errRescued is a rescue notice: the call is stuck behind a slow answer and the
// caller is to send the query again elsewhere. The call stays live.
var errRescued = errors.New("dot: query stuck behind a slow answer")

// rescueDelay is how long a query may wait with nothing read before it is rescued.
func (p *Pool) rescueDelay() int64 {
	return max(int64(minRescueDelay), rescueFactor*p.learned.mode.base.Load())
}

// blockWatch is the sweeper's view of one connection's reads, for telling when
// it is blocked. Sweeper only.
type blockWatch struct {
	reads  int64 // the connection's frames read at the last tick
	since  int64 // unix ns since when reads has not moved
	others int64 // frames the other connections had read then
}

// watch runs on every tick. It finds blocked connections and rescues the calls
// stuck on them (see rescueLocked), and reports whether any connection has
// calls outstanding and how many frames all have read. late is how much later
// than due the tick came: the time this process did not run is not counted as
// time a connection read nothing.
func (p *Pool) watch(now, late int64, conns []*conn) (busy bool, total int64) {
	reads := p.sizer.reads[:0]
	loaded := 0 // connections with calls outstanding
	for _, c := range conns {
		reads = append(reads, c.reads.Load())
		total += reads[len(reads)-1]
		if c.load.Load() > 0 {
			loaded++
		}
	}
	p.sizer.reads = reads
	delay := p.rescueDelay()
	for i, c := range conns {
		w := &c.watch
		if reads[i] != w.reads || w.since == 0 {
			w.reads, w.since, w.others = reads[i], now, total-reads[i]
		} else {
			w.since = min(w.since+late, now)
		}
		load := c.load.Load()
		if load == 0 {
			continue
		}
		busy = true
		if load < 2 || now-w.since < delay {
			continue
		}
		// Others read during this quiet spell, or no other has anything to read.
		if total-reads[i] > w.others || loaded == 1 {
			c.rescueLocked(now, delay, &p.sizer.tokens)
		}
	}
	return busy, total
}

// rescueLocked marks c blocked if a written call has waited delay with an older
// call outstanding and nothing read since it was written, and sends each such
// call that may be rescued a rescue notice, as far as tokens allow.
func (c *conn) rescueLocked(now, delay int64, tokens *float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state == stateClosed {
		return
	}
	var head uint32 // the oldest written call's seq, tombstones included
	for _, cl := range c.calls {
		if cl.state.Load() == callSent && (head == 0 || cl.seq < head) { // seq is set before the state
			head = cl.seq
		}
	}
	reads := c.reads.Load()
	for _, cl := range c.calls {
		if cl.state.Load() != callSent || cl.seq == head || cl.readsAt.Load() != reads || now-cl.sentAt.Load() < delay {
			continue
		}
		c.blockedAt.Store(reads + 1)
		if cl.tombUntil != 0 || !cl.rescuable || cl.rescued || *tokens < 1 || cl.deadline-now < delay {
			continue
		}
		select {
		case cl.resp <- result{err: errRescued}: // room for it: a live call is completed only under mu
			cl.rescued = true
			*tokens--
		default:
		}
	}
}

// rescue sends q once more, on another connection than c, for its call cl that
// is stuck there, and returns the first answer of the two attempts (see race).
// If no other connection can take it, cl is simply awaited.
func (p *Pool) rescue(ctx context.Context, q *query, deadline time.Time, c *conn, cl *call) (result, bool) {
	r := p.newCall(ctx, q, deadline)
	r.avoid, r.rescuable = c, false
	rc, err := p.acquire(ctx, r)
	if err != nil {
		respChans.Put(r.resp)
		return c.await(ctx.Done(), cl)
	}
	q.resent = true
	p.sizeObs.Rescued()
	defer respChans.Put(r.resp)
	return p.race(ctx.Done(), attempt{c, cl}, attempt{rc, r})
}

// attempt is a call and the connection it is registered on.
type attempt struct {
	c  *conn
	cl *call
}

// race waits for the first answer of a stuck attempt and its rescue and gives
// up the other. An error of one leaves the other to answer; if both fail, the
// last error is returned. A rescue answered sooner than the stuck call had
// waited when it was rescued is counted as evidence of an in-order upstream.
func (p *Pool) race(done <-chan struct{}, stuck, resc attempt) (result, bool) {
	start := nanotime()
	waited := start - stuck.cl.sentAt.Load()
	pending := [2]*attempt{&stuck, &resc}
	var last result
	for pending[0] != nil || pending[1] != nil {
		var res result
		var i int
		select {
		case res = <-respOf(pending[0]):
		case res = <-respOf(pending[1]):
			i = 1
		case <-done:
			return p.giveUpBoth(pending)
		}
		pending[i] = nil
		if !answered(res) {
			last = res
			continue
		}
		if other := pending[1-i]; other != nil {
			if r, ok := other.c.release(other.cl, true); ok && answered(r) {
				p.obs.Dropped(DropRescued) // both were in: the loser's answer goes nowhere
			}
		}
		if i == 1 && nanotime()-start < waited {
			p.rescuesWon.Add(1)
		}
		return res, true
	}
	return last, true
}

// respOf is a pending attempt's result channel, nil (never ready) for none.
func respOf(a *attempt) <-chan result {
	if a == nil {
		return nil
	}
	return a.cl.resp
}

// giveUpBoth ends a race whose caller gave up: both pending attempts are given
// up, and an answer that came meanwhile is still preferred.
func (p *Pool) giveUpBoth(pending [2]*attempt) (result, bool) {
	var got result
	found := false
	for _, a := range pending {
		if a == nil {
			continue
		}
		if r, ok := a.c.release(a.cl, false); ok && (!found || answered(r)) {
			got, found = r, true
		}
	}
	return got, found
}

// answered reports whether a call's result is the upstream's answer (malformed
// or not), as opposed to a failure of the attempt.
func answered(r result) bool { return r.err == nil || errors.Is(r.err, ErrMalformed) }
