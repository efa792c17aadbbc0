package dotforward

import (
	"context"
	"errors"
	"time"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// prober sends active health probes for one upstream, through its pool (so a probe
// rides an open connection instead of paying a TLS handshake): once at startup,
// then every health_check interval while the upstream is suspect or down.
type prober struct {
	u      *upstream
	msg    *dns.Msg // never modified: the pool packs it without touching it
	ctx    context.Context
	cancel context.CancelFunc
	first  chan struct{} // closed once the first round has finished
	done   chan struct{} // closed when run returns
}

func newProber(u *upstream) *prober {
	m := new(dns.Msg)
	m.SetQuestion(u.hc.domain, dns.TypeNS)
	m.RecursionDesired = !u.hc.noRec
	ctx, cancel := context.WithCancel(context.Background())
	return &prober{u: u, msg: m, ctx: ctx, cancel: cancel, first: make(chan struct{}), done: make(chan struct{})}
}

func (p *prober) run() {
	defer close(p.done)
	// An upstream that fails its very first probe starts down, so that it is
	// skipped from the first client query on rather than after max_fails of them.
	if err := p.probe(); err != nil && !isNoFiles(err) {
		p.u.health.setDown(err)
	}
	close(p.first)
	t := time.NewTicker(p.u.hc.interval)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
			// Only a suspect (a failure seen since the last answer) or down upstream
			// is probed. A healthy one is left alone: client answers prove its health,
			// the pool reports its failures, and probing an idle upstream would keep
			// a connection open forever and load a public resolver for nothing.
			if p.u.health.isDown() || p.u.health.suspect() {
				p.probe()
			}
		}
	}
}

// probe sends one probe and records its outcome. Any answer counts, whatever its
// rcode: the upstream is reachable and speaks DNS. The pool answers ErrUnavailable
// without sending anything, both while it waits out its dial backoff and when the
// dial the probe waited for failed. Only the latter tried the upstream and counts
// as a failed health check; neither is new health evidence, since the pool
// reported the failed dial itself.
func (p *prober) probe() error {
	pool := p.u.pool.Load()
	dials := p.u.health.failedDials.Load()
	ctx, cancel := context.WithTimeout(p.ctx, p.u.readTimeout())
	defer cancel()
	_, err := pool.Exchange(ctx, p.msg)
	switch {
	case err == nil:
		p.u.health.answered()
	case p.ctx.Err() != nil:
		return err // stopping
	case errors.Is(err, dot.ErrUnavailable):
		// The pool reports a failed dial (Dialed) before it wakes the callers
		// waiting for it, so the count has moved if this probe's dial failed.
		if p.u.health.failedDials.Load() != dials {
			p.u.obs.HealthCheckFailed()
		}
	default:
		p.u.obs.HealthCheckFailed()
		p.u.health.failure(err)
	}
	return err
}

func (p *prober) firstRoundDone() bool {
	select {
	case <-p.first:
		return true
	default:
		return false
	}
}

// stop ends probing and waits for the prober to return.
func (p *prober) stop() {
	p.cancel()
	<-p.done
}
