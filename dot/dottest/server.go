package dottest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Options script a Server's behaviour. The zero value answers every query at once,
// concurrently (so answers may leave out of order), with an A record.
type Options struct {
	// Handler builds the answer to a query. Default: NOERROR with A 192.0.2.1 for
	// A queries, an empty NOERROR answer otherwise.
	Handler func(q *dns.Msg) *dns.Msg
	// InOrder answers strictly one query at a time in arrival order, as miekg/dns
	// (and so CoreDNS's tls:// server) does.
	InOrder bool
	// Delay holds the answer to matching questions back for the returned duration.
	Delay func(q dns.Question) time.Duration
	// Drop never answers matching questions.
	Drop func(q dns.Question) bool
	// CloseAfter serves only the first N queries of each connection, like a server
	// with a per-connection query limit: later queries are read and ignored, and the
	// connection closes right after the Nth answer, whatever is still pending on it.
	// 0: never.
	CloseAfter int
	// SlowNth holds back the answer to the SlowNth query of each connection
	// by Slow (besides Delay): with CloseAfter, a server whose every
	// connection is cut only after a slow answer. 0: none.
	SlowNth int
	Slow    time.Duration
	// NthDelay, if set, holds back the answer to the nth query of each
	// connection by what it returns for n and the question (besides Delay
	// and Slow): a server whose first answers on a connection come late.
	NthDelay func(n int, q dns.Question) time.Duration
	// SilentAfter stops answering on each connection after its Nth answer, keeping
	// the connection open (a black hole). 0: never.
	SilentAfter int
	// CloseAfterHandshake completes the TLS handshake, then closes.
	CloseAfterHandshake bool
	// IdleCut: a query that comes after its connection had nothing
	// outstanding for this long is read, never answered, and the connection
	// closes, as when a server's idle timeout fires while the client's next
	// query is on its way (dnsdist closes a client connection idle for its
	// tcpRecvTimeout, 2 s). 0: never.
	IdleCut time.Duration
	// Mutate changes an answer before it is packed (wrong ID, wrong question...).
	Mutate func(q, r *dns.Msg)
	// Raw, if set, replaces the answer with the returned raw messages (each framed
	// with its own length prefix): garbage, truncated or duplicate answers.
	Raw func(q *dns.Msg, answer []byte) [][]byte
	// LazyRecords reads only the first query of each TLS record until the next
	// record arrives, as a server does that waits for its socket to become readable
	// while more queries sit in its TLS library's buffer (dnsdist 1.7 without
	// maxInFlight). When a record arrives, the queries held from earlier ones are
	// served first.
	LazyRecords bool
	// Turns, if set, serves every connection on one thread, in turn (see
	// Turns); Delay then holds that thread, as a server busy with one query
	// answers no other.
	Turns *Turns
	// OnQuery observes every query as received (without the length prefix).
	OnQuery func(wire []byte)
	// Cert is the server's certificate. Default: NewCert() for 127.0.0.1 and ServerName.
	Cert *Cert
	// TLS adjusts the server's TLS configuration.
	TLS func(*tls.Config)
	// Addr is the listen address. Default "127.0.0.1:0". With Pipe, nothing
	// listens and Addr is only the server's name (default 127.0.0.1:853): give
	// each of a test's Pipe servers its own, for whatever is keyed by address.
	Addr string
	// Pipe serves connections made by Server.Dial over in-memory pipes (see the
	// function Pipe) instead of listening: for tests under testing/synctest, whose clock only advances
	// while every goroutine waits on something in memory, never on a socket.
	// Start and use such a server inside the bubble.
	Pipe bool
}

// Server is a scriptable DoT server on 127.0.0.1.
type Server struct {
	Addr       string // host:port it listens on
	ServerName string // the name its certificate is valid for
	Cert       *Cert

	opts Options
	tls  *tls.Config
	ln   net.Listener

	queries, answers, handshakes, resumed, conns, maxOutstanding, records atomic.Int64

	inOrder atomic.Bool // Options.InOrder, changed by SetInOrder
	turns   *turnQueue  // Options.Turns: the one thread's queue

	mu             sync.Mutex
	open           map[net.Conn]struct{} // guarded by mu
	handshakeTimes []time.Time           // guarded by mu
	closed         bool                  // guarded by mu
	wg             sync.WaitGroup
}

