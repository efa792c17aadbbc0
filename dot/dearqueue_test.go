package dot

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// oneOverForward is the one connection past the model's these tests allow:
// a query that dialled for itself may take a connection freed before its
// dial is done (acquireSlow), and that dial's connection is then one more
// than forward's, whose query waited for its own. Whether it does depends on
// the order in which goroutines woken at one virtual instant run: under
// -race, 14 against 13 (1 ms handshakes) and 18 against 17 (3 ms) in about
// one run in ten. The rescue wave these tests are about was 28-30.
const oneOverForward = 1

// make bench's dnsdist-slow regime, in a bubble: dnsdist's DoT frontend
// serves one query of a connection at a time, in order, in front of a backend
// answering after about 5 ms, under a steady 2,000 QPS. forward holds about
// ten connections (2,000 QPS × 5 ms, and a dial now and then). The pool's
// first answer (5 ms) is under unknownSlow, so it pipelines the queries that
// come next while it learns the mode: the answers of a queue that grows on
// one connection show in order only one service time at a time, and the
// rescues of that queue, once in order is learned, take connections forward
// never opens (issue 21: 29-30 against the model's 13 before the fix).
func TestFastInOrderSteadyLoadNoMoreConnectionsThanForward(t *testing.T) {
	ld := offeredLoad{qps: 2000, deadline: 5 * time.Second}
	for i := range 2000 {
		ld.arrivals = append(ld.arrivals, time.Duration(i)*500*time.Microsecond)
	}
	for _, handshake := range []time.Duration{time.Millisecond, 3 * time.Millisecond} {
		t.Run(handshake.String(), func(t *testing.T) {
			b := behaviour{seed: 5, inOrder: true, scale: 5150 * time.Microsecond, jitter: 0.03, handshake: handshake}
			model := runForward(t, &b, ld)
			pool := runPool(t, &b, ld)
			t.Logf("pool:  %v\nmodel: %v", pool, model)
			// One connection past the model's is allowed (see
			// oneOverForward); the wave was 28-30 against 13-17.
			judged := model
			judged.peak += oneOverForward
			if msg := judgeSeed(pool, judged); msg != "" {
				t.Errorf("%s\n  upstream: %v\n  pool:  %v\n  model: %v", msg, b, pool, model)
			}
		})
	}
}

// The same load in front of an upstream that answers out of order, every
// query after 5 ms: while the mode is unknown, connections of their own
// carry it as forward's would (dearQueue), and the query waiting on the
// oldest one,
// answered in its own time rather than a service time after the one before,
// shows the upstream serving side by side. Out of order learned, the pool
// goes back to a few full connections.
func TestFastOutOfOrderSteadyLoadLearnedSideBySide(t *testing.T) {
	opts := dottest.Options{Delay: func(dns.Question) time.Duration { return 5 * time.Millisecond }}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		name := func(i int) string { return fmt.Sprintf("q%d.example.", i) }
		checkOutcomes(t, offer(p, 4000, 500*time.Microsecond, name), func(string) time.Duration { return 10 * time.Millisecond })
		if m := p.Stats().Mode; m != ModeOutOfOrder {
			t.Errorf("Mode = %v, want %v", m, ModeOutOfOrder)
		}
		if c := p.Stats().Conns; c > AutoMaxConnsOutOfOrder {
			t.Errorf("%d connections open after 2 s, want %d at most", c, AutoMaxConnsOutOfOrder)
		}
	})
}

// The same regime as CoreDNS runs it: the health check's first probe (one
// query) is answered on the pool's one connection before the load starts,
// so there is no cold start of dials to spread the load over; before
// dearQueue, the load queued on that connection until in order was learned,
// and the rescues of the queue took connections forward never opens (peak
// 28 against the model's 13, held 27). make bench samples the
// upstream's connections once a second after a 2 s warm-up (34-45 against
// forward's 20-21 in dnsdist-slow); the property test compares the peak.
// Both are asserted: the wave is what opens the connections held.
func TestFastInOrderAfterAProbeHoldsNoMoreConnectionsThanForward(t *testing.T) {
	const gap, warmUp = 500 * time.Millisecond, 2 * time.Second
	ld := offeredLoad{qps: 2000, deadline: 5 * time.Second, heldFrom: gap + warmUp}
	ld.arrivals = append(ld.arrivals, 0) // the probe
	for i := range 6000 {
		ld.arrivals = append(ld.arrivals, gap+time.Duration(i)*500*time.Microsecond)
	}
	for _, handshake := range []time.Duration{time.Millisecond, 3 * time.Millisecond} {
		t.Run(handshake.String(), func(t *testing.T) {
			b := behaviour{seed: 5, inOrder: true, scale: 5150 * time.Microsecond, jitter: 0.03, handshake: handshake}
			model := runForward(t, &b, ld)
			pool := runPool(t, &b, ld)
			t.Logf("pool:  %v\nmodel: %v", pool, model)
			if pool.peak > model.peak+oneOverForward {
				t.Errorf("%d connections at once, want at most the model's %d (+%d)\n  pool:  %v\n  model: %v", pool.peak, model.peak, oneOverForward, pool, model)
			}
			if pool.held > model.held+oneOverForward {
				t.Errorf("%d connections held after the warm-up, want at most the model's %d (+%d)\n  pool:  %v\n  model: %v", pool.held, model.held, oneOverForward, pool, model)
			}
		})
	}
}

