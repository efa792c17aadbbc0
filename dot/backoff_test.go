package dot

import (
	"testing"
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
