package dot

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
	"testing"

	"github.com/dotforward/dotforward/dot/dottest"
)

// wireServer is a DoT server that allocates nothing per query once a
// connection is up: it answers each TLS record's queries in order, with
// dottest.AppendAnswer into a buffer it reuses, in one write. In a benchmark's
// process its allocations are then the client's alone.
type wireServer struct {
	Addr  string
	cert  *dottest.Cert
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn // guarded by mu: closed by close
}

func startWireServer(tb testing.TB) *wireServer {
	tb.Helper()
	cert, err := dottest.NewCert()
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &wireServer{Addr: ln.Addr().String(), cert: cert, ln: ln}
	s.wg.Add(1)
	go s.accept()
	tb.Cleanup(s.close)
	return s
}

func (s *wireServer) clientTLS() *tls.Config { return s.cert.ClientTLS(dottest.ServerName) }

func (s *wireServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(tls.Server(c, s.cert.ServerTLS()))
	}
}

// serve answers the queries of one connection until it fails or is closed.
func (s *wireServer) serve(tc *tls.Conn) {
	defer s.wg.Done()
	defer tc.Close()
	in := make([]byte, 0, 64<<10) // received, not yet framed
	var out []byte
	for {
		if len(in) == cap(in) {
			return // a query larger than the buffer: not from the pool
		}
		n, err := tc.Read(in[len(in):cap(in)])
		if err != nil {
			return
		}
		in = in[:len(in)+n]
		out = out[:0]
		rest := in
		for len(rest) >= 2 && len(rest) >= 2+int(binary.BigEndian.Uint16(rest)) {
			end := 2 + int(binary.BigEndian.Uint16(rest))
			out, _ = dottest.AppendAnswer(out, rest[2:end])
			rest = rest[end:]
		}
		in = in[:copy(in[:cap(in)], rest)]
		if len(out) > 0 {
			if _, err := tc.Write(out); err != nil {
				return
			}
		}
	}
}

func (s *wireServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}
