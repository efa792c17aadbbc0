package dot

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// Call states. The writer moves a call from queued to sent just before copying it
// into the write buffer; a caller or the sweeper giving up moves it from queued to
// abandoned. Whichever CAS wins decides whether the query may be on the wire.
const (
	callQueued int32 = iota
	callSent
	callAbandoned
)

// call is one attempt of a query on one connection.
type call struct {
	q        *query
	deadline int64       // unix ns after which the attempt times out; immutable
	resp     chan result // cap 1; exactly one completion is ever sent (see conn.mu)
	state    atomic.Int32
	sentAt   atomic.Int64 // unix ns when the batch holding it was flushed; 0 before
	readsAt  atomic.Int64 // the connection's frames read when it was flushed
	id       uint16       // connection-local ID, set under conn.mu by register
	trial    bool         // the call is one of a record trial's two queries (see packing)

	callerDeadline bool // deadline is the caller's, not ReadTimeout

	completions atomic.Int32 // how often complete ran: the tests hold it to exactly 1

	// tombUntil, guarded by conn.mu, is non-zero once the caller gave up on the sent
	// query: its ID stays reserved until the late answer arrives or this time passes.
	tombUntil int64
}

// complete delivers the call's result. The ownership rule makes this happen once, so
// the send on the 1-slot channel never blocks.
func (cl *call) complete(r result) {
	cl.completions.Add(1)
	cl.resp <- r
}

// result completes a call: an answer, unpacked for the caller, or an error.
type result struct {
	msg *dns.Msg
	err error
}

// conn is one TLS connection to the upstream, carrying many queries at once. Its
// reader goroutine frames answers and hands each to its call; its writer goroutine
// coalesces queued queries into one TLS write.
//
// Ownership rule: a call is live while it is in calls with tombUntil == 0. Whoever
// ends that state under mu (reader on an answer, sweeper on a timeout, closeFor on
// death, the caller on cancellation) completes the call, and only that one.
type conn struct {
	pool   *Pool
	tc     *tls.Conn
	br     *bufio.Reader // reader goroutine only
	bc     *batchConn    // under tc: gathers the records of one batch into one write
	wbuf   []byte        // writer goroutine only: frames of the batch being written
	trialc chan *call    // cap 2: the reader reports answers to record trial queries to the writer
	writeq chan *call    // cap MaxInflight; sends never block (see register)
	done   chan struct{} // closed when the connection is closed
	born   int64         // unix ns

	load      atomic.Int32 // live calls + tombstones; written under mu, read lock-free to pick
	unusable  atomic.Bool  // closed or draining; written under mu
	nearLimit atomic.Bool  // 3/4 of the learned query limit taken: time to dial the next one; written under mu
	reads     atomic.Int64 // frames read so far: "read nothing since" is exact, needs no clock
	lastUsed  atomic.Int64 // pool clock (coarse) of the last query registered or answered

	mu       sync.Mutex
	calls    map[uint16]*call // guarded by mu: live calls and tombstones by ID
	nextID   uint16           // guarded by mu
	tombs    int              // guarded by mu
	answered int              // guarded by mu: answers delivered on this connection
	accepted int              // guarded by mu: calls ever registered on this connection
	limit    int              // guarded by mu: drain after this many calls (learned from the server); 0: none
	closed   bool             // guarded by mu
	werr     error            // guarded by mu: the writer's first error; no write after it
	draining CloseReason      // guarded by mu: why it drains; -1 when not draining
	idle     time.Duration    // guarded by mu: IdleTimeout, lowered by the server's keepalive

	// The sweeper's view of the read counter, guarded by mu: the reads seen at the
	// last sweep and since when that number has not moved.
	sweepReads int64
	quietSince int64
}

func newConn(p *Pool, tc *tls.Conn, bc *batchConn) *conn {
	now := nanotime()
	c := &conn{
		pool:     p,
		tc:       tc,
		br:       bufio.NewReaderSize(tc, 16<<10),
		bc:       bc,
		writeq:   make(chan *call, p.cfg.MaxInflight),
		trialc:   make(chan *call, 2),
		done:     make(chan struct{}),
		born:     now,
		calls:    make(map[uint16]*call, p.cfg.MaxInflight),
		draining: -1,
		idle:     p.cfg.IdleTimeout,
		limit:    int(p.learnedLimit()),
	}
	c.lastUsed.Store(now)
	return c
}

