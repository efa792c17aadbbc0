package dot

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// TestWokenTickHeldUpIsLate: a tick that a query woke (kickSweeper) and that
// a hold-up of the process then kept from running is late by the hold-up,
// as a tick of the timer's is: measured against the timer's time, far off
// while the sweeper ticked slowly, it looked on time, and servedBy dated
// the reads it saw grow by its own time (the flake of
// TestUnknownModeHeldUpPoolDialsNone).
func TestWokenTickHeldUpIsLate(t *testing.T) {
	const hold = 5 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return 100 * time.Microsecond }}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		if _, err := exchange(p, "warm.example."); err != nil {
			t.Fatalf("warm-up: %v", err)
		}
		time.Sleep(2 * p.sweepInterval()) // ticks with nothing outstanding: the sweeper ticks slowly
		if !p.idleTicks.Load() {
			t.Fatal("the sweeper ticks fast with nothing outstanding")
		}
		var armed, held atomic.Bool
		armed.Store(true)
		hook := func() {
			if armed.CompareAndSwap(true, false) {
				time.Sleep(hold) // the hold-up, in virtual time: not a test waiting for a condition
				held.Store(true)
			}
		}
		p.tickHold.Store(&hook)
		if _, err := exchange(p, "woke.example."); err != nil {
			t.Fatalf("query: %v", err)
		}
		waitFor(t, "the held tick", held.Load)
		synctest.Wait() // the tick ran on: the sweeper waits for its next
		if got := time.Duration(p.heldFor.Load()); got < hold-time.Millisecond {
			t.Errorf("the woken tick's hold-up noted as %v, want about %v", got, hold)
		}
	})
}
