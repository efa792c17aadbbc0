package dotforward

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/dotforward/dotforward/dot"
	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func testUpstreams(n int) []*upstream {
	ups := make([]*upstream, n)
	for i := range ups {
		ups[i] = newUpstream(dot.Config{Addr: fmt.Sprintf("192.0.2.%d:853", i+1)}, defaultMaxFails, healthCheck{})
	}
	return ups
}

func order(ups []*upstream) string {
	s := ""
	for _, u := range ups {
		s += u.addr[len("192.0.2."):len("192.0.2.")+1] + " "
	}
	return s
}

func TestNewPolicy(t *testing.T) {
	for _, name := range []string{"random", "round_robin", "sequential", "latency"} {
		if p := newPolicy(name); p == nil || p.String() != name {
			t.Errorf("Expected policy %s, got %v", name, p)
		}
	}
	if p := newPolicy("fastest"); p != nil {
		t.Errorf("Expected no policy for an unknown name, got %v", p)
	}
}

func TestSequential(t *testing.T) {
	ups := testUpstreams(3)
	p := &sequential{}
	for i := range 3 {
		if got := order(p.List(ups)); got != "1 2 3 " {
			t.Errorf("Call %d: expected order 1 2 3, got %s", i, got)
		}
	}
}

func TestRoundRobin(t *testing.T) {
	ups := testUpstreams(3)
	p := &roundRobin{}
	want := []string{"1 2 3 ", "2 3 1 ", "3 1 2 ", "1 2 3 "}
	for i, w := range want {
		if got := order(p.List(ups)); got != w {
			t.Errorf("Call %d: expected order %s, got %s", i, w, got)
		}
	}
	if got := order(ups); got != "1 2 3 " {
		t.Errorf("Expected the configured order untouched, got %s", got)
	}
	if got := p.List(nil); got != nil {
		t.Errorf("Expected no order for no upstreams, got %v", got)
	}
}

func TestRandom(t *testing.T) {
	ups := testUpstreams(3)
	p := &random{}
	firsts := map[string]int{}
	for range 300 {
		got := p.List(ups)
		if !isPermutation(got, ups) {
			t.Fatalf("Expected a permutation of the upstreams, got %s", order(got))
		}
		firsts[got[0].addr]++
	}
	// Each upstream is first with probability 1/3; missing one in 300 draws has
	// probability 3·(2/3)^300 ≈ 1e-52.
	if len(firsts) != 3 {
		t.Errorf("Expected every upstream to come first sometimes, got %v", firsts)
	}
	if got := order(ups); got != "1 2 3 " {
		t.Errorf("Expected the configured order untouched, got %s", got)
	}
}

func TestLatency(t *testing.T) {
	ms := func(n int) int64 { return int64(time.Duration(n) * time.Millisecond) }
	tests := []struct {
		name    string
		mean    []int64
		pending []int64
		explore int // -1: no exploration; else the index pick returns
		want    string
	}{
		{name: "fastest first", mean: []int64{ms(30), ms(10), ms(20)}, pending: []int64{0, 0, 0}, explore: -1, want: "2 3 1 "},
		{name: "queue counts", mean: []int64{ms(30), ms(10), ms(20)}, pending: []int64{0, 4, 0}, explore: -1, want: "3 1 2 "},
		{name: "unmeasured first", mean: []int64{ms(5), 0, ms(1)}, pending: []int64{0, 0, 0}, explore: -1, want: "2 3 1 "},
		{name: "unmeasured spread by queue", mean: []int64{0, 0, ms(1)}, pending: []int64{3, 0, 0}, explore: -1, want: "2 1 3 "},
		{name: "exploration puts a slower one first", mean: []int64{ms(30), ms(10), ms(20)}, pending: []int64{0, 0, 0}, explore: 1, want: "1 3 2 "},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ups := testUpstreams(3)
			for i, u := range ups {
				u.answers.mean.Store(tc.mean[i])
				u.pending.Store(tc.pending[i])
			}
			p := newLatency()
			p.explore = func() bool { return tc.explore >= 0 }
			p.pick = func(n int) int {
				if n != 2 {
					t.Errorf("Expected a pick among the 2 others, got %d", n)
				}
				return tc.explore
			}
			if got := order(p.List(ups)); got != tc.want {
				t.Errorf("Expected order %s, got %s", tc.want, got)
			}
		})
	}
}

// TestLatencyExploresRarely checks the real exploration rate: the fastest upstream
// comes first about 19 times in 20.
func TestLatencyExploresRarely(t *testing.T) {
	ups := testUpstreams(3)
	for i, u := range ups {
		u.answers.mean.Store(int64(time.Duration(i+1) * time.Millisecond))
	}
	p := newLatency()
	first := 0
	const n = 2000
	for range n {
		got := p.List(ups)
		if !isPermutation(got, ups) {
			t.Fatalf("Expected a permutation of the upstreams, got %s", order(got))
		}
		if got[0] == ups[0] {
			first++
		}
	}
	// Expected 1900; the bounds are more than 7 standard deviations (≈9.7) away.
	if first < 1820 || first > 1970 || first == n {
		t.Errorf("Expected the fastest upstream first in about 95%% of %d lists, got %d", n, first)
	}
}

