package dotforward

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// An upstream that accepts queries and never answers: under steady load every
// query fails within the configured timeout and memory stays bounded (the pool's
// slots, its bounded waiting room and health checking keep queries from piling
// up). The load is bounded in count and time; make bench runs the full-size
// version against a real CoreDNS. It runs in a synctest bubble over in-memory
// TLS: the load's pacing and every timeout are on the virtual clock, memory and
// goroutines are real.
func TestBlackHoleKeepsMemoryBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate     = 2000 // queries per second, a fifth of make bench's: this runs under -race
			duration = 4 * time.Second
			timeout  = 2 * time.Second
			memLimit = 200 << 20
		)
		cert := testCert(t)
		s := startPipe(t, cert, dottest.Options{Drop: func(dns.Question) bool { return true }})
		f := newPipeForward(t, cert, fmt.Sprintf("timeout %s\nread_timeout 1s\nhealth_check 500ms", timeout), s)
		waitFor(t, "ready", f.Ready)

		var peakHeap, peakGoroutines uint64
		var ms runtime.MemStats
		sample := func() {
			runtime.ReadMemStats(&ms)
			peakHeap = max(peakHeap, ms.HeapInuse+ms.StackInuse)
			peakGoroutines = max(peakGoroutines, uint64(runtime.NumGoroutine()))
		}
		var slowest atomic.Int64
		var answered atomic.Int64
		var wg sync.WaitGroup
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		for n := 0; time.Since(start) < duration; n++ {
			<-tick.C
			for i := range rate / 100 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					began := time.Now()
					_, rcode, _ := serve(f, newMsg(fmt.Sprintf("void-%d-%d.example.org.", n, i), dns.TypeA))
					if rcode == dns.RcodeSuccess {
						answered.Add(1)
					}
					took := int64(time.Since(began))
					for old := slowest.Load(); took > old && !slowest.CompareAndSwap(old, took); old = slowest.Load() {
					}
				}()
			}
			if n%10 == 0 {
				sample()
			}
		}
		wg.Wait()
		sample()
		t.Logf("Peak heap+stacks %d MB, peak goroutines %d, slowest query %v, server saw %d queries",
			peakHeap>>20, peakGoroutines, time.Duration(slowest.Load()).Round(time.Millisecond), s.Queries())
		if answered.Load() != 0 {
			t.Errorf("Expected no answers from a black hole, got %d", answered.Load())
		}
		if peakHeap > memLimit {
			t.Errorf("Expected heap+stacks under %d MB, peaked at %d MB", memLimit>>20, peakHeap>>20)
		}
		// The deadline is enforced by the pool's sweeper (a twentieth of the read
		// timeout) and the handler. On the bubble's virtual clock a loaded machine
		// cannot make a query late, so this checks the precision: within the
		// timeout and two of the sweeper's ticks.
		if got := time.Duration(slowest.Load()); got > timeout+2*time.Second/20 {
			t.Errorf("Expected every query to fail within the %v timeout, the slowest took %v", timeout, got)
		}
		if !f.upstreams[0].Down() {
			t.Error("Expected the black hole marked down")
		}
	})
}
