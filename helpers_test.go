package dotforward

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// testCert is shared by every fake upstream of a test so one `tls CA` line trusts them all.
func testCert(t *testing.T) *dottest.Cert {
	t.Helper()
	c, err := dottest.NewCert()
	if err != nil {
		t.Fatalf("Generating a test certificate: %v", err)
	}
	return c
}

// startServer starts a fake DoT upstream with the shared certificate.
func startServer(t *testing.T, cert *dottest.Cert, opts dottest.Options) *dottest.Server {
	t.Helper()
	opts.Cert = cert
	return dottest.Start(t, opts)
}

// deadAddr returns an address on 127.0.0.1 where nothing listens.
func deadAddr(t *testing.T, cert *dottest.Cert) string {
	t.Helper()
	s, err := dottest.New(dottest.Options{Cert: cert})
	if err != nil {
		t.Fatalf("Starting DoT test server: %v", err)
	}
	s.Close()
	return s.Addr
}

// newForward parses a dotforward line for addrs with the given block options,
// trusting cert, starts it and shuts it down when the test or benchmark ends.
func newForward(t testing.TB, cert *dottest.Cert, options string, addrs ...string) *DoTForward {
	t.Helper()
	f := parseForward(t, cert, options, addrs...)
	startForward(t, f)
	return f
}

// parseForward parses a dotforward line for addrs with the given block options,
// trusting cert, without starting it.
func parseForward(t testing.TB, cert *dottest.Cert, options string, addrs ...string) *DoTForward {
	t.Helper()
	ca := writeFile(t, t.TempDir(), "ca.pem", cert.CAPEM)
	to := ""
	for _, a := range addrs {
		to += " tls://" + strings.Replace(a, ":", "%"+dottest.ServerName+":", 1)
	}
	if !strings.Contains(options, "health_check") {
		// Handler tests count the queries upstreams receive: no probes among them.
		options += "\nhealth_check 0"
	}
	input := fmt.Sprintf("dotforward .%s {\ntls %s\n%s\n}", to, ca, options)
	fs, err := parse(caddy.NewTestController("dns", input))
	if err != nil {
		t.Fatalf("Parsing %q: %v", input, err)
	}
	return fs[0]
}

// startForward starts f and shuts it down when the test ends.
func startForward(t testing.TB, f *DoTForward) {
	t.Helper()
	if err := f.OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	t.Cleanup(func() {
		if err := f.OnShutdown(); err != nil {
			t.Errorf("Shutting down: %v", err)
		}
		checkNoPoolGoroutines(t)
	})
}

// pipePorts names the root tests' Pipe servers apart: metrics are global and
// keyed by an upstream's address, and a test counts from its own start.
var pipePorts atomic.Int32

// startPipe starts a fake upstream with the shared certificate that serves
// in-memory pipes (dottest.Options.Pipe), for a test inside a testing/synctest
// bubble: the pool's timers and the server's delays then run on the bubble's
// virtual clock, which jumps ahead whenever every goroutine waits, so a test
// of hedge delays and timeouts takes no wall-clock time and cannot be upset
// by a loaded machine. Start it inside the bubble, and newPipeForward with it.
func startPipe(t *testing.T, cert *dottest.Cert, opts dottest.Options) *dottest.Server {
	t.Helper()
	opts.Cert, opts.Pipe = cert, true
	opts.Addr = fmt.Sprintf("127.0.0.1:%d", 20000+pipePorts.Add(1)%40000)
	return dottest.Start(t, opts)
}

// newPipeForward is newForward over Pipe servers: each upstream dials its
// server in memory (the test hook is dot.Config.Dial, set between parsing and
// starting) with the servers' key exchange.
func newPipeForward(t *testing.T, cert *dottest.Cert, options string, servers ...*dottest.Server) *DoTForward {
	t.Helper()
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	f := parseForward(t, cert, options, addrs...)
	for i, u := range f.upstreams {
		u.cfg.Dial = servers[i].Dial
		u.cfg.TLS = u.cfg.TLS.Clone()
		u.cfg.TLS.CurvePreferences = servers[i].ClientTLS().CurvePreferences
	}
	startForward(t, f)
	return f
}

func serve(f *DoTForward, m *dns.Msg) (*dnstest.Recorder, int, error) {
	return serveCtx(context.Background(), f, m)
}

func serveCtx(ctx context.Context, f *DoTForward, m *dns.Msg) (*dnstest.Recorder, int, error) {
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	rcode, err := f.ServeDNS(ctx, rec, m)
	return rec, rcode, err
}

func newMsg(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// waitFor and checkNoPoolGoroutines are dottest's, under the names the tests use.
// Inside a synctest bubble waitFor polls on the virtual clock, which costs no
// wall-clock time; outside one, each call says why it needs real time.
func waitFor(t *testing.T, what string, cond func() bool) { t.Helper(); dottest.WaitFor(t, what, cond) }

func checkNoPoolGoroutines(t testing.TB) { t.Helper(); dottest.CheckNoPoolGoroutines(t) }

func rcodeAnswer(rcode int) func(q *dns.Msg) *dns.Msg {
	return func(q *dns.Msg) *dns.Msg {
		r := new(dns.Msg)
		r.SetRcode(q, rcode)
		return r
	}
}

func writeFile(t testing.TB, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatalf("Writing %s: %v", p, err)
	}
	return p
}

// lockedBuffer collects log output, which other goroutines may write too.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// deadPipe returns a closed Pipe server: dialing it fails at once, as dialing an
// address where nothing listens does.
func deadPipe(t *testing.T, cert *dottest.Cert) *dottest.Server {
	t.Helper()
	s := startPipe(t, cert, dottest.Options{})
	s.Close()
	return s
}
