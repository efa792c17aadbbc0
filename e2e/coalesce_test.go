package e2e

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// slowUpstream is CoreDNS's tls:// server answering every query through the
// erratic plugin (A 192.0.2.53, the question's name as the owner, in the case
// asked), each answer held back for a fixed delay.
type slowUpstream struct {
	addr, metrics string
	p             *proc
}

func startSlowUpstream(t *testing.T, c *certs, delay time.Duration) *slowUpstream {
	t.Helper()
	port, mport := freePort(t), freePort(t)
	conf := writeFile(t, t.TempDir(), "Corefile", fmt.Sprintf(`tls://.:%d {
    bind 127.0.0.1
    tls %s %s
    prometheus 127.0.0.1:%d
    erratic {
        delay 1 %s
    }
}
`, port, c.Cert, c.Key, mport, delay))
	u := &slowUpstream{addr: addr(port), metrics: addr(mport)}
	u.p = startProc(t, "coredns-slow-upstream", nil, corednsBinary(t), "-conf", conf)
	waitFor(t, "the slow upstream on "+u.addr, startTimeout, u.p, func() error {
		r, err := dotExchange(c, u.addr, newQuery("ready.e2e.test.", dns.TypeA))
		if err != nil {
			return err
		}
		return checkAnswer(r, dns.TypeA, "192.0.2.53")
	})
	return u
}

// queries returns how many queries the upstream has received.
func (u *slowUpstream) queries(t *testing.T) int {
	t.Helper()
	n, _ := metricSum(scrape(t, u.metrics), "coredns_dns_requests_total")
	return int(n)
}

// Identical queries in flight through the CoreDNS under test (no cache) reach a
// slow upstream once per flight, not once each, and every one is answered.
func TestCoalesceInFlight(t *testing.T) {
	c := newCerts(t)
	up := startSlowUpstream(t, c, 300*time.Millisecond)
	f := startFront(t, c, frontOpts{Upstreams: []string{up.addr}, Prometheus: true, Failing: true})
	before := up.queries(t)

	const total, concurrent = 2000, 200
	var next, failed atomic.Int64
	var firstErr error // set once, read after wg.Wait
	var once sync.Once
	var wg sync.WaitGroup
	for range concurrent {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= total {
				r, err := exchange("udp", f.addr, nil, newQuery("same.e2e.test.", dns.TypeA))
				if err == nil {
					err = checkAnswer(r, dns.TypeA, "192.0.2.53")
				}
				if err != nil {
					failed.Add(1)
					once.Do(func() { firstErr = err })
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of %d queries failed, the first with: %v", n, total, firstErr)
	}
	got := up.queries(t) - before
	t.Logf("%d identical queries, %d at a time, reached the upstream %d times", total, concurrent, got)
	if got > 40 {
		t.Errorf("The upstream got %d queries for %d identical ones, %d at a time; want at most 40", got, total, concurrent)
	}
	if n, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_coalesced_total"); int(n) < total-40 {
		t.Errorf("coalesced_total is %v, want at least %d", n, total-40)
	}
}

// Two dig queries in flight together that differ only in the name's case are
// merged, and each gets its own spelling back (dig keeps case; kdig would not);
// two that differ only in the DO bit never are.
func TestCoalesceDigPairs(t *testing.T) {
	c := newCerts(t)
	// A second to spare: the second dig starts once the first one's query is in
	// flight, and must get there before its answer, however slow a process start.
	up := startSlowUpstream(t, c, time.Second)
	f := startFront(t, c, frontOpts{Upstreams: []string{up.addr}, Prometheus: true, Failing: true})
	dig := tool(t, "dig")
	host, port, _ := strings.Cut(f.addr, ":")
	// +nocookie: dig sends a client cookie of its own per run, which would keep
	// the two queries apart (as it should: the upstream's answer depends on it).
	base := []string{"@" + host, "-p", port, "+nocookie", "+tries=1", "+time=5"}

	pairs := []struct {
		name       string
		a, b       []string // dig arguments after base
		wantUpQ    int      // queries the pair sends upstream
		checkSpell bool
	}{
		{"case", []string{"CoAlEsCe.e2e.test", "A"}, []string{"cOaLeScE.E2E.TEST", "A"}, 1, true},
		{"DO", []string{"dnssec-pair.e2e.test", "A"}, []string{"+dnssec", "dnssec-pair.e2e.test", "A"}, 2, false},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			before := up.queries(t)
			coalescedBefore, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_coalesced_total")
			var outs [2]string
			var errs [2]error
			var wg sync.WaitGroup
			for i, args := range [][]string{p.a, p.b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					outs[i], errs[i] = run(t, clientTimeout, dig, append(append([]string{}, base...), args...)...)
				}()
				if i == 0 {
					waitFor(t, "the first query in flight", startTimeout, f.p, func() error {
						if n, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_inflight"); n < 1 {
							return fmt.Errorf("%v queries in flight", n)
						}
						return nil
					})
				}
			}
			wg.Wait()
			for i, args := range [][]string{p.a, p.b} {
				if errs[i] != nil || !strings.Contains(outs[i], "status: NOERROR") {
					t.Fatalf("dig %s: %v\n%s", strings.Join(args, " "), errs[i], outs[i])
				}
				name := args[len(args)-2] + "."
				if p.checkSpell && (!strings.Contains(outs[i], "\n;"+name+"\t") || !strings.Contains(outs[i], "\n"+name+"\t")) {
					t.Errorf("dig %s: want the question and the answer's owner spelled %s:\n%s", name, name, outs[i])
				}
			}
			// Merged or not is what the front counts: the upstream's own count
			// would also take in a rescue of the leader, which the pool sends when
			// the query waits behind a slow one on this in-order upstream.
			merged, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_coalesced_total")
			if got := int(merged - coalescedBefore); got != 2-p.wantUpQ {
				t.Errorf("The pair was merged %d times (coalesced_total), want %d; the upstream got %d queries", got, 2-p.wantUpQ, up.queries(t)-before)
			}
		})
	}
}