// register reserves a slot and an ID for cl and queues it for writing. It fails if
// the connection is full, draining or closed.
func (c *conn) register(cl *call) bool {
	c.mu.Lock()
	if c.closed || c.werr != nil || c.draining >= 0 || len(c.calls) >= c.pool.cfg.MaxInflight {
		c.mu.Unlock()
		return false
	}
	// len(calls) < MaxInflight <= 65535/2, so a free ID is found within a few steps.
	for {
		id := c.nextID
		c.nextID++
		if _, busy := c.calls[id]; !busy {
			cl.id = id
			break
		}
	}
	c.calls[cl.id] = cl
	c.load.Store(int32(len(c.calls)))
	c.accepted++
	c.checkLimitLocked()
	c.mu.Unlock()
	c.lastUsed.Store(c.pool.clock.Load())
	select {
	case c.writeq <- cl:
		return true
	default:
		// Calls abandoned while queued still sit in writeq until the writer skips
		// them; if a stuck writer let them pile up, go elsewhere rather than block.
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.calls[cl.id] != cl {
			return true // closeFor got there first and completed it: the caller sees errUnsent
		}
		c.removeLocked(cl)
		return false
	}
}

// checkLimitLocked applies the learned query limit to what the connection has
// accepted. c.mu must be held.
func (c *conn) checkLimitLocked() {
	if c.limit > 0 && c.accepted >= c.limit*3/4 {
		c.nearLimit.Store(true)
	}
	if c.limit > 0 && c.accepted >= c.limit && c.draining < 0 {
		// The server cuts connections after about this many queries: stop here so
		// that nothing we write is cut off.
		c.setDrainingLocked(CloseLimit)
	}
}

// setLimit applies a newly learned query limit to an open connection.
func (c *conn) setLimit(limit int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.limit = limit
	c.checkLimitLocked()
}

// writeLoop writes queued calls: everything queued while it was busy goes out in
// one flush, one syscall for a burst of queries (see packing for how they are
// framed into TLS records).
func (c *conn) writeLoop() {
	defer c.pool.wg.Done()
	var batch []*call
	for {
		var ok bool
		if batch, ok = c.gather(batch[:0]); !ok {
			return
		}
		err := c.writeBatch(batch)
		clear(batch)
		if err != nil {
			c.writeFailed(err)
			return
		}
	}
}

// gather waits for a queued call and takes everything queued behind it. It yields
// once, so that callers about to queue make it into this write (gRPC's loopy writer
// does the same). It returns false when the connection is closed.
func (c *conn) gather(batch []*call) ([]*call, bool) {
	select {
	case cl := <-c.writeq:
		batch = append(batch, cl)
	case <-c.done:
		return batch, false
	}
	yielded, size := false, len(batch[0].q.wire)
	for {
		select {
		case cl := <-c.writeq:
			batch = append(batch, cl)
			size += len(cl.q.wire)
			continue
		default:
		}
		if yielded || size >= coalesceBytes {
			return batch, true
		}
		yielded = true
		runtime.Gosched()
	}
}

// writeBatch writes the calls of batch that are still queued, in shared TLS records
// if the upstream is known to read them, else one record each; a batch of three or
// more runs the record trial when there is no verdict yet.
func (c *conn) writeBatch(batch []*call) error {
	v := c.pool.packing()
	if v == packUnknown && len(batch) >= 3 && c.pool.startTrial() {
		n, err := c.trial(batch)
		if err != nil {
			return err
		}
		batch, v = batch[n:], c.pool.packing()
	}
	f := ownRecords
	if v == packShared {
		f = sharedRecords
	}
	_, err := c.writeRecords(batch, f)
	return err
}

// framing says how writeRecords puts queries into TLS records.
type framing int

const (
	ownRecords    framing = iota // each query in a record of its own
	sharedRecords                // all but the last share records, the last has its own
	oneRecord                    // all in one record: the record trial
)

