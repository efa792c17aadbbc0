package dot

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// While the upstream is slow and unknown, an order check goes out only when
// it is cheap (slowCheckCheap): not before the pool has read
// minSlowCheckReads answers (the p99 of a small load is its slowest answer,
// which a check waiting behind another is), nor while the load grows (a
// connection took its first query within two usual answer times: the check's
// service, moved an answer time later, lands on a higher load). Property
// seeds 2, 64, 186, 194 failed 1-7 replays in 20 each by a check's luck.
// Known in order, checks roll as before, growing or not.
//
// In a bubble: the pool's sweeper learns at every full sweep, and a mode set
// by hand, learned at no time, lapses there (serveMode.decide). On the wall
// clock, a sweep that came during the last 5,120 picks (under -race on a
// loaded machine, 0.3-0.8 s) made the upstream unknown again, read nothing,
// and no check went out: 2 runs in 40 under -race, 1 in 3 of a -race
// ./dot/ run.
func TestSlowUnknownOrderChecksOnlyWhenCheap(t *testing.T) {
	synctest.Test(t, testSlowUnknownOrderChecksOnlyWhenCheap)
}

func testSlowUnknownOrderChecksOnlyWhenCheap(t *testing.T) {
	busy := newBareConn(t, 8)
	p := busy.pool
	idle := newConn(p, busy.tc, busy.bc)
	p.conns.Store(&[]*conn{busy, idle})
	const usual = 100 * time.Millisecond
	p.learned.mode.usual.Store(int64(usual))
	if !busy.register(newTestCall(mustPrepare(t, "first.example."))) {
		t.Fatal("register failed")
	}
	<-busy.writeq
	const picks = 20 * orderCheckEvery
	checks := func(reads int64, takenAgo time.Duration) int {
		busy.reads.Store(reads)
		n := 0
		for range picks {
			now := nanotime()
			busy.wroteAt.Store(now) // just written: an order check may go behind it
			busy.takenAt.Store(now - int64(time.Hour))
			idle.takenAt.Store(now - int64(takenAgo))
			if pickedOnce(t, p, newTestCall(mustPrepare(t, "q.example."))) == busy {
				n++
			}
		}
		return n
	}
	if !p.slowUnknown() {
		t.Fatal("Not slow and unknown")
	}
	steady := 2*usual + time.Millisecond
	if n := checks(minSlowCheckReads-1, steady); n != 0 {
		t.Errorf("Slow and unknown, %d answers read: %d order checks in %d queries, want none", minSlowCheckReads-1, n, picks)
	}
	if n := checks(minSlowCheckReads, usual); n != 0 {
		t.Errorf("Slow and unknown, a connection taken %v ago: %d order checks in %d queries, want none", usual, n, picks)
	}
	if n := checks(minSlowCheckReads, steady); n == 0 {
		t.Errorf("Slow and unknown, steady, %d answers read: no order check in %d queries, want about 20", minSlowCheckReads, picks)
	}
	p.learned.mode.mode.Store(int32(ModeInOrder))
	if n := checks(0, 0); n == 0 {
		t.Errorf("In order, growing: no order check in %d queries, want about 20", picks)
	}
}

// pickedOnce returns the connection pickIdle gives cl, with one idle, and
// takes cl back off it, so that the next pick finds the connections as they
// were.
func pickedOnce(t *testing.T, p *Pool, cl *call) *conn {
	t.Helper()
	c := p.pickIdle(cl)
	if c == nil {
		t.Fatal("No connection picked, with one idle")
	}
	<-c.writeq
	c.mu.Lock()
	c.removeLocked(cl)
	c.mu.Unlock()
	return c
}

