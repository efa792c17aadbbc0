package dot

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// simUpstream is a DoT server that serves as a drawn behaviour says, over
// in-memory pipes, inside a synctest bubble. The pool dials it with TLS; the
// model of forward without (a handshake's cost is the dial's virtual time,
// which both pay alike; its CPU is not measured, so the model saves it).
type simUpstream struct {
	b     *behaviour
	start time.Time // the load's start: the behaviour's windows count from it
	cert  *dottest.Cert
	tls   *tls.Config

	mu      sync.Mutex
	asked   map[string]int        // guarded by mu: how often each name was taken up
	conns   map[*simConn]struct{} // guarded by mu: open connections
	peak    int                   // guarded by mu: the most connections ever open at once
	dials   int                   // guarded by mu
	closed  bool                  // guarded by mu
	held    int                   // guarded by mu: the most connections open at a sample (see sampleHeld)
	heldN   int                   // guarded by mu: the samples taken
	heldSum int                   // guarded by mu: the connections open at them, summed
	stop    chan struct{}         // closed by close: ends sampleHeld
	side    string                // with -property.trace, whose upstream it is ("pool", "forward"): see traceOpen
	wg      sync.WaitGroup
}

// newSimUpstream starts an upstream behaving as b. Start it in the bubble: its
// certificate is valid from the bubble's (virtual) start.
func newSimUpstream(t *testing.T, b *behaviour) *simUpstream {
	cert, err := dottest.NewCert()
	if err != nil {
		t.Fatal(err)
	}
	cfg := cert.ServerTLS()
	cfg.NextProtos = []string{"dot"}
	cfg.CurvePreferences = []tls.CurveID{tls.X25519} // as dottest's pipe servers: CPU is not what is tested
	u := &simUpstream{
		b: b, start: time.Now(), cert: cert, tls: cfg,
		asked: map[string]int{},
		conns: map[*simConn]struct{}{},
		stop:  make(chan struct{}),
	}
	u.cutAtSwitch()
	return u
}

// cutAtSwitch closes every open connection at a mixed upstream's switch,
// if its style is switchCuts: the server behind the address failed over or
// restarted, and the connections to the old one die with it, busy or not.
func (u *simUpstream) cutAtSwitch() {
	m := u.b.mix
	if m == nil || m.switchAt == 0 || m.style != switchCuts {
		return
	}
	u.wg.Go(func() {
		t := time.NewTimer(m.switchAt)
		defer t.Stop()
		select {
		case <-u.stop:
			return
		case <-t.C:
		}
		u.mu.Lock()
		conns := u.connsLocked()
		u.mu.Unlock()
		for _, sc := range conns {
			sc.close()
		}
	})
}

// heldEvery is how often sampleHeld samples the open connections.
const heldEvery = 100 * time.Millisecond

// sampleHeld samples the connections open every heldEvery from the load's
// start plus from until close, as make bench samples an upstream's during
// its measured run after a warm-up: what a pool holds, where the peak says
// what it opened at its busiest moment. 0: no samples.
func (u *simUpstream) sampleHeld(from time.Duration) {
	if from == 0 {
		return
	}
	u.wg.Go(func() {
		t := time.NewTimer(from)
		defer t.Stop()
		for {
			select {
			case <-u.stop:
				return
			case <-t.C:
			}
			u.mu.Lock()
			u.held = max(u.held, len(u.conns))
			u.heldN++
			u.heldSum += len(u.conns)
			u.mu.Unlock()
			t.Reset(heldEvery)
		}
	})
}

// clientTLS is the configuration the pool and the model of forward both
// dial with: both pay the same handshake on the same loaded client.
func (u *simUpstream) clientTLS() *tls.Config {
	cfg := u.cert.ClientTLS(dottest.ServerName)
	cfg.CurvePreferences = u.tls.CurvePreferences
	return cfg
}

// since is the virtual time since the load's start.
func (u *simUpstream) since() time.Duration { return time.Since(u.start) }

// dial connects to the upstream after the handshake's round trips (longer on
// a loaded client), over TLS if withTLS.
func (u *simUpstream) dial(ctx context.Context, withTLS bool) (net.Conn, error) {
	wait := u.b.handshake + 5*u.b.readDelay(u.since())
	if err := sleepOrDone(ctx, wait); err != nil {
		return nil, err
	}
	client, server := dottest.Pipe()
	sc := &simConn{u: u, raw: server, done: make(chan struct{}), freed: make(chan struct{}, 1), dialedAt: u.since()}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return nil, dottest.ErrClosed
	}
	u.conns[sc] = struct{}{}
	u.peak = max(u.peak, len(u.conns))
	u.traceOpenLocked()
	u.dials++
	sc.n = u.dials
	u.wg.Add(1)
	u.mu.Unlock()
	go sc.serve(withTLS)
	return &loadedConn{Conn: client, b: u.b, start: u.start}, nil
}