// Start starts a server for a test and closes it when the test ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatalf("Starting DoT test server: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// New starts a server; the caller must Close it.
func New(opts Options) (*Server, error) {
	if opts.Cert == nil {
		c, err := NewCert()
		if err != nil {
			return nil, err
		}
		opts.Cert = c
	}
	named := opts.Addr
	if opts.Addr == "" {
		opts.Addr, named = "127.0.0.1:0", pipeAddr
	}
	cfg := opts.Cert.ServerTLS()
	cfg.NextProtos = []string{"dot"}
	if opts.Pipe {
		cfg.CurvePreferences = pipeCurves
	}
	if opts.TLS != nil {
		opts.TLS(cfg)
	}
	s := &Server{
		Addr: named, ServerName: ServerName, Cert: opts.Cert,
		opts: opts, tls: cfg, open: map[net.Conn]struct{}{},
	}
	s.inOrder.Store(opts.InOrder)
	if opts.Turns != nil {
		s.startTurns()
	}
	if opts.Pipe {
		return s, nil
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, err
	}
	s.Addr, s.ln = ln.Addr().String(), ln
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// pipeAddr is a Pipe server's Addr: a well-formed address nothing listens on.
const pipeAddr = "127.0.0.1:853"

// ErrClosed is returned by Dial once the server is closed.
var ErrClosed = errors.New("dottest: server closed")

// Dial connects to a Pipe server over an in-memory pipe; it has the signature
// of dot.Config.Dial. The server end is served like an accepted connection.
func (s *Server) Dial(context.Context, string, string) (net.Conn, error) {
	client, server := Pipe()
	if !s.track(server) {
		return nil, ErrClosed
	}
	s.wg.Add(1)
	go s.serve(server)
	return client, nil
}

// track records an accepted connection, unless the server is closed.
func (s *Server) track(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		c.Close()
		return false
	}
	s.open[c] = struct{}{}
	return true
}

// Piped reports whether the server serves in-memory pipes made by Dial
// (Options.Pipe) rather than listening.
func (s *Server) Piped() bool { return s.opts.Pipe }

// SetInOrder changes whether the server answers each connection's queries one
// at a time, in order (Options.InOrder), from the next query on.
func (s *Server) SetInOrder(inOrder bool) { s.inOrder.Store(inOrder) }

// ClientTLS returns a client configuration that trusts this server.
func (s *Server) ClientTLS() *tls.Config {
	cfg := s.Cert.ClientTLS(s.ServerName)
	if s.opts.Pipe {
		cfg.CurvePreferences = pipeCurves
	}
	return cfg
}

// pipeCurves are the key exchanges of a Pipe server and its ClientTLS: X25519
// alone, without the default post-quantum hybrid, whose keys cost several times
// as much CPU. Tests under synctest (the regime tests dial hundreds of
// connections) are about the pool, not the key exchange, and their run time is
// nothing but CPU.
var pipeCurves = []tls.CurveID{tls.X25519}

// Queries returns how many queries the server received.
func (s *Server) Queries() int64 { return s.queries.Load() }

// Records returns how many TLS records of application data the server read.
func (s *Server) Records() int64 { return s.records.Load() }

// Answers returns how many answers the server wrote.
func (s *Server) Answers() int64 { return s.answers.Load() }

// Handshakes returns how many TLS handshakes completed.
func (s *Server) Handshakes() int64 { return s.handshakes.Load() }

// HandshakeTimes returns when each completed TLS handshake completed, in order.
func (s *Server) HandshakeTimes() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.handshakeTimes...)
}

// Resumed returns how many completed handshakes resumed a session.
func (s *Server) Resumed() int64 { return s.resumed.Load() }

// Conns returns how many connections are open now.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.open)
}

// MaxOutstanding returns the most queries ever received but not yet answered or
// dropped on one connection.
func (s *Server) MaxOutstanding() int64 { return s.maxOutstanding.Load() }

// Close stops the server and closes every connection.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for c := range s.open {
		c.Close()
	}
	s.mu.Unlock()
	if s.turns != nil {
		s.turns.close()
	}
	if s.ln != nil {
		s.ln.Close()
	}
	s.wg.Wait()
}

