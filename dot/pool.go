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
)

// Pool is a set of pipelined TLS connections to one upstream. It is safe for
// concurrent use.
type Pool struct {
	cfg Config
	tls *tls.Config
	obs Observer

	conns         atomic.Pointer[[]*conn] // copy-on-write snapshot, replaced under mu; creation order
	waiters       atomic.Int32            // callers waiting in acquire for a slot or a connection
	rescuers      atomic.Int32            // of those, rescues: they wait for an idle connection, dialled as the load needs (see dialForWaiter)
	rescueCalls   atomic.Int64            // rescues ever sent for a connection (acquireOr): no arrivals (see sizer.arrivals)
	dialing       atomic.Int32            // mirrors dials, for a lock-free check on the hot path
	closing       atomic.Int32            // connections between closeFor and connClosed
	learned       learned                 // what the pool learned of its upstream: query limit, record verdict, mode
	flights       *flights                // open flights of queries that identical ones wait for; nil: NoCoalesce
	clock         atomic.Int64            // unix ns, updated every sweep: a clock for what needs no precision
	needed        atomic.Int32            // from the sweeper: connections an in-order upstream needs (sizing.go)
	shortfall     atomic.Int32            // from the sweeper: connections wanted and not open
	arriving      atomic.Int32            // from the sweeper: queries that come in one dial's time (sizing.go)
	turnover      atomic.Int32            // from the sweeper: queries that come in a dial's time or a usual answer time, the longer (see dropSurplusDials)
	oldestDial    atomic.Int64            // unix ns: the start of the oldest dial under way; 0: none (see dialWait)
	waiterRuns    atomic.Int32            // dials under way for waiting queries, not dropped: written under mu (see dropSurplusDials)
	warm          atomic.Int32            // from the sweeper: how many of the oldest connections an in-order pool keeps, taken in turn (see pickIdle)
	warmTurn      atomic.Uint32           // where pickIdle's turn over the warm connections starts next
	rescuesWon    atomic.Int32            // rescues that won by far, since the last learn (conn.judgeLocked)
	learnDue      atomic.Bool             // a connection's answers since the last learn suffice to learn in order from (reader.go)
	waitedKickAt  atomic.Int64            // when waited answers last woke the sweeper to learn (waitedKick)
	sharers       atomic.Int32            // of the waiters, those that share the pool's first dial: owed no dial of their own (see firstDialBurst)
	firstShared   atomic.Int32            // the queries that shared the pool's first dial since it started (see joinFirst)
	firstJoined   atomic.Int32            // the queries that joined the pool's first connection for having dialled before it opened (see joinFirst)
	order         waitOrder               // the waiters' order: an idle connection goes to the one that waited longest (waitorder.go)
	dialTime      atomic.Int64            // ns: how long a dial takes, smoothed
	serverIdle    atomic.Int64            // ns: the shortest idle timeout the server's keepalive told; 0: none told (see connLife.failed)
	readsGrewAt   int64                   // sweeper only: unix ns of the last tick at which the connections' reads grew (see silentBeyondLocked)
	closedReads   atomic.Int64            // frames read by the connections no longer in conns: the sweeper's read total goes on past their close (see sweep)
	servingAt     atomic.Int64            // readsGrewAt for the hot path, but at a late tick the latest served answer's arrival (see servedBy, queueDepth)
	heldUntil     atomic.Int64            // unix ns of the last late sweeper tick (written by the sweeper, noteHoldUp): the pool's process was held up until then at the latest (see overdue)
	heldFor       atomic.Int64            // ns: how late that tick ran, the hold-up's length (written by the sweeper, noteHoldUp)
	askedAt       atomic.Int64            // unix ns when a query went out with the sweeper idle (kickSweeper): the upstream read nothing before, asked nothing (see dearQueue)
	kickedAt      atomic.Int64            // unix ns of the latest wake of the sweeper (kickSweeper, kickLearn): the woken tick is due then (see sweepLoop)
	sizeObs       SizeObserver            // obs, or obs with no-op sizing events
	sizer         sizer                   // the sweeper's
	spellSamples  []spellSample           // sweeper only: rescueSpells' buffer, kept from sweep to sweep
	respChans     *sync.Pool              // see newRespChans
	bufs          spareBufs               // closed connections' buffers, for the next ones
	queries       sync.Pool               // queries no longer held, for the next ones (see recycle)
	idleTicks     atomic.Bool             // the sweeper ticks slowly: nothing was outstanding (see kickSweeper)
	orderCheckDue atomic.Bool             // in order: the next query that can is an order check (see orderCheckConn)
	stormAt       atomic.Int64            // unix ns: when an answer came stormFactor usual times slow (see answersStormy)
	checkHeldAt   atomic.Int64            // unix ns: since when due order checks are held in a storm; 0: none held (see orderCheckHeld)
	youngLevel    atomic.Int32            // in order: order checks go 2^youngLevel times as often; set as in order is learned, less by each check that confirms it, raised by one answered side by side (see orderCheckRate)
	youngUntil    atomic.Int64            // unix ns: youngLevel counts until then (see beliefYoung)
	noOrderChecks atomic.Bool             // set by tests whose timing one random order check would upset
	untimedSince  atomic.Int64            // unix ns: the pool's first query's dial, set once (see untimedRoom)
	checksOwed    checksOwed              // the order checks that may each spare a waiter its dial (see checkOwesWaiter)
	sparedWaiters atomic.Int32            // queries spared a dial that wait for a connection (see checkOwesWaiter)
	noDepthProbe  atomic.Bool             // set by tests of connections filled past a query limit, which the depth probe spares a slow upstream's (probe.go)
	kick          chan struct{}           // cap 1: wakes the sweeper
	tickHold      atomic.Pointer[func()]  // set by tests: run as the sweeper's timer fires, before the tick reads the clock (its goroutine held up: see sweepLoop)

	ctx    context.Context // the pool's lifetime: dials use it, never a caller's context
	cancel context.CancelFunc
	wg     sync.WaitGroup // connection goroutines, dials and the sweeper

	mu     sync.Mutex
	dials  int           // guarded by mu: dials under way
	wake   chan struct{} // guarded by mu: closed and replaced when a slot or a connection may be free
	redial redial        // guarded by mu: the reconnect backoff
	fds    fdCap         // guarded by mu: the cap after dials failed for lack of file descriptors
	closed bool          // guarded by mu
	// dialRuns, guarded by mu: the dials under way, in start order;
	// oldestDial is the first's start, 0 with none (see dialWait).
	dialRuns []*dialRun
	// answeredCut, guarded by mu: when the server last closed a connection
	// that had answered (see noteServerCutLocked, backoff.go)
	answeredCut time.Time

	// firstDialAt, guarded by mu, unix ns (see firstDialBurst): the last
	// query that came before the pool had a connection
	firstDialAt int64

	probe depthProbe // guarded by mu: the connection going past the depth served (probe.go)
}

