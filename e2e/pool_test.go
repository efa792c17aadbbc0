package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// countingObserver counts the pool events the cut test asserts on.
type countingObserver struct {
	mu                 sync.Mutex
	closes             map[string]int
	timeouts, replays  atomic.Int64
	dials, dialFailure atomic.Int64
	verdicts           []bool // guarded by mu: SharedRecords reports
}

func (o *countingObserver) Dialed(_ time.Duration, _ bool, err error) {
	o.dials.Add(1)
	if err != nil {
		o.dialFailure.Add(1)
	}
}

func (o *countingObserver) Closed(r dot.CloseReason) {
	o.mu.Lock()
	o.closes[r.String()]++
	o.mu.Unlock()
}

func (o *countingObserver) Dropped(r dot.DropReason) {
	o.mu.Lock()
	o.closes["dropped "+r.String()]++
	o.mu.Unlock()
}

func (o *countingObserver) Replayed()    { o.replays.Add(1) }
func (o *countingObserver) TimedOut()    { o.timeouts.Add(1) }
func (o *countingObserver) Failed(error) {}

func (o *countingObserver) SharedRecords(shared bool) {
	o.mu.Lock()
	o.verdicts = append(o.verdicts, shared)
	o.mu.Unlock()
}

// TestPoolAgainstServerCuts drives dot.Pool itself (no CoreDNS in between) against
// dnsdist closing every DoT connection after cutAfter queries. dnsdist always
// ends such a connection within milliseconds (EOF, or RST when more queries were
// already written), so no attempt may wait out the read timeout and every query
// must be answered. With MaxConns 1 a stuck connection cannot hide behind a
// second one.
func TestPoolAgainstServerCuts(t *testing.T) {
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{})
	d := startCuttingDnsdist(t, c, u.plain)
	for _, maxConns := range []int{1, 4} {
		t.Run(fmt.Sprintf("MaxConns=%d", maxConns), func(t *testing.T) {
			o := &countingObserver{closes: map[string]int{}}
			p, err := dot.New(dot.Config{
				Addr: d.addr, TLS: &tls.Config{RootCAs: c.pool, ServerName: serverName},
				MaxConns: maxConns, Observer: o,
			})
			if err != nil {
				t.Fatalf("dot.New: %v", err)
			}
			defer p.Close()
			const total = 3000
			sent, failed, slow, errs := poolLoad(p, total, loadWorkers, poolBudget)
			o.mu.Lock()
			t.Logf("%d of %d queries sent: %d failed, %d took over 1s; %d dials, %d replays, %d read timeouts, closes %v",
				sent, total, failed, slow, o.dials.Load(), o.replays.Load(), o.timeouts.Load(), o.closes)
			o.mu.Unlock()
			if sent != total || failed > 0 || o.timeouts.Load() > 0 {
				t.Errorf("Against a server that closes every %d queries, %d of %d queries sent in %v, %d failed, %d attempts timed out; first failures: %v",
					cutAfter, sent, total, poolBudget, failed, o.timeouts.Load(), errs)
			}
		})
	}
}

// poolBudget bounds one load through the pool.
const poolBudget = 20 * time.Second

// poolLoad sends up to total checked queries through p from workers goroutines,
// each bounded by a 5 s context, until budget has passed. It returns how many were
// sent, the failures, the attempts slower than a second and the first few errors.
func poolLoad(p *dot.Pool, total, workers int, budget time.Duration) (sent, failed, slow int64, errs []string) {
	var mu sync.Mutex
	var nSent, nFailed, nSlow atomic.Int64
	start := time.Now()
	deadline := start.Add(budget)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < total && time.Now().Before(deadline); i += workers {
				nSent.Add(1)
				h := i % hostCount
				ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
				begin := time.Now()
				r, err := p.Exchange(ctx, newQuery(hostName(h), dns.TypeA))
				cancel()
				if err == nil {
					err = checkAnswer(r, dns.TypeA, hostAddr(h))
				}
				if time.Since(begin) > time.Second {
					nSlow.Add(1)
				}
				if err != nil {
					nFailed.Add(1)
					mu.Lock()
					if len(errs) < 5 {
						errs = append(errs, fmt.Sprintf("at %v: %v", time.Since(start).Round(time.Millisecond), err))
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return nSent.Load(), nFailed.Load(), nSlow.Load(), errs
}
