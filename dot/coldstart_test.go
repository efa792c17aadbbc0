package dot

import (
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// A fresh pool in front of a fast in-order upstream (every answer 5 ms after
// its query, one at a time per connection) offered 2,000 QPS from the start:
// before the mode is learned (at a full sweep, sweepInterval), the pool
// fills connections in turn and queries queue behind each other, a score
// deep. Once it is learned, what is queued must leave the queue: a query k
// deep waits k service times while its connection reads an answer every
// service time, so that it is never silent for the rescue delay and nothing
// is rescued. forward answers every query in a handshake and a service time.
// Every query must be answered within the first full sweep, a rescue delay,
// a few ticks and its own service time (150 ms).
func TestColdStartInOrderQueueLeaves(t *testing.T) {
	const service = 5 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		out := offer(p, 1000, 500*time.Microsecond, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		checkOutcomes(t, out, func(string) time.Duration { return 150 * time.Millisecond })
		t.Logf("Mode %v, %d handshakes, %d rescues", p.Stats().Mode, s.Handshakes(), rec.get(func(r *recorder) int { return r.rescues }))
	})
}

// Queries that come one by one while the pool's first dial is under way
// (not a burst), each dial a
// connection of their own, as forward does, rather than all wait for the
// first: an in-order upstream would serve a slow handshake's worth of
// queries gathered on it one after the other (issue 21, seeds 79, 149).
// Each takes a connection dialled for it or for an older one (waitOrder),
// and none joins the first connection: none shared its dial (joinFirst).
// Here, out of order: a handshake takes 80 ms, an answer
// 25 ms, and five queries come 15 ms apart: five handshakes, and every
// query answered within a handshake and an answer.
func TestFirstDialSharedByBurstOnly(t *testing.T) {
	const service, handshake, gap = 25 * time.Millisecond, 80 * time.Millisecond, 15 * time.Millisecond
	opts := dottest.Options{Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		out := offer(p, 5, gap, names("q"))
		checkOutcomes(t, out, func(string) time.Duration { return handshake + service })
		waitFor(t, "no dial under way", func() bool { return p.dialing.Load() == 0 })
		if h := s.Handshakes(); h != 5 {
			t.Errorf("%d handshakes for five queries that came during the first, want 5", h)
		}
	})
}

// Queries that share the pool's first dial are owed no dial of their own,
// however often they look again while it is under way: woken then (here by
// hand, as a slot freed or a dial ended would), each found no connection and
// counted every waiting query as one owed a dial, and the burst that shared
// one dial opened one each.
func TestFirstDialSharersOweNoDial(t *testing.T) {
	bubble(t, dottest.Options{}, 50*time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				if _, err := exchange(p, fmt.Sprintf("q%d.example.", i)); err != nil {
					t.Errorf("Query %d: %v", i, err)
				}
			})
		}
		synctest.Wait() // every query waits for the first dial
		for range 3 {
			p.mu.Lock()
			p.wakeLocked()
			p.mu.Unlock()
			synctest.Wait()
			if d := p.dialing.Load(); d != 1 {
				t.Fatalf("%d dials under way after a wake, want the one shared", d)
			}
		}
		wg.Wait()
		if h := s.Handshakes(); h != 1 {
			t.Errorf("%d handshakes for six queries that came together, want 1", h)
		}
	})
}

// An in-order upstream (20 ms an answer) behind a slow handshake (60 ms),
// offered a query every millisecond from the start, 40 in all: before the
// first answer, the first connection carries the query that dialled it, and
// the queries that dialled for themselves before it opened join it only in
// place of queries that shared its dial (none here); the
// others go out on the connections they dialled, as forward's would, and
// are answered a handshake and an answer after they came: an eighth of the
// queries or more (15-22 of 40, mostly 17, in 100 runs) are answered within
// a handshake and two answers, and the pool opens no more connections than
// queries.
// Gathered on the first connection, the 40 queries waited for each other in
// order until rescued: 2-3 of 40 were that fast, in 60 runs (issue 21,
// seeds 132 and 35).
func TestFirstConnectionTakesFewBeforeAnswer(t *testing.T) {
	const service, handshake, gap, n = 20 * time.Millisecond, 60 * time.Millisecond, time.Millisecond, 40
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		out := offer(p, n, gap, names("q"))
		checkOutcomes(t, out, func(string) time.Duration { return time.Second })
		fast := 0 // answered within a handshake and two answers
		for _, o := range out {
			if o.took <= handshake+2*service {
				fast++
			}
		}
		if fast < n/8 {
			t.Errorf("%d of %d queries answered within a handshake and two answers, want %d or more", fast, n, n/8)
		}
		if h := s.Handshakes(); h > n {
			t.Errorf("%d handshakes for %d queries, want at most one each", h, n)
		}
	})
}

