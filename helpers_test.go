package dotforward

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
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
	f := fs[0]
	if err := f.OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	t.Cleanup(func() {
		if err := f.OnShutdown(); err != nil {
			t.Errorf("Shutting down: %v", err)
		}
		checkNoPoolGoroutines(t)
	})
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
