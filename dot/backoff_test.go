package dot

import (
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
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
// tight loop: a handshake alone does not reset the backoff.
func TestHandshakeThenCloseBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{CloseAfterHandshake: true})
		b := Backoff{Base: 100 * time.Millisecond, Jitter: 0.01}
		p, _ := newTestPool(t, s, func(c *Config) { c.Backoff = b })
		var unavailable int
		// Until four handshakes (three backoffs) are in, bounded in count and time;
		// a query that fails fast in backoff is followed by a millisecond's pause, the
		// pace at which the test probes the backoff.
		for i, start := 0, time.Now(); i < 10000 && s.Handshakes() < 4 && time.Since(start) < 10*time.Second; i++ {
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
		// Each dial waits out the backoff of the failures before it: 100ms, 160ms,
		// 256ms (±1%). A lower bound, so a slow machine cannot break it.
		times := s.HandshakeTimes()
		if len(times) < 3 {
			t.Fatalf("%d handshakes, want at least 3", len(times))
		}
		for i := 1; i < len(times); i++ {
			least := time.Duration(float64(b.Base) * math.Pow(DefaultBackoffMultiplier, float64(i-1)) * 0.99)
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