// Queries that come 500 µs apart (no burst) while the pool's first dial is
// under way each dial their own, as forward's do, and each is answered a
// handshake and an answer after it came. They used to share the first dial
// when they came within 10 ms of its start (up to 16 of them: four dials
// under way for these twenty), and an in-order upstream served them one
// after the other on the first connection: here the last sharer waited 16
// answers more (issue 21, seeds 36, 46, 120 and 182 over forward's p99).
func TestFirstDialSharedByNoneApart(t *testing.T) {
	const service, handshake, gap, n = 20 * time.Millisecond, 60 * time.Millisecond, 500 * time.Microsecond, 20
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		done := make(chan []regimeOutcome)
		go func() { done <- offer(p, n, gap, names("q")) }()
		time.Sleep(handshake / 2) // every query came, no dial is done
		synctest.Wait()
		if d := p.dialing.Load(); d != n {
			t.Errorf("%d dials under way for %d queries that came %v apart, want %d", d, n, gap, n)
		}
		checkOutcomes(t, <-done, func(string) time.Duration { return handshake + service })
	})
}

// Before the first answer, a query that dialled for itself while the pool's
// first dial was under way, and shared it with none, waits for its own
// connection rather than go behind the first one's query: in order, that
// costs it an answer time (issue 21, seed 45: 87 ms answers, a 28 ms
// handshake; two queries that came 11 and 21 ms after the first joined it
// and were answered 277 ms after they came, against forward's 115). Here
// the same: each of three queries is answered within a handshake and an
// answer of coming. With every such query joining the first connection, the
// second and third took two and three answers.
func TestFirstConnectionJoinedByNoneWithoutSharers(t *testing.T) {
	const service, handshake = 87 * time.Millisecond, 28 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		pauses := []time.Duration{11 * time.Millisecond, 10 * time.Millisecond, 0}
		out := offerPaced(p, len(pauses), func(i int) time.Duration { return pauses[i] }, names("q"))
		checkOutcomes(t, out, func(string) time.Duration { return handshake + service + time.Millisecond })
	})
}

// Before the first answer, as many queries that dialled for themselves join
// the pool's first connection as shared its dial (joinFirst): their dials,
// done later, serve the queries that come next, as the sharers' own
// connections would have served them in forward's pool (issue 21, seeds 79,
// 119, 149: with none joining, 2-5 connections more at once than forward;
// seed 45: with any number joining, in order, each waited an answer time
// more than its own dial). Here two shared it, and of four that dialled,
// two join. With the join uncapped (below firstDialShareMax), four did.
func TestFirstConnectionJoinedAsItWasShared(t *testing.T) {
	first := newBareConn(t, 64)
	p := first.pool
	conns := []*conn{first}
	p.mu.Lock()
	p.conns.Store(&conns)
	p.mu.Unlock()
	p.firstShared.Store(2)
	// One that finds a connection idle, or a rescue, does not join, and
	// takes no join from the others (pickIdle asks joinFirst before it
	// knows which way the query goes).
	idler := newTestCall(mustPrepare(t, "idle.example."))
	idler.burstStart = true
	rescue := newTestCall(mustPrepare(t, "rescue.example."))
	rescue.burstStart, rescue.avoid = true, first
	if p.joinFirst(idler, conns, 1) != nil || p.joinFirst(rescue, conns, 0) != nil {
		t.Errorf("A query with a connection idle, or a rescue, joined the first connection")
	}
	joined := 0
	for range 4 {
		cl := newTestCall(mustPrepare(t, "dialled.example."))
		cl.burstStart = true
		if c := p.joinFirst(cl, conns, 0); c != nil && c.register(cl) {
			joined++
		}
	}
	if joined != 2 {
		t.Errorf("%d of 4 queries that dialled joined the first connection, want the 2 that shared its dial", joined)
	}
}
