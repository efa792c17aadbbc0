package dot

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Exchange sends m upstream and returns the answer with m's ID and question case.
// m is not modified. The attempt is bounded by ReadTimeout and by ctx. Unless
// NoCoalesce is set, a query identical to one whose flight is open waits for that one's
// answer instead of going upstream (see coalesce.go).
func (p *Pool) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	return p.ExchangeDeadline(ctx, m, time.Time{})
}

// ExchangeDeadline is Exchange with a deadline of the caller's besides ctx's (zero:
// none), so that a caller does not have to allocate a context and a timer per
// query. Reaching it fails with an error that wraps context.DeadlineExceeded.
func (p *Pool) ExchangeDeadline(ctx context.Context, m *dns.Msg, deadline time.Time) (*dns.Msg, error) {
	q, err := prepareQuery(m, p.cfg.PadBlock, !p.cfg.NoKeepalive)
	if err != nil {
		return nil, err
	}
	if p.flights == nil {
		return p.exchange(ctx, q, deadline)
	}
	// coalesce.go: identical queries go upstream once. The leader's exchange runs
	// from this frame rather than from one more below it: this goroutine's stack
	// is the client's query's, and a deeper one costs a stack copy per query.
	if r, done, err := p.joinFlight(ctx, q, deadline); done {
		return r, err
	}
	r, err := p.exchange(ctx, q, deadline)
	p.flights.fail(q, err)
	return r, err
}

// exchange runs q's attempts: moves to another connection, a rescue from a
// blocked one, and replays (see replayable).
func (p *Pool) exchange(ctx context.Context, q *query, deadline time.Time) (*dns.Msg, error) {
	for moves := 0; ; {
		cl := p.newCall(ctx, q, deadline)
		c, err := p.acquire(ctx, cl)
		if err != nil {
			p.respChans.Put(cl.resp)
			return nil, err
		}
		res, ok := c.await(ctx.Done(), cl)
		if ok && res.err == errRescued {
			res, ok = p.rescue(ctx, q, deadline, c, cl)
		}
		p.respChans.Put(cl.resp)
		if !ok {
			return nil, ctx.Err()
		}
		if res.err == nil || errors.Is(res.err, ErrMalformed) {
			return res.msg, res.err
		}
		switch {
		case errors.Is(res.err, ErrTimeout) && cl.callerDeadline:
			// The caller's own deadline: say so, so it is not taken for a slow upstream.
			return nil, wrap(res.err, context.DeadlineExceeded)
		case errors.Is(res.err, errUnsent) && moves < p.capConns():
			moves++ // never written: another connection, at no cost
		case p.replayable(ctx, q, res.err) && (deadline.IsZero() || time.Now().Before(deadline)):
			q.resent = true // no rescue after a replay
			q.replays++
			q.noteCut(res.err)
			p.obs.Replayed()
		case errors.Is(res.err, errUnsent):
			return nil, wrap(ErrConnLost, res.err)
		default:
			return nil, res.err
		}
	}
}

// replayable reports whether a query whose written attempt failed may be sent again:
// only a plain QUERY (idempotent), only if its connection had answered before (a
// connection that never answered tells nothing good about the next one, even in
// a restart: a query that made the server close its connection, and others
// with it, is not sent again), only if
// the caller still has time; a rescued query is not replayed (it was written
// twice already). A replay whose connection the server cut in turn is
// replayed again, up to maxReplays times in all: a server that cuts
// connections after a few queries cuts the replay's too until the pool learns
// its limit (two like cuts, see learnLimit), and forward, which takes another
// connection whenever a reused one was cut, answers those queries. A stall or
// an error ends the replays at one.
func (p *Pool) replayable(ctx context.Context, q *query, err error) bool {
	var lost *connLostError
	if !errors.As(err, &lost) || !lost.replayable || q.opcode != dns.OpcodeQuery || ctx.Err() != nil {
		return false
	}
	if errors.Is(lost.cause, errBeyondLimit) {
		// Moved by the pool itself, past a limit it just learned or a
		// connection that fell silent (see evictBeyondLocked), not lost:
		// whatever the query went through before (a rescue, replays), it
		// goes on elsewhere, up to twice maxReplays times: a limit may be
		// taken back and learned again, and a server that falls silent
		// after a different count on each connection teaches none, so
		// nothing else ends the moves but the deadline.
		return q.replays < 2*maxReplays
	}
	if q.replays == 0 {
		return !q.resent
	}
	return q.replays < maxReplays && lost.serverCut
}

// noteCut notes the answers after which the server cut the connection of q's
// attempt that failed with err, if it did: q's replays go only where a
// server cutting there would not cut them too (see call.within). Until the
// pool learns a limit (two like cuts, or one past minLearnedLimit), a
// connection's worth of queries pipelined onto an out-of-order upstream that
// cuts connections after a few answers was cut, replayed onto one other
// connection together, cut there again, and ran out of replays (property
// seed 105: 88 of 555 queries failed where forward answered all).
func (q *query) noteCut(err error) {
	var lost *connLostError
	if errors.As(err, &lost) && lost.serverCut && lost.served > 0 {
		n := int32(min(lost.served, math.MaxInt32))
		if q.cutAfter == 0 || n < q.cutAfter {
			q.cutAfter = n
		}
	}
}

// maxReplays is how often a query is replayed at most.
const maxReplays = 3

// respChans recycles calls' result channels, one pool per Pool (so that a
// channel never outlives its Pool's synctest bubble in tests). A call's channel is
// idle once acquire failed (nothing was registered) or await returned: by the
// ownership rule (see conn) the one completion was received then, or will never
// be sent, because the caller gave the call up while it was live (and a rescue
// notice it did not read was taken out). The call itself cannot be recycled: a
// tombstone keeps it.
func newRespChans() *sync.Pool {
	return &sync.Pool{New: func() any { return make(chan result, 2) }}
}

// newCall starts an attempt of q: it times out after ReadTimeout, or at the caller's
// deadline (ctx's or the explicit one) if that comes first.
func (p *Pool) newCall(ctx context.Context, q *query, deadline time.Time) *call {
	cl := &q.first
	if q.firstUsed {
		cl = new(call) // a move or a replay
	}
	q.firstUsed = true
	cl.q, cl.resp = q, p.respChans.Get().(chan result)
	cl.rescuable = !q.resent && q.opcode == dns.OpcodeQuery
	cl.within = q.cutAfter
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	at := time.Now().Add(p.cfg.ReadTimeout)
	if !deadline.IsZero() && deadline.Before(at) {
		at, cl.callerDeadline = deadline, true
	}
	cl.deadline = at.UnixNano()
	return cl
}
