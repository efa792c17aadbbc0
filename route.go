package dotforward

import (
	"context"
	"errors"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// route is one query's way through the upstreams (see forward): which are left to
// try, in policy order, and what the tries so far brought.
type route struct {
	list     []*upstream // the candidates left; list[i] is tried next
	i        int
	attempts int      // exchanges made, hedges included
	once     bool     // not a QUERY: sent at most once (see forward)
	hedge    bool     // the query's one hedge may still be sent
	held     *dns.Msg // the last failover answer
	heldFrom *upstream
	tried    *upstream // the last upstream tried
	lastErr  error
}

// startRoute sets rt out for r: the candidates, and whether it may be hedged
// (counted in the hedge budget if so).
func (f *DoTForward) startRoute(rt *route, r *dns.Msg) error {
	list, err := f.candidates()
	if err != nil {
		return err
	}
	once := r.Opcode != dns.OpcodeQuery
	*rt = route{list: list, once: once, hedge: f.hedge != nil && !once, lastErr: ErrNoHealthy}
	if rt.hedge {
		f.hedge.budget.count()
	}
	return nil
}

// more reports whether another attempt is due: an upstream is left and the
// attempts allow it (max, 0 for no cap). It wraps i around the list.
func (rt *route) more(max int) bool {
	if len(rt.list) == 0 || (max != 0 && rt.attempts >= max) {
		return false
	}
	rt.i %= len(rt.list)
	return true
}

// hedging reports whether the next attempt may race a hedge: hedging is on and
// not yet spent, and another upstream and attempt are left.
func (rt *route) hedging(left int) bool {
	return rt.hedge && len(rt.list) >= 2 && left >= 2
}

// settle takes the outcome of one exchange, which went to list[i]: a hedge's two
// outcomes are settled in list order, the hedge having gone to list[i+1], and
// settling the first either moves i on or removes list[i]. done reports that
// the query is over, with ret or err; otherwise the route moves on.
func (f *DoTForward) settle(ctx context.Context, rt *route, o outcome) (ret *dns.Msg, done bool, err error) {
	rt.attempts++
	rt.i %= len(rt.list)
	rt.tried = o.u
	switch {
	case o.err == nil && (rt.once || !f.failover[o.ret.Rcode]):
		setUpstream(ctx, o.u)
		return o.ret, true, nil
	case o.err == nil:
		rt.held, rt.heldFrom = o.ret, o.u
	case errors.Is(o.err, dot.ErrBadQuery):
		setUpstream(ctx, o.u)
		return nil, true, o.err
	default:
		rt.lastErr = upstreamError(o.u.addr, o.err)
		if rt.once && !unsent(o.err) {
			setUpstream(ctx, o.u)
			return nil, true, rt.lastErr
		}
		if retryable(o.err) {
			rt.i++
			return nil, false, nil
		}
	}
	rt.list = append(rt.list[:rt.i], rt.list[rt.i+1:]...)
	return nil, false, nil
}

// end is the route's result when no attempt ended it: the last failover answer
// if one came, else the last error.
func (rt *route) end(ctx context.Context) (*dns.Msg, error) {
	if rt.held != nil {
		setUpstream(ctx, rt.heldFrom)
		return rt.held, nil
	}
	setUpstream(ctx, rt.tried)
	return nil, rt.lastErr
}
