package dot

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// An answer that overtakes a query written before it on its connection, still
// outstanding, shows the upstream out of order at once: not only when the
// overtaken one's answer comes, late (see conn.overtookLocked).
func TestOvertakingAnswerShowsOutOfOrderAtOnce(t *testing.T) {
	const slow = time.Second
	opts := dottest.Options{Delay: func(q dns.Question) time.Duration {
		if q.Name == "order.example." {
			return slow
		}
		return time.Millisecond
	}}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		if _, err := exchange(p, "warm.example."); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		done := make(chan error, 1)
		go func() { _, err := exchange(p, "order.example."); done <- err }()
		synctest.Wait() // written first
		if _, err := exchange(p, "overtakes.example."); err != nil {
			t.Fatal(err)
		}
		if n := s.Handshakes(); n != 1 {
			t.Fatalf("%d handshakes, want the 2 queries on the one connection", n)
		}
		waitFor(t, "the mode out of order", func() bool { return p.Stats().Mode == ModeOutOfOrder })
		if took := time.Since(start); took >= slow {
			t.Errorf("Out of order learned after %v, want before the overtaken answer came (%v)", took, slow)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}