// An order check keeps its connection busy an answer time longer than
// forward would (it is served after the query it went behind), and a query
// that then finds no connection idle would, under forward, have taken the
// check's own connection: it waits for the next to free rather than dial
// (checkOwesWaiter). Here every connection is busy at 12.5 ms, the check's
// until 21 ms, forward's check connection free since 11 ms; the late query
// takes the check's connection at 21 ms, and no connection is dialled. With
// every waiter dialling (dialForWaiter without checkOwesWaiter), it took
// the same connection and one handshake was made for nothing: steady
// property seeds 75 and 94 were one or two connections over forward's so.
func TestOrderCheckSparesAWaiterItsDial(t *testing.T) {
	const service, handshake = 10 * time.Millisecond, 40 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true) // none but the one below
		learnInOrder(t, p, service)
		offer(p, 4, 0, names("warm")) // 4 connections, one each
		// The warm queries' dials (40 ms) end after their answers (10
		// ms): learnt as the waited answers come, in order may leave
		// fewer than 3 connections open until then.
		waitFor(t, "no dial under way", func() bool { return p.dialing.Load() == 0 })
		time.Sleep(2 * service) // every connection idle
		n, before := p.Stats().Conns, s.Handshakes()
		if n < 3 {
			t.Fatalf("%d connections after learning in order, want 3 or more", n)
		}
		// Queries that pick at the same instant may take one idle
		// connection together (only a waiter's register fails on a
		// taken one, see pickIdle); a microsecond apart each sees the
		// one before it on its connection. Sent together, one in 7 runs
		// under -race on a loaded machine queued one behind another.
		const apart = time.Microsecond
		first := offerFor(p, n-1, apart, names("first")) // answered at 10 ms
		time.Sleep(time.Millisecond)
		p.orderCheckDue.Store(true)
		p.noOrderChecks.Store(false)
		check := offerFor(p, 1, 0, names("check")) // behind the last first: served from 10 to 20 ms
		synctest.Wait()
		p.noOrderChecks.Store(true)
		filler := offerFor(p, 1, 0, names("filler")) // the last idle connection, to 11 ms
		time.Sleep(10*time.Millisecond + 500*time.Microsecond)
		second := offerFor(p, n-1, apart, names("second")) // 11.5 ms: every connection but the check's
		time.Sleep(time.Millisecond)
		late := offer(p, 1, 0, names("late")) // 12.5 ms: none idle
		checkOutcomes(t, first(), func(string) time.Duration { return service })
		checkOutcomes(t, filler(), func(string) time.Duration { return service })
		checkOutcomes(t, second(), func(string) time.Duration { return service })
		c := check()
		if c[0].took < 2*service-time.Millisecond {
			t.Fatalf("The check took %v, want about %v: it went behind no query", c[0].took, 2*service-time.Millisecond)
		}
		checkOutcomes(t, c, func(string) time.Duration { return 2 * service })
		// It waited for the check's connection, 8.5 ms, then its answer.
		checkOutcomes(t, late, func(string) time.Duration { return 2 * service })
		waitFor(t, "no dial under way", func() bool { return p.dialing.Load() == 0 })
		if h := s.Handshakes() - before; h != 0 {
			t.Errorf("%d connections dialled for a query that found all %d busy, one for an order check: want none", h, n)
		}
	})
}

// TestOrderCheckHeldInAStormOnlyAWhile: an answer stormFactor usual times
// slow holds due order checks (property seed 184: a check put behind a storm's
// slow answer, rescued, was served twice, one connection over forward's at
// the peak), for no longer than orderCheckHoldMax however long the storm
// lasts, and not once the slow answers stop.
func TestOrderCheckHeldInAStormOnlyAWhile(t *testing.T) {
	const usual = 4 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return usual }}
	bubble(t, opts, 0, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.learned.mode.usual.Store(int64(usual))
		if p.orderCheckHeld() {
			t.Fatal("check held with no slow answer")
		}
		storm := func() { p.noteStormy(int64(10*usual), nanotime(), int64(usual)) }
		storm()
		if !p.orderCheckHeld() {
			t.Fatal("check not held right after an answer 10 usual times slow")
		}
		for held := time.Duration(0); held < orderCheckHoldMax-usual; held += usual {
			time.Sleep(usual)
			storm()
			if !p.orderCheckHeld() {
				t.Fatalf("check no longer held %v into a storm, want %v", held+usual, orderCheckHoldMax)
			}
		}
		time.Sleep(2 * usual)
		storm()
		if p.orderCheckHeld() {
			t.Fatalf("check still held %v into a storm, past orderCheckHoldMax", orderCheckHoldMax+usual)
		}
		time.Sleep(2 * usual) // no slow answer since
		if p.orderCheckHeld() || p.checkHeldAt.Load() != 0 {
			t.Fatal("check held, or its hold not ended, two usual times after the last slow answer")
		}
		storm()
		if !p.orderCheckHeld() {
			t.Fatal("a new storm's check not held")
		}
	})
}