// writeRecords frames the calls of batch still queued (one abandoned by its caller
// is skipped) and writes them with one syscall, in records as f says. In shared
// records the last query has a record of its own: a server that serves the queries
// left in its TLS buffer only when its socket is readable (dnsdist 1.7) finds that
// record unread on the socket until it has served the others. The shared query
// wire is never written to: our length and ID go in front of a copy. It returns
// how many calls it wrote (moved to the front of batch) and the first write
// error, which is sticky.
func (c *conn) writeRecords(batch []*call, f framing) (int, error) {
	var werr error
	write := func(p []byte) {
		if _, err := c.tc.Write(p); err != nil && werr == nil {
			werr = err
		}
	}
	n, last := 0, 0
	buf := c.wbuf[:0]
	c.bc.begin()
	for _, cl := range batch {
		if !cl.q.framed() {
			continue // never sent: left queued, its caller or the sweeper gives it up
		}
		if !cl.state.CompareAndSwap(callQueued, callSent) {
			continue
		}
		last = len(buf)
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(cl.q.wire)-2))
		buf = binary.BigEndian.AppendUint16(buf, cl.id)
		buf = append(buf, cl.q.wire[4:]...)
		if f == ownRecords {
			write(buf)
			buf = buf[:0]
		}
		batch[n] = cl
		n++
	}
	switch {
	case n == 0 || f == ownRecords:
	case f == sharedRecords && last > 0:
		write(buf[:last])
		write(buf[last:])
	default:
		write(buf)
	}
	c.wbuf = buf[:0]
	if n == 0 {
		return 0, c.bc.flush()
	}
	// Frames read before the write cannot be answers to it: whatever is read from
	// now on counts as "read since it was sent".
	reads := c.reads.Load()
	c.tc.SetWriteDeadline(time.Now().Add(c.pool.cfg.WriteTimeout))
	err := c.bc.flush()
	if werr != nil {
		err = werr
	}
	now := nanotime()
	for _, cl := range batch[:n] {
		cl.readsAt.Store(reads)
		cl.sentAt.Store(now)
	}
	return n, err
}

// readLoop frames answers and dispatches them until the connection fails or is
// closed; then it closes the socket.
func (c *conn) readLoop() {
	defer c.pool.wg.Done()
	defer c.closeSocket()
	c.readFailed(c.readFrames(c.br))
}

// readFrames reads length-prefixed answers from r and dispatches each until r fails.
// The frame buffer is reused: dispatch is done with a frame when it returns (the
// answer is unpacked on this goroutine, and miekg/dns copies what it keeps).
func (c *conn) readFrames(r io.Reader) error {
	var hdr [2]byte
	var buf []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := int(binary.BigEndian.Uint16(hdr[:]))
		if cap(buf) < n {
			buf = make([]byte, max(n, 1024))
		}
		frame := buf[:n]
		if _, err := io.ReadFull(r, frame); err != nil {
			return err
		}
		c.reads.Add(1)
		c.dispatch(frame)
	}
}

// writeFailed handles the writer's first (sticky) error. A write usually fails
// because the server closed the connection, and answers it sent before closing may
// still be unread: the reader gets a short grace to deliver them and to see the
// server's EOF before the connection is closed as failed.
func (c *conn) writeFailed(err error) {
	c.mu.Lock()
	c.werr = fmt.Errorf("write: %w", err)
	c.unusable.Store(true)
	c.mu.Unlock()
	c.tc.SetReadDeadline(time.Now().Add(closeGrace))
}

// readFailed classifies the error that ended the read loop.
func (c *conn) readFailed(err error) {
	c.mu.Lock()
	werr := c.werr
	c.mu.Unlock()
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		c.closeFor(errServerClosed, CloseServer)
	case werr != nil:
		c.closeFor(werr, CloseError)
	default:
		c.closeFor(fmt.Errorf("read: %w", err), CloseError) // no-op if we closed it ourselves
	}
}

var errServerClosed = errors.New("server closed the connection")

// dispatch hands an answer to the call waiting for it, or drops and counts it.
func (c *conn) dispatch(frame []byte) {
	if len(frame) < 12 {
		c.pool.obs.Dropped(DropMalformed)
		return
	}
	id := binary.BigEndian.Uint16(frame)
	c.mu.Lock()
	cl, ok := c.calls[id]
	var drop DropReason = -1
	switch {
	case !ok || cl.state.Load() != callSent:
		drop = DropUnknownID // never asked, or not yet written: nobody can own it
	case !answers(frame, cl.q.question):
		drop = DropWrongQuestion // the call keeps waiting for its real answer
	case cl.tombUntil != 0:
		drop = DropLate
		c.removeLocked(cl)
	default:
		c.removeLocked(cl)
		c.answered++
	}
	first := drop < 0 && c.answered == 1
	drain := c.drainedLocked()
	c.mu.Unlock()

	if first {
		c.pool.answered() // before the caller hears of it: its next query sees the reset
	}
	if drop >= 0 {
		c.pool.obs.Dropped(drop)
	} else {
		c.deliver(cl, frame)
		if cl.trial {
			c.trialAnswered(cl)
		}
	}
	if drain >= 0 {
		c.closeFor(errDrained, drain)
	}
	c.pool.slotFreed()
}

var errDrained = errors.New("connection drained")