func TestLatencyEstimate(t *testing.T) {
	u := testUpstreams(1)[0]
	u.answers.addMean(100 * time.Millisecond)
	if got := time.Duration(u.answers.mean.Load()); got != 100*time.Millisecond {
		t.Errorf("Expected the first sample as the estimate, got %s", got)
	}
	u.answers.addMean(20 * time.Millisecond)
	if got := time.Duration(u.answers.mean.Load()); got != 80*time.Millisecond {
		t.Errorf("Expected the estimate to move a quarter of the way to 20ms, got %s", got)
	}
	// A failure weighs like a read timeout, however fast it came.
	u.answers.missed(fmt.Errorf("wrapped: %w", dot.ErrConnLost), time.Millisecond)
	if got, want := time.Duration(u.answers.mean.Load()), 80*time.Millisecond+(dot.DefaultReadTimeout-80*time.Millisecond)/4; got != want {
		t.Errorf("Expected a failure to count as a read timeout (%s), got %s", want, got)
	}
	// The client's own deadline says nothing about the upstream.
	before := u.answers.mean.Load()
	u.answers.missed(errors.Join(dot.ErrTimeout, context.DeadlineExceeded), time.Second)
	if u.answers.mean.Load() != before || u.health.fails.Load() != 0 {
		t.Errorf("Expected a caller deadline not to count, got mean %s and %d fails", time.Duration(u.answers.mean.Load()), u.health.fails.Load())
	}
}

// TestLatencyPolicyPrefersFasterUpstream sends sequential queries to a slow and a
// fast upstream: once both are measured, the fast one takes nearly all of them.
func TestLatencyPolicyPrefersFasterUpstream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		slow := startPipe(t, cert, dottest.Options{Delay: func(dns.Question) time.Duration { return 30 * time.Millisecond }})
		fast := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "policy latency", slow, fast)
		const n = 200
		for i := range n {
			if _, rcode, err := serve(f, newMsg(fmt.Sprintf("q%d.example.org.", i), dns.TypeA)); rcode != dns.RcodeSuccess {
				t.Fatalf("Query %d: expected an answer, got rcode %d, error %v", i, rcode, err)
			}
		}
		// Expected: the slow one once or twice while unmeasured, then one query in 20
		// exploring (about 10); the bound leaves room for a loaded machine.
		if got := fast.Queries(); got < n*3/4 {
			t.Errorf("Expected the fast upstream to take most of %d queries, got %d (slow: %d)", n, got, slow.Queries())
		}
		if slow.Queries() == 0 {
			t.Errorf("Expected exploration to send some queries to the slow upstream")
		}
	})
}

func isPermutation(got, ups []*upstream) bool {
	if len(got) != len(ups) {
		return false
	}
	for _, u := range ups {
		if !slices.Contains(got, u) {
			return false
		}
	}
	return true
}

// BenchmarkPolicies measures what each policy costs the client when one of two
// upstreams is slower (20ms against 1ms, the slow one listed first): the answer
// time percentiles and the share of queries the fast upstream took.
//
//	go test -run XXX -bench Policies -benchtime 2000x
func BenchmarkPolicies(b *testing.B) {
	cert, err := dottest.NewCert()
	if err != nil {
		b.Fatalf("Generating a test certificate: %v", err)
	}
	delay := func(d time.Duration) func(dns.Question) time.Duration {
		return func(dns.Question) time.Duration { return d }
	}
	for _, policy := range []string{"random", "round_robin", "sequential", "latency"} {
		b.Run(policy, func(b *testing.B) {
			slow := dottest.Start(b, dottest.Options{Cert: cert, Delay: delay(20 * time.Millisecond)})
			fast := dottest.Start(b, dottest.Options{Cert: cert, Delay: delay(time.Millisecond)})
			f := newForward(b, cert, "policy "+policy, slow.Addr, fast.Addr)
			var mu sync.Mutex
			var took []time.Duration
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				m := new(dns.Msg)
				m.SetQuestion("example.org.", dns.TypeA)
				var mine []time.Duration
				for pb.Next() {
					start := time.Now()
					rcode, err := f.ServeDNS(context.Background(), dnstest.NewRecorder(&test.ResponseWriter{}), m)
					if rcode != dns.RcodeSuccess {
						b.Errorf("Expected an answer, got rcode %d, error %v", rcode, err)
						return
					}
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				took = append(took, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			slices.Sort(took)
			if len(took) > 0 {
				b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
			}
			b.ReportMetric(float64(fast.Queries())/float64(fast.Queries()+slow.Queries()), "fast-share")
		})
	}
}
