package dotforward

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// startHeldServer starts a fake upstream whose answers wait until release is
// called, so that queries are pending together for as long as the test needs.
// It serves in-memory pipes: start it, and the test, inside a synctest bubble.
func startHeldServer(t *testing.T, cert *dottest.Cert) (s *dottest.Server, release func()) {
	t.Helper()
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	s = startPipe(t, cert, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		<-held
		return dottest.DefaultAnswer(q)
	}})
	t.Cleanup(release) // before the server's Close, which waits for held answers
	return s, release
}

// spell spells name with the case of its letters chosen by the bits of i.
func spell(name string, i int) string {
	b := []byte(name)
	for j, c := range b {
		if 'a' <= c && c <= 'z' && (i>>(j%16))&1 == 1 {
			b[j] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// served is one ServeDNS call's query and what it wrote.
type served struct {
	q     *dns.Msg
	r     *dns.Msg
	rcode int
	err   error
}

// serveAll serves n queries for name at once, each with its own ID and spelling.
func serveAll(f *DoTForward, name string, n int) <-chan served {
	out := make(chan served, n)
	for i := range n {
		m := newMsg(spell(name, i*7919), dns.TypeA)
		m.Id = uint16(2000 + i)
		go func() {
			rec, rcode, err := serve(f, m)
			out <- served{q: m, r: rec.Msg, rcode: rcode, err: err}
		}()
	}
	return out
}

// checkServed checks that each of n queries got an answer of its own: its ID,
// its spelling of the name in the question and the owner names.
func checkServed(t *testing.T, out <-chan served, n int) {
	t.Helper()
	for range n {
		s := <-out
		name := s.q.Question[0].Name
		switch {
		case s.err != nil || s.rcode != dns.RcodeSuccess || s.r == nil:
			t.Errorf("Query %d: rcode %d, error %v", s.q.Id, s.rcode, s.err)
		case s.r.Id != s.q.Id || s.r.Question[0].Name != name:
			t.Errorf("Query %d for %s: answer %d for %s", s.q.Id, name, s.r.Id, s.r.Question[0].Name)
		case len(s.r.Answer) != 1 || s.r.Answer[0].Header().Name != name:
			t.Errorf("Query %d for %s: answer records %v", s.q.Id, name, s.r.Answer)
		}
	}
}

// Identical queries pending at once reach the upstream once; each client gets
// its own answer, and coalesced_total counts the ones that waited.
func TestServeDNSCoalesces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		s, release := startHeldServer(t, cert)
		f := newPipeForward(t, cert, "", s)
		u := f.upstreams[0]
		before := metricValue(t, coalescedTotal.WithLabelValues(s.Addr))
		const n = 16
		out := serveAll(f, "www.coalesce.example.org.", n)
		waitFor(t, "every query at the upstream's pool", func() bool { return u.pending.Load() == n && s.Queries() >= 1 })
		release()
		checkServed(t, out, n)
		if got := s.Queries(); got != 1 {
			t.Errorf("Expected 1 upstream query for %d identical ones, got %d", n, got)
		}
		if got := metricValue(t, coalescedTotal.WithLabelValues(s.Addr)) - before; got != n-1 {
			t.Errorf("Expected coalesced_total %d, got %v", n-1, got)
		}
	})
}

// With no_coalesce, identical queries pending at once each reach the upstream.
func TestServeDNSNoCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		s, release := startHeldServer(t, cert)
		f := newPipeForward(t, cert, "no_coalesce", s)
		const n = 16
		before := metricValue(t, coalescedTotal.WithLabelValues(s.Addr)) // keyed by address, which tests may reuse
		out := serveAll(f, "www.coalesce.example.org.", n)
		// At least n: the pool may also rescue a few, held behind the first ones.
		waitFor(t, fmt.Sprintf("%d queries at the upstream", n), func() bool { return s.Queries() >= n })
		release()
		checkServed(t, out, n)
		if got := metricValue(t, coalescedTotal.WithLabelValues(s.Addr)) - before; got != 0 {
			t.Errorf("Expected no query coalesced, coalesced_total is %v", got)
		}
	})
}

// When the shared exchange fails at the first upstream (its connection closes, or
// no answer comes within read_timeout), each waiting client fails over to the
// second upstream on its own, as it would have alone, and gets its answer.
func TestServeDNSCoalescedFailover(t *testing.T) {
	cases := []struct {
		name    string
		options string
		fail    func(s *dottest.Server)
	}{
		{"connection closed", "", func(s *dottest.Server) { s.CloseConns() }},
		{"timeout", "read_timeout 300ms", func(*dottest.Server) {}},
	}
	for _, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cert := testCert(t)
				first, _ := startHeldServer(t, cert)
				second := startPipe(t, cert, dottest.Options{})
				f := newPipeForward(t, cert, "policy sequential\n"+tc.options, first, second)
				const n = 8
				out := serveAll(f, "failover.example.org.", n)
				waitFor(t, "every query at the first upstream's pool", func() bool {
					return f.upstreams[0].pending.Load() == n && first.Queries() >= 1
				})
				tc.fail(first)
				checkServed(t, out, n)
				if got := first.Queries(); got != 1 {
					t.Errorf("Expected 1 query at the first upstream, got %d", got)
				}
				if second.Queries() < 1 {
					t.Error("Expected the second upstream to answer the failed-over queries")
				}
			})
		})
	}
}
