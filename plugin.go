package dotforward

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coredns/coredns/plugin"
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

	admitted atomic.Int64 // queries admitted under max_concurrent and not yet answered
	started  atomic.Bool
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
	if !f.admit() {
		maxConcurrentRejects.Inc()
		return dns.RcodeRefused, ErrLimitExceeded
	}
	defer f.leave()

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

// admit gives the query one of max_concurrent admissions, or reports that all
// are taken (always true without max_concurrent). leave gives it back.
func (f *DoTForward) admit() bool {
	if f.maxConcurrent == 0 {
		return true
	}
	if f.admitted.Add(1) > f.maxConcurrent {
		f.admitted.Add(-1)
		return false
	}
	return true
}

func (f *DoTForward) leave() {
	if f.maxConcurrent != 0 {
		f.admitted.Add(-1)
	}
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
