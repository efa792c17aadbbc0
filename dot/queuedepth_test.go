package dot

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// While the mode is unknown, an upstream that answers a connection's queries
// in order, each in 1 ms, behind a 5 ms handshake: a burst of 30 queries is
// not written one behind the other on the pool's connection (the last would
// wait 30 ms, as property seed 115's did behind one connection) but, past the
// five a dial's time serves there, each waits for a connection of its own,
// as forward's would (queueDepth), and no more are dialled than queries wait.
// The warm-up times a query alone and the spacing of a busy connection's
// answers (pairs written together): each 1 ms, so the queue is the
// connection's own, which a dial spares.
func TestUnknownModeDialsRatherThanQueueDeep(t *testing.T) {
	const service, handshake, n = time.Millisecond, 5 * time.Millisecond, 30
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		warmInPairs(t, p)
		for i := range 4 { // the upstream serving now: queues move (see servedLately)
			if _, err := exchange(p, fmt.Sprintf("warm%d.example.", i)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(service)
		}
		if m := p.Stats().Mode; m != ModeUnknown {
			t.Fatalf("Mode after the warm-up %v, want %v", m, ModeUnknown)
		}
		if d := p.queueDepth(); d != int32(handshake/service) {
			t.Fatalf("queueDepth after the warm-up %d, want %d (usual answer %v, spacing %v, dial %v)", d, handshake/service, time.Duration(p.learned.mode.usual.Load()), time.Duration(p.learned.mode.spacing.Load()), time.Duration(p.dialTime.Load()))
		}
		took := make([]time.Duration, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				start := time.Now()
				if _, err := exchange(p, fmt.Sprintf("q%d.example.", i)); err != nil {
					t.Error(err)
				}
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		// A dial and its answer, or five answers in turn, and a margin:
		// not the 30 answers in turn of one connection.
		if worst, want := slices.Max(took), handshake+5*service+4*service; worst > want {
			t.Errorf("Slowest of %d queries that came together took %v, want at most %v", n, worst, want)
		}
		if h := s.Handshakes(); h > n {
			t.Errorf("%d handshakes for %d queries, want at most one each", h, n)
		}
		t.Logf("%d handshakes", s.Handshakes())
	})
}

// queueDepth divides the dial time by the spacing of a busy connection's
// answers, never by more than the usual answer time, and puts no bound where
// a query alone on its connection waits many spacings (queueShared): that
// wait is in a queue all connections share, which a dial does not spare.
func TestQueueDepthBySpacing(t *testing.T) {
	bubble(t, dottest.Options{}, 0, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		const ms = int64(time.Millisecond)
		for _, tc := range []struct {
			usual, spacing, dial int64
			want                 int32
		}{
			{ms, ms, 5 * ms, 5},                                 // in order, each connection served alone: seed 115
			{ms, ms / 2, 5 * ms, 10},                            // answers closer than the answer time
			{ms / 2, ms, 5 * ms, 10},                            // spaced as sent: no more than the answer time
			{4 * ms, 100 * int64(time.Microsecond), 10 * ms, 0}, // a shared queue (a busy machine's CPU)
			{4 * ms, int64(time.Microsecond), 10 * ms, 0},       // unbound saturated: answers batched
			{ms, 0, 5 * ms, 0},                                  // no busy answer yet
			{ms, ms, ms, minQueueDepth},                         // fewer than minQueueDepth: a queue costs a dial (dearQueue)
			{5 * ms, 0, ms, minQueueDepth},                      // no busy answer yet, a dial shorter than an answer (dearQueue)
			{5 * ms, 0, 11 * ms, 0},                             // no busy answer yet, a dial longer than two answers
		} {
			p.learned.mode.usual.Store(tc.usual)
			p.learned.mode.spacing.Store(tc.spacing)
			p.dialTime.Store(tc.dial)
			p.servingAt.Store(nanotime())
			want := cmp.Or(tc.want, int32(p.cfg.MaxInflight))
			if got := p.queueDepth(); got != want {
				t.Errorf("queueDepth with usual answer %v, spacing %v, dial %v: %d, want %d",
					time.Duration(tc.usual), time.Duration(tc.spacing), time.Duration(tc.dial), got, want)
			}
		}
	})
}

