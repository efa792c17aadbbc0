package dot

import (
	"bufio"
	"crypto/tls"
	"sync"
	"sync/atomic"
	"time"
)

// conn is one TLS connection to the upstream, carrying many queries at once. Its
// reader goroutine frames answers and hands each to its call; its writer goroutine
// coalesces queued queries into one TLS write.
//
// Ownership rule: a call is live while it is in calls with tombUntil == 0. Whoever
// ends that state under mu (reader on an answer, sweeper on a timeout, closeFor on
// death, the caller on cancellation) completes the call, and only that one.
// Completed, a call may still be held (a tombstone in calls, a writer's queue or
// batch): its query, in whose allocation the first call is, is recycled only
// when its exchange proves that nothing is (see query.settle).
type conn struct {
	pool   *Pool
	tc     *tls.Conn
	br     *bufio.Reader // reader goroutine only
	bc     *batchConn    // under tc: gathers the records of one batch into one write
	wbuf   []byte        // writer goroutine only: frames of the batch being written
	bufs   *connBufs     // the buffers above, given back by loopDone
	exited atomic.Int32  // of the two goroutines (see loopDone)
	trialc chan *call    // cap 2: the reader reports answers to record trial queries to the writer
	// trialStop (cap 1): the sweeper tells a record trial holding the
	// writer that the connection is blocked (see stopTrial).
	trialStop chan struct{}
	writeq    chan *call    // cap MaxInflight; sends never block (see register)
	done      chan struct{} // closed when the connection is closed
	born      int64         // unix ns

	load      atomic.Int32 // live calls + tombstones; written under mu, read lock-free to pick
	taken     atomic.Int32 // accepted, for pick's lock-free read (see call.within); written under mu
	unusable  atomic.Bool  // closed, draining or failed to write; written under mu
	closed    atomic.Bool  // closed; written under mu (before unusable)
	nearEnd   atomic.Bool  // from nearEndAfter on (half the learned query limit where filled in turn), or near MaxAge: time to dial its successor
	reads     atomic.Int64 // frames read so far: "read nothing since" is exact, needs no clock
	lastUsed  atomic.Int64 // pool clock (coarse) of the last query registered or answered
	blockedAt atomic.Int64 // reads+1 when the sweeper found it blocked: blocked until the next frame is read
	quietAt   atomic.Int64 // reads+1 when the sweeper found it reading nothing for the rescue delay with queries waiting: quiet until the next frame
	wroteAt   atomic.Int64 // unix ns of the last write of queries
	servedAt  atomic.Int64 // unix ns when lastServed last rose; written under mu, read lock-free by watchSilence
	pickedAt  atomic.Int64 // unix ns when pickIdle last gave it a query before the pool's first answer (see burstSince)
	takenAt   atomic.Int64 // unix ns when it was given its first query; written under mu (see pickInTurn)
	busyAt    atomic.Int64 // unix ns when it last took a query with nothing outstanding; written under mu (see quietFor)
	// orderedCap: the most queries it takes, its server serving them in
	// order past a few (see orderedqueue.go); 0: no such bound. The
	// sweeper's; pickInTurn reads it.
	orderedCap atomic.Int32
	serial     atomic.Bool // its own answers show it served in order (serial.go): it takes a query only with nothing outstanding; written under mu
	overtaken  atomic.Bool // an answer of its own overtook or came side by side, and it was not serial since (serial.go); written under mu
	wseq       uint32      // writer goroutine only: calls written so far

	mu         sync.Mutex
	calls      callTable     // guarded by mu: live calls and tombstones by ID
	nextID     uint16        // guarded by mu
	tombs      int           // guarded by mu
	answered   int           // guarded by mu: answers delivered on this connection
	served     int           // guarded by mu: answers to its calls, late ones included (what the server served)
	lastServed uint32        // guarded by mu: the highest write order (call.seq) the server served
	answerAt   int64         // guarded by mu: unix ns of the last answer the server served (see idledBeforeCutLocked)
	accepted   int           // guarded by mu: calls ever registered on this connection
	idleBefore int64         // guarded by mu: ns the connection sat idle before the first of its outstanding calls (see closeFor)
	queryLimit int           // guarded by mu: drain after this many calls (learned from the server); 0: none
	limitProbe int           // guarded by mu: the learned limit this connection goes past, to re-test it (see queryLimit.probe); 0: none
	silentAt   int           // guarded by mu: the answers after which it fell silent (learnSilence), which its cut may confirm (see cutConfirmsLocked); 0: none
	state      connState     // guarded by mu; changed only by setDrainingLocked and closeFor
	drainFor   CloseReason   // guarded by mu: why it drains, once state is stateDraining
	werr       error         // guarded by mu: the writer's first error; no write after it
	idle       time.Duration // guarded by mu: IdleTimeout, lowered by the server's keepalive
	answers    answerLog     // guarded by mu: what the answers say of the upstream (learned.go)
	// serialWeight, guarded by mu: the in-order evidence of this
	// connection's own answers, faded, since its last answer out of order
	// (see judgeSerialLocked)
	serialWeight float64
	watch        blockWatch // the sweeper's: is it blocked (rescue.go)

	// The sweeper's view of the read counter, guarded by mu: the reads seen at the
	// last sweep and since when that number has not moved.
	sweepReads int64
	quietSince int64
}

