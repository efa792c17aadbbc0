package dot

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// newTestPool returns a pool to s, configured by mod, closed (and checked for
// leaked goroutines) when the test ends. To a Pipe server (see startPipe) it
// dials in-memory pipes.
func newTestPool(t *testing.T, s *dottest.Server, mod func(*Config)) (*Pool, *recorder) {
	t.Helper()
	rec := newRecorder()
	cfg := Config{Addr: s.Addr, TLS: s.ClientTLS(), Observer: rec}
	if s.Piped() {
		cfg.Dial = s.Dial
	}
	if mod != nil {
		mod(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		p.Close()
		checkNoPoolGoroutines(t)
	})
	return p, rec
}

// startPipe starts a server scripted by opts that serves in-memory pipes, for a
// test inside a testing/synctest bubble (synctest.Test): its timers (timeouts,
// idle, stall, backoff, max age, keepalive, deadlines) then run on the bubble's
// virtual clock, which jumps ahead whenever every goroutine of the bubble
// waits, so they fire at once and exactly on time. Start it inside the bubble;
// it closes when the test ends.
func startPipe(t *testing.T, opts dottest.Options) *dottest.Server {
	t.Helper()
	opts.Pipe = true
	return dottest.Start(t, opts)
}

func newQuery(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// exchange runs one query with a generous deadline.
func exchange(p *Pool, name string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return p.Exchange(ctx, newQuery(name, dns.TypeA))
}

// waitFor and checkNoPoolGoroutines are dottest's, under the names the tests use.
func waitFor(t *testing.T, what string, cond func() bool) { t.Helper(); dottest.WaitFor(t, what, cond) }

func checkNoPoolGoroutines(t *testing.T) { t.Helper(); dottest.CheckNoPoolGoroutines(t) }

// recorder is an Observer that counts events.
type recorder struct {
	mu        sync.Mutex
	dials     int
	dialErrs  int
	resumed   int
	closes    map[CloseReason]int
	drops     map[DropReason]int
	replays   int
	timeouts  int
	failures  int
	verdicts  []bool // SharedRecords reports, in order
	coalesced int
	rescues   int
	modes     []Mode // ModeLearned reports of a new mode, in order
	perConn   []int  // ModeLearned reports' queries per connection, in order
	wanted    int    // the last Sized report
	open      int
	maxWant   int // the most connections ever wanted
}

func newRecorder() *recorder {
	return &recorder{closes: map[CloseReason]int{}, drops: map[DropReason]int{}}
}

func (r *recorder) Dialed(_ time.Duration, resumed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dials++
	if err != nil {
		r.dialErrs++
	}
	if resumed {
		r.resumed++
	}
}

func (r *recorder) Closed(reason CloseReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closes[reason]++
}

func (r *recorder) Dropped(reason DropReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drops[reason]++
}

func (r *recorder) Replayed() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replays++
}

func (r *recorder) TimedOut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timeouts++
}

func (r *recorder) Failed(error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures++
}

func (r *recorder) SharedRecords(shared bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.verdicts = append(r.verdicts, shared)
}

func (r *recorder) Coalesced() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.coalesced++
}

func (r *recorder) ModeLearned(m Mode, perConn int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.perConn = append(r.perConn, perConn)
	if len(r.modes) == 0 && m == ModeUnknown || len(r.modes) > 0 && r.modes[len(r.modes)-1] == m {
		return // the queries per connection changed, not the mode
	}
	r.modes = append(r.modes, m)
}

func (r *recorder) Sized(wanted, open int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wanted, r.open, r.maxWant = wanted, open, max(r.maxWant, wanted)
}

func (r *recorder) Rescued() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rescues++
}

func (r *recorder) get(f func(r *recorder) int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return f(r)
}

// gate is a Dial wrapper whose connections count writes and can hold them.
type gate struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error) // nil: TCP
	mu      sync.Mutex
	held    chan struct{} // non-nil: writes block until it is closed
	entered chan struct{} // receives once per write that blocked
	writes  atomic.Int64
	last    []byte // guarded by mu: the bytes of the last write
	dials   atomic.Int64
	conns   []net.Conn
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 1024)} }

// newPipeGate returns a gate over the in-memory pipes of s, a Pipe server.
func newPipeGate(s *dottest.Server) *gate {
	g := newGate()
	g.dial = s.Dial
	return g
}

func (g *gate) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	dial := g.dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	c, err := dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	g.dials.Add(1)
	gc := &gatedConn{Conn: c, g: g, closed: make(chan struct{})}
	g.mu.Lock()
	g.conns = append(g.conns, gc)
	g.mu.Unlock()
	return gc, nil
}

// hold makes later writes block until release.
func (g *gate) hold() {
	g.mu.Lock()
	g.held = make(chan struct{})
	g.mu.Unlock()
}

func (g *gate) release() {
	g.mu.Lock()
	if g.held != nil {
		close(g.held)
		g.held = nil
	}
	g.mu.Unlock()
}

type gatedConn struct {
	net.Conn
	g      *gate
	once   sync.Once
	closed chan struct{}
}

func (c *gatedConn) Write(b []byte) (int, error) {
	c.g.mu.Lock()
	held := c.g.held
	c.g.mu.Unlock()
	if held != nil {
		c.g.entered <- struct{}{}
		select {
		case <-held:
		case <-c.closed: // like a blocked socket write, closing the socket ends it
			return 0, net.ErrClosed
		}
	}
	c.g.writes.Add(1)
	c.g.mu.Lock()
	c.g.last = append(c.g.last[:0], b...)
	c.g.mu.Unlock()
	return c.Conn.Write(b)
}

func (c *gatedConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// tlsRecords counts the TLS records in b, which must hold whole records.
func tlsRecords(b []byte) int {
	n := 0
	for len(b) >= 5 {
		n++
		b = b[min(len(b), 5+(int(b[3])<<8|int(b[4]))):]
	}
	return n
}

// slowName is a server's answer delay: slow for "slow.example.", other for
// every other name.
func slowName(slow, other time.Duration) func(dns.Question) time.Duration {
	return func(q dns.Question) time.Duration {
		if q.Name == "slow.example." {
			return slow
		}
		return other
	}
}

// hiccups is a busy machine for the connections a test wraps in hiccupConn:
// from a time on, every period, each read and write that comes in the first
// length(k) of the k-th period waits to its end, as if the goroutine doing it
// waited for a CPU (the pool's writer, and its reader with an answer read).
type hiccups struct {
	from   atomic.Int64 // unix ns of the first hiccup; 0: none
	period time.Duration
	length func(k int64) time.Duration
}

// wait sleeps to the end of the hiccup under way, if any.
func (h *hiccups) wait() {
	from, now := h.from.Load(), time.Now().UnixNano()
	if from == 0 || now < from {
		return
	}
	k, in := (now-from)/int64(h.period), time.Duration(now-from)%h.period
	if l := h.length(k); in < l {
		time.Sleep(l - in) // the machine's hiccup, in virtual time: not a test waiting for a condition
	}
}

// dial wraps dial's connections in hiccupConn.
func (h *hiccups) dial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &hiccupConn{Conn: c, h: h}, nil
	}
}

// hiccupConn is the client's end of a connection on a machine with hiccups.
type hiccupConn struct {
	net.Conn
	h *hiccups
}

func (c *hiccupConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.h.wait()
	return n, err
}

func (c *hiccupConn) Write(b []byte) (int, error) {
	c.h.wait()
	return c.Conn.Write(b)
}