func (u *simUpstream) connClosed(sc *simConn) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.conns, sc)
	u.traceOpenLocked()
}

// drawJitter draws the jitter of an answer to name, in [-1, 1]: from the seed,
// the name and how often it was asked before, so that a replay of the seed
// draws the same for the same attempts, whatever order the goroutines ran in.
func (u *simUpstream) drawJitter(name string) float64 {
	name = strings.ToLower(name)
	u.mu.Lock()
	n := u.asked[name]
	u.asked[name]++
	u.mu.Unlock()
	h := fnv.New64a()
	h.Write([]byte(name))
	r := rand.New(rand.NewPCG(u.b.seed^uint64(n+1)*0x2545f4914f6cdd1d, h.Sum64()))
	return 2*r.Float64() - 1
}

// stats returns the peak of open connections, the dials, and the most open
// at a sample and their mean (sampleHeld).
func (u *simUpstream) stats() (peak, dials, held int, heldMean float64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.heldN > 0 {
		heldMean = float64(u.heldSum) / float64(u.heldN)
	}
	return u.peak, u.dials, u.held, heldMean
}

// connsLocked returns the open connections, to be closed once u.mu is let go
// (a connection's close takes locks of its own). u.mu must be held.
func (u *simUpstream) connsLocked() []*simConn {
	conns := make([]*simConn, 0, len(u.conns))
	for sc := range u.conns {
		conns = append(conns, sc)
	}
	return conns
}

// close closes every connection and waits for their goroutines.
func (u *simUpstream) close() {
	u.mu.Lock()
	u.closed = true
	close(u.stop)
	conns := u.connsLocked()
	u.mu.Unlock()
	for _, sc := range conns {
		sc.close()
	}
	u.wg.Wait()
}

