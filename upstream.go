package dotforward

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// upstream is one DoT server: its pool, its metrics, its health (health.go, fed
// by the pool's events and by the prober, prober.go), and what the policies need
// to know about it (how fast it answers, how busy it is).
type upstream struct {
	addr     string
	cfg      dot.Config
	obs      *observer
	health   *health
	hc       healthCheck
	addrFunc func() string // addr, for the dotforward/upstream metadata
	readTO   time.Duration // cfg's ReadTimeout with its default

	pool    atomic.Pointer[dot.Pool]
	prober  *prober
	answers answerTime   // how fast it answers, for the latency policy and hedge auto
	pending atomic.Int64 // exchanges begun and not yet returned
}

// events is the upstream's dot.Observer: every pool event goes to the metrics,
// and the ones about the upstream's health go to its health as well.
type events struct {
	*observer
	health *health
}

var _ dot.Observer = events{}

// Dialed implements dot.Observer.
func (e events) Dialed(took time.Duration, resumed bool, err error) {
	switch {
	case isNoFiles(err):
		// Local, not the upstream's: the prober must not take it as its dial failing.
		logNoFiles(e.health.addr, err)
	case err != nil:
		e.health.failedDials.Add(1)
	}
	e.observer.Dialed(took, resumed, err)
}

// Failed implements dot.Observer: the pool saw the upstream itself fail.
func (e events) Failed(err error) { e.health.failure(err) }

func newUpstream(cfg dot.Config, maxFails int, hc healthCheck) *upstream {
	obs := newObserver(cfg.Addr)
	u := &upstream{
		addr:   cfg.Addr,
		cfg:    cfg,
		obs:    obs,
		health: newHealth(cfg.Addr, maxFails, obs.setHealthy),
		hc:     hc,
		readTO: cfg.WithDefaults().ReadTimeout,
	}
	u.answers.readTimeout = u.readTO
	u.cfg.Observer = events{observer: obs, health: u.health}
	u.addrFunc = func() string { return u.addr }
	return u
}

// enableHedging binds the hedge metrics of the upstream (only lines with hedge
// export them) and, with hedge auto, gives it a delay estimator bounded by
// [hedgeMinDelay, half of read_timeout or of timeout, whichever is less]: a later
// hedge leaves the hedge little time before the query times out or fails over
// anyway.
func (u *upstream) enableHedging(c *hedgeConfig, timeout time.Duration) {
	u.obs.bindHedging()
	if !c.auto {
		u.obs.hedgeDelay.Set(c.delay.Seconds())
		return
	}
	u.answers.hedge = newHedgeEstimator(hedgeMinDelay, min(u.readTimeout(), timeout)/2, u.obs.hedgeDelay)
}

// start creates the pool and starts probing. Calling it on a started upstream
// does nothing.
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
	if u.hc.interval > 0 && u.health.maxFails > 0 {
		u.prober = newProber(u)
		go u.prober.run()
	}
	return nil
}

// stop stops probing and closes the pool; queries still using it fail with
// dot.ErrPoolClosed.
func (u *upstream) stop() error {
	if u.prober != nil {
		u.prober.stop()
	}
	if p := u.pool.Load(); p != nil {
		return p.Close()
	}
	return nil
}

// probed reports whether the first round of health probes has finished (true if
// the upstream is not probed).
func (u *upstream) probed() bool {
	return u.prober == nil || u.prober.firstRoundDone()
}

// Down reports whether queries should skip the upstream.
func (u *upstream) Down() bool { return u.health.isDown() }

// exchange sends r through the pool and updates health, latency and metrics.
func (u *upstream) exchange(ctx context.Context, r *dns.Msg, deadline time.Time) (*dns.Msg, error) {
	p := u.pool.Load()
	if p == nil {
		return nil, ErrNotStarted
	}
	u.obs.begin()
	u.pending.Add(1)
	start := time.Now()
	var ret *dns.Msg
	var end time.Time
	// Deferred, so that a panic in the pool, which CoreDNS recovers per query, does
	// not leave the query counted as pending for good: the latency policy and the
	// inflight gauge read that count.
	defer func() {
		if end.IsZero() { // panicking
			end = time.Now()
		}
		u.pending.Add(-1)
		u.obs.end(end.Sub(start), ret)
	}()
	ret, err := p.ExchangeDeadline(ctx, r, deadline)
	end = time.Now()
	// When the caller's deadline or cancellation cut the attempt short, the pool
	// may report it as its own timeout: neither says anything about the upstream.
	u.learn(end.Sub(start), err, ctx.Err() == nil && end.Before(deadline))
	if err != nil {
		return nil, err
	}
	return ret, nil
}

// learn updates health and the answer-time model after an exchange that took
// took and ended with err; timeLeft says the caller's deadline or cancellation
// did not cut it short. It is out of line, so that exchange's frame, on the
// stack all through the pool's work, stays small (see forward).
//
//go:noinline
func (u *upstream) learn(took time.Duration, err error, timeLeft bool) {
	if err == nil {
		u.health.answered()
	}
	u.answers.exchanged(took, err, timeLeft)
}

// readTimeout is the pool's read timeout, its default applied.
func (u *upstream) readTimeout() time.Duration { return u.readTO }
