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
func (p *Pool) ExchangeDeadline(ctx context.Context, m *dns.Msg, deadline time.Time) (r *dns.Msg, err error) {
	q, err := prepareInto(&p.queries, m, p.cfg.PadBlock, !p.cfg.NoKeepalive)
	if err != nil {
		return nil, err
	}
	// coalesce.go: identical queries go upstream once. The leader's exchange runs
	// from this frame rather than from one more below it: this goroutine's stack
	// is the client's query's, and a deeper one costs a stack copy per query.
	// One way out, to recycle q: three returns, each keeping its results
	// across recycle's call, took three times the room in this frame.
	done := false
	if p.flights != nil {
		r, done, err = p.joinFlight(ctx, q, deadline)
	}
	if !done {
		r, err = p.exchange(ctx, q, deadline)
		p.flights.fail(q, err) // the end of q's flight, if it leads one (never without flights)
	}
	p.recycle(q)
	return r, err
}

// recycle gives q back for a later query if its exchange found it free: held by
// nothing else (see query.settle). Otherwise the garbage collector takes it
// once its last holder lets go. A query reused while a connection, its writer
// or a flight still held it would take an answer meant for another one, or
// hand it one: far worse than an allocation, so every doubt leaves q alone.
// Out of line: inlined, it would grow ExchangeDeadline's frame, which is on
// the client's query's stack, under everything the exchange calls.
//
//go:noinline
func (p *Pool) recycle(q *query) {
	if q.free {
		*q = query{} // drops the client's name and a long query's wire with it
		p.queries.Put(q)
	}
}

// settle marks q free if its answer res, through cl, leaves nothing but the
// exchange holding it. Each condition is a holder let go:
//   - res.err == nil: only the reader's deliver completes a call without an
//     error, and it took cl out of its connection's calls first, under the
//     connection's mu, as a live call: no tombstone keeps it, and no sweeper,
//     rescue, eviction or close can reach it there any more;
//   - cl == &q.first && !q.more: cl was q's only call, registered once, so no
//     other call (a move's, a replay's, a rescue's) waits in a writer's queue
//     or a connection's calls with q in it;
//   - cl.sentAt != 0: the writer's last touch of cl, after the CAS that sent it,
//     is that store (writeRecords); an answer that came before it (an upstream
//     answering ahead of the flush) leaves q alone;
//   - !cl.trial: a record trial's call goes on to the writer on trialc after
//     its answer, and is compared there.
//
// A flight q led ended before its answer was delivered (flights.land), or ends
// in flights.fail before recycle; its waiters never hold their leader.
func (q *query) settle(cl *call, res result) {
	q.free = res.err == nil && cl == &q.first && !q.more && !cl.trial && cl.sentAt.Load() != 0
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
			q.settle(cl, res)
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
// notice it did not read was taken out). The call itself is recycled with its
// query, and only when nothing else holds either (see recycle): a tombstone,
// say, keeps it.
func newRespChans() *sync.Pool {
	return &sync.Pool{New: func() any { return make(chan result, 2) }}
}

// newCall starts an attempt of q: it times out after ReadTimeout, or at the caller's
// deadline (ctx's or the explicit one) if that comes first.
func (p *Pool) newCall(ctx context.Context, q *query, deadline time.Time) *call {
	cl := &q.first
	if q.firstUsed {
		cl, q.more = new(call), true // a move, a replay or a rescue
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
