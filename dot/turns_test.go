package dot

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// An upstream with one thread that serves its connections in turn (unbound
// with num-threads 1, dottest.Turns) answers a query in about one round of
// turns, and a round is longer the more connections hold queries: forward's
// shape, a connection per query, is the slowest it can be given. Here 50
// clients each send the next query when the last is answered, after a first
// query alone whose answer is slow (the thread busy for 40 ms, as on a machine
// starting up). The pool takes the upstream for a slow one and gives each
// query a connection of its own (slowUnknown); with 50 connections a round
// takes 15 ms, which confirms the belief, and the gaps between rounds look like
// in-order service. What shows the belief wrong is queries written together on
// a connection being answered together, in the same turn (side by side): with
// that rule off, the pool held 50 connections at a fifth of the rate few get
// for the whole run. Against unbound, the same trap held 200 connections at
// half the rate for whole make bench rounds (1 cold start in 6; see
// TestServeModeSideBySide for the evidence it saw).
//
// The connections are counted over the run's last second, its fourth: how
// soon the pool learns out of order depends on which queries roll an order
// check (one in orderCheckEvery, at random) and on the order goroutines run
// in, and it closes the connections it no longer needs inOrderIdle (1 s)
// later. Counted over the third second, a run that learned at 1.0 s held
// its 50 until 2.2 s and failed (under -race, 1 run in 40 here, and one CI
// run; the others learned at 0.2-0.8 s).
func TestTurnsUpstreamEndsOnFewConnections(t *testing.T) {
	const clients, run = 50, 4 * time.Second
	turns := &dottest.Turns{PerTurn: 250 * time.Microsecond, PerQuery: 50 * time.Microsecond}
	var first atomic.Bool
	delay := func(q dns.Question) time.Duration {
		if first.CompareAndSwap(false, true) {
			return 40 * time.Millisecond // the thread's first answer, on a machine busy starting up
		}
		return 0
	}
	bubble(t, dottest.Options{Turns: turns, Delay: delay}, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		if _, err := exchange(p, "first.example."); err != nil { // alone, and slow
			t.Fatal(err)
		}
		start := time.Now()
		var answered [4]atomic.Int64 // by second of the run
		peak := 0                    // connections open in the last second, at most
		var wg sync.WaitGroup
		for c := range clients {
			wg.Go(func() {
				for i := 0; time.Since(start) < run; i++ {
					if _, err := exchange(p, fmt.Sprintf("q%d-%d.example.", c, i)); err != nil {
						t.Errorf("Client %d, query %d: %v", c, i, err)
						return
					}
					if sec := int(time.Since(start) / time.Second); sec < len(answered) {
						answered[sec].Add(1)
					}
				}
			})
		}
		for time.Since(start) < run {
			time.Sleep(100 * time.Millisecond)
			if time.Since(start) > run-time.Second {
				peak = max(peak, p.Stats().Conns)
			}
		}
		st := p.Stats()
		wg.Wait()
		if st.Mode == ModeInOrder || peak > 2*AutoMaxConnsOutOfOrder {
			t.Errorf("In the last second: mode %v, up to %d connections, want few (%d or fewer), not in order; answers by second %v",
				st.Mode, peak, 2*AutoMaxConnsOutOfOrder, bySecond(answered[:]))
		}
		// Few connections serve the thread's turns best: from the second
		// second on, the rate is what a round of a few turns gives, far
		// above one of 50. (How much of the first second the pool spends
		// learning depends on the order checks rolled and the order
		// goroutines run in: 3,400 to 13,200 answers in 40 runs under the
		// race detector.)
		oneEach := 1 / (turns.PerTurn + turns.PerQuery).Seconds() // a round of 50 turns answers 50 queries
		for sec := 1; sec < len(answered); sec++ {
			if got := float64(answered[sec].Load()); got < 2*oneEach {
				t.Errorf("%.0f answers in second %d of the run, want twice or more the %.0f of a connection per query", got, sec+1, oneEach)
			}
		}
		t.Logf("answers by second: %v; mode %v; %d connections at the end, %d dials", bySecond(answered[:]), st.Mode, st.Conns, s.Handshakes())
	})
}

// bySecond returns the counts of answers by second of a run.
func bySecond(answered []atomic.Int64) []int64 {
	n := make([]int64, len(answered))
	for i := range answered {
		n[i] = answered[i].Load()
	}
	return n
}
