// Package dot exchanges DNS messages with one DNS-over-TLS upstream (RFC 7858) over a
// small pool of long-lived, pipelined TLS connections.
//
// Each connection carries up to MaxInflight queries at once; answers may come back
// in any order and are matched by a connection-local message ID and the question.
// A query whose connection dies before it was written moves to another connection;
// one that was written is replayed once (RFC 7766 §6.2.4). The package knows nothing
// of CoreDNS: it takes and returns *dns.Msg.
package dot

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// Pool is a set of pipelined TLS connections to one upstream. It is safe for
// concurrent use.
type Pool struct {
	cfg Config
	tls *tls.Config
	obs Observer

	conns        atomic.Pointer[[]*conn] // copy-on-write snapshot, replaced under mu; creation order
	waiters      atomic.Int32            // callers waiting in acquire for a slot or a connection
	dialing      atomic.Bool             // mirrors dialc != nil, for a lock-free check on the hot path
	closing      atomic.Int32            // connections between closeFor and connClosed
	limit        atomic.Int32            // queries per connection the server allows, learned from its cuts
	limitUntil   atomic.Int64            // unix ns until which limit holds
	pack         atomic.Int32            // a packing: how the upstream reads TLS records
	packUntil    atomic.Int64            // pool clock until which a packShared or packOnePer verdict holds
	lastVerdict  atomic.Int32            // the last verdict reported to the observer
	onePerStreak atomic.Int32            // "one per record" verdicts in a row
	clock        atomic.Int64            // unix ns, updated every sweep: a clock for what needs no precision

	ctx    context.Context // the pool's lifetime: dials use it, never a caller's context
	cancel context.CancelFunc
	wg     sync.WaitGroup // connection goroutines, dials and the sweeper

	mu      sync.Mutex
	dialc   chan struct{} // guarded by mu: non-nil while the single dial is in flight
	wake    chan struct{} // guarded by mu: closed and replaced when a slot or a connection may be free
	fails   int           // guarded by mu: consecutive failures since the last answer on a new connection
	retryAt time.Time     // guarded by mu: no dial before this (backoff)
	lastErr error         // guarded by mu: the last dial or connection failure
	closed  bool          // guarded by mu
}

// Stats is a snapshot of a pool's state.
type Stats struct {
	Conns    int // open connections
	Inflight int // queries outstanding (tombstones included)
	Fails    int // consecutive failures; 0 once a new connection answered
}

// New returns a pool for the upstream described by cfg. It dials lazily: the first
// Exchange opens the first connection.
func New(cfg Config) (*Pool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, tls: clientTLS(cfg), obs: cfg.Observer, wake: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.conns.Store(&[]*conn{})
	p.clock.Store(nanotime())
	p.wg.Add(1)
	go p.sweepLoop()
	return p, nil
}

// Addr returns the upstream's address.
func (p *Pool) Addr() string { return p.cfg.Addr }

// Exchange sends m upstream and returns the answer with m's ID and question case.
// m is not modified. The attempt is bounded by ReadTimeout and by ctx.
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
	replayed := false
	for moves := 0; ; {
		cl := p.newCall(ctx, q, deadline)
		c, err := p.acquire(ctx, cl)
		if err != nil {
			respChans.Put(cl.resp)
			return nil, err
		}
		res, ok := c.await(ctx.Done(), cl)
		respChans.Put(cl.resp)
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
		case errors.Is(res.err, errUnsent) && moves < p.cfg.MaxConns:
			moves++ // never written: another connection, at no cost
		case !replayed && p.replayable(ctx, q, res.err) && (deadline.IsZero() || time.Now().Before(deadline)):
			replayed = true
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
// connection that never answered tells nothing good about the next one), and only if
// the caller still has time.
func (p *Pool) replayable(ctx context.Context, q *query, err error) bool {
	var lost *connLostError
	return errors.As(err, &lost) && lost.replayable && q.opcode == dns.OpcodeQuery && ctx.Err() == nil
}

// respChans recycles calls' result channels. A call's channel is idle once acquire
// failed (nothing was registered) or await returned: by the ownership rule (see
// conn) the one completion was received then, or will never be sent, because the
// caller gave the call up while it was live. The call itself cannot be recycled:
// a tombstone keeps it.
var respChans = sync.Pool{New: func() any { return make(chan result, 1) }}

// newCall starts an attempt of q: it times out after ReadTimeout, or at the caller's
// deadline (ctx's or the explicit one) if that comes first.
func (p *Pool) newCall(ctx context.Context, q *query, deadline time.Time) *call {
	cl := &q.first
	if q.firstUsed {
		cl = new(call) // a move or a replay
	}
	q.firstUsed = true
	cl.q, cl.resp = q, respChans.Get().(chan result)
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

// acquire registers cl on a usable connection (see pick), dialing one when all
// are busy and the pool has room, and waiting (bounded by ctx and cl's deadline)
// when every connection is full.
func (p *Pool) acquire(ctx context.Context, cl *call) (*conn, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	if c := p.pick(cl); c != nil {
		return c, nil
	}
	// Count ourselves as a waiter before taking the wake channel, and pick again
	// after: a slot freed in between is then either seen by pick or wakes us. The
	// waiters are bounded in proportion to the slots, whatever they wait for (a
	// slot, a dial, a draining connection's replacement): past that the pool is
	// overloaded, or a black hole is eating every slot, and waiting would only pile
	// up goroutines and memory, so the caller fails at once and can go elsewhere.
	if p.waiters.Add(1) > int32(maxWaitersPerSlot*p.cfg.MaxConns*p.cfg.MaxInflight) {
		p.waiters.Add(-1)
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, errSaturated)
	}
	defer p.waiters.Add(-1)
	for {
		wake, err := p.needConn()
		if err != nil {
			return nil, err
		}
		if c := p.pick(cl); c != nil {
			return c, nil
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(time.Unix(0, cl.deadline)))
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			if cl.callerDeadline {
				return nil, context.DeadlineExceeded // the caller's deadline, not ours
			}
			return nil, fmt.Errorf("%w: no free connection", ErrTimeout)
		}
	}
}

