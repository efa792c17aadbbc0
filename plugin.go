// Package dotforward is a CoreDNS plugin that forwards queries to upstream
// resolvers over DNS-over-TLS (RFC 7858), through pipelined, health-checked
// connection pools (package dot).
package dotforward

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/metadata"
	clog "github.com/coredns/coredns/plugin/pkg/log"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

var log = clog.NewWithPlugin("dotforward")

// DoTForward forwards the queries under one zone to a set of DoT upstreams.
type DoTForward struct {
	Next plugin.Handler

	from          string
	ignored       []string
	upstreams     []*upstream
	policy        Policy
	timeout       time.Duration
	maxAttempts   int // 0: bounded by timeout only
	maxConcurrent int64
	failover      map[int]bool
	failfast      bool
	hc            healthCheck
	hedge         *hedger // nil: no hedging (the default)

	concurrent atomic.Int64
	started    atomic.Bool
}

var _ plugin.Handler = (*DoTForward)(nil)

func newDoTForward(from string, ups []*upstream, o *options) *DoTForward {
	f := &DoTForward{
		from:          from,
		ignored:       o.ignored,
		upstreams:     ups,
		policy:        o.policy,
		timeout:       o.timeout,
		maxAttempts:   o.maxAttempts,
		maxConcurrent: int64(o.maxConcurrent),
		failover:      make(map[int]bool, len(o.failover)),
		failfast:      o.failfast,
		hc:            o.hc,
	}
	if f.maxAttempts < 0 {
		f.maxAttempts = 2 * len(ups)
	}
	for _, rc := range o.failover {
		f.failover[rc] = true
	}
	if o.hedge != nil {
		f.hedge = newHedger(o.hedge)
		for _, u := range ups {
			u.enableHedging(o.hedge, o.timeout)
		}
	}
	return f
}

// Name implements plugin.Handler.
func (f *DoTForward) Name() string { return "dotforward" }

// ServeDNS implements plugin.Handler.
func (f *DoTForward) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	if !f.match(r) {
		return plugin.NextOrFailure(f.Name(), f.Next, ctx, w, r)
	}
	if err := checkQuery(r); err != nil {
		return errorRcode(err), err
	}
	if !f.acquire() {
		maxConcurrentRejects.Inc()
		return dns.RcodeRefused, ErrLimitExceeded
	}
	defer f.release()

	// A deadline rather than a context with a timeout: no timer per query.
	ret, err := f.forward(ctx, r, time.Now().Add(f.timeout))
	if err != nil {
		return errorRcode(err), plugin.Error(f.Name(), untaggedError{err})
	}
	if err := w.WriteMsg(ret); err != nil {
		return dns.RcodeSuccess, plugin.Error(f.Name(), err)
	}
	return dns.RcodeSuccess, nil
}

// match reports whether the query is for this instance: under FROM and not under
// an except zone (FROM itself is never excepted). Names compare case-insensitively.
func (f *DoTForward) match(r *dns.Msg) bool {
	name := "."
	if len(r.Question) > 0 {
		name = r.Question[0].Name
	}
	if !plugin.Name(f.from).Matches(name) {
		return false
	}
	if strings.EqualFold(name, f.from) {
		return true
	}
	for _, ignore := range f.ignored {
		if plugin.Name(ignore).Matches(name) {
			return false
		}
	}
	return true
}

// checkQuery refuses what the pool cannot forward before any upstream is tried.
func checkQuery(r *dns.Msg) error { return dot.CheckQuery(r) }

// errorRcode is the rcode the server answers with when forwarding failed.
func errorRcode(err error) int {
	switch {
	case errors.Is(err, ErrZoneTransfer):
		return dns.RcodeNotImplemented
	case errors.Is(err, dot.ErrBadQuery):
		return dns.RcodeFormatError
	}
	return dns.RcodeServerFailure
}

func (f *DoTForward) acquire() bool {
	if f.maxConcurrent == 0 {
		return true
	}
	if f.concurrent.Add(1) > f.maxConcurrent {
		f.concurrent.Add(-1)
		return false
	}
	return true
}

func (f *DoTForward) release() {
	if f.maxConcurrent != 0 {
		f.concurrent.Add(-1)
	}
}

