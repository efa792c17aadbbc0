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

// While the mode is unknown, an upstream that answers a connection's queries
// in order, each in 1 ms, behind a 5 ms handshake: a burst of 30 queries is
// not written one behind the other on the pool's connection (the last would
// wait 30 ms, as property seed 115's did behind one connection) but, past the
// five a dial's time serves there, each waits for a connection of its own,
// as forward's would (queueDepth), and no more are dialled than queries wait.
func TestUnknownModeDialsRatherThanQueueDeep(t *testing.T) {
	const service, handshake, n = time.Millisecond, 5 * time.Millisecond, 30
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true)
		for i := range 4 { // times the answer and the dial, each query alone
			if _, err := exchange(p, fmt.Sprintf("warm%d.example.", i)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(service)
		}
		if m := p.Stats().Mode; m != ModeUnknown {
			t.Fatalf("Mode after the warm-up %v, want %v", m, ModeUnknown)
		}
		if d := p.queueDepth(); d != int32(handshake/service) {
			t.Fatalf("queueDepth after the warm-up %d, want %d", d, handshake/service)
		}
		took := make([]time.Duration, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				start := time.Now()
				if _, err := exchange(p, fmt.Sprintf("q%d.example.", i)); err != nil {
					t.Error(err)
				}
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		// A dial and its answer, or five answers in turn, and a margin:
		// not the 30 answers in turn of one connection.
		if worst, want := slices.Max(took), handshake+5*service+4*service; worst > want {
			t.Errorf("Slowest of %d queries that came together took %v, want at most %v", n, worst, want)
		}
		if h := s.Handshakes(); h > n {
			t.Errorf("%d handshakes for %d queries, want at most one each", h, n)
		}
		t.Logf("%d handshakes", s.Handshakes())
	})
}
