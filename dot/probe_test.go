package dot

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/miekg/dns"

	"github.com/dotforward/dotforward/dot/dottest"
)

// A slow out-of-order upstream (80 ms answers) that serves 22 queries a
// connection and ignores the rest, whose limit the pool has not learned: one
// connection served 19 deep (a burst at its start), and a load of 1,000 QPS
// follows. Filled in turn to the reach (twice the 19 served and 16 more), the
// connections each took 32 queries past the limit, ignored until a silence
// showed them, two answer times and more late (property seed 19). With the
// depth probe, a connection takes no more than the deepest write order served,
// and one at a time goes a few past it: none went past the limit in 10 runs
// of 10 (97 and 122 late, the limit learned, with the probe off).
func TestSlowUpstreamGoesPastTheDepthServedOneConnectionAtATime(t *testing.T) {
	const limit, answer, slow = 22, 80 * time.Millisecond, 1500 * time.Millisecond
	opts := dottest.Options{CloseAfter: limit, SlowNth: limit, Slow: slow, Delay: func(q dns.Question) time.Duration {
		switch {
		case q.Name == "order.example.":
			return 20 * time.Millisecond
		case strings.HasPrefix(q.Name, "q"), strings.HasPrefix(q.Name, "b"):
			return answer
		}
		return time.Millisecond
	}}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		warmOutOfOrder(t, p) // 3 queries on the first connection
		var wg sync.WaitGroup
		for i := range 16 { // a burst: 19 deep on the first connection
			wg.Go(func() { _, _ = exchange(p, fmt.Sprintf("b%d.example.", i)) })
		}
		wg.Wait()
		if d := p.learned.limit.deepest.Load(); d < probeStep || d+probeStep > limit {
			t.Fatalf("Deepest write order served %d, want %d to %d", d, probeStep, limit-probeStep)
		}
		p.learned.mode.usual.Store(int64(answer)) // a slow upstream
		out := offer(p, 240, time.Millisecond, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		late := 0
		for _, o := range out {
			switch {
			case o.err != nil:
				t.Errorf("Query %s: %v", o.name, o.err)
			case o.took > 2*answer && o.took < slow/2: // past the limit, not a slow 22nd
				late++
			}
		}
		if late > probeStep {
			t.Errorf("%d queries answered two answer times late or more (past the server's limit), want at most %d (one probe's step)", late, probeStep)
		}
		// forward: a connection per query outstanding, 80 at this rate
		if h, most := s.Handshakes(), int64(answer/time.Millisecond); h > most {
			t.Errorf("%d handshakes, want at most %d (forward's)", h, most)
		}
	})
}

// A query that finds no connection with room within the deepest write order
// served, and the probe as far past it as it may go, dials one of its own; a
// connection that reached the deepest, with nothing outstanding, is retired
// for it (drains, and closes empty), the oldest first, the probe never. Kept,
// such connections counted beside the new ones (see retireOne).
func TestRetireOneDrainsAnIdleConnectionAtTheDepthServed(t *testing.T) {
	probe := newBareConn(t, 8)
	p := probe.pool
	busy, idle, fresh := newConn(p, probe.tc, probe.bc), newConn(p, probe.tc, probe.bc), newConn(p, probe.tc, probe.bc)
	p.conns.Store(&[]*conn{probe, busy, idle, fresh})
	for _, c := range []*conn{probe, busy, idle} {
		c.taken.Store(5)
	}
	fresh.taken.Store(2)
	busy.load.Store(1)
	p.probe.c = probe
	p.retireOne(5)
	for _, c := range []struct {
		name string
		c    *conn
		want avail
	}{{"the probe", probe, availTaking}, {"a busy one", busy, availTaking}, {"one within the depth", fresh, availTaking}, {"the idle one at the depth", idle, availDraining}} {
		if a := c.c.avail(); a != c.want {
			t.Errorf("%s: %v, want %v", c.name, a, c.want)
		}
	}
}