// CloseConns closes every open connection but keeps listening.
func (s *Server) CloseConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.open {
		c.Close()
	}
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		raw, err := s.ln.Accept()
		if err != nil {
			return
		}
		if !s.track(raw) {
			return
		}
		s.wg.Add(1)
		go s.serve(raw)
	}
}

// serverConn is the state of one accepted connection.
type serverConn struct {
	s           *Server
	tc          *tls.Conn
	wmu         sync.Mutex // serialises answers
	answered    int        // guarded by wmu
	closed      bool       // guarded by wmu
	idleSince   time.Time  // guarded by wmu: when the last answer left (or the handshake ended)
	outstanding atomic.Int64
	pending     sync.WaitGroup
}

func (s *Server) serve(raw net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.open, raw)
		s.mu.Unlock()
		raw.Close()
	}()
	tc := tls.Server(raw, s.tls)
	if err := tc.Handshake(); err != nil {
		return
	}
	s.handshakes.Add(1)
	s.mu.Lock()
	s.handshakeTimes = append(s.handshakeTimes, time.Now())
	s.mu.Unlock()
	if tc.ConnectionState().DidResume {
		s.resumed.Add(1)
	}
	if s.opts.CloseAfterHandshake {
		return
	}
	sc := &serverConn{s: s, tc: tc, idleSince: time.Now()}
	defer sc.pending.Wait()
	sc.readLoop()
}

func (sc *serverConn) readLoop() {
	// crypto/tls returns at most one record's plaintext per Read, so each Read
	// here is one TLS record the client sent.
	buf := make([]byte, 64<<10)
	var stream []byte // plaintext received and not yet framed
	var held [][]byte // LazyRecords: queries read but left in the record's buffer
	received := 0
	for {
		n, err := sc.tc.Read(buf)
		if err != nil {
			return
		}
		sc.s.records.Add(1)
		stream = append(stream, buf[:n]...)
		var queries [][]byte
		for len(stream) >= 2 && len(stream) >= 2+int(binary.BigEndian.Uint16(stream)) {
			end := 2 + int(binary.BigEndian.Uint16(stream))
			queries = append(queries, bytes.Clone(stream[2:end]))
			stream = stream[end:]
		}
		if sc.s.opts.LazyRecords {
			// New bytes make the socket readable: the held queries are read now,
			// then only the first of this record's.
			queries = append(held, queries...)
			take := len(held) + min(len(queries)-len(held), 1)
			held = append([][]byte(nil), queries[take:]...)
			queries = queries[:take]
		}
		if sc.s.turns != nil {
			qs := make([]turnQuery, len(queries))
			for i, wire := range queries {
				received++
				qs[i] = turnQuery{wire, received}
			}
			sc.s.turns.queue(sc, qs)
			continue
		}
		if sc.idleCut(len(queries)) {
			return
		}
		for _, wire := range queries {
			received++
			sc.query(wire, received)
		}
	}
}

// idleCut reports whether n queries just read come after the connection sat
// idle for Options.IdleCut, and if so closes it (see IdleCut).
func (sc *serverConn) idleCut(n int) bool {
	cut := sc.s.opts.IdleCut
	if cut == 0 || n == 0 || sc.outstanding.Load() > 0 {
		return false
	}
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	if sc.closed || time.Since(sc.idleSince) < cut {
		return false
	}
	sc.closed = true
	sc.tc.Close()
	return true
}

// query handles the received-th query of the connection.
func (sc *serverConn) query(wire []byte, received int) {
	sc.s.queries.Add(1)
	if f := sc.s.opts.OnQuery; f != nil {
		f(wire)
	}
	if n := sc.s.opts.CloseAfter; n > 0 && received > n {
		return // over this connection's query limit: never answered
	}
	if sc.s.onWire() {
		if frame, ok := AppendAnswer(make([]byte, 0, 2+len(wire)+answerRoom), wire); ok {
			sc.answerFrame(frame)
			return
		}
	}
	q := new(dns.Msg)
	if err := q.Unpack(wire); err != nil || len(q.Question) != 1 {
		return
	}
	sc.noteOutstanding(1)
	slow := time.Duration(0)
	if received == sc.s.opts.SlowNth {
		slow = sc.s.opts.Slow
	}
	if f := sc.s.opts.NthDelay; f != nil {
		slow += f(received, q.Question[0])
	}
	if sc.s.serial() {
		time.Sleep(slow) // scripted slowness, as in answer
		sc.answer(q)
		return
	}
	sc.pending.Add(1)
	go func() {
		defer sc.pending.Done()
		time.Sleep(slow)
		sc.answer(q)
	}()
}

