package dot

import (
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// Queries that each wait for a connection of their own (a slow upstream
// whose mode is not known: one query a connection, as forward sends them)
// take the connections in the order they came: each is answered within its
// own dial and answer, as forward's are. Every waiter wakes when a dial is
// done, and the first to run took the connection: one that came later took
// the one dialled for an earlier query, which waited for a later dial.
func TestWaitersTakeConnectionsInTheirOrder(t *testing.T) {
	const service, handshake = 30 * time.Millisecond, 40 * time.Millisecond
	opts := dottest.Options{Delay: func(dns.Question) time.Duration { return service }}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		p.noOrderChecks.Store(true) // none put behind another on purpose
		checkOutcomes(t, offer(p, 1, 0, names("warm")), func(string) time.Duration { return time.Second })
		if !p.slowUnknown() {
			t.Fatalf("The upstream is not served a query a connection (mode %v): the test tests nothing", p.Stats().Mode)
		}
		// The first takes the warm connection; each of the others dials
		// one, done 2 ms after the one before.
		out := offer(p, 12, 2*time.Millisecond, names("q"))
		checkOutcomes(t, out, func(string) time.Duration { return handshake + service + time.Millisecond })
	})
}