func newConn(p *Pool, tc *tls.Conn, bc *batchConn) *conn {
	now := nanotime()
	bufs := p.bufs.get()
	bufs.br.Reset(tc)
	bc.buf = bufs.bbuf[:0]   // not yet shared: the handshake wrote outside a batch
	bc.readAhead(bufs.ahead) // before the reader starts
	c := &conn{
		pool:       p,
		tc:         tc,
		br:         bufs.br,
		bc:         bc,
		wbuf:       bufs.wbuf[:0],
		bufs:       bufs,
		writeq:     make(chan *call, p.cfg.MaxInflight),
		trialc:     make(chan *call, 2),
		trialStop:  make(chan struct{}, 1),
		done:       make(chan struct{}),
		born:       now,
		idle:       p.cfg.IdleTimeout,
		queryLimit: int(p.learned.limit.get()),
	}
	if p.learned.limit.probe(now) {
		c.limitProbe, c.queryLimit = c.queryLimit, 0
	}
	// The idle timeout the server told on other connections holds for this
	// one before it hears it here (see keepalive).
	if told := time.Duration(p.serverIdle.Load()); told > 0 {
		c.idle = min(c.idle, idleWithin(told))
	}
	c.lastUsed.Store(now)
	return c
}

// loopDone is called by each of the connection's two goroutines as it exits;
// the last one gives the buffers back, which nothing uses any more.
func (c *conn) loopDone() {
	if c.exited.Add(1) < 2 {
		return
	}
	b := c.bufs
	b.br.Reset(nil)
	b.ahead.Reset(nil)
	c.bc.ahead = nil // nothing reads any more; a stray read goes to the (closed) socket
	b.wbuf = c.wbuf[:0]
	c.bc.mu.Lock()
	b.bbuf, c.bc.buf = c.bc.buf[:0], nil
	c.bc.mu.Unlock()
	c.pool.bufs.put(b, len(*c.pool.conns.Load())+int(c.pool.dialing.Load()))
}

// register reserves a slot and an ID for cl and queues it for writing. It fails if
// the connection is full, draining or closed, or if cl is a rescue and the
// connection holds a call: a rescue goes only to a connection with nothing
// outstanding (accepts), and the pickers read the load without the lock, so
// that rescues woken together all saw the same idle connection and went on it
// one behind the other, each stuck in turn (TestRescuesTakeIdleConnsAlone).
func (c *conn) register(cl *call) bool { return c.registerWithin(cl, c.pool.cfg.MaxInflight) }