// learnWatch is a recorder that, as the pool learns in order, counts the
// connections holding a query written behind another (load above one).
type learnWatch struct {
	*recorder
	pool   atomic.Pointer[Pool]
	queued atomic.Int64 // at the last report of in order; -1: none yet
}

func (w *learnWatch) ModeLearned(m Mode, perConn int) {
	w.recorder.ModeLearned(m, perConn)
	if p := w.pool.Load(); p != nil && m == ModeInOrder {
		n := int64(0)
		for _, c := range *p.conns.Load() {
			if c.load.Load() > 1 {
				n++
			}
		}
		w.queued.Store(n)
	}
}

// While the mode is unknown, dearQueue has the oldest connection hold a
// second query, whose answer, a service time after the one before, is what
// shows in order. In order is learned as the answer that makes the waited
// evidence suffice is read, not at the sweeper's next tick: meanwhile the
// next arrival queued on that connection behind a query just begun, and was
// answered a whole answer time late, while its connection stayed busy for
// it; the query after found none idle and dialled one more than forward's
// (property steady seed 51: 17 connections against 16, in order, 9.5 ms
// answers at 1,361 QPS). Learned at the next tick instead, 1 connection
// held a second query as in order was learned, in 1 to 6 of the 14 gaps,
// in 8 of 8 runs. The gaps are odd so that no arrival comes at the very
// instant of that answer.
func TestFastInOrderLearnedWithNoQueryQueued(t *testing.T) {
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return 9500 * time.Microsecond }}
	for _, us := range []int{601, 613, 647, 659, 691, 701, 733, 743, 769, 787, 811, 829, 853, 877} {
		gap := time.Duration(us) * time.Microsecond
		t.Run(gap.String(), func(t *testing.T) {
			w := &learnWatch{recorder: newRecorder()}
			w.queued.Store(-1)
			mod := func(cfg *Config) { cfg.Observer = w }
			bubble(t, opts, 700*time.Microsecond, mod, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
				w.pool.Store(p)
				name := func(i int) string { return fmt.Sprintf("q%d.example.", i) }
				checkOutcomes(t, offer(p, 400, gap, name), func(string) time.Duration { return 30 * time.Millisecond })
				if m := p.Stats().Mode; m != ModeInOrder {
					t.Errorf("Mode = %v, want %v", m, ModeInOrder)
				}
				if n := w.queued.Load(); n != 0 {
					t.Errorf("%d connections held a query behind another as in order was learned, want 0", n)
				}
			})
		})
	}
}

// Waited answers wake the sweeper to learn at most once a minWatchInterval:
// one that a learn refused lets the next one through again (the kept
// evidence), and at a fast upstream's rate every waited answer woke a learn
// of its own, each locking every connection (session 21's review).
func TestWaitedAnswersWakeTheSweeperAtMostOnceAnInterval(t *testing.T) {
	var p Pool
	t0 := int64(time.Hour)
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{
		{0, true},
		{time.Microsecond, false},
		{minWatchInterval - time.Microsecond, false},
		{minWatchInterval, true},
		{minWatchInterval + time.Millisecond, false},
		{3 * minWatchInterval, true},
	} {
		if got := p.waitedKick(t0 + int64(tc.at)); got != tc.want {
			t.Errorf("A waited answer %v after the first: woke the sweeper %v, want %v", tc.at, got, tc.want)
		}
	}
}

// An in-order upstream answering in 8 ms, under unknownSlow but sixteen
// handshakes long, under a light load (a query every 3.3 ms: two or three
// out at once). While the mode was unknown, dearQueue had the oldest
// connection hold a second query, to learn the mode from its answer; each
// query so queued waited a whole answer time behind the one in service, where
// forward's, on a connection of its own, waited half a millisecond for a
// handshake. Few queries are ever out, so in order was learned late and the
// bet was lost again and again (past the CI range, property seed 470: 8.7 ms
// answers at 523 QPS, p99 17 ms against forward's 9.4).
func TestLightLoadSlowishUpstreamQueuesNothing(t *testing.T) {
	ld := offeredLoad{qps: 300, deadline: 5 * time.Second, paced: true}
	for i := range 300 {
		ld.arrivals = append(ld.arrivals, time.Duration(i)*3300*time.Microsecond)
	}
	b := behaviour{seed: 7, inOrder: true, scale: 8 * time.Millisecond, handshake: 500 * time.Microsecond}
	model := runForward(t, &b, ld)
	pool := runPool(t, &b, ld)
	t.Logf("pool:  %v\nmodel: %v", pool, model)
	if msg := judgeSeed(pool, model); msg != "" {
		t.Errorf("%s\n  upstream: %v\n  pool:  %v\n  model: %v", msg, b, pool, model)
	}
}
