package dot

import (
	"sync"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// An upstream that pauses (answers nothing on any connection for a while, then
// everything due at once) blocks every connection, and once they are as many as
// the pool opens (here max_conns 1; in the property test's seed 97 the four of
// a mode not yet known) it dials no more. A query that comes meanwhile goes out
// at once on the least loaded blocked connection (pickInTurn), as forward's
// would on a connection of its own, instead of waiting unwritten for the pause
// to end. In seed 97 such queries waited from 200 ms to the end of an 800 ms
// pause and then missed their 1 s deadline behind moves.
func TestQueryDuringUpstreamPauseGoesOut(t *testing.T) {
	const service, pause = time.Millisecond, 500 * time.Millisecond
	var mu sync.Mutex
	var pauseUntil time.Time
	received := map[string]time.Time{}
	delay := func(q dns.Question) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return max(service, time.Until(pauseUntil))
	}
	onQuery := func(wire []byte) {
		m := new(dns.Msg)
		if m.Unpack(wire) == nil && len(m.Question) == 1 {
			mu.Lock()
			received[m.Question[0].Name] = time.Now()
			mu.Unlock()
		}
	}
	bubble(t, dottest.Options{Delay: delay, OnQuery: onQuery}, time.Millisecond, func(c *Config) { c.MaxConns = 1 }, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		for _, name := range []string{"warm1.example.", "warm2.example."} {
			if _, err := exchange(p, name); err != nil {
				t.Fatal(err)
			}
		}
		mu.Lock()
		pauseUntil = time.Now().Add(pause)
		mu.Unlock()
		var wg sync.WaitGroup
		for _, name := range []string{"a.example.", "b.example.", "c.example."} {
			wg.Go(func() {
				if _, err := exchange(p, name); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			})
		}
		for range pause / 2 / time.Millisecond { // the sweeper finds the connection blocked
			if p.Stats().Blocked == 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if s := p.Stats(); s.Blocked != 1 || s.Conns != 1 {
			t.Fatalf("Stats %+v, want the one connection blocked", s)
		}
		if m := p.Stats().Mode; m != ModeUnknown {
			t.Fatalf("Mode = %v, want unknown", m)
		}
		start := time.Now()
		if _, err := exchange(p, "during.example."); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		if got := received["during.example."]; !got.Before(pauseUntil) {
			t.Errorf("The query that came %v into the pause reached the upstream %v after it ended, want before",
				start.Sub(pauseUntil.Add(-pause)), got.Sub(pauseUntil))
		}
	})
}