// registerWithin is register that also fails if the connection holds limit
// calls or more: the pickers' bounds on a connection's queue (queueDepth,
// firstDialShareMax) read its load without the lock, and queries woken
// together all saw room on the same connection and went on it: 91 where 16
// were meant to join the pool's first connection (issue 21, seed 29), 21 on
// a new connection where queueDepth allowed 5.
func (c *conn) registerWithin(cl *call, limit int) bool {
	c.mu.Lock()
	if c.state != stateOpen || c.werr != nil || c.calls.len() >= min(limit, c.pool.cfg.MaxInflight) ||
		cl.avoid != nil && c.calls.len() > 0 {
		c.mu.Unlock()
		return false
	}
	// len(calls) < MaxInflight <= 65535/2, so a free ID is found within a few steps.
	for {
		id := c.nextID
		c.nextID++
		if c.calls.get(id) == nil {
			cl.id = id
			break
		}
	}
	c.calls.put(cl)
	if c.calls.len() == 1 {
		c.idleBefore = c.pool.clock.Load() - c.lastUsed.Load()
		c.busyAt.Store(nanotime())
	}
	c.load.Store(int32(c.calls.len()))
	c.accepted++
	c.taken.Store(int32(c.accepted))
	cl.nth = c.accepted
	if c.accepted == 1 {
		c.takenAt.Store(nanotime())
	}
	c.checkQueryLimitLocked()
	c.mu.Unlock()
	c.lastUsed.Store(c.pool.clock.Load())
	c.pool.kickSweeper()
	select {
	case c.writeq <- cl:
		return true
	default:
		// Calls abandoned while queued still sit in writeq until the writer skips
		// them; if a stuck writer let them pile up, go elsewhere rather than block.
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.calls.get(cl.id) != cl {
			return true // closeFor got there first and completed it: the caller sees errUnsent
		}
		c.removeLocked(cl)
		return false
	}
}

// removeLocked deletes cl's entry, live or tombstone. c.mu must be held.
func (c *conn) removeLocked(cl *call) {
	if cl.tombUntil != 0 && !cl.lost {
		c.tombs--
	}
	c.calls.remove(cl.id)
	c.load.Store(int32(c.calls.len()))
}

// giveUpLocked ends a live call whose caller or deadline gave up: a query never
// written is forgotten, a written one leaves a tombstone so that its ID cannot be
// handed to a newer query before the late answer is in. c.mu must be held.
func (c *conn) giveUpLocked(cl *call, now int64) {
	if cl.state.CompareAndSwap(callQueued, callAbandoned) {
		c.removeLocked(cl)
		return
	}
	cl.tombUntil = now + int64(c.pool.cfg.TombstoneTTL)
	if cl.lost {
		return // its answer is late because the other attempt won, not lost
	}
	c.tombs++
	if c.tombs > c.pool.cfg.MaxInflight/2 {
		// A connection soaking up unanswered queries is probably black-holed: stop
		// feeding it and let it drain or stall out.
		c.setDrainingLocked(CloseDrain)
	}
}

// await waits for cl's result, a rescue notice (errRescued) or the caller's
// cancellation.
func (c *conn) await(done <-chan struct{}, cl *call) (result, bool) {
	if done == nil {
		// A context that is never cancelled (CoreDNS's per-query one): one
		// receive instead of a select, which locks both channels and parks on
		// both. The call is completed all the same (see the ownership rule): by
		// an answer, its deadline (the sweeper) or the connection's death.
		return <-cl.resp, true
	}
	select {
	case r := <-cl.resp:
		return r, true
	case <-done:
	}
	return c.release(cl, false, 0)
}

// release ends the caller's interest in cl: a live call is given up (and c
// closed if its caller gave up every call it holds), else the result that
// completed it is received and returned, an answer in particular.
// It reports whether there was one. lost is set when the query's other attempt
// won: then the late answer is dropped as rescued, and, for the original of a
// rescue that won at wonAt, judged (see judgeLocked).
func (c *conn) release(cl *call, lost bool, wonAt int64) (result, bool) {
	c.mu.Lock()
	live := c.calls.get(cl.id) == cl && cl.tombUntil == 0 && c.state != stateClosed
	// given: its caller gave cl up (its deadline), and c now holds only
	// calls given up (see rescuedOnlyLocked). It closes now, as forward
	// closes a connection on its read timeout, not at the next full sweep:
	// the upstream counts it open until then, and each query given up so
	// kept one more open at once than forward did (property seeds 40 and
	// 87, with as many dials as the model). Not so the original of a
	// rescue that won (lost): its late answer, if it comes before that
	// sweep, is judged as evidence of in order (judgeLocked).
	given := false
	if live {
		cl.lost, cl.wonAt = lost, wonAt
		c.giveUpLocked(cl, nanotime())
		given = !lost && c.rescuedOnlyLocked()
	}
	c.mu.Unlock()
	if live {
		// No completion will come; a rescue notice may wait unread (it is sent
		// under mu, so it is in the channel by now).
		select {
		case <-cl.resp:
		default:
		}
		if given {
			c.closeFor(errRescuedOnly, CloseDrain)
		}
		c.pool.slotFreed()
		return result{}, false
	}
	for {
		if r := <-cl.resp; r.err != errRescued {
			return r, true
		}
	}
}

