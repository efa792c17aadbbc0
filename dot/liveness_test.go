package dot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// Liveness of queries that wait for a connection (issue 21's rework: in
// order, or unknown with a slow upstream, a query that finds no idle
// connection waits for one dialled for it or the first to become idle). No
// query may wait out its deadline while a connection is idle or a dial could
// start.

// An in-order upstream offered bursts of 50 queries at once, 100 ms apart:
// every query is answered, and once the mode is learned none waits more than
// two answer times (a burst of 50 on an in-order upstream needs 50
// connections; forward dials them all at once).
func TestLivenessInOrderBursts(t *testing.T) {
	const service = 5 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		burst := func(i int) time.Duration {
			if i%50 == 49 {
				return 100 * time.Millisecond
			}
			return 0
		}
		out := offerPaced(p, 1000, burst, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		checkOutcomes(t, out[:500], func(string) time.Duration { return time.Second })
		// Once learned, a query of a burst waits for one answer at most (it
		// takes the first connection to become idle if that comes before
		// the one dialled for it).
		checkOutcomes(t, out[500:], func(string) time.Duration { return 2 * service })
		t.Logf("Mode %v, %d handshakes, %d rescues", p.Stats().Mode, s.Handshakes(), rec.get(func(r *recorder) int { return r.rescues }))
	})
}

// An upstream that answers nothing for its first 300 ms (a resolver
// starting), then every query at once: no query waits past the silence and a
// few milliseconds. Before its first answer the pool cannot tell it from a slow
// upstream, and gives each waiting query a connection of its own, as forward
// does: no more handshakes than queries. Once it has answered fast, the pool
// pipelines: after the idle timeout the surplus is gone, and the load runs on a
// few connections.
func TestLivenessSilentStartThenFast(t *testing.T) {
	var start atomic.Int64
	const silence = 300 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration {
		return max(time.Duration(start.Load()+int64(silence)-time.Now().UnixNano()), 0)
	}}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		start.Store(time.Now().UnixNano())
		const n, gap = 3000, 500 * time.Microsecond
		out := offer(p, n, gap, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		checkOutcomes(t, out, func(string) time.Duration { return silence + 20*time.Millisecond })
		if h, waited := s.Handshakes(), int64(silence/gap)+1; h > waited {
			t.Errorf("%d handshakes, want at most %d: one per query that came during the silence", h, waited)
		}
		time.Sleep(DefaultIdleTimeout + time.Second) // the surplus idles out (virtual time)
		sm := sample(p)
		out = offer(p, n, gap, func(i int) string { return fmt.Sprintf("r%d.example.", i) })
		sm.end()
		checkOutcomes(t, out, func(string) time.Duration { return 20 * time.Millisecond })
		if c := sm.conns.Load(); c > AutoMaxConnsOutOfOrder {
			t.Errorf("At most %d connections open once the surplus idled out, want at most %d: the upstream is fast once it answers", c, AutoMaxConnsOutOfOrder)
		}
		t.Logf("Mode %v, %d handshakes, usual %v", p.Stats().Mode, s.Handshakes(), time.Duration(p.learned.mode.usual.Load()))
	})
}

// MaxConns set by the operator: an in-order upstream gets at most that many
// connections, and queries that find none idle go behind busy ones (they do
// not wait for dials the cap forbids).
func TestLivenessInOrderMaxConns(t *testing.T) {
	const service = 5 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, time.Millisecond, func(c *Config) { c.MaxConns = 8 }, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		sm := sample(p)
		out := offer(p, 2000, 250*time.Microsecond, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		sm.end()
		checkOutcomes(t, out, func(string) time.Duration { return time.Second })
		if c := sm.taking.Load(); c > 8 {
			t.Errorf("At most %d connections taking queries, want 8 at most (MaxConns)", c)
		}
	})
}

// Dials that fail for a while (the upstream refuses new connections for
// 200 ms, its established ones keep answering) while in-order queries wait
// for a connection of their own: the waiting queries go to the open
// connections as they become idle, and every query is answered.
func TestLivenessDialsFailWhileWaiting(t *testing.T) {
	const service = 5 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	var refuse atomic.Bool
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		dial := p.cfg.Dial
		p.cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if refuse.Load() {
				return nil, errors.New("connection refused")
			}
			return dial(ctx, network, addr)
		}
		name := func(i int) string { return fmt.Sprintf("q%d.example.", i) }
		warm := offer(p, 400, 500*time.Microsecond, name)
		checkOutcomes(t, warm, func(string) time.Duration { return time.Second })
		if m := p.Stats().Mode; m != ModeInOrder {
			t.Fatalf("Mode after the warm-up %v, want %v", m, ModeInOrder)
		}
		refuse.Store(true)
		go func() { time.Sleep(200 * time.Millisecond); refuse.Store(false) }()
		// Twice the load the warm-up needed: queries wait for dials that fail.
		out := offer(p, 1000, 250*time.Microsecond, func(i int) string { return fmt.Sprintf("r%d.example.", i) })
		checkOutcomes(t, out, func(string) time.Duration { return time.Second })
		t.Logf("%d dial errors, %d handshakes", rec.get(func(r *recorder) int { return r.dialErrs }), s.Handshakes())
	})
}

// An in-order upstream and MaxAge: connections near their end take queries
// (their successors are being dialled). A query that finds only those idle
// must take one, not wait for a handshake.
func TestLivenessInOrderNearEndIdleIsTaken(t *testing.T) {
	const service = 5 * time.Millisecond
	const handshake = 20 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, func(c *Config) { c.MaxAge = 2 * time.Second }, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		name := func(i int) string { return fmt.Sprintf("w%d.example.", i) }
		warm := offer(p, 1000, time.Millisecond, name)
		checkOutcomes(t, warm, func(string) time.Duration { return time.Second })
		if m := p.Stats().Mode; m != ModeInOrder {
			t.Fatalf("Mode after the warm-up %v, want %v", m, ModeInOrder)
		}
		// Light load (one query every 10 ms, one in flight at a time) across
		// the connections' MaxAge: an idle connection is always there.
		out := offer(p, 300, 10*time.Millisecond, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		checkOutcomes(t, out, func(string) time.Duration { return service + time.Millisecond })
	})
}
