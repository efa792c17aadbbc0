package dotforward

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/coredns/coredns/plugin/metadata"
	"github.com/coredns/coredns/plugin/pkg/dnstest"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func TestMetadataUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		dead := deadPipe(t, cert)
		s := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "policy sequential", dead, s)
		ctx := metadata.ContextWithMetadata(context.Background())
		if _, rcode, err := serveCtx(ctx, f, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
			t.Fatalf("Expected an answer, got rcode %d, error %v", rcode, err)
		}
		fn := metadata.ValueFunc(ctx, "dotforward/upstream")
		if fn == nil || fn() != s.Addr {
			t.Errorf("Expected dotforward/upstream metadata %s, the upstream that answered", s.Addr)
		}
	})
}

// A non-QUERY message (UPDATE, NOTIFY) is not idempotent: once it may have been
// written, no other upstream gets it, whatever went wrong. Only an error that
// proves it was never written (an unreachable upstream) lets it go elsewhere.
func TestNonQueryOpcodesAreNotSentTwice(t *testing.T) {
	opcodes := []struct {
		name string
		msg  func() *dns.Msg
	}{
		{"UPDATE", func() *dns.Msg { return new(dns.Msg).SetUpdate("example.org.") }},
		{"NOTIFY", func() *dns.Msg { return new(dns.Msg).SetNotify("example.org.") }},
	}
	upstreams := []struct {
		name    string
		opts    dottest.Options
		options string
		rcode   int // what ServeDNS returns
		answer  int // the rcode written, when ServeDNS returns success
	}{
		{name: "silent", opts: dottest.Options{Drop: func(dns.Question) bool { return true }}, rcode: dns.RcodeServerFailure},
		// Raw writes no bytes, which counts as the first answer: CloseAfter 1 then
		// closes the connection right after reading the query.
		{name: "closes after reading", opts: dottest.Options{CloseAfter: 1, Raw: func(*dns.Msg, []byte) [][]byte { return nil }}, rcode: dns.RcodeServerFailure},
		{name: "failover rcode", opts: dottest.Options{Handler: rcodeAnswer(dns.RcodeServerFailure)}, options: "failover SERVFAIL", answer: dns.RcodeServerFailure},
	}
	for _, op := range opcodes {
		for _, up := range upstreams {
			t.Run(op.name+" "+up.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					cert := testCert(t)
					a := startPipe(t, cert, up.opts)
					b := startPipe(t, cert, up.opts)
					f := newPipeForward(t, cert, "policy sequential\nread_timeout 200ms\n"+up.options, a, b)
					rec, rcode, err := serve(f, op.msg())
					if rcode != up.rcode {
						t.Errorf("Expected rcode %s, got %s (error %v)", dns.RcodeToString[up.rcode], dns.RcodeToString[rcode], err)
					}
					if up.rcode == dns.RcodeSuccess && (rec.Msg == nil || rec.Msg.Rcode != up.answer) {
						t.Errorf("Expected the upstream's %s answer written, got %v", dns.RcodeToString[up.answer], rec.Msg)
					}
					if got := a.Queries() + b.Queries(); got != 1 {
						t.Errorf("Expected the %s sent once, the upstreams got it %d times (%d and %d)", op.name, got, a.Queries(), b.Queries())
					}
				})
			})
		}
		t.Run(op.name+" unreachable first", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cert := testCert(t)
				dead := deadPipe(t, cert)
				b := startPipe(t, cert, dottest.Options{})
				f := newPipeForward(t, cert, "policy sequential", dead, b)
				rec, rcode, err := serve(f, op.msg())
				if rcode != dns.RcodeSuccess || rec.Msg == nil {
					t.Fatalf("Expected the second upstream's answer, got rcode %d, error %v", rcode, err)
				}
				if b.Queries() != 1 {
					t.Errorf("Expected the %s at the second upstream once, got %d", op.name, b.Queries())
				}
			})
		})
	}
}

// A failover answer in hand is the client's answer when time runs out on a later
// upstream, rather than a SERVFAIL of our own.
func TestFailoverAnswerKeptAtDeadline(t *testing.T) {
	tests := []struct {
		name    string
		options string
		cancel  bool
	}{
		{name: "deadline", options: "timeout 300ms\nread_timeout 1m"},
		{name: "cancelled", options: "timeout 1m\nread_timeout 1m", cancel: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cert := testCert(t)
				a := startPipe(t, cert, dottest.Options{Handler: rcodeAnswer(dns.RcodeRefused)})
				b := startPipe(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
				f := newPipeForward(t, cert, "policy sequential\nfailover REFUSED\n"+tc.options, a, b)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				type result struct {
					rec   *dnstest.Recorder
					rcode int
					err   error
				}
				done := make(chan result, 1)
				go func() {
					rec, rcode, err := serveCtx(ctx, f, newMsg("example.org.", dns.TypeA))
					done <- result{rec, rcode, err}
				}()
				if tc.cancel {
					waitFor(t, "the query at the second upstream", func() bool { return b.Queries() == 1 })
					cancel()
				}
				r := <-done // bounded by the 300ms timeout, or by the cancellation
				if r.rcode != dns.RcodeSuccess || r.err != nil {
					t.Fatalf("Expected the first upstream's REFUSED answer written, got rcode %d, error %v", r.rcode, r.err)
				}
				if r.rec.Msg == nil || r.rec.Msg.Rcode != dns.RcodeRefused {
					t.Errorf("Expected a REFUSED answer, got %v", r.rec.Msg)
				}
			})
		})
	}
}

// dotforward/upstream names the upstream whose answer the client gets, not the
// last one tried.
func TestMetadataNamesTheAnsweringUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		a := startPipe(t, cert, dottest.Options{Handler: rcodeAnswer(dns.RcodeRefused)})
		b := startPipe(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
		f := newPipeForward(t, cert, "policy sequential\nfailover REFUSED\nread_timeout 200ms\nmax_connect_attempts 2", a, b)
		ctx := metadata.ContextWithMetadata(context.Background())
		rec, rcode, err := serveCtx(ctx, f, newMsg("example.org.", dns.TypeA))
		if rcode != dns.RcodeSuccess || rec.Msg == nil || rec.Msg.Rcode != dns.RcodeRefused {
			t.Fatalf("Expected the first upstream's REFUSED answer, got rcode %d, error %v", rcode, err)
		}
		if b.Queries() != 1 {
			t.Fatalf("Expected the query tried at the second upstream, got %d queries there", b.Queries())
		}
		fn := metadata.ValueFunc(ctx, "dotforward/upstream")
		if fn == nil || fn() != a.Addr {
			got := "none"
			if fn != nil {
				got = fn()
			}
			t.Errorf("Expected dotforward/upstream %s (whose answer was returned), got %s", a.Addr, got)
		}
	})
}
