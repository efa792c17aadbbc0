package dot

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// The replay of forward's connections (shadow.go) follows forward's rule: a
// query that finds a connection idle takes it, one that finds none dials its
// own and holds it for the dial and its answer; queries are replayed in the
// order they came, so one still outstanding holds back those after it; a
// connection unused for expire closes.
func TestForwardShadowReplaysForwardsDials(t *testing.T) {
	const ms = int64(time.Millisecond)
	const dial, expire = 40 * time.Millisecond, 10 * time.Second
	var s forwardShadow
	base := int64(time.Hour) // any clock
	at := func(d int64) int64 { return base + d*ms }

	// Three at once: three dials. The second's answer is noted first: it
	// waits for the first's, which came before it.
	q0, q1, q2 := s.begin(at(0), int64(dial)), s.begin(at(0), int64(dial)), s.begin(at(0), int64(dial))
	s.end(q1, 10*ms)
	if n := s.replay(at(60), dial, expire); n != 0 {
		t.Fatalf("%d connections replayed with the first query outstanding, want 0", n)
	}
	s.end(q0, 10*ms)
	s.end(q2, 10*ms)
	if n := s.replay(at(60), dial, expire); n != 3 {
		t.Fatalf("%d connections for three queries at once, want 3", n)
	}
	// Free at 50 ms (dial and answer): two that come then take two of them.
	for range 2 {
		s.end(s.begin(at(55), int64(dial)), 10*ms)
	}
	// Four at 56 ms, while those two are busy: one idle, three dials.
	for range 4 {
		s.end(s.begin(at(56), int64(dial)), 10*ms)
	}
	if n := s.replay(at(200), dial, expire); n != 6 {
		t.Errorf("%d connections after 2 queries with 3 idle and 4 with 1, want 6", n)
	}
	if c := s.count.Load(); c != 6 {
		t.Errorf("count %d, want 6", c)
	}
	// Eleven seconds later all six were unused for expire: the query then
	// finds none, dials one, and forward has that one open.
	s.end(s.begin(at(11_000), int64(dial)), 10*ms)
	if n := s.replay(at(11_100), dial, expire); n != 1 {
		t.Errorf("%d connections after 11 s unused, want 1", n)
	}
}

// A query outstanding so long that its slot is half the ring behind is
// replayed as if answered now, so that the queries after it are; one whose
// slot a later query took is left out, and the replay goes on past it.
func TestForwardShadowGoesOnPastLongQueries(t *testing.T) {
	const dial, expire = 40 * time.Millisecond, 10 * time.Second
	var s forwardShadow
	now := int64(time.Hour)
	s.begin(now, int64(dial)) // never ends
	for range shadowSlots / 2 {
		s.end(s.begin(now, int64(dial)), int64(time.Millisecond))
	}
	if n := s.replay(now+int64(time.Second), dial, expire); n == 0 || s.head != shadowSlots/2+1 {
		t.Errorf("replayed to ticket %d (%d connections), want %d", s.head, n, shadowSlots/2+1)
	}
	// A full ring more: each slot is taken by a later query before it is
	// replayed, and the replay skips to those.
	for range shadowSlots + 3 {
		s.end(s.begin(now, int64(dial)), int64(time.Millisecond))
	}
	s.replay(now+int64(time.Second), dial, expire)
	if want := s.tickets.Load(); s.head != want {
		t.Errorf("replayed to ticket %d, want %d", s.head, want)
	}
}

// Ten queries at once on a fresh pool in front of an in-order upstream:
// forward dials ten connections for them and keeps them for 10 s. The pool
// queues them on its first connection and, once in order is learned,
// rescues the queue onto a few; under the light load that follows it would
// keep only those (keepInOrder). It holds, and dials idle up to, what
// forward holds less its margin (keepForwards): nine, never more than ten,
// through 3 s, past inOrderIdle and the sweeps that close idle ones.
func TestInOrderPoolHoldsForwardsConnections(t *testing.T) {
	const service, handshake = 10 * time.Millisecond, 40 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		learnInOrder(t, p, service)
		// Then one query every 50 ms, which one connection serves (no
		// load, no spare: see keepForwards).
		light := offerFor(p, 60, 50*time.Millisecond, names("light"))
		want := 10 - 1 - 10/shadowMarginDiv
		waitFor(t, "forward's connections, less the margin", func() bool { return p.Stats().Conns >= want })
		checkOutcomes(t, light(), func(string) time.Duration { return handshake + service })
		synctest.Wait()
		if n, h := p.Stats().Conns, s.Handshakes(); n < want || h > 10 {
			t.Errorf("%d connections open, %d dialled; want %d to 10 open and 10 dialled at most, as forward", n, h, want)
		}
	})
}