// sleepOrDone sleeps d, or less if ctx ends first.
func sleepOrDone(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loadedConn is the client's end of a connection on the drawn machine: in a
// loaded spell each read returns late, as if the reading goroutine waited for
// a CPU. The pool and the model of forward both read through it.
type loadedConn struct {
	net.Conn
	b     *behaviour
	start time.Time
}

func (c *loadedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if d := c.b.readDelay(time.Since(c.start)); d > 0 && n > 0 {
		time.Sleep(d) // the drawn machine's load, in virtual time: not a test waiting for a condition
	}
	return n, err
}

// simConn is the server's end of one connection.
type simConn struct {
	u        *simUpstream
	n        int           // the upstream's n-th connection, for -property.trace and a mixed upstream's backend
	dialedAt time.Duration // since the load's start: which side of a mixed upstream's switch it was made
	raw      net.Conn
	c        net.Conn // raw, or TLS over it
	once     sync.Once
	done     chan struct{} // closed by close

	wmu      sync.Mutex // serialises answers
	answered int        // guarded by wmu

	pending sync.WaitGroup // answers being prepared (out of order)
	busy    sync.Mutex     // guards outstanding
	outst   int            // guarded by busy: queries taken and not yet answered
	freed   chan struct{}  // a token each time an answer ends (capacity 1): wakes takeBounded
}

func (sc *simConn) close() {
	sc.once.Do(func() {
		close(sc.done)
		sc.raw.Close()
		sc.u.connClosed(sc)
	})
}

func (sc *simConn) serve(withTLS bool) {
	defer sc.u.wg.Done()
	defer sc.pending.Wait()
	defer sc.close()
	sc.c = sc.raw
	if withTLS {
		tc := tls.Server(sc.raw, sc.u.tls)
		if tc.Handshake() != nil {
			return
		}
		sc.c = tc
	}
	r := bufio.NewReaderSize(sc.c, 4<<10)
	for received := 1; ; received++ {
		wire, err := sc.readQuery(r)
		if err != nil {
			return
		}
		if b := sc.u.b; b.limit > 0 && received > b.limit {
			sc.traceIgnore(wire)
			continue // over the connection's query limit: read and ignored
		}
		if sc.u.b.mix != nil {
			sc.takeBounded(wire)
			continue
		}
		sc.take(wire)
	}
}

// readQuery reads one framed query. An idle connection (nothing outstanding)
// that receives nothing for the idle timeout is closed.
func (sc *simConn) readQuery(r *bufio.Reader) ([]byte, error) {
	var head [2]byte
	for {
		if idle := sc.u.b.idle; idle > 0 {
			sc.raw.SetReadDeadline(time.Now().Add(idle))
		}
		_, err := io.ReadFull(r, head[:1])
		if err == nil {
			break
		}
		if !isNetTimeout(err) || sc.outstanding() == 0 {
			return nil, err
		}
	}
	sc.raw.SetReadDeadline(time.Time{})
	if _, err := io.ReadFull(r, head[1:]); err != nil {
		return nil, err
	}
	wire := make([]byte, binary.BigEndian.Uint16(head[:]))
	if _, err := io.ReadFull(r, wire); err != nil {
		return nil, err
	}
	return wire, nil
}

func isNetTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func (sc *simConn) outstanding() int {
	sc.busy.Lock()
	defer sc.busy.Unlock()
	return sc.outst
}

func (sc *simConn) addOutstanding(d int) {
	sc.busy.Lock()
	sc.outst += d
	sc.busy.Unlock()
}

// take serves a query: in order, before reading the next; out of order, on
// its own goroutine.
func (sc *simConn) take(wire []byte) {
	q := new(dns.Msg)
	if q.Unpack(wire) != nil || len(q.Question) != 1 {
		return
	}
	if sc.u.b.silent {
		return
	}
	sc.addOutstanding(1)
	if sc.u.b.inOrder {
		sc.answer(q, 1)
		return
	}
	sc.pending.Go(func() { sc.answer(q, 1) })
}

// takeBounded serves a query on a mixed upstream's connection as its backend
// does (see backend): at most depth of the connection's queries worked on at
// once (1: in order, one at a time; 0: any number), each on its own
// goroutine; past it the server reads nothing more until one is answered, so
// the queries behind wait, in order, as a pipelining server's queue does.
// The backend is asked again at each query: an in-place switch changes it
// under an open connection.
func (sc *simConn) takeBounded(wire []byte) {
	q := new(dns.Msg)
	if q.Unpack(wire) != nil || len(q.Question) != 1 || sc.u.b.silent {
		return
	}
	be := sc.backend()
	for be.depth > 0 && sc.outstanding() >= be.depth {
		select {
		case <-sc.freed:
		case <-sc.done:
			return
		}
		be = sc.backend()
	}
	sc.addOutstanding(1)
	sc.pending.Go(func() { sc.answer(q, be.speed) })
}

// backend is the backend serving the connection now.
func (sc *simConn) backend() backend {
	return sc.u.b.mix.backendOf(sc.n, sc.dialedAt, sc.u.since())
}

// answer answers q after its answer time, on a backend speed times as slow
// as the drawn upstream (1 but on a mixed upstream).
func (sc *simConn) answer(q *dns.Msg, speed float64) {
	defer sc.signalFreed()
	defer sc.addOutstanding(-1)
	d := sc.u.b.answerTimeAt(q.Question[0].Name, sc.u.since(), sc.u.drawJitter(q.Question[0].Name), speed)
	sc.traceTake(q.Question[0].Name, d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-sc.done:
		return
	}
	wire, err := sc.reply(q).Pack()
	if err != nil {
		return
	}
	sc.write(wire)
}

// signalFreed tells takeBounded an answer ended (after outstanding fell):
// a token left over from an earlier answer only makes it check once more.
func (sc *simConn) signalFreed() {
	select {
	case sc.freed <- struct{}{}:
	default:
	}
}

// reply answers q with an A record, and with the idle timeout in a keepalive
// option if the client asked for it and the behaviour tells it.
func (sc *simConn) reply(q *dns.Msg) *dns.Msg {
	r := dottest.DefaultAnswer(q)
	o := q.IsEdns0()
	if o == nil || !sc.u.b.keepalive {
		return r
	}
	for _, opt := range o.Option {
		if opt.Option() == dns.EDNS0TCPKEEPALIVE {
			r.IsEdns0().Option = append(r.IsEdns0().Option, &dns.EDNS0_TCP_KEEPALIVE{
				Code: dns.EDNS0TCPKEEPALIVE, Timeout: uint16(max(sc.u.b.idle/(100*time.Millisecond), 1)),
			})
		}
	}
	return r
}

// write sends an answer; the Nth answer of a connection with a query limit of
// N is its last: the server closes it.
func (sc *simConn) write(wire []byte) {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	buf := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(wire)), uint16(len(wire)))
	if _, err := sc.c.Write(append(buf, wire...)); err != nil {
		sc.close()
		return
	}
	sc.answered++
	if lim := sc.u.b.limit; lim > 0 && sc.answered >= lim {
		sc.close()
	}
}