// Past the deepest write order served, with the probe as far past it as it may
// go, a query goes on a connection that reached the depth only while that one
// has nothing outstanding, one query at a time, as forward sends them: a
// server with a limit closes the connection after answering its last query,
// so none goes past it unseen, and the server's depth grows with each such
// answer. It dialled instead, and a limitless upstream's connections, all at
// the depth and idle, were replaced one dial per query:
// TestTurnsUpstreamEndsOnFewConnections made 74 to 126 dials under the race
// detector, 50 (its clients') with this.
func TestIdleConnectionAtTheDepthTakesOneQuery(t *testing.T) {
	probe := newBareConn(t, 8)
	p := probe.pool
	p.noOrderChecks.Store(true)
	p.learned.mode.mode.Store(int32(ModeOutOfOrder))
	p.learned.mode.usual.Store(int64(100 * time.Millisecond))
	p.learned.limit.deepest.Store(5)
	busy, idle := newConn(p, probe.tc, probe.bc), newConn(p, probe.tc, probe.bc)
	p.conns.Store(&[]*conn{probe, busy, idle})
	for _, c := range []*conn{busy, idle} {
		c.taken.Store(5)
	}
	probe.taken.Store(5 + probeStep)
	probe.load.Store(probeStep)
	busy.load.Store(1)
	p.probe = depthProbe{c: probe, target: 5 + probeStep, step: probeStep, last: nanotime()}
	cl := newTestCall(mustPrepare(t, "a.example."))
	if c := p.pick(cl); c != idle {
		t.Fatalf("Picked %p, want the idle connection at the depth %p (the probe %p, a busy one %p)", c, idle, probe, busy)
	}
	if l := idle.load.Load(); l != 1 {
		t.Errorf("The idle connection holds %d, want 1", l)
	}
}

// The probe hands back to the reach once the server served unprovenDepth past
// the depth it first found: as deep as the reach bets with nothing served
// beyond, which a limit that close would have stopped. Kept on, a limitless
// slow upstream's connections each took no more than the depth the probe had
// proven, which grew by one probe step an answer time: a load of 75 queries an
// answer time dialled past the 4 connections it needs
// (TestUniformlySlowSteadyLoadLearnedSideBySide held 5 or 6 in 2 of 5 runs
// under the race detector).
func TestDepthProbeHandsBackToTheReach(t *testing.T) {
	p := newBareConn(t, 8).pool
	p.learned.mode.mode.Store(int32(ModeOutOfOrder))
	p.learned.mode.usual.Store(int64(100 * time.Millisecond))
	for _, c := range []struct{ deepest, want int32 }{{10, 10}, {10 + unprovenDepth - 1, 10 + unprovenDepth - 1}, {10 + unprovenDepth, 0}} {
		p.learned.limit.deepest.Store(c.deepest)
		if r := p.probedReach(); r != c.want {
			t.Errorf("Deepest served %d (first %d): probed reach %d, want %d", c.deepest, 10, r, c.want)
		}
	}
}

// While the probe holds a slow upstream's connections at the depth, a server's
// cut of one that took no more than the depth, at its last answer, teaches no
// limit: such connections take one query at a time there and sit idle, and an
// idle timeout cuts them all after as many answers, some at an answer. Two
// within a dial's time taught steady property seed 45 (idle timeout 144 ms,
// answers 276 ms, no limit) a limit of 13 at a depth of 14, and the queries
// past it were evicted and replayed (p99 640 ms against the model's 375).
// The control: the probe handed back, the same two cuts teach it. The depth
// here is 20, not 14: cuts at an answer after fewer than minLearnedLimit
// answers teach no limit, probe or not.
func TestCutAtTheDepthUnderTheProbeTeachesNoLimit(t *testing.T) {
	const depth = 20
	for _, c := range []struct {
		name     string
		probedTo int32
		want     int32
	}{{"the probe on", depth + unprovenDepth, 0}, {"the probe handed back", depth, depth}} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				first := newBareConn(t, 8)
				p := first.pool
				second := newConn(p, first.tc, first.bc)
				time.Sleep(2 * restartWindow)
				synctest.Wait() // the sweeper's tick at this instant done
				// Set after the sweeper's ticks: seeing no answers, they
				// take the mode back to unknown. The cuts come at one
				// instant, within a dial's time, with no tick between.
				p.learned.mode.mode.Store(int32(ModeOutOfOrder))
				p.learned.mode.usual.Store(int64(276 * time.Millisecond))
				p.dialTime.Store(int64(4 * time.Millisecond))
				p.learned.limit.deepest.Store(depth)
				p.learned.limit.probedTo.Store(c.probedTo)
				for _, cn := range []*conn{first, second} {
					cn.mu.Lock()
					cn.accepted, cn.served = depth, depth
					cn.mu.Unlock()
					cn.servedAt.Store(nanotime())
					cn.closeFor(errServerClosed, CloseServer)
				}
				if got := p.learned.limit.get(); got != c.want {
					t.Errorf("Two connections that took %d queries cut at their last answer together, the depth %d: limit %d, want %d", depth, depth, got, c.want)
				}
			})
		})
	}
}
