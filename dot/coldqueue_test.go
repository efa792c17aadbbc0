package dot

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// A fast in-order upstream (4 ms a query, handshakes of 2 ms) is timed by one
// query, then met by a burst: 60 queries 850 µs apart. Its usual answer time
// is under unknownSlow, so until the pool learns in order it pipelines them
// on its one connection, where each waits a service time for every one
// before it, and the queue grows by four queries each service time; once in
// order is learned the queue is rescued onto connections of their own. From
// the third answer of the queue on, each answer waited behind the one before
// and came one service time after it (waited evidence): the pool learns in
// order from minWaitedEvidence of them (four), not from the eight slow gaps
// that were needed before, and half the burst is answered within six
// service times. (Issue 21, property seed 78: in order learned 56 ms into a
// burst of 3-4 ms answers, p99 60 ms against forward's 34; with eight waited
// answers needed this test's median was 26-28 ms, with four 18-20.)
func TestColdQueueInOrderLearnedSoon(t *testing.T) {
	const service, handshake, gap, n = 4 * time.Millisecond, 2 * time.Millisecond, 850 * time.Microsecond, 60
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	var learned learnedAt
	mod := func(cfg *Config) { learned.recorder = cfg.Observer.(*recorder); cfg.Observer = &learned }
	bubble(t, opts, handshake, mod, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		never := func(string) time.Duration { return time.Second }
		checkOutcomes(t, offer(p, 1, 0, func(int) string { return "warm.example." }), never)
		start := time.Now()
		out := offer(p, n, gap, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		checkOutcomes(t, out, never)
		took := make([]time.Duration, 0, len(out))
		for _, o := range out {
			took = append(took, o.took)
		}
		slices.Sort(took)
		median := took[len(took)/2]
		t.Logf("in order learned %v into the burst; median %v, slowest %v", learned.since(start), median, took[len(took)-1])
		if limit := 6 * service; median > limit {
			t.Errorf("Median answer time of the burst %v, want %v at most (in order learned %v into it)", median, limit, learned.since(start))
		}
	})
}

// learnedAt is a recorder that notes when the mode first became in order.
type learnedAt struct {
	*recorder
	mu sync.Mutex
	at time.Time
}

func (l *learnedAt) ModeLearned(m Mode, perConn int) {
	l.mu.Lock()
	if m == ModeInOrder && l.at.IsZero() {
		l.at = time.Now()
	}
	l.mu.Unlock()
	l.recorder.ModeLearned(m, perConn)
}

// since is how long after start in order was learned (negative: never).
func (l *learnedAt) since(start time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at.IsZero() {
		return -1
	}
	return l.at.Sub(start)
}

// A fast in-order upstream (9 ms a query) that shakes hands slowly (40 ms),
// timed by one query and then met by 16 at once: the pool pipelines them on
// its one connection before it learns in order (about four answers in), then
// rescues the rest of that queue. A rescue dial takes longer than four
// answers there, which the queue's connection serves meanwhile: the rescues
// go one dial at a time (dialForRescue), taking each connection as it is
// done, rather than one dial each at once, all done when the queue is
// nearly served (issue 21, property seed 79: 42 ms handshakes, 9 ms
// answers, three rescue dials at once, 10 connections against forward's
// 9). The answers come no later than the queue's own in-order service and a
// dial. Here 2-3 connections (12 and 4 of 16 runs); with a dial for each
// rescue at once, 5 (3 runs of 3).
func TestInOrderSlowHandshakeRescuesDialOneAtATime(t *testing.T) {
	const service, handshake, n = 9 * time.Millisecond, 40 * time.Millisecond, 16
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		never := func(string) time.Duration { return time.Second }
		checkOutcomes(t, offer(p, 1, 0, func(int) string { return "warm.example." }), never)
		sm := sample(p)
		out := offer(p, n, 0, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		sm.end()
		checkOutcomes(t, out, func(string) time.Duration { return n*service + handshake })
		t.Logf("mode %v; peak %d connections, %d dials; rescues %d", p.Stats().Mode, sm.conns.Load(), s.Handshakes(),
			rec.get(func(r *recorder) int { return r.rescues }))
		if m := p.Stats().Mode; m != ModeInOrder {
			t.Errorf("Mode = %v, want %v", m, ModeInOrder)
		}
		if c := sm.conns.Load(); c > 3 {
			t.Errorf("Up to %d connections open, want 3 at most: the warm one and the rescues' dialled one after the other", c)
		}
	})
}
