package dot

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
)

// make bench's throughput phase in a bubble: unbound on loopback (one thread
// serving its connections in turn, dottest.Turns, tens of microseconds a
// query) under dnsperf's closed loop (200 queries always out, each sent when
// the last is answered: a burst of 200, then as fast as the upstream
// answers). It answers in order and never out of order, so the mode stays
// unknown; its answers come microseconds apart on a connection while every
// query waits milliseconds in the thread's queue. A few pipelined
// connections serve it at its full rate: the pool holds 4-5 (the cap, and
// one dialled in the first burst), as it held 4 in make bench. A depth bound
// measured against the answer time (the queue's milliseconds), not the
// answers' spacing, dialled a connection for every few queries: 40-53 to
// unbound in make bench, 156-197 here (and 36,000-41,000 answers, not
// 49,000).
func TestSaturatedFastUpstreamKeepsFewConnections(t *testing.T) {
	turns := &dottest.Turns{PerTurn: 20 * time.Microsecond, PerQuery: 20 * time.Microsecond}
	saturate(t, dottest.Options{Turns: turns})
}

// saturate runs dnsperf's closed loop (200 queries always out) against the
// upstream opts scripts, dials taking 10 ms (on make bench's two busy cores a
// handshake waits behind the queries too), for a second, and fails the test
// if the pool held more than twice the out-of-order cap after a warm-up.
func saturate(t *testing.T, opts dottest.Options) {
	const clients, run, warmUp, handshake = 200, time.Second, 200 * time.Millisecond, 10 * time.Millisecond
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		start := time.Now()
		var answered atomic.Int64
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				for i := 0; time.Since(start) < run; i++ {
					if _, err := exchange(p, fmt.Sprintf("q%d-%d.example.", c, i)); err != nil {
						t.Errorf("Client %d, query %d: %v", c, i, err)
						return
					}
					answered.Add(1)
				}
			})
		}
		time.Sleep(warmUp)
		sm := sample(p)
		wg.Wait()
		sm.end()
		st, m := p.Stats(), &p.learned.mode
		if c := sm.conns.Load(); c > 2*AutoMaxConnsOutOfOrder {
			t.Errorf("Up to %d connections open after the warm-up (%d dials), want %d at most; mode %v",
				c, s.Handshakes(), 2*AutoMaxConnsOutOfOrder, st.Mode)
		}
		t.Logf("%d answers in %v; up to %d connections after the warm-up, %d dials; mode %v, usual answer %v",
			answered.Load(), run, sm.conns.Load(), s.Handshakes(), st.Mode, time.Duration(m.usual.Load()))
	})
}
