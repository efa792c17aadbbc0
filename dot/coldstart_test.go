package dot

import (
	"fmt"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// A fresh pool in front of a fast in-order upstream (every answer 5 ms after
// its query, one at a time per connection) offered 2,000 QPS from the start:
// before the mode is learned (at a full sweep, sweepInterval), the pool
// fills connections in turn and queries queue behind each other, a score
// deep. Once it is learned, what is queued must leave the queue: a query k
// deep waits k service times while its connection reads an answer every
// service time, so that it is never silent for the rescue delay and nothing
// is rescued. forward answers every query in a handshake and a service time.
// Every query must be answered within the first full sweep, a rescue delay,
// a few ticks and its own service time (150 ms).
func TestColdStartInOrderQueueLeaves(t *testing.T) {
	const service = 5 * time.Millisecond
	opts := dottest.Options{InOrder: true, Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		out := offer(p, 1000, 500*time.Microsecond, func(i int) string { return fmt.Sprintf("q%d.example.", i) })
		checkOutcomes(t, out, func(string) time.Duration { return 150 * time.Millisecond })
		t.Logf("Mode %v, %d handshakes, %d rescues", p.Stats().Mode, s.Handshakes(), rec.get(func(r *recorder) int { return r.rescues }))
	})
}