// pick registers cl on the oldest usable connection with room, and starts a dial
// when that one is three-quarters full (all older ones being full), so that the
// next connection is ready before it is needed. Filling connections in turn,
// as HTTP/2 clients do, rather than spreading queries over all of them, keeps
// the batches of queries and answers large: each costs one syscall, and a TLS
// record read, at each end, whatever its size.
func (p *Pool) pick(cl *call) *conn {
	limit := int32(p.cfg.MaxInflight)
	for range 3 { // a lost race for the last slot is retried on a fresh snapshot
		conns := *p.conns.Load()
		var best *conn
		var load int32
		usable := 0
		for _, c := range conns {
			if c.unusable.Load() {
				continue
			}
			usable++
			if l := c.load.Load(); best == nil && l < limit {
				best, load = c, l
			}
		}
		if best == nil {
			return nil
		}
		if best.register(cl) {
			busy := load+1 >= limit*3/4 || best.nearLimit.Load()
			if busy && usable < p.cfg.MaxConns && !p.dialing.Load() {
				p.mu.Lock()
				p.startDialLocked()
				p.mu.Unlock()
			}
			return best
		}
	}
	return nil
}

// needConn is acquire's slow path: it starts a dial if allowed and returns the
// channel that is closed when the pool's capacity may have changed. While the
// upstream is in backoff and has no usable connection, it fails at once so the
// caller can try another upstream.
func (p *Pool) needConn() (<-chan struct{}, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, ErrPoolClosed
	}
	if !p.hasRoomLocked() {
		p.startDialLocked()
	}
	if p.dialc == nil && !p.hasUsableLocked() && time.Now().Before(p.retryAt) {
		if p.lastErr != nil {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, p.lastErr)
		}
		return nil, ErrUnavailable
	}
	return p.wake, nil
}

// hasRoomLocked reports whether a usable connection has a free slot.
func (p *Pool) hasRoomLocked() bool {
	for _, c := range *p.conns.Load() {
		if !c.unusable.Load() && c.load.Load() < int32(p.cfg.MaxInflight) {
			return true
		}
	}
	return false
}

func (p *Pool) hasUsableLocked() bool {
	for _, c := range *p.conns.Load() {
		if !c.unusable.Load() {
			return true
		}
	}
	return false
}

// startDialLocked starts the single shared dial if none is running, the pool has
// room and backoff allows it. It reports whether a dial was started.
//
// MaxConns caps the connections that take new queries. A draining connection only
// waits for its last answers, so it does not count, lest it hold up all traffic
// while it waits; at most MaxConns more than the cap may be draining at once.
func (p *Pool) startDialLocked() bool {
	// While a connection is closing, whether it failed (and so arms the backoff)
	// is not known yet: connClosed wakes the waiters when it is.
	if p.closed || p.dialc != nil || p.closing.Load() > 0 || time.Now().Before(p.retryAt) {
		return false
	}
	conns, usable := *p.conns.Load(), 0
	for _, c := range conns {
		if !c.unusable.Load() {
			usable++
		}
	}
	if usable >= p.cfg.MaxConns || len(conns) >= 2*p.cfg.MaxConns {
		return false
	}
	p.dialc = make(chan struct{})
	p.dialing.Store(true)
	p.wg.Add(1)
	go p.dial()
	return true
}