// Stats is a snapshot of a pool's state.
type Stats struct {
	Conns    int  // open connections
	Taking   int  // of those, the ones that take new queries: not draining, not blocked (near their end included; the conns_taking gauge)
	Blocked  int  // connections blocked behind a slow answer (see rescue.go)
	Inflight int  // queries outstanding (tombstones included)
	Strikes  int  // failed dials and connections in a row; 0 once a new connection answered
	Mode     Mode // how the upstream serves a connection, as learned
}

// New returns a pool for the upstream described by cfg. It dials lazily: the first
// Exchange opens the first connection.
func New(cfg Config) (*Pool, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	p := &Pool{cfg: cfg, tls: clientTLS(cfg), obs: cfg.Observer, wake: make(chan struct{})}
	p.sizeObs = sizeObserver(cfg.Observer)
	p.respChans = newRespChans()
	p.queries.New = func() any { return new(query) }
	p.kick = make(chan struct{}, 1)
	p.idleTicks.Store(true)
	p.sizer.tokens = maxRescueBurst
	p.sizer.at = nanotime() // the queries that come before the first tick are arrivals too
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.conns.Store(&[]*conn{})
	p.clock.Store(nanotime())
	if !cfg.NoCoalesce {
		p.flights = newFlights(p.respChans)
	}
	p.wg.Add(1)
	go p.sweepLoop()
	return p, nil
}

// Addr returns the upstream's address.
func (p *Pool) Addr() string { return p.cfg.Addr }

// dial opens one connection with the pool's context (so that no single caller's
// cancellation can abort a dial others wait for) and adds it to the pool.
func (p *Pool) dial(run *dialRun) {
	defer p.wg.Done()
	defer run.cancel()
	start := time.Now()
	tc, bc, err := p.handshake(run.ctx)
	if err == nil {
		p.noteDialTime(time.Since(start))
	}
	if err != nil {
		err = dialError(err)
	}
	resumed := err == nil && tc.ConnectionState().DidResume
	if err == nil || p.ctx.Err() == nil && !run.dropped.Load() { // a dial cut short by Close or as surplus is not reported
		p.obs.Dialed(time.Since(start), resumed, err)
	}

	p.mu.Lock()
	p.dials--
	p.dialing.Store(int32(p.dials))
	p.dialDoneLocked(run)
	p.wakeLocked()
	switch {
	case err != nil && (p.closed || run.dropped.Load()):
		// Close, or dropSurplusDials, cancelled the dial: that says
		// nothing about the upstream.
		p.mu.Unlock()
		return
	case errors.Is(err, ErrNoFiles):
		// Local: no strike, no failure of the upstream; a cap (fdlimit.go).
		p.fds.hit(len(*p.conns.Load()), err, time.Now())
		p.mu.Unlock()
		return
	case err != nil:
		p.redial.strike(err, p.cfg.Backoff)
		p.mu.Unlock()
		p.obs.Failed(err)
		return
	case p.closed:
		p.mu.Unlock()
		tc.NetConn().Close()
		p.obs.Closed(ClosePool) // Dialed reported it open
		return
	}
	p.fds.lift()
	c := newConn(p, tc, bc)
	conns := *p.conns.Load()
	next := append(conns[:len(conns):len(conns)], c)
	p.conns.Store(&next)
	p.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	p.mu.Unlock()
	if r := p.probedReach(); r != 0 {
		p.retireOne(r) // the new one takes the queries it could not (probe.go)
	}
}