// Before the pool's first answer, each query that finds its one connection
// busy waits for a dial of its own, as forward's would. The first answer
// (a fast upstream: 5 ms, behind handshakes of 30 ms) wakes them all at
// once, before any busy connection's answers are timed (queueDepth sets no
// bound yet): they still wait for their dials, or take a connection that is
// idle, rather than go one behind the other on the connection that
// answered, where an in-order upstream serves them one at a time (issue
// 21, property seed 29: 85 queries went on one connection at its first
// answer, and waited up to 130 ms against forward's 67).
func TestFirstAnswerLeavesWaitersTheirDials(t *testing.T) {
	const service, handshake, n = 5 * time.Millisecond, 30 * time.Millisecond, 20
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		first := offerFor(p, 1, 0, func(int) string { return "first.example." })
		time.Sleep(handshake + time.Millisecond) // its connection is open, its answer not yet in
		out := offer(p, n, 200*time.Microsecond, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		checkOutcomes(t, first(), func(string) time.Duration { return handshake + service })
		// Each waits a handshake for its dial, and its answer: as forward.
		checkOutcomes(t, out, func(string) time.Duration { return handshake + 2*service })
	})
}

// The spacing of a busy connection's answers is learned at the sweeper's
// next tick after the pool's first busy answer, not at the next full sweep
// (100 ms with the default timeouts): until then queueDepth sets no bound,
// and a query that waited for its dial keeps waiting for it
// (awaitsItsDial), while every other query is pipelined however deep.
func TestFirstBusyAnswersTimeTheSpacingAtOnce(t *testing.T) {
	const service, handshake = 5 * time.Millisecond, 2 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		if _, err := exchange(p, "first.example."); err != nil { // times the upstream: fast, pipelined
			t.Fatal(err)
		}
		start := time.Now()
		checkOutcomes(t, offer(p, 3, 0, func(i int) string { return fmt.Sprintf("q%d.example.", i) }),
			func(string) time.Duration { return 4 * service })
		time.Sleep(3 * service) // a tick or two: the sweeper ticks at a quarter of the rescue delay while busy
		if sp, since := p.learned.mode.spacing.Load(), time.Since(start); sp == 0 || since >= p.sweepInterval() {
			t.Errorf("Spacing %v, %v after three queries written together, want it timed by then (before the full sweep at %v)", time.Duration(sp), since, p.sweepInterval())
		}
	})
}

// While the mode is unknown, a fast upstream that answers a connection's
// queries in order, each in 4 ms, behind 1 ms handshakes (fewer than
// minQueueDepth answers in a dial's time: queueDepth allows a queue of
// minQueueDepth on the oldest connection, see dearQueue), with one
// slow name (60 ms). A query that comes 6 ms after the slow one was written on
// the pool's one connection does not go behind it, where it would wait the
// slow answer's rest, 54 ms: that answer is overdue (overdueAfter), and the
// query waits for a dial of its own, as forward's would (property seed 142:
// 36 ms against forward's 24, behind a 19 ms name).
func TestUnknownModeQueryPassesOverdueAnswer(t *testing.T) {
	const service, slow, handshake = 4 * time.Millisecond, 60 * time.Millisecond, time.Millisecond
	delay := slowName(slow, service)
	bubble(t, dottest.Options{InOrder: true, Delay: delay}, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		warmInPairs(t, p)
		if _, err := exchange(p, "warm.example."); err != nil { // the upstream serving now
			t.Fatal(err)
		}
		if m, d := p.Stats().Mode, p.queueDepth(); m != ModeUnknown || d < minQueueDepth {
			t.Fatalf("After the warm-up: mode %v, queueDepth %d; want %v and a queue allowed (usual answer %v, spacing %v, dial %v)",
				m, d, ModeUnknown, time.Duration(p.learned.mode.usual.Load()), time.Duration(p.learned.mode.spacing.Load()), time.Duration(p.dialTime.Load()))
		}
		slowOne := offerFor(p, 1, 0, func(int) string { return "slow.example." })
		time.Sleep(6 * time.Millisecond)
		start := time.Now()
		if _, err := exchange(p, "next.example."); err != nil {
			t.Fatal(err)
		}
		if took, want := time.Since(start), handshake+service+2*time.Millisecond; took > want {
			t.Errorf("A query 6 ms after a slow one took %v, want at most %v (a dial and its answer, not the slow answer's rest)", took, want)
		}
		checkOutcomes(t, slowOne(), func(string) time.Duration { return slow + service })
	})
}

