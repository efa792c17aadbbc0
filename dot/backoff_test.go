package dot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func TestBackoffSchedule(t *testing.T) {
	b := Backoff{}.withDefaults()
	want := []time.Duration{0, 250 * time.Millisecond, 400 * time.Millisecond, 640 * time.Millisecond, 1024 * time.Millisecond}
	for n, w := range want {
		for range 50 {
			d := b.Delay(n)
			lo, hi := time.Duration(float64(w)*0.8), time.Duration(float64(w)*1.2)
			if d < lo || d > hi {
				t.Fatalf("Delay(%d) = %v, want %v ±20%%", n, d, w)
			}
		}
	}
	for range 50 {
		if d := b.Delay(100); d > 36*time.Second || d < 24*time.Second {
			t.Fatalf("Delay(100) = %v, want the 30s cap ±20%%", d)
		}
	}
	// Jitter spreads pools that failed together.
	seen := map[time.Duration]bool{}
	for range 20 {
		seen[b.Delay(3)] = true
	}
	if len(seen) < 10 {
		t.Errorf("Delay(3) took only %d distinct values in 20 draws: no jitter", len(seen))
	}
}

// The backoff resets after an answer on a new connection, not after a handshake.
func TestBackoffResetsOnAnswer(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	addr := s.Addr
	s.Close()
	p, rec := newTestPool(t, s, func(c *Config) { c.Addr = addr; c.Backoff = Backoff{Base: time.Millisecond, Max: time.Millisecond} })
	for range 3 {
		exchange(p, "a.example.")
		waitFor(t, "the backoff to pass", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return time.Now().After(p.redial.after) })
	}
	if f := p.Stats().Strikes; f < 2 {
		t.Fatalf("Fails = %d after failed dials, want >= 2", f)
	}
	again, err := dottest.New(dottest.Options{Addr: addr, Cert: s.Cert})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := exchange(p, "b.example."); err != nil {
		t.Fatal(err)
	}
	if f := p.Stats().Strikes; f != 0 {
		t.Errorf("Fails = %d after an answer, want 0", f)
	}
	if f := rec.get(func(r *recorder) int { return r.failures }); f < 2 {
		t.Errorf("Observer saw %d failures, want the failed dials", f)
	}
}

// A server that completes the handshake and closes at once is not redialled in a
// tight loop: a handshake alone does not reset the backoff. The first failure's
// one retry comes at once (see redial.strike), then the backoff paces them.
func TestHandshakeThenCloseBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{CloseAfterHandshake: true})
		b := Backoff{Base: 100 * time.Millisecond, Jitter: 0.01}
		p, _ := newTestPool(t, s, func(c *Config) { c.Backoff = b })
		var unavailable int
		// Until five handshakes (the retry and three backoffs) are in, bounded in
		// count and time; a query that fails fast in backoff is followed by a
		// millisecond's pause, the pace at which the test probes the backoff.
		for i, start := 0, time.Now(); i < 10000 && s.Handshakes() < 5 && time.Since(start) < 10*time.Second; i++ {
			_, err := exchange(p, "x.example.")
			switch {
			case err == nil:
				t.Fatal("Query succeeded against a server that closes every connection")
			case errors.Is(err, ErrUnavailable):
				unavailable++
				time.Sleep(time.Millisecond)
			case !errors.Is(err, ErrConnLost) && !errors.Is(err, ErrTimeout):
				t.Fatalf("Error = %v, want ErrConnLost, ErrUnavailable or ErrTimeout", err)
			}
		}
		// After the retry, each dial waits out the backoff of the failures
		// before it: 100ms, 160ms, 256ms (±1%). A lower bound, so a slow
		// machine cannot break it.
		times := s.HandshakeTimes()
		if len(times) < 4 {
			t.Fatalf("%d handshakes, want at least 4", len(times))
		}
		for i := 2; i < len(times); i++ {
			least := time.Duration(float64(b.Base) * math.Pow(DefaultBackoffMultiplier, float64(i-2)) * 0.99)
			if gap := times[i].Sub(times[i-1]); gap < least {
				t.Errorf("Handshake %d came %v after the one before, want at least the backoff of %v", i+1, gap, least)
			}
		}
		if unavailable == 0 {
			t.Error("No query failed fast with ErrUnavailable during backoff")
		}
		if p.Stats().Strikes < 2 {
			t.Errorf("Consecutive failures = %d, want >= 2", p.Stats().Strikes)
		}
	})
}

