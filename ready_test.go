package dotforward

import (
	"fmt"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/test"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func TestReadyAndChain(t *testing.T) {
	cert := testCert(t)
	a := startServer(t, cert, dottest.Options{})
	b := startServer(t, cert, dottest.Options{})
	ca := writeFile(t, t.TempDir(), "ca.pem", cert.CAPEM)
	to := func(s *dottest.Server) string {
		return "tls://" + strings.Replace(s.Addr, ":", "%"+dottest.ServerName+":", 1)
	}
	input := fmt.Sprintf("dotforward example.org %s {\ntls %s\nhealth_check 0\n}\ndotforward . %s {\ntls %s\nhealth_check 0\n}", to(a), ca, to(b), ca)
	fs, err := parse(caddy.NewTestController("dns", input))
	if err != nil || len(fs) != 2 {
		t.Fatalf("Parsing two lines: %d instances, error %v", len(fs), err)
	}
	fs[0].Next, fs[1].Next = fs[1], test.NextHandler(dns.RcodeServerFailure, nil)
	if err := fs[0].OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	if fs[0].Ready() {
		t.Errorf("Expected not ready while the chained line has not started")
	}
	if err := fs[1].OnStartup(); err != nil {
		t.Fatalf("Starting: %v", err)
	}
	if !fs[0].Ready() {
		t.Errorf("Expected ready once both lines started")
	}
	for _, name := range []string{"www.example.org.", "www.example.net."} {
		if _, rcode, err := serve(fs[0], newMsg(name, dns.TypeA)); rcode != dns.RcodeSuccess {
			t.Errorf("%s: expected an answer, got rcode %d, error %v", name, rcode, err)
		}
	}
	if a.Queries() != 1 || b.Queries() != 1 {
		t.Errorf("Expected one query at each line's upstream, got %d and %d", a.Queries(), b.Queries())
	}
	for _, f := range fs {
		if err := f.OnShutdown(); err != nil {
			t.Errorf("Shutting down: %v", err)
		}
	}
	if fs[0].Ready() {
		t.Errorf("Expected not ready after OnShutdown")
	}
	checkNoPoolGoroutines(t)
}