// While the mode is unknown, a fast upstream (unbound in make bench's
// unbound regime: 0.1 ms answers, one query at a time in order, 0.5 ms
// handshakes) at 1,000 QPS, on a busy machine whose hiccups hold the pool's
// reads and writes 1, 2 or 3 ms every 20 ms. No answer overtakes another or
// comes a slow gap after it: the mode stays unknown, and overdueAfter is in
// force. A hiccup makes no answer overdue (overdueAfter is twice
// minWatchInterval at least, the time after which the pool tells a pause):
// the one connection carries the load, and no query dials. With the answer
// time and a dial's alone (0.6 ms), the queries that came in the first
// hiccups found the connection overdue and dialled (make bench: 5-14 dials a
// run, up to 13 connections). The load opens in a 3 ms hiccup, after the
// warm-up's 100 ms idle: the connection, idle longer than the rescue delay,
// was then quiet at the first tick (quiet counted from its last answer, not
// from its first query, see quietFor), and a query of the hiccup dialled.
func TestUnknownModeHiccupsDialNone(t *testing.T) {
	const service, handshake = 100 * time.Microsecond, 500 * time.Microsecond
	const gap, n = time.Millisecond, 2000
	h := &hiccups{period: 20 * time.Millisecond, length: func(k int64) time.Duration { return time.Duration(k%3+1) * time.Millisecond }}
	mod := func(c *Config) { c.Dial = h.dial(c.Dial) }
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, mod, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		warmInPairs(t, p) // times the spacing: overdueAfter needs it
		// The third hiccup, 3 ms, from now.
		h.from.Store(time.Now().Add(-2 * h.period).UnixNano())
		dials := rec.get(func(r *recorder) int { return r.dials })
		sm := sample(p)
		var inForce atomic.Bool // overdueAfter set a time
		stop := make(chan struct{})
		var watch sync.WaitGroup
		watch.Go(func() {
			for {
				if after, _ := p.overdueAfter(); after != 0 {
					inForce.Store(true)
				}
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Microsecond):
				}
			}
		})
		out := offer(p, n, gap, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		close(stop)
		watch.Wait()
		sm.end()
		if m := p.Stats().Mode; m != ModeUnknown || !inForce.Load() {
			t.Fatalf("Mode %v, overdueAfter in force: %v; want unknown and in force (usual answer %v, spacing %v, dial %v)", m, inForce.Load(),
				time.Duration(p.learned.mode.usual.Load()), time.Duration(p.learned.mode.spacing.Load()), time.Duration(p.dialTime.Load()))
		}
		if d, c := rec.get(func(r *recorder) int { return r.dials })-dials, sm.conns.Load(); d != 0 || c != 1 {
			t.Errorf("%d dials and %d connections at most under the load, want 0 and 1", d, c)
		}
		checkOutcomes(t, out, func(string) time.Duration { return 4 * time.Millisecond })
	})
}