// avail is what a connection can do for a new query: its one state as pick,
// dial, sizing, the sweeper and Stats see it (see census.go). The states are
// ordered: each one below takes less than the one above.
type avail uint8

const (
	availTaking   avail = iota // takes new queries
	availQuiet                 // takes them, last: it read nothing for the rescue delay with queries waiting
	availNearEnd               // takes them; its successor is due (nearEndAfter, or near MaxAge)
	availBlocked               // takes none until it reads again: blocked behind a slow answer (rescue.go)
	availDraining              // takes none again: draining, or its writer failed; closes soon
	availClosed                // closed; the pool forgets it
	availCount
)

// avail returns c's state, lock-free: the one test of whether c can take a
// query. Each part is an atomic written under mu (unusable, closed, nearEnd)
// or by the sweeper (blockedAt, quietAt: until the reader reads again).
func (c *conn) avail() avail {
	switch {
	case c.unusable.Load():
		if c.closed.Load() {
			return availClosed
		}
		return availDraining
	case c.blocked():
		return availBlocked
	case c.nearEnd.Load():
		return availNearEnd
	case c.quiet():
		return availQuiet
	}
	return availTaking
}

// blocked reports whether the sweeper found c blocked and it has read nothing since.
func (c *conn) blocked() bool {
	b := c.blockedAt.Load()
	return b != 0 && b == c.reads.Load()+1
}

// quiet reports whether the sweeper found c reading nothing for the rescue
// delay while queries wait behind another, it has read nothing since, and
// something is still outstanding: nothing shows yet that they are blocked (see
// rescue.go), but a query put there may be, so one goes there only if no
// other connection has room.
func (c *conn) quiet() bool {
	q := c.quietAt.Load()
	return q != 0 && q == c.reads.Load()+1 && c.load.Load() > 0
}

// takes reports whether a connection in state a takes new queries.
func (a avail) takes() bool { return a <= availNearEnd }

// open reports whether a connection in state a is open and will be used again
// (neither draining nor closed).
func (a avail) open() bool { return a < availDraining }

// connState is where a connection is in its life. The transitions, all under
// conn.mu, are open → draining (setDrainingLocked: no new queries, and it closes
// once its last answer is in) and open or draining → closed (closeFor, once).
type connState uint8

const (
	stateOpen connState = iota
	stateDraining
	stateClosed
)

func (c *conn) drainReason() CloseReason {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.drainFor
}

// setDrainingLocked stops new queries on an open connection; it does nothing to a
// connection already draining (the first reason stays) or closed.
func (c *conn) setDrainingLocked(r CloseReason) {
	if c.state != stateOpen {
		return
	}
	c.state, c.drainFor = stateDraining, r
	c.unusable.Store(true)
}

// drainedLocked returns the drain reason if the connection is draining and empty,
// or -1.
func (c *conn) drainedLocked() CloseReason {
	if c.state == stateDraining && c.calls.len() == 0 {
		return c.drainFor
	}
	return -1
}

// idleRaceAfter: a server's close of a connection idle this long before the
// queries it carries is taken for its idle timeout (see closeFor).
const idleRaceAfter = 100 * time.Millisecond