// dial opens one connection with the pool's context (so that no single caller's
// cancellation can abort a dial others wait for) and adds it to the pool.
func (p *Pool) dial() {
	defer p.wg.Done()
	start := time.Now()
	tc, bc, err := p.handshake()
	resumed := err == nil && tc.ConnectionState().DidResume
	if err == nil || p.ctx.Err() == nil { // a dial cut short by Close is not reported
		p.obs.Dialed(time.Since(start), resumed, err)
	}

	if err != nil {
		err = dialError(err)
	}
	p.mu.Lock()
	close(p.dialc)
	p.dialc = nil
	p.dialing.Store(false)
	p.wakeLocked()
	switch {
	case err != nil && p.closed:
		// Close cancelled the dial: that says nothing about the upstream.
		p.mu.Unlock()
		return
	case err != nil:
		p.failedLocked(err)
		p.mu.Unlock()
		p.obs.Failed(err)
		return
	case p.closed:
		p.mu.Unlock()
		tc.NetConn().Close()
		p.obs.Closed(ClosePool) // Dialed reported it open
		return
	}
	defer p.mu.Unlock()
	c := newConn(p, tc, bc)
	conns := *p.conns.Load()
	next := append(conns[:len(conns):len(conns)], c)
	p.conns.Store(&next)
	p.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
}

// dialError wraps a failed dial's error in ErrDial, with a hint when the server's
// alert says what is wrong in terms an operator may not recognise.
func dialError(err error) error {
	if isAlert(err, alertNoApplicationProtocol) {
		return fmt.Errorf("%w: %w: the upstream refused ALPN \"dot\": it does not serve DNS-over-TLS on this port", ErrDial, err)
	}
	return fmt.Errorf("%w: %w", ErrDial, err)
}

// alertNoApplicationProtocol is TLS alert 120 (RFC 7301): no protocol offered in
// ALPN is one the server serves.
const alertNoApplicationProtocol = 120

// isAlert reports whether err is the TLS alert code received from the server.
// crypto/tls reports a received alert as a net.OpError "remote error" around a
// value of its unexported alert type (a uint8), so the code is read by kind.
func isAlert(err error, code uint64) bool {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "remote error" || op.Err == nil {
		return false
	}
	v := reflect.ValueOf(op.Err)
	return v.Kind() == reflect.Uint8 && v.Uint() == code
}

func (p *Pool) handshake() (*tls.Conn, *batchConn, error) {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	defer cancel()
	raw, err := p.cfg.Dial(ctx, "tcp", p.cfg.Addr)
	if err != nil {
		return nil, nil, err
	}
	bc := &batchConn{Conn: raw}
	if sc, ok := raw.(syscall.Conn); ok {
		bc.rc, _ = sc.SyscallConn()
	}
	tc := tls.Client(bc, p.tls)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, nil, err
	}
	return tc, bc, nil
}

// failedLocked records a dial or connection failure and arms the backoff.
func (p *Pool) failedLocked(err error) {
	p.fails++
	p.lastErr = err
	p.retryAt = time.Now().Add(p.cfg.Backoff.Delay(p.fails))
}

// answered is called on the first answer of each connection: the upstream works, so
// the backoff resets. A handshake alone does not reset it, so a server that accepts
// TLS and then closes cannot cause a tight reconnect loop.
func (p *Pool) answered() {
	p.mu.Lock()
	p.fails = 0
	p.retryAt = time.Time{}
	p.mu.Unlock()
}

// learnLimit is told how a connection ended. A server that closes a busy
// connection after answering many queries teaches the pool its per-connection
// query limit. It runs before the dead connection's queries are moved or replayed,
// so that the connections they go to already respect the limit.
func (p *Pool) learnLimit(reason CloseReason, answered, outstanding int) {
	if reason != CloseServer || outstanding == 0 || answered < minLearnedLimit {
		return
	}
	limit := int32(answered - answered/10) // a margin for servers that count bytes
	if old := p.learnedLimit(); old == 0 || limit < old {
		p.limit.Store(limit)
		// The connections opened with this one are as old and about to be cut
		// too: they take no more queries than the limit either, so that the
		// dead connection's replays do not land on them and die again.
		for _, c := range *p.conns.Load() {
			c.setLimit(int(limit))
		}
	}
	// Forget it after a while: a cut may have been a one-off (a restart), and a
	// needlessly low limit costs handshakes.
	p.limitUntil.Store(nanotime() + int64(learnedTTL))
}