// warmInPairs times the answer, the dial and the spacing: three pairs of
// queries written together, each followed by a full sweep that learns them.
func warmInPairs(t *testing.T, p *Pool) {
	t.Helper()
	for i := range 3 {
		var wg sync.WaitGroup
		for j := range 2 {
			wg.Go(func() {
				if _, err := exchange(p, fmt.Sprintf("warm%d-%d.example.", i, j)); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		time.Sleep(100 * time.Millisecond)
	}
}

// While the mode is unknown, a fast upstream (unbound in make bench's
// unbound regime: 0.1 ms answers, 1 ms handshakes; its one thread serves
// queries one at a time, as an in-order one does, and no answer overtakes
// another, so that the mode stays unknown) under a steady load of 2,000 QPS
// on one connection, and then the whole pool held up (its process not run on
// a loaded machine: a GC, a descheduled thread): a sweeper tick due in the
// hold-up runs only at its end; a query written as it starts has its answer
// read only after it; and the queries that came meanwhile all come at its
// end. The upstream, as the pool can tell, read nothing for the hold-up: a
// pause (see servingAt), not an overdue answer (overdueAfter), and none of
// those queries dials. When the late tick stamped servingAt with its own
// time, the upstream looked served just now, the query in service overdue,
// and each query of the backlog dialled one of its own (make bench: bursts of
// 7-40 dials within a millisecond on a loaded machine); stamped with the
// time it was due, so did a tick due 2 ms into a 6.5 ms hold-up (make
// bench: 5-9 dials after ticks 4 ms late).
func TestUnknownModeHeldUpPoolDialsNone(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lead, hold time.Duration // the hold-up starts lead after a tick, and lasts hold
	}{
		{"tick due as the hold-up starts", 0, 8 * time.Millisecond},
		{"tick due inside the hold-up", 500 * time.Microsecond, 6500 * time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) { heldUpPool(t, tc.lead, tc.hold) })
	}
}

// heldUpPool is TestUnknownModeHeldUpPoolDialsNone with a hold-up that starts
// lead after a sweeper tick (0: the tick is held from when it is due) and
// lasts hold: the next tick runs at its end.
func heldUpPool(t *testing.T, lead, hold time.Duration) {
	const service, handshake, gap = 100 * time.Microsecond, time.Millisecond, 500 * time.Microsecond
	// The reads return after the backlog is picked, the sweeper's tick runs
	// before: the order that dialled (goroutines woken together run in any).
	h := &hiccups{period: time.Hour, length: func(int64) time.Duration { return hold + 40*time.Microsecond }}
	mod := func(c *Config) { c.Dial = h.dial(c.Dial) }
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, mod, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		warmInPairs(t, p) // times the spacing: overdueAfter needs it

		var heldAt atomic.Int64 // unix ns the hold-up started
		var dials atomic.Int64  // the dials before the hold-up
		heldOut := make(chan []regimeOutcome, 1)
		start := func() {
			now := time.Now().UnixNano()
			dials.Store(int64(rec.get(func(r *recorder) int { return r.dials })))
			heldAt.Store(now)
			h.from.Store(now)
			go func() { heldOut <- offer(p, 1, 0, func(int) string { return "held.example." }) }()
		}
		var last int64 // the previous tick (the sweeper's goroutine only, as armed)
		armed := false // the hold-up is to start lead after a tick (the sweeper's goroutine only)
		hook := func() {
			now := time.Now().UnixNano()
			prev := last
			last = now
			switch {
			case heldAt.Load() != 0 && now < heldAt.Load()+int64(hold):
				time.Sleep(time.Duration(heldAt.Load() + int64(hold) - now)) // the hold-up, in virtual time: not a test waiting for a condition
			case armed || heldAt.Load() != 0 || prev == 0 || now-prev < int64(time.Millisecond):
				// The hold-up follows a tick a millisecond after another
				// at least: the reads grew since.
			case lead == 0:
				start()
				time.Sleep(hold)
			default:
				armed = true
				go func() {
					time.Sleep(lead)
					start()
				}()
			}
		}
		heldUpLoad(t, p, rec, heldUp{hook: &hook, heldAt: &heldAt, hold: hold, gap: gap, backlog: int(hold / gap), dials: &dials, heldOut: heldOut})
	})
}

// TestUnknownModeHeldUpReadsOneFirstDialsNone is TestUnknownModeHeldUpPoolDialsNone
// with more than one connection, whose readers run in some order after the
// hold-up: a burst earlier in the load opens two more connections; one
// written just before the hold-up fills the oldest (a dial's time of
// queries, queueBound) and puts one on the second. After the hold-up the
// oldest's reader runs, then the late tick, then the backlog, and the
// others' readers only after those. The oldest's reads made the upstream
// look served just now, the second's query, in service since before the
// hold-up, overdue (overdueAfter), and of the backlog, more than the oldest
// and the idle third take, those the second would have taken dialled.
func TestUnknownModeHeldUpReadsOneFirstDialsNone(t *testing.T) {
	const service, handshake, gap, hold = 100 * time.Microsecond, time.Millisecond, 500 * time.Microsecond, 8 * time.Millisecond
	const backlog = 26
	var heldAt atomic.Int64            // unix ns the hold-up started; 0: not yet
	var early atomic.Pointer[heldConn] // the oldest connection's: its reads come first
	mod := func(c *Config) {
		dial := c.Dial
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &heldConn{Conn: nc, heldAt: &heldAt, hold: hold, early: &early}, nil
		}
	}
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, mod, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		warmInPairs(t, p) // times the spacing
		var dials atomic.Int64
		heldOut := make(chan []regimeOutcome, 1)
		var last int64 // the previous tick (the sweeper's goroutine only)
		hook := func() {
			now := time.Now().UnixNano()
			prev := last
			last = now
			switch {
			case heldAt.Load() != 0 && now < heldAt.Load()+int64(hold):
				time.Sleep(time.Duration(heldAt.Load() + int64(hold) + int64(10*time.Microsecond) - now)) // the hold-up, in virtual time
			case heldAt.Load() != 0 || prev == 0 || now-prev < int64(time.Millisecond):
			default:
				go func() {
					heldOut <- offer(p, 11, 0, func(i int) string { return fmt.Sprintf("held%d.example.", i) })
				}()
				time.Sleep(50 * time.Microsecond) // written, not yet answered
				dials.Store(int64(rec.get(func(r *recorder) int { return r.dials })))
				if conns := *p.conns.Load(); len(conns) < 3 || conns[1].load.Load() == 0 {
					t.Errorf("%d connections, the second's load not 1 or more: want 3, the second in service", len(conns))
				} else {
					early.Store(conns[0].bc.Conn.(*heldConn))
				}
				heldAt.Store(time.Now().UnixNano())
				time.Sleep(hold + 10*time.Microsecond)
			}
		}
		heldUpLoad(t, p, rec, heldUp{hook: &hook, heldAt: &heldAt, hold: hold, gap: gap, backlog: backlog, burst: 11, dials: &dials, heldOut: heldOut})
	})
}

