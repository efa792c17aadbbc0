package e2e

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// loadResult counts the outcome of a bounded load run.
type loadResult struct {
	sent, ok atomic.Int64
	mu       sync.Mutex
	errs     []string // the first few failures
}

func (r *loadResult) fail(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) < 10 {
		r.errs = append(r.errs, fmt.Sprintf(format, args...))
	}
}

// runLoad sends total queries for the h*.e2e.test names from workers goroutines
// over network to addr, each checked against its expected A record. It stops
// early when budget has passed, so it is bounded in count and time.
func runLoad(network, addr string, total, workers int, budget time.Duration) *loadResult {
	res := &loadResult{}
	deadline := time.Now().Add(budget)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < total && time.Now().Before(deadline); i += workers {
				h := i % hostCount
				res.sent.Add(1)
				r, err := exchange(network, addr, nil, newQuery(hostName(h), dns.TypeA))
				if err == nil {
					err = checkAnswer(r, dns.TypeA, hostAddr(h))
				}
				if err != nil {
					res.fail("query %d %s: %v", i, hostName(h), err)
					continue
				}
				res.ok.Add(1)
			}
		})
	}
	wg.Wait()
	return res
}

// requireAllAnswered fails the test unless every one of total queries was sent
// and answered correctly.
func requireAllAnswered(t testing.TB, what string, res *loadResult, total int) {
	t.Helper()
	if sent, ok := res.sent.Load(), res.ok.Load(); sent != int64(total) || ok != int64(total) {
		t.Fatalf("%s: %d of %d queries sent, %d answered correctly; first failures:\n%v", what, sent, total, ok, res.errs)
	}
	t.Logf("%s: all %d queries answered correctly", what, total)
}