// An upstream served side by side that looked in order just long enough to
// be learned so (here it was in order, and switches as the load starts) has
// the belief re-tested soon: order checks go out at the young rate
// (orderCheckRate), higher still once one is answered side by side
// (checkContradicted), and the nine or so side-by-side answers that
// outweigh the slow gaps that taught it (minSideEvidence, sideShare) come
// within about a second at 333 QPS: 0.44-1.04 s in 30 runs (without
// checkContradicted, over 2 s in 5 runs of 20). At one in orderCheckEvery
// they take 2,300 queries: in 20 runs without the young rate, corrected at
// 2.9-3.7 s in 5 and not within 4 s in 15.
func TestYoungInOrderBeliefRetestedSoon(t *testing.T) {
	const service, gap = 30 * time.Millisecond, 3 * time.Millisecond
	const youngCorrected, within = 2 * time.Second, 4 * time.Second
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		learnInOrder(t, p, service)
		s.SetInOrder(false)
		out := offerFor(p, int(within/gap), gap, names("b"))
		corrected := inOrderLeft(p, within)
		checkOutcomes(t, out(), func(string) time.Duration { return 2 * service })
		if corrected < 0 || corrected > youngCorrected {
			t.Errorf("A young in-order belief corrected after %v (-1: never in %v), want within %v", corrected, within, youngCorrected)
		}
	})
}

// On an upstream truly in order, the young rate of order checks ends as
// their answers confirm it (each comes a service time after the query it
// went behind): youngCheckLevel checks in the first few hundred queries, then
// one in orderCheckEvery again, well before youngBeliefSpan would end it.
// Here two checks, one in 64 then one in 128 queries: both within 1,000
// queries but about 1 run in 1,000. With checkConfirmed removed, the young
// rate holds to the end (20 of 20 runs).
func TestConfirmedInOrderBeliefChecksSeldom(t *testing.T) {
	const service, gap, n = 30 * time.Millisecond, time.Millisecond, 1000
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		learnInOrder(t, p, service)
		checkOutcomes(t, offer(p, n, gap, names("q")), func(string) time.Duration { return 2 * service })
		if left := time.Duration(p.youngUntil.Load() - nanotime()); left <= 0 {
			t.Fatalf("youngBeliefSpan ended %v ago, want the young rate ended by confirmations alone", -left)
		}
		if m := p.Stats().Mode; m != ModeInOrder {
			t.Fatalf("Mode %v after %d queries, want %v", m, n, ModeInOrder)
		}
		if r := p.orderCheckRate(); r != orderCheckEvery {
			t.Errorf("In order, %d queries after it was learned: an order check in %d, want one in %d (young level %d)", n, r, orderCheckEvery, p.youngLevel.Load())
		}
	})
}

// The young rate of order checks holds while its span lasts and in order is
// believed; once either ends, the first query to see it clears youngLevel,
// so that the queries after it read no clock (orderCheckRate).
func TestYoungRateClearedOnceOver(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  Mode
		until time.Duration // youngUntil from now
		want  uint32
		level int32 // youngLevel after
	}{
		{"young", ModeInOrder, time.Second, orderCheckEvery >> youngCheckLevel, youngCheckLevel},
		{"span over", ModeInOrder, -time.Millisecond, orderCheckEvery, 0},
		{"in order lapsed", ModeUnknown, time.Second, orderCheckEvery, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Pool{}
			p.learned.mode.mode.Store(int32(tc.mode))
			p.youngLevel.Store(youngCheckLevel)
			p.youngUntil.Store(nanotime() + int64(tc.until))
			if r := p.orderCheckRate(); r != tc.want {
				t.Errorf("orderCheckRate() = %d, want %d", r, tc.want)
			}
			if l := p.youngLevel.Load(); l != tc.level {
				t.Errorf("youngLevel = %d after, want %d", l, tc.level)
			}
		})
	}
}