// deliver unpacks an answer for its call and completes it. The reader does this,
// not the caller: the reader's stack has grown once and for all, whereas the caller
// runs on CoreDNS's fresh per-query goroutine, whose stack an unpack this deep would
// grow (copy) on every query.
func (c *conn) deliver(cl *call, frame []byte) {
	r, keepalive, err := finishAnswer(cl.q, frame)
	if err != nil {
		c.pool.obs.Dropped(DropMalformed)
	} else if keepalive >= 0 {
		c.keepalive(keepalive)
	}
	cl.complete(result{msg: r, err: err})
	c.lastUsed.Store(c.pool.clock.Load())
}

// removeLocked deletes cl's entry, live or tombstone. c.mu must be held.
func (c *conn) removeLocked(cl *call) {
	if cl.tombUntil != 0 {
		c.tombs--
	}
	delete(c.calls, cl.id)
	c.load.Store(int32(len(c.calls)))
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
	c.tombs++
	if c.tombs > c.pool.cfg.MaxInflight/2 && c.draining < 0 {
		// A connection soaking up unanswered queries is probably black-holed: stop
		// feeding it and let it drain or stall out.
		c.setDrainingLocked(CloseDrain)
	}
}

// await waits for cl's result or the caller's cancellation.
func (c *conn) await(done <-chan struct{}, cl *call) (result, bool) {
	select {
	case r := <-cl.resp:
		return r, true
	case <-done:
	}
	c.mu.Lock()
	live := c.calls[cl.id] == cl && cl.tombUntil == 0 && !c.closed
	if live {
		c.giveUpLocked(cl, nanotime())
	}
	c.mu.Unlock()
	if live {
		c.pool.slotFreed()
		return result{}, false
	}
	// Someone completed it first; prefer that result, an answer in particular.
	return <-cl.resp, true
}

// sweep runs on the pool's ticker: it times out calls past their deadline, reaps
// tombstones, and closes the connection when it is stalled, idle or drained.
func (c *conn) sweep(now int64) {
	cfg := &c.pool.cfg
	var expired []*call
	var oldest *call // the outstanding written query sent first
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	for _, cl := range c.calls {
		if cl.tombUntil != 0 && now > cl.tombUntil {
			c.removeLocked(cl)
			continue
		}
		if cl.tombUntil == 0 && now > cl.deadline {
			c.giveUpLocked(cl, now)
			expired = append(expired, cl)
		}
		if s := cl.sentAt.Load(); s != 0 && (oldest == nil || s < oldest.sentAt.Load()) {
			oldest = cl
		}
	}
	if cfg.MaxAge > 0 && c.draining < 0 && now-c.born > int64(cfg.MaxAge) {
		c.setDrainingLocked(CloseMaxAge)
	}
	// Stalled: the oldest outstanding query is older than the stall timeout and not
	// a single frame was read since it was written. A slow answer on a connection
	// that is still answering others is not a stall.
	stalled := oldest != nil && now-oldest.sentAt.Load() > int64(cfg.StallTimeout) && c.reads.Load() == oldest.readsAt.Load()
	if r := c.reads.Load(); r != c.sweepReads || c.quietSince == 0 {
		c.sweepReads, c.quietSince = r, now
	}
	// A draining connection gets no new queries, so its answers only dry up. If
	// they stop while queries are still out, the server has most likely dropped
	// them (or is about to cut the connection): close it so that they are
	// replayed elsewhere now, rather than waiting out their read timeout.
	stuck := c.draining >= 0 && oldest != nil && now-c.quietSince > int64(drainQuiet(cfg))
	idle := len(c.calls) == 0 && now-c.lastUsed.Load() > int64(c.idle)
	drain := c.drainedLocked()
	c.mu.Unlock()

	for _, cl := range expired {
		c.pool.obs.TimedOut()
		cl.complete(result{err: ErrTimeout})
	}
	switch {
	case stalled:
		c.closeFor(ErrStalled, CloseStall)
	case stuck:
		c.closeFor(errDrainStuck, c.drainReason())
	case drain >= 0:
		c.closeFor(errDrained, drain)
	case idle:
		c.closeFor(errIdle, CloseIdle)
	}
	if len(expired) > 0 {
		c.pool.slotFreed()
	}
}

var (
	errIdle       = errors.New("connection idle")
	errDrainStuck = errors.New("draining connection stopped answering")
)

// drainQuiet is how long a draining connection may go without any answer while
// queries are outstanding: a quarter of the stall timeout, at most 500ms.
func drainQuiet(cfg *Config) time.Duration { return min(cfg.StallTimeout/4, 500*time.Millisecond) }

func (c *conn) drainReason() CloseReason {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.draining
}