func TestDialFailureIsUnavailableUntilBackoffPasses(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	addr := s.Addr
	s.Close() // nothing listens there now
	p, err := New(Config{Addr: addr, TLS: s.ClientTLS(), Backoff: Backoff{Base: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := exchange(p, "a.example."); !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrDial) {
		t.Errorf("First error = %v, want ErrUnavailable wrapping ErrDial", err)
	}
	if _, err := exchange(p, "b.example."); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Second error = %v, want ErrUnavailable at once", err)
	}
}

// Connections that fail together are one strike: a server that restarts cuts
// every connection at once, and a pool with one per query (a slow upstream
// not learned yet, as forward opens them) counted each, which armed the 30 s
// cap for a restart of under a second (e2e: dnsdist and kresd, no answer for
// 10 s after the restart). Queries sent once the server is back and a
// backoff or three have passed are answered.
func TestConnectionsFailingTogetherAreOneStrike(t *testing.T) {
	const service, downFor = 50 * time.Millisecond, 900 * time.Millisecond
	var down atomic.Bool
	mod := func(c *Config) {
		dial := c.Dial
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if down.Load() {
				time.Sleep(time.Millisecond) // dials started together fail together
				return nil, syscall.ECONNREFUSED
			}
			return dial(ctx, network, addr)
		}
	}
	opts := dottest.Options{Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, time.Millisecond, mod, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		start := time.Now()
		wait := offerFor(p, 2000, 2500*time.Microsecond, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		time.Sleep(time.Second)
		open := p.Stats().Conns
		down.Store(true)
		s.CloseConns()
		time.Sleep(downFor)
		down.Store(false)
		back := time.Since(start)
		// Three backoffs at most (250, 400, 640 ms, ±20 %) from the cut.
		resumeBy := time.Second + 1600*time.Millisecond
		failedAfter := 0
		for i, o := range wait() {
			if at := time.Duration(i) * 2500 * time.Microsecond; at >= resumeBy && o.err != nil {
				failedAfter++
			}
		}
		t.Logf("%d connections open at the cut, server back %v after the start, %d strikes", open, back, p.Stats().Strikes)
		if open < 10 {
			t.Fatalf("%d connections open at the cut, want a query a connection (10 or more)", open)
		}
		if failedAfter > 0 {
			t.Errorf("%d queries sent %v or more after the start failed, want none: the server was back at %v", failedAfter, resumeBy, back)
		}
	})
}

// A server that closes the pool's first connection in its handshake (EOF),
// then serves, under a steady 50,000 queries a second: forward fails the one
// query whose dial that was and dials again for the next; the pool, whose
// burst shares its first dial, fails no more than a few. Before the first
// strike's retry (redial.strike) the one failure armed the dial backoff
// (250 ms ±20 %) with no connection open, and every query in it failed at
// once with ErrUnavailable.
func TestOneFailedFirstDialFailsFewQueries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{Delay: func(dns.Question) time.Duration { return time.Millisecond }})
		var dials atomic.Int32
		p, _ := newTestPool(t, s, func(c *Config) {
			c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				time.Sleep(time.Millisecond)
				if dials.Add(1) == 1 {
					return eofInHandshake(), nil
				}
				return s.Dial(ctx, network, addr)
			}
		})
		const n, gap, forwardFails = 15000, 20 * time.Microsecond, 1
		failed := 0
		var first error
		for _, o := range offer(p, n, gap, func(i int) string { return fmt.Sprintf("q%d.example.", i) }) {
			if o.err != nil {
				failed++
				first = cmp.Or(first, o.err)
			}
		}
		t.Logf("%d of %d queries failed (first: %v), %d dials", failed, n, first, dials.Load())
		if failed > 3*forwardFails {
			t.Errorf("%d of %d queries failed after one failed first dial, want at most %d (forward: %d)", failed, n, 3*forwardFails, forwardFails)
		}
	})
}

// eofInHandshake returns the client end of a pipe whose server end reads the
// ClientHello and closes: the client's handshake reads EOF.
func eofInHandshake() net.Conn {
	client, server := dottest.Pipe()
	go func() {
		server.Read(make([]byte, 4096))
		server.Close()
	}()
	return client
}
