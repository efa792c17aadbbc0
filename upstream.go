package dotforward

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// upstream is one DoT server: its pool, its metrics, and what the handler and the
// policies need to know about it (whether it is down, how fast it answers).
//
// Health is passive for now: an upstream is down after maxFails consecutive
// failed exchanges, or at once when its pool reports dot.ErrUnavailable (no
// connection and in dial backoff). While down it is skipped, except that one
// query per recheck interval is let through as a probe: the pool answers it with
// ErrUnavailable at no cost while its backoff lasts, and the first answer brings
// the upstream back. Active probes (issue 4) replace the recheck by calling
// markUp/markFailed from the prober.
type upstream struct {
	addr     string
	cfg      dot.Config
	obs      *observer
	maxFails int32
	recheck  time.Duration
	addrFunc func() string // addr, for the dotforward/upstream metadata

	pool     atomic.Pointer[dot.Pool]
	fails    atomic.Int32 // consecutive failed exchanges
	down     atomic.Bool
	retryAt  atomic.Int64 // unix ns after which a down upstream gets one probe query
	rtt      atomic.Int64 // EWMA of answer time in ns; 0 until the first answer
	inflight atomic.Int64
}

func newUpstream(cfg dot.Config, maxFails int, hc healthCheck) *upstream {
	u := &upstream{
		addr:     cfg.Addr,
		cfg:      cfg,
		obs:      newObserver(cfg.Addr),
		maxFails: int32(min(maxFails, 1<<30)),
		recheck:  hc.interval,
	}
	if u.recheck == 0 {
		u.recheck = defaultHealthCheck
	}
	u.cfg.Observer = u.obs
	u.addrFunc = func() string { return u.addr }
	return u
}

// start creates the pool. Calling it on a started upstream does nothing.
func (u *upstream) start() error {
	if u.pool.Load() != nil {
		return nil
	}
	p, err := dot.New(u.cfg)
	if err != nil {
		return fmt.Errorf("upstream %s: %w", u.addr, err)
	}
	u.pool.Store(p)
	u.obs.setHealthy(true)
	return nil
}

// stop closes the pool; queries still using it fail with dot.ErrPoolClosed.
func (u *upstream) stop() error {
	if p := u.pool.Load(); p != nil {
		return p.Close()
	}
	return nil
}

// Down reports whether queries should skip the upstream. For a down upstream it
// returns false once per recheck interval, so that one query probes it.
func (u *upstream) Down() bool {
	if !u.down.Load() {
		return false
	}
	now := time.Now().UnixNano()
	at := u.retryAt.Load()
	if now < at {
		return true
	}
	return !u.retryAt.CompareAndSwap(at, now+int64(u.recheck))
}

// exchange sends r through the pool and updates health, latency and metrics.
func (u *upstream) exchange(ctx context.Context, r *dns.Msg) (*dns.Msg, error) {
	p := u.pool.Load()
	if p == nil {
		return nil, ErrNotStarted
	}
	u.obs.begin()
	u.inflight.Add(1)
	start := time.Now()
	ret, err := p.Exchange(ctx, r)
	took := time.Since(start)
	u.inflight.Add(-1)
	u.obs.end(took, ret)
	if err != nil {
		// When the caller's deadline or cancellation cut the attempt short, the
		// pool may report it as its own timeout: neither says anything about the
		// upstream, so only failures with time left count.
		if !callerExpired(ctx) {
			u.failed(err, took)
		}
		return nil, err
	}
	u.markUp()
	u.observeRTT(took)
	return ret, nil
}

// callerExpired reports whether ctx is done or past its deadline (the pool's
// sweeper can time a call out at the deadline just before ctx notices).
func callerExpired(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// failed records a failed exchange. The client's deadline or cancellation and a
// query the pool refused say nothing about the upstream and are not counted.
func (u *upstream) failed(err error, took time.Duration) {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, dot.ErrBadQuery) {
		return
	}
	// A failure weighs as much as a read timeout in the latency estimate, so that
	// the latency policy moves away from an upstream that fails fast.
	u.observeRTT(max(took, u.readTimeout()))
	if errors.Is(err, dot.ErrUnavailable) {
		u.markDown()
		return
	}
	u.markFailed()
}

// markFailed counts one consecutive failure and marks the upstream down at maxFails.
// maxFails 0 never marks it down.
func (u *upstream) markFailed() {
	n := u.fails.Add(1)
	if u.maxFails > 0 && n >= u.maxFails {
		u.markDown()
	}
}

func (u *upstream) markDown() {
	u.retryAt.Store(time.Now().Add(u.recheck).UnixNano())
	if !u.down.Swap(true) {
		u.obs.setHealthy(false)
		log.Warningf("Upstream %s is down", u.addr)
	}
}

func (u *upstream) markUp() {
	u.fails.Store(0)
	if u.down.Swap(false) {
		u.obs.setHealthy(true)
		log.Infof("Upstream %s is back up", u.addr)
	}
}

func (u *upstream) readTimeout() time.Duration {
	if u.cfg.ReadTimeout > 0 {
		return u.cfg.ReadTimeout
	}
	return dot.DefaultReadTimeout
}

// ewmaWeight is the weight of a new sample in the answer-time average: about the
// last eight answers count.
const ewmaWeight = 0.25

func (u *upstream) observeRTT(took time.Duration) {
	for {
		old := u.rtt.Load()
		next := int64(took)
		if old != 0 {
			next = old + int64(ewmaWeight*float64(int64(took)-old))
		}
		if u.rtt.CompareAndSwap(old, next) {
			return
		}
	}
}