// heldUp is what heldUpLoad runs: the sweeper's hook (armed at the 60th query
// of the steady load), which starts the hold-up (heldAt) and stores the dials
// before it; the queries of the hold-up's backlog; a burst at the 30th query
// (0: none); and where the hook's own queries report.
type heldUp struct {
	hook    *func()
	heldAt  *atomic.Int64
	hold    time.Duration
	gap     time.Duration // between the steady load's queries
	backlog int
	burst   int
	dials   *atomic.Int64
	heldOut chan []regimeOutcome
}

// heldUpLoad sends a steady load every h.gap until the hold-up starts, then,
// as it ends, its backlog, and checks that every query was answered in time,
// that the mode stayed unknown with overdueAfter in force, and that the
// backlog dialled none.
func heldUpLoad(t *testing.T, p *Pool, rec *recorder, h heldUp) {
	t.Helper()
	var load sync.WaitGroup
	outs := make([]regimeOutcome, 0, 200)
	var mu sync.Mutex
	send := func(name string) {
		load.Go(func() {
			start := time.Now()
			_, err := exchange(p, name)
			mu.Lock()
			outs = append(outs, regimeOutcome{name, time.Since(start), err})
			mu.Unlock()
		})
	}
	inForce := false // overdueAfter set a time under the steady load
	for i := 0; h.heldAt.Load() == 0; i++ {
		switch i {
		case 30:
			for j := range h.burst { // opens more connections
				send(fmt.Sprintf("o%d.example.", j))
			}
		case 60:
			p.tickHold.Store(h.hook)
		}
		if after, _ := p.overdueAfter(); after != 0 {
			inForce = true
		}
		send(fmt.Sprintf("s%d.example.", i))
		time.Sleep(h.gap)
	}
	time.Sleep(time.Until(time.Unix(0, h.heldAt.Load()+int64(h.hold+20*time.Microsecond))))
	for i := range h.backlog { // the queries that came in the hold-up
		send(fmt.Sprintf("b%d.example.", i))
	}
	load.Wait()
	late := func(string) time.Duration { return h.hold + time.Millisecond }
	checkOutcomes(t, <-h.heldOut, late)
	checkOutcomes(t, outs, late)
	if m := p.Stats().Mode; m != ModeUnknown || !inForce {
		t.Fatalf("Mode %v, overdueAfter in force under the load: %v; want unknown and in force (usual answer %v, spacing %v, dial %v)", m, inForce,
			time.Duration(p.learned.mode.usual.Load()), time.Duration(p.learned.mode.spacing.Load()), time.Duration(p.dialTime.Load()))
	}
	if d := int64(rec.get(func(r *recorder) int { return r.dials })) - h.dials.Load(); d != 0 {
		t.Errorf("%d dials for the queries that came in the hold-up, want 0", d)
	}
}

// heldConn is the client's end of a connection held up from *heldAt for
// hold: a read returns at the hold-up's end on *early, 40µs later on any
// other.
type heldConn struct {
	net.Conn
	heldAt *atomic.Int64
	hold   time.Duration
	early  *atomic.Pointer[heldConn]
}

func (c *heldConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	at := c.heldAt.Load()
	if at == 0 {
		return n, err
	}
	end := at + int64(c.hold)
	if c.early.Load() != c {
		end += int64(40 * time.Microsecond)
	}
	if now := time.Now().UnixNano(); now < end {
		time.Sleep(time.Duration(end - now)) // the hold-up, in virtual time: not a test waiting for a condition
	}
	return n, err
}