// connLife is what a closed connection did: what connClosed judges it by.
type connLife struct {
	answered int           // answers delivered
	accepted int           // queries registered
	age      time.Duration // from handshake to close
}

// failed reports whether a connection that ended for reason counts as a failure of
// the upstream: one that died before its first answer while it carried a query,
// or that the server closed so soon after the handshake that it cannot have been
// its idle timeout (a server that accepts TLS and hangs up). An unused connection
// the server closed later was closed for idleness: servers' idle timeouts (dnsdist,
// unbound under load) can be shorter than ours.
func (l connLife) failed(reason CloseReason) bool {
	if l.answered > 0 || (reason != CloseServer && reason != CloseError && reason != CloseStall) {
		return false
	}
	return l.accepted > 0 || l.age < minIdleLife
}

// minIdleLife is the least age at which a server's close of a connection that
// carried no query is taken for its idle timeout rather than a refusal.
const minIdleLife = time.Second

// connClosed removes c from the pool. A connection that failed before its first
// answer counts as a failure of the upstream (see connLife.failed).
func (p *Pool) connClosed(c *conn, reason CloseReason, life connLife) {
	p.mu.Lock()
	conns := *p.conns.Load()
	next := make([]*conn, 0, len(conns))
	for _, o := range conns {
		if o != c {
			next = append(next, o)
		}
	}
	p.conns.Store(&next)
	// A connection that never answered arms the dial backoff. A stall is a
	// failure for health checking even after answers (a black hole), but does not
	// delay the redial its queries' replay needs.
	var failure error
	switch {
	case life.failed(reason):
		failure = fmt.Errorf("%w before its first answer (%s)", ErrConnLost, reason)
		p.failedLocked(failure)
	case reason == CloseStall:
		failure = ErrStalled
	}
	p.closing.Add(-1)
	p.wakeLocked()
	p.mu.Unlock()
	p.obs.Closed(reason)
	if failure != nil {
		p.obs.Failed(failure)
	}
}

// slotFreed wakes callers waiting for capacity, if there are any.
func (p *Pool) slotFreed() {
	if p.waiters.Load() == 0 {
		return
	}
	p.mu.Lock()
	p.wakeLocked()
	p.mu.Unlock()
}

func (p *Pool) wakeLocked() {
	close(p.wake)
	p.wake = make(chan struct{})
}

// sweepLoop drives timeouts, tombstone expiry, stall, idle and drain checks for
// every connection from one ticker.
func (p *Pool) sweepLoop() {
	defer p.wg.Done()
	t := time.NewTicker(p.sweepInterval())
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case now := <-t.C:
			p.clock.Store(now.UnixNano())
			for _, c := range *p.conns.Load() {
				c.sweep(now.UnixNano())
			}
		}
	}
}

// minLearnedLimit is the fewest answers after which a server's cut teaches a
// per-connection limit: fewer is more likely a fault than a policy, and a tiny limit
// would mean a handshake every few queries.
const minLearnedLimit = 16

// maxWaitersPerSlot bounds the callers waiting for a slot of a saturated pool.
const maxWaitersPerSlot = 4

// learnedTTL is how long what the pool learns of its upstream holds: a
// per-connection query limit, how it reads TLS records.
const learnedTTL = 10 * time.Minute

// learnedLimit returns the per-connection query limit learned from the server's
// cuts, or 0 if none holds.
func (p *Pool) learnedLimit() int32 {
	if nanotime() > p.limitUntil.Load() {
		return 0
	}
	return p.limit.Load()
}

// sweepInterval is the timer granularity: a twentieth of the shortest timeout,
// between 5ms and 100ms.
func (p *Pool) sweepInterval() time.Duration {
	d := min(p.cfg.ReadTimeout, p.cfg.StallTimeout) / 20
	return min(max(d, 5*time.Millisecond), 100*time.Millisecond)
}

// Stats returns a snapshot of the pool's state.
func (p *Pool) Stats() Stats {
	conns := *p.conns.Load()
	s := Stats{Conns: len(conns)}
	for _, c := range conns {
		s.Inflight += int(c.load.Load())
	}
	p.mu.Lock()
	s.Fails = p.fails
	p.mu.Unlock()
	return s
}

// Close closes every connection, fails every waiting caller with ErrPoolClosed and
// returns once no goroutine of the pool is left. It never hangs on a dead peer.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.wakeLocked()
	p.mu.Unlock()
	p.cancel()
	for _, c := range *p.conns.Load() {
		c.closeFor(ErrPoolClosed, ClosePool)
	}
	p.wg.Wait()
	return nil
}