// serial reports whether a connection's queries are answered one at a time,
// on the goroutine that reads them (InOrder) or on the one thread (Turns).
func (s *Server) serial() bool { return s.inOrder.Load() || s.turns != nil }

// answerRoom is what AppendAnswer adds to a query at most: an A record and an OPT
// without options, which replaces the query's own.
const answerRoom = 16 + 11

// onWire reports whether the default answer may be built on the wire: nothing is
// scripted that needs the query as a dns.Msg.
func (s *Server) onWire() bool {
	o := &s.opts
	return o.Handler == nil && o.Mutate == nil && o.Raw == nil && o.Delay == nil && o.Drop == nil && o.SlowNth == 0 && o.NthDelay == nil
}

// answerFrame writes an answer built on the wire, concurrently or in order as
// answer does.
func (sc *serverConn) answerFrame(frame []byte) {
	sc.noteOutstanding(1)
	if sc.s.serial() {
		sc.noteOutstanding(-1)
		sc.write(frame)
		return
	}
	sc.pending.Add(1)
	go sc.writeConcurrently(frame)
}

func (sc *serverConn) writeConcurrently(frame []byte) {
	defer sc.pending.Done()
	sc.noteOutstanding(-1)
	sc.write(frame)
}

func (sc *serverConn) noteOutstanding(d int64) {
	n := sc.outstanding.Add(d)
	for {
		m := sc.s.maxOutstanding.Load()
		if n <= m || sc.s.maxOutstanding.CompareAndSwap(m, n) {
			return
		}
	}
}

// answer builds, delays and writes the answer to q as scripted.
func (sc *serverConn) answer(q *dns.Msg) {
	o := &sc.s.opts
	if o.Drop != nil && o.Drop(q.Question[0]) {
		return
	}
	if o.Delay != nil {
		if d := o.Delay(q.Question[0]); d > 0 {
			time.Sleep(d) // simulates a slow upstream; not a test waiting on a condition
		}
	}
	frames, err := sc.build(q)
	sc.noteOutstanding(-1) // before the write: the client may send the next query at once
	if err != nil {
		return
	}
	var buf []byte
	for _, f := range frames {
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(f)))
		buf = append(buf, f...)
	}
	sc.write(buf)
}

func (sc *serverConn) build(q *dns.Msg) ([][]byte, error) {
	o := &sc.s.opts
	var r *dns.Msg
	if o.Handler != nil {
		r = o.Handler(q)
	} else {
		r = DefaultAnswer(q)
	}
	if r == nil {
		return nil, errors.New("no answer")
	}
	if o.Mutate != nil {
		o.Mutate(q, r)
	}
	wire, err := r.Pack()
	if err != nil {
		return nil, err
	}
	if o.Raw != nil {
		return o.Raw(q, wire), nil
	}
	return [][]byte{wire}, nil
}

// write writes one answer's frames, each behind its length prefix, in one write.
func (sc *serverConn) write(buf []byte) {
	o := &sc.s.opts
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	if sc.closed || (o.SilentAfter > 0 && sc.answered >= o.SilentAfter) {
		return
	}
	if _, err := sc.tc.Write(buf); err != nil {
		sc.closed = true
		return
	}
	sc.answered++
	sc.idleSince = time.Now()
	sc.s.answers.Add(1)
	if o.CloseAfter > 0 && sc.answered >= o.CloseAfter {
		sc.closed = true
		sc.tc.Close()
	}
}

// DefaultAnswer answers A queries with 192.0.2.1 and anything else with an empty
// NOERROR answer, echoing the question and the query's EDNS0 buffer size.
func DefaultAnswer(q *dns.Msg) *dns.Msg {
	r := new(dns.Msg)
	r.SetReply(q)
	qq := q.Question[0]
	if qq.Qtype == dns.TypeA {
		r.Answer = append(r.Answer, &dns.A{
			Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   net.IPv4(192, 0, 2, 1),
		})
	}
	if o := q.IsEdns0(); o != nil {
		r.SetEdns0(o.UDPSize(), o.Do())
	}
	return r
}