// forward tries the upstreams in policy order until one answers with an rcode
// not listed in failover, the attempts run out, the deadline passes or ctx ends.
// Upstreams that fail with a transient error (timeout, lost connection, failed
// dial) are tried again on the next pass; ones that are unavailable or answered
// with a failover rcode are not. If only failover answers came, the last one is
// returned, also when time runs out before another upstream answered.
//
// A message other than a QUERY (UPDATE, NOTIFY) may change state upstream, so it
// is sent at most once: its first answer is returned whatever the rcode, and
// after a failure it goes to another upstream only if the error proves it was
// never written (see unsent), and it is never hedged.
//
// With hedge, an attempt without an answer after the hedge delay races the next
// upstream of the list (see hedged): the route then settles the winner's
// outcome, or both outcomes in list order, as if it had tried them in turn.
func (f *DoTForward) forward(ctx context.Context, r *dns.Msg, deadline time.Time) (*dns.Msg, error) {
	var rt route
	if err := f.startRoute(&rt, r); err != nil {
		return nil, err
	}
	// This frame is on the stack all through the exchange, which runs deep on the
	// client's query's own goroutine: past 4 KB the runtime copies the stack, a
	// few microseconds per query. So the way through the upstreams is kept in rt,
	// and handled by settle and end, out of line.
	for rt.more(f.maxAttempts) {
		if err := expired(ctx, deadline); err != nil {
			rt.lastErr = withLast(err, rt.lastErr)
			break
		}
		if rt.hedging(f.attemptsLeft(rt.attempts)) {
			if ret, done, err := f.hedged(ctx, r, deadline, &rt); done {
				return ret, err
			}
			continue
		}
		u := rt.list[rt.i]
		ret, err := u.exchange(ctx, r, deadline)
		if ret, done, err := f.settle(ctx, &rt, outcome{u: u, ret: ret, err: err}); done {
			return ret, err
		}
	}
	return rt.end(ctx)
}

// attemptsLeft is how many attempts max_connect_attempts still allows after
// attempts (a large number when it is 0: no cap); a hedge is one.
func (f *DoTForward) attemptsLeft(attempts int) int {
	if f.maxAttempts == 0 {
		return math.MaxInt
	}
	return f.maxAttempts - attempts
}

// expired returns the reason to stop trying: ctx ended or the deadline passed.
func expired(ctx context.Context, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// setUpstream publishes the dotforward/upstream metadata: the upstream whose answer
// the client gets or, when none does, the last one tried. It is set once per query,
// when the outcome is known, so that it never names a later upstream than the one
// that answered.
func setUpstream(ctx context.Context, u *upstream) {
	if u != nil {
		metadata.SetValueFunc(ctx, "dotforward/upstream", u.addrFunc)
	}
}

// withLast and upstreamError build errors out of line, keeping the hot path's stack
// frames small: CoreDNS runs each query on a new goroutine, and a deep frame makes
// it grow (copy) its stack, which costs microseconds per query.
//
//go:noinline
func withLast(err, last error) error { return fmt.Errorf("%w (last error: %w)", err, last) }

//go:noinline
func upstreamError(addr string, err error) error { return fmt.Errorf("%s: %w", addr, err) }

// retryable reports whether an upstream that failed with err may be tried again
// for the same query.
func retryable(err error) bool {
	return !errors.Is(err, dot.ErrUnavailable) && !errors.Is(err, dot.ErrPoolClosed) && !errors.Is(err, ErrNotStarted)
}

// unsent reports whether err proves the query was never written to the upstream:
// the pool was unavailable (in backoff, or saturated), closed or not started
// before the query got a connection. A query lost with its connection wraps
// dot.ErrConnLost, also when the pool closed under it: it may have been written.
func unsent(err error) bool {
	if errors.Is(err, dot.ErrConnLost) {
		return false
	}
	return errors.Is(err, dot.ErrUnavailable) || errors.Is(err, dot.ErrPoolClosed) || errors.Is(err, ErrNotStarted)
}

// candidates returns the upstreams to try, in policy order, without the down
// ones. When all are down it returns the one that failed least recently, or
// ErrNoHealthy with failfast_all_unhealthy_upstreams.
func (f *DoTForward) candidates() ([]*upstream, error) {
	// A single upstream needs no copy: forward removing it from the list writes
	// nothing into the array.
	ordered := f.upstreams
	if len(ordered) != 1 {
		ordered = f.policy.List(f.upstreams) // a fresh slice, ours to change
	}
	down := 0
	for _, u := range ordered {
		if u.Down() {
			down++
		}
	}
	if down == 0 {
		return ordered, nil
	}
	if down < len(ordered) {
		up := make([]*upstream, 0, len(ordered)-down)
		for _, u := range ordered {
			if !u.Down() {
				up = append(up, u)
			}
		}
		return up, nil
	}
	healthcheckBroken.Inc()
	if f.failfast {
		return nil, ErrNoHealthy
	}
	// Every upstream is down: try the one whose last failure is oldest, the best
	// bet, once. Its pool fails at once while in dial backoff, so the query costs
	// nothing when it is really gone.
	best := ordered[0]
	for _, u := range ordered[1:] {
		if u.health.lastFailure() < best.health.lastFailure() {
			best = u
		}
	}
	return []*upstream{best}, nil
}

// OnStartup starts every upstream's pool.
func (f *DoTForward) OnStartup() error {
	for _, u := range f.upstreams {
		if err := u.start(); err != nil {
			_ = f.OnShutdown()
			return plugin.Error(f.Name(), untaggedError{err})
		}
	}
	f.started.Store(true)
	return nil
}

// OnShutdown closes every upstream's pool.
func (f *DoTForward) OnShutdown() error {
	f.started.Store(false)
	var errs []error
	for _, u := range f.upstreams {
		errs = append(errs, u.stop())
	}
	return errors.Join(errs...)
}