// closeFor closes the connection once, for cause. Live calls complete with an error
// telling the caller whether the query was written (and so may be replayed) or not
// (and so moves elsewhere at no cost). It never blocks on the peer.
func (c *conn) closeFor(cause error, reason CloseReason) {
	c.mu.Lock()
	if c.state == stateClosed {
		c.mu.Unlock()
		return
	}
	wasOpen := c.state == stateOpen
	c.state = stateClosed
	c.pool.closing.Add(1) // before unusable: no dial may start until connClosed has judged this one
	c.closed.Store(true)
	c.unusable.Store(true)
	live := make([]*call, 0, c.calls.len())
	ignored := 0 // evicted and still unanswered: the server held them
	for cl := range c.calls.all() {
		if cl.tombUntil == 0 {
			live = append(live, cl)
		} else if cl.evicted {
			ignored++
		}
	}
	c.calls.clear()
	c.tombs = 0
	c.load.Store(0)
	answered, served := c.answered, c.served
	// A server that closes a connection which sat idle a while before the
	// queries it now carries most likely closed it for idleness as they
	// went out (its idle timeout may be shorter than ours): they are
	// replayed, as on a connection that had answered, and the close is no
	// failure of the upstream.
	idleRace := reason == CloseServer && c.idleBefore >= int64(idleRaceAfter)
	confirms := c.cutConfirmsLocked(reason, ignored)
	idled := c.idledBeforeCutLocked()
	life := connLife{answered: answered, accepted: c.accepted, age: time.Duration(nanotime() - c.born),
		serverIdle: time.Duration(c.pool.serverIdle.Load()), idleRace: idleRace}
	c.mu.Unlock()

	close(c.done)
	// Wake the reader, which closes the socket on its way out, and fail any write
	// blocked on a peer that does not read (the writer's, or crypto/tls's own reply
	// to a post-handshake message, which the reader makes).
	c.tc.SetReadDeadline(time.Unix(1, 0))
	c.bc.kill()
	// The pool forgets the connection, learns from its end and arms its backoff
	// before the queries move on, so that where they go reflects all of that.
	if wasOpen || len(live) > 0 || confirms {
		// Only a cut of a connection we were still feeding says anything about the
		// server's limit: one that ends while draining was stopped by us first,
		// though with queries still out it shows a restart as any cut does.
		// Nor does one that came as a query reached a connection idle for
		// idleRaceAfter or more: that is the server's idle timeout, counted as
		// a cut of an idle connection (a sign of a restart if a busy one is cut
		// with it, never a limit). dnsdist closes client connections idle for
		// 2 s; two such cuts after 8 and 7 answers taught a limit of 6, and
		// every connection was then closed after six queries: some 3,400
		// handshakes in 15 s, and under load a quarter of the queries
		// unanswered (make bench-regimes, dnsdist-slow). Nor, whatever
		// the idle spell, one whose queries went out after it sat idle
		// past answerCutWithin from its last answer (idledBeforeCutLocked).
		busy := len(live)
		if !wasOpen || idleRace || idled {
			busy = 0
		}
		if confirms {
			busy = ignored
		}
		// Not one the depth probe held at the depth: see heldAtDepth.
		atAnswer := busy == 0 && wasOpen && !idleRace && nanotime()-c.servedAt.Load() < int64(answerCutWithin) && !c.pool.heldAtDepth(life.accepted)
		c.pool.learnLimit(reason, served, busy, atAnswer)
	}
	c.pool.connClosed(c, reason, life)
	lost := &connLostError{cause: cause, replayable: answered > 0 || idleRace, serverCut: reason == CloseServer, served: served}
	for _, cl := range live {
		if cl.state.CompareAndSwap(callQueued, callAbandoned) {
			cl.complete(result{err: errUnsent})
		} else {
			cl.complete(result{err: lost})
		}
	}
}

// closeSocket closes the TLS connection. tls.Conn.Close sends close_notify and may
// block for seconds on a peer that does not read, so the raw socket is closed after
// a short grace.
func (c *conn) closeSocket() {
	t := time.AfterFunc(closeGrace, func() { c.tc.NetConn().Close() })
	c.tc.Close()
	t.Stop()
}

const closeGrace = 250 * time.Millisecond

func nanotime() int64 { return time.Now().UnixNano() }
