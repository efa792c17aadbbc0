package dot

import (
	"sync/atomic"
	"testing"
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
		start := time.Now()
		done := overtake(t, p)
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

// One overtake shows out of order once: when the overtaken query's answer
// comes, late, it is no second inversion. An upstream that answered one
// query past a slow one (2 s), then served its queries one at a time, in
// order, 10 ms each: in order is learned from the slow gaps of its answers
// once outOfOrderQuiet has passed, and holds when the slow answer comes.
// (Counted again then, the old overtake made the upstream out of order once
// more, on no new evidence.)
func TestOvertakenAnswerCountsNoSecondInversion(t *testing.T) {
	const slow, service = 2 * time.Second, 10 * time.Millisecond
	var serial atomic.Bool
	opts := dottest.Options{Delay: func(q dns.Question) time.Duration {
		switch {
		case q.Name == "order.example.":
			return slow
		case serial.Load():
			return service
		}
		return time.Millisecond
	}}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		done := overtake(t, p)
		waitFor(t, "the mode out of order", func() bool { return p.Stats().Mode == ModeOutOfOrder })
		s.SetInOrder(true) // order.example.'s answer is on its way already
		serial.Store(true)
		burst := burster(t, p)
		for i := 0; p.Stats().Mode != ModeInOrder; i++ {
			if i == 30 {
				t.Fatalf("Mode %v after %d bursts in order, want in order before the slow answer", p.Stats().Mode, i)
			}
			burst(4)
			time.Sleep(50 * time.Millisecond)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond) // full sweeps (100 ms apart) learn from the slow answer
		if m := p.Stats().Mode; m != ModeInOrder {
			t.Errorf("Mode %v after the overtaken query's answer came, want %v: the overtake was counted once already", m, ModeInOrder)
		}
	})
}