func (c *conn) setDrainingLocked(r CloseReason) {
	c.draining = r
	c.unusable.Store(true)
}

// drainedLocked returns the drain reason if the connection is draining and empty,
// or -1.
func (c *conn) drainedLocked() CloseReason {
	if c.draining >= 0 && len(c.calls) == 0 && !c.closed {
		return c.draining
	}
	return -1
}

// keepalive applies the server's RFC 7828 timeout (units of 100ms): close idle
// connections well before the server would, and drain on a timeout of 0.
func (c *conn) keepalive(units int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if units == 0 {
		if c.draining < 0 {
			c.setDrainingLocked(CloseDrain)
		}
		return
	}
	if t := time.Duration(units) * 100 * time.Millisecond * 3 / 4; t < c.idle {
		c.idle = t
	}
}

// closeFor closes the connection once, for cause. Live calls complete with an error
// telling the caller whether the query was written (and so may be replayed) or not
// (and so moves elsewhere at no cost). It never blocks on the peer.
func (c *conn) closeFor(cause error, reason CloseReason) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.pool.closing.Add(1) // before unusable: no dial may start until connClosed has judged this one
	c.unusable.Store(true)
	live := make([]*call, 0, len(c.calls))
	for _, cl := range c.calls {
		if cl.tombUntil == 0 {
			live = append(live, cl)
		}
	}
	clear(c.calls)
	c.tombs = 0
	c.load.Store(0)
	answered, draining := c.answered, c.draining
	c.mu.Unlock()

	close(c.done)
	// Wake the reader, which closes the socket on its way out.
	c.tc.SetReadDeadline(time.Unix(1, 0))
	// The pool forgets the connection, learns from its end and arms its backoff
	// before the queries move on, so that where they go reflects all of that.
	if draining < 0 {
		// Only a cut of a connection we were still feeding says anything about the
		// server's limit: one that ends while draining was stopped by us first.
		c.pool.learnLimit(reason, answered, len(live))
	}
	c.pool.connClosed(c, reason, answered > 0)
	lost := &connLostError{cause: cause, replayable: answered > 0}
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

// coalesceBytes: below this much buffered, the writer yields once before flushing.
const coalesceBytes = 4 << 10

// connLostError is returned for a written query whose connection died.
type connLostError struct {
	cause      error
	replayable bool // the connection had answered before: a replay has a chance
}

func (e *connLostError) Error() string   { return fmt.Sprintf("%v: %v", ErrConnLost, e.cause) }
func (e *connLostError) Unwrap() []error { return []error{ErrConnLost, e.cause} }

func nanotime() int64 { return time.Now().UnixNano() }

// batchConn sits between a tls.Conn and its socket. While the writer has a batch
// open, the records TLS writes are gathered and sent with one syscall when the
// batch is flushed; outside a batch (the handshake, alerts) writes go straight
// through. So however a burst of queries is framed into records (see framing), it
// costs one write.
type batchConn struct {
	net.Conn
	rc       syscall.RawConn // the socket, when Conn has one: for setQuickAck
	flushes  atomic.Uint64   // batches written
	acked    uint64          // reader only: flushes when quick ACKs were last armed
	mu       sync.Mutex
	batching bool   // guarded by mu
	buf      []byte // guarded by mu
	err      error  // guarded by mu: the first write error, sticky
}

func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.err != nil:
		return 0, b.err
	case b.batching:
		b.buf = append(b.buf, p...)
		return len(p), nil
	}
	n, err := b.Conn.Write(p)
	if err != nil {
		b.err = err
	}
	return n, err
}

// Read reads from the socket and re-arms quick ACKs (see setQuickAck) if a batch
// was written since they were last armed: Linux goes back to delaying ACKs when
// we send, and stays in quick mode until then, so arming them on every read would
// be a wasted syscall most of the time.
func (b *batchConn) Read(p []byte) (int, error) {
	n, err := b.Conn.Read(p)
	if f := b.flushes.Load(); n > 0 && b.rc != nil && f != b.acked {
		b.acked = f
		b.rc.Control(setQuickAck)
	}
	return n, err
}

// begin opens a batch: writes are buffered until flush.
func (b *batchConn) begin() {
	b.mu.Lock()
	b.batching = true
	b.mu.Unlock()
}

// flush closes the batch and writes what it gathered in one call.
func (b *batchConn) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.batching = false
	if len(b.buf) > 0 && b.err == nil {
		if _, err := b.Conn.Write(b.buf); err != nil {
			b.err = err
		}
		b.flushes.Add(1)
	}
	b.buf = b.buf[:0]
	return b.err
}