// dialError wraps a failed dial's error in ErrDial, with a hint when the server's
// alert says what is wrong in terms an operator may not recognise.
func dialError(err error) error {
	if outOfFiles(err) {
		return fmt.Errorf("%w: %w: %w", ErrDial, ErrNoFiles, err)
	}
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

func (p *Pool) handshake(parent context.Context) (*tls.Conn, *batchConn, error) {
	ctx, cancel := context.WithTimeout(parent, p.cfg.DialTimeout)
	defer cancel()
	raw, err := p.cfg.Dial(ctx, "tcp", p.cfg.Addr)
	if err != nil {
		return nil, nil, err
	}
	bc := &batchConn{Conn: raw, timeout: p.cfg.WriteTimeout}
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

// answered is called on the first answer of each connection: the upstream works, so
// the backoff resets. A handshake alone does not reset it, so a server that accepts
// TLS and then closes cannot cause a tight reconnect loop.
func (p *Pool) answered() {
	p.mu.Lock()
	p.redial = redial{}
	p.mu.Unlock()
}

// connLife is what a closed connection did: what connClosed judges it by.
type connLife struct {
	answered   int           // answers delivered
	accepted   int           // queries registered
	age        time.Duration // from handshake to close
	serverIdle time.Duration // the idle timeout the server told, on any connection; 0: none
	idleRace   bool          // the server closed it as its first queries after idleRaceAfter or more went out (see closeFor)
}

// failed reports whether a connection that ended for reason counts as a failure of
// the upstream: one that died before its first answer while it carried a query,
// or that the server closed so soon after the handshake that it cannot have been
// its idle timeout (a server that accepts TLS and hangs up). An unused connection
// the server closed later was closed for idleness: servers' idle timeouts (dnsdist,
// unbound under load) can be shorter than ours. Later is minIdleLife, or half
// the idle timeout the server told (RFC 7828) if that is sooner: a server
// that tells 100 ms closes the spares of a burst within that, and strikes
// for them put the pool in backoff with no connection left (issue 21, seed 85).
// Nor is a close that came as the first queries after a long idle went out
// (idleRace): the server's idle timeout racing them.
func (l connLife) failed(reason CloseReason) bool {
	if l.answered > 0 || l.idleRace || (reason != CloseServer && reason != CloseError && reason != CloseStall) {
		return false
	}
	return l.accepted > 0 || l.age < minIdleLife && (l.serverIdle == 0 || l.age < l.serverIdle/2)
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
	// After the store: the sweeper reads closedReads before the snapshot,
	// so that a connection's reads are never counted twice, at worst a
	// tick late.
	p.closedReads.Add(c.reads.Load())
	// A connection that never answered arms the dial backoff. A stall is a
	// failure for health checking even after answers (a black hole), but does not
	// delay the redial its queries' replay needs.
	var failure error
	switch now := time.Now(); {
	case reason == CloseServer && life.answered > 0:
		p.noteServerCutLocked(now)
	case life.failed(reason):
		failure = fmt.Errorf("%w before its first answer (%s)", ErrConnLost, reason)
		if reason == CloseServer && p.restartLocked(now) {
			break // a restart (see noteServerCutLocked)
		}
		if p.redial.strike(failure, p.cfg.Backoff) && reason == CloseServer {
			// Only a strike of its own may be taken back: one within
			// an armed backoff is of an earlier failure's episode.
			p.redial.cutAt = now
		}
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

// Stats returns a snapshot of the pool's state.
func (p *Pool) Stats() Stats {
	conns := *p.conns.Load()
	n := countConns(conns)
	s := Stats{Conns: len(conns), Mode: p.learned.mode.get(), Taking: n.takes(), Blocked: n.n[availBlocked], Inflight: n.load}
	p.mu.Lock()
	s.Strikes = p.redial.strikes
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
