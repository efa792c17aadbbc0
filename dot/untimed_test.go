package dot

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// untimedLoad sends n queries, one every gap (paced, as the steady property
// seeds' loads), and returns the slowest answer's time and the errors.
func untimedLoad(p *Pool, n int, gap time.Duration) (slowest time.Duration, errs []error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			began := time.Now()
			_, err := exchange(p, fmt.Sprintf("q%d.example.", i))
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, time.Since(began))
			if err != nil {
				errs = append(errs, err)
			}
		})
		time.Sleep(gap)
	}
	wg.Wait()
	return slowest, errs
}

// An in-order upstream that answers every query after 150 ms, under a load
// (4,000 QPS for 100 ms) that needs 400 connections before its first answer:
// forward dials one per query and answers each in about 150 ms. The pool,
// which cannot yet tell this upstream from a black hole, dials as forward
// does while its first query has waited less than an eighth of the read
// timeout (untimedRoom). Capped at untimedMaxConns (256), as it was, it
// dialled 260 and queued the rest behind 150 ms answers: the slowest took
// 438 ms; now 400 dials, the slowest 151 ms
// (issue 21, steady property seed 30: p99 500 ms against forward's 182).
func TestSlowUpstreamGetsForwardsConnectionsBeforeItsFirstAnswer(t *testing.T) {
	const queries, gap, answer = 400, 250 * time.Microsecond, 150 * time.Millisecond
	delay := func(dns.Question) time.Duration { return answer }
	bubble(t, dottest.Options{InOrder: true, Delay: delay}, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		slowest, errs := untimedLoad(p, queries, gap)
		if len(errs) > 0 {
			t.Fatalf("%d queries failed, the first: %v", len(errs), errs[0])
		}
		// A query behind another waits two answer times; one of its own
		// waits one, and a handshake.
		if slowest >= answer+answer/2 {
			t.Errorf("Slowest answer %v with %d dials for %d queries, want under %v: each query on a connection of its own",
				slowest, s.Handshakes(), queries, answer+answer/2)
		}
		if got := s.Handshakes(); got > queries {
			t.Errorf("%d dials for %d queries, want no more than forward's one a query", got, queries)
		}
	})
}

// In front of a black hole, the pool dials a connection per query only for
// the first eighth of the read timeout (untimedRoom): at 3,000 QPS and a
// 1 s read timeout, about 375 connections (376 dials), against the 900
// queries of the 300 ms load that forward would each give one. With
// untimedRoom bounded by the in-order cap alone, the pool dialled 900.
func TestBlackHoleStopsDiallingAfterAPlausibleAnswerTime(t *testing.T) {
	const queries, gap, readTimeout = 900, time.Second / 3000, time.Second
	drop := func(dns.Question) bool { return true }
	timeout := func(c *Config) { c.ReadTimeout = readTimeout }
	bubble(t, dottest.Options{Drop: drop}, time.Millisecond, timeout, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		_, errs := untimedLoad(p, queries, gap)
		if len(errs) != queries {
			t.Errorf("%d of %d queries failed, want all: a black hole", len(errs), queries)
		}
		// The window's arrivals, and the dials under way as it closes.
		most := int64(readTimeout/untimedShare/gap) + maxParallelDials
		if got := s.Handshakes(); got > most {
			t.Errorf("%d dials for %d queries, want %d or fewer: no connection per query past %v",
				got, queries, most, readTimeout/untimedShare)
		}
	})
}
