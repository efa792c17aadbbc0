package dot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// fdDialer dials a Pipe server while the process "has descriptors": allow
// connections in all; every dial past them fails as socket(2) does at
// RLIMIT_NOFILE, before anything reaches the upstream.
type fdDialer struct {
	s     *dottest.Server
	allow atomic.Int32 // successful dials allowed in all
	ok    atomic.Int32 // successful dials so far
}

func (d *fdDialer) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.ok.Add(1) > d.allow.Load() {
		d.ok.Add(-1)
		return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}
	return d.s.Dial(ctx, network, addr)
}

// burst sends n queries for distinct names (none coalesced) at once and
// returns their errors.
func burst(p *Pool, n int) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, errs[i] = exchange(p, fmt.Sprintf("q%d.example.", i)) })
	}
	wg.Wait()
	return errs
}

// A dial that fails for lack of file descriptors is no failure of the upstream:
// no Observer.Failed (health), no strike (backoff). The pool serves every query
// on the connections it could open, re-tests the cap at most once per
// fdRetest, and grows again once descriptors are to be had.
func TestOutOfFilesCapsWithoutStrike(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{Delay: func(dns.Question) time.Duration { return 20 * time.Millisecond }})
		d := &fdDialer{s: s}
		d.allow.Store(2)
		p, rec := newTestPool(t, s, func(c *Config) { c.Dial = d.Dial; c.MaxInflight = 2 })

		start := time.Now()
		firstWave := 0          // dials that failed in the first burst
		for round := range 20 { // 20 bursts of 20: each wants more than 2 × 2 slots
			for i, err := range burst(p, 20) {
				if err != nil {
					t.Fatalf("Round %d, query %d: %v; want every query answered on the connections open", round, i, err)
				}
			}
			if round == 0 {
				firstWave = rec.get(func(r *recorder) int { return r.dialErrs })
			}
		}
		elapsed := time.Since(start)
		st := p.Stats()
		errs := rec.get(func(r *recorder) int { return r.dialErrs })
		if errs == 0 {
			t.Fatal("No dial failed: the load never wanted a third connection, the test tests nothing")
		}
		if f := rec.get(func(r *recorder) int { return r.failures }); f != 0 {
			t.Errorf("Observer.Failed called %d times for dials that failed locally, want 0 (health must not count them)", f)
		}
		if st.Strikes != 0 {
			t.Errorf("Strikes = %d, want 0: a local failure is no strike against the upstream", st.Strikes)
		}
		if st.Conns != 2 {
			t.Errorf("Conns = %d, want the 2 that could be opened", st.Conns)
		}
		// The dials under way when the first failed (one for each query
		// that waited for a connection of its own) fail with it; after
		// them, one re-test per fdRetest, not a dial per waiting query.
		if most := firstWave + int(elapsed/fdRetest); errs > most {
			t.Errorf("%d failed dials in %v, want at most %d (one re-test per %v)", errs, elapsed, most, fdRetest)
		}

		// Descriptors freed: the next re-test succeeds and lifts the cap, and the
		// pool grows to its out-of-order cap at once, not one re-test at a time.
		d.allow.Store(AutoMaxConnsOutOfOrder)
		freed := time.Now()
		for i := 0; i < 100 && p.Stats().Conns < AutoMaxConnsOutOfOrder; i++ {
			burst(p, 20)
		}
		if n, took := p.Stats().Conns, time.Since(freed); n < AutoMaxConnsOutOfOrder || took > fdRetest+fdRetest/2 {
			t.Errorf("Conns = %d %v after descriptors were freed, want %d within %v: the cap must lift",
				n, took, AutoMaxConnsOutOfOrder, fdRetest+fdRetest/2)
		}
	})
}

// With no connection and none to be had, a query fails at once with
// ErrUnavailable wrapping ErrNoFiles (the caller can go elsewhere), without a
// strike; the next dial waits for the re-test.
func TestOutOfFilesWithNoConnectionFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{})
		d := &fdDialer{s: s}
		p, rec := newTestPool(t, s, func(c *Config) { c.Dial = d.Dial })

		_, err := exchange(p, "a.example.")
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrNoFiles) || !errors.Is(err, syscall.EMFILE) {
			t.Fatalf("Error = %v, want ErrUnavailable wrapping ErrNoFiles and EMFILE", err)
		}
		if _, err := exchange(p, "b.example."); !errors.Is(err, ErrNoFiles) {
			t.Errorf("Second error = %v, want ErrNoFiles at once", err)
		}
		if n := rec.get(func(r *recorder) int { return r.dialErrs }); n != 1 {
			t.Errorf("%d dials failed, want 1: the second query must not dial before the re-test", n)
		}
		if f := rec.get(func(r *recorder) int { return r.failures }); f != 0 || p.Stats().Strikes != 0 {
			t.Errorf("Failures = %d, strikes = %d, want 0 and 0", f, p.Stats().Strikes)
		}

		d.allow.Store(1)
		time.Sleep(fdRetest) // the bubble's clock: the re-test is due
		if _, err := exchange(p, "c.example."); err != nil {
			t.Errorf("After the re-test: %v, want an answer", err)
		}
	})
}
