package dot

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// A "one per record" verdict holds a second, then twice as long with each one in a
// row, up to learnedTTL; a "shared" one holds learnedTTL and ends the streak.
func TestRecordVerdictTTL(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	p, rec := newTestPool(t, s, nil)
	// The pool clock may tick between the verdict and the check: allow a second.
	ttl := func() time.Duration { return time.Duration(p.learned.records.until.Load() - p.clock.Load()) }
	near := func(got, want time.Duration) bool { return got <= want && got > want-time.Second }
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}
	for range 6 { // 16 s to 512 s
		want = append(want, 2*want[len(want)-1])
	}
	want = append(want, learnedTTL, learnedTTL)
	for i, w := range want {
		p.endTrial(verdictOwn)
		if got := ttl(); !near(got, w) {
			t.Errorf("One-per-record verdict %d holds %v, want %v", i+1, got, w)
		}
	}
	p.endTrial(verdictShared)
	if got := ttl(); !near(got, learnedTTL) {
		t.Errorf("Shared verdict holds %v, want %v", got, learnedTTL)
	}
	p.endTrial(verdictOwn)
	if got := ttl(); !near(got, ownTTL) {
		t.Errorf("One-per-record verdict after a shared one holds %v, want %v", got, ownTTL)
	}
	if v := verdicts(rec); len(v) != 3 || v[0] || !v[1] || v[2] {
		t.Errorf("Verdicts reported = %v, want [false true false]: only changes", v)
	}
}

// Shared records end with a record of its own for the last query, so that a server
// that serves the queries left in its TLS buffer only when its socket is readable
// (dnsdist 1.7) serves them all: even such a server may be given shared records
// (the trial's verdict on it depends on timing) without any query waiting.
func TestSharedRecordsKeepLazyServerReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{LazyRecords: true})
		g := newPipeGate(s)
		p, rec := newTestPool(t, s, func(c *Config) { c.Dial = g.Dial; c.MaxConns = 1 })
		p.learned.records.v.Store(int32(verdictShared))
		p.learned.records.until.Store(math.MaxInt64)
		if _, err := exchange(p, "warm.example."); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if w := gatedBurst(t, p, g, 20); w != 2 {
				t.Errorf("Socket writes = %d, want 2", w)
			}
		}
		if to := rec.get(func(r *recorder) int { return r.timeouts }); to != 0 {
			t.Errorf("%d queries timed out, want 0", to)
		}
		if r, q := s.Records(), s.Queries(); r >= q {
			t.Errorf("The server read %d records for %d queries, want fewer records than queries", r, q)
		}
	})
}

// gatedBurst blocks p's next socket write, queues n queries behind it, releases
// the write and waits for every answer. It returns how many socket writes that took.
func gatedBurst(t *testing.T, p *Pool, g *gate, n int) int64 {
	t.Helper()
	g.hold()
	before := g.writes.Load()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	run := func(i int) {
		defer wg.Done()
		if _, err := exchange(p, fmt.Sprintf("q%d.example.", i)); err != nil {
			errs <- fmt.Errorf("q%d: %w", i, err)
		}
	}
	wg.Add(1)
	go run(0)
	<-g.entered // the first query's write is now blocked
	for i := 1; i < n; i++ {
		wg.Add(1)
		go run(i)
	}
	waitFor(t, "all queries to be queued", func() bool { return p.Stats().Inflight == n })
	g.release()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Query failed: %v", err)
	}
	return g.writes.Load() - before
}

func verdicts(r *recorder) []bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.verdicts)
}

// A record trial ends on its queries' answers even when their callers no longer
// wait for them (gave up, or a rescue won): the upstream read both, so records
// can be shared, and the connection's next queries go out at once rather than
// after trialTimeout. (Before, such a trial held a connection's writes for
// 250 ms while queries kept being queued on it.) The answers come sooner
// after their write than a rescue may start (minRescueDelay): at 60 ms, the
// sweeper found the one connection blocked behind the first of them in about
// 1 run in 200 under -race, and a trial on a blocked connection ends without
// a verdict (stopTrial, TestTrialEndsWhenItsConnectionIsBlocked). The
// callers give up after the queries are queued (waitFor polls every 2 ms)
// and before the answers come.
func TestTrialEndsOnAnswersNobodyWaitsFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const slow, giveUp = minRescueDelay * 9 / 10, 7 * time.Millisecond
		var wg sync.WaitGroup
		p, rec, g := trialBatch(t, &wg, "gone", slow)
		// The trial's two queries, whose callers give up long before the answers come.
		for i := range 2 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), giveUp)
				defer cancel()
				p.Exchange(ctx, newQuery(fmt.Sprintf("gone%d.example.", i), dns.TypeA))
			})
			waitFor(t, "the query to be queued", func() bool { return p.Stats().Inflight == 2+i })
		}
		var took [3]time.Duration
		for i := range took {
			wg.Go(func() {
				start := time.Now()
				if _, err := exchange(p, fmt.Sprintf("next%d.example.", i)); err != nil {
					t.Errorf("next%d: %v", i, err)
				}
				took[i] = time.Since(start)
			})
		}
		waitFor(t, "all queries to be queued", func() bool { return p.Stats().Inflight == 6 })
		g.release()
		wg.Wait()
		if v := verdicts(rec); len(v) != 1 || !v[0] {
			t.Errorf("Verdicts reported = %v, want [true]: the server answered both trial queries", v)
		}
		for i, d := range took {
			if d > 2*slow {
				t.Errorf("next%d took %v, want the trial's %v at most: the trial held the connection", i, d, slow)
			}
		}
	})
}

// A record trial ends without a verdict when the sweeper finds its
// connection blocked behind a slow answer (a stall): the trial's answers wait
// for that one, and its hold would keep the queries put on the connection
// unwritten until trialTimeout; the next trial waits ownTTL. Without
// stopTrial the next query here took trialTimeout (250 ms) and the stall
// was reported as "one per record".
func TestTrialEndsWhenItsConnectionIsBlocked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const stall = time.Second
		var wg sync.WaitGroup
		p, rec, g := trialBatch(t, &wg, "held", stall)
		for i := range 2 { // the trial's two queries, answered after the stall
			wg.Go(func() { exchange(p, fmt.Sprintf("held%d.example.", i)) })
			waitFor(t, "the query to be queued", func() bool { return p.Stats().Inflight == 2+i })
		}
		var took time.Duration
		wg.Go(func() {
			start := time.Now()
			if _, err := exchange(p, "next.example."); err != nil {
				t.Errorf("next: %v", err)
			}
			took = time.Since(start)
		})
		waitFor(t, "all queries to be queued", func() bool { return p.Stats().Inflight == 4 })
		g.release()
		wg.Wait()
		if took >= trialTimeout/2 {
			t.Errorf("next took %v, want less than %v: the trial held its connection through the stall", took, trialTimeout/2)
		}
		if v := verdicts(rec); len(v) != 0 {
			t.Errorf("Verdicts reported = %v, want none: a stall tells nothing of how records are read", v)
		}
		if p.startTrial() {
			t.Error("A trial started again at once: in the same stall it would hold the writes again")
		}
	})
}

// No record trial runs before the first answer, or while the usual answer
// time is a quarter of trialTimeout or more: it would hold the connection's
// writes for that long (a 300 ms upstream's p99 went from 306 ms to 462 ms in
// the slow-pipelining regime when a new connection ran one, and to 504 ms in
// TestPropertyIssue21 when the pool's first connection did).
func TestNoTrialForSlowUpstream(t *testing.T) {
	c := newBareConn(t, 8)
	p := c.pool
	if p.startTrial() {
		t.Fatal("A trial started before the first answer")
	}
	p.learned.mode.usual.Store(int64(trialTimeout / 4))
	if p.startTrial() {
		t.Fatalf("A trial started with a usual answer time of %v", trialTimeout/4)
	}
	p.learned.mode.usual.Store(int64(time.Millisecond))
	if !p.startTrial() {
		t.Fatal("No trial started with a usual answer time of 1ms and no verdict")
	}
}

// A record trial whose first query was given up while queued writes only its
// second: the rest of the batch is written after it without that one, whose
// write order (call.seq) is its own. (The writer took the trial's second
// query once more with the rest and gave it the next one's seq after its
// send, the same as the next query's, which the reader reads meanwhile.)
func TestTrialWithAnAbandonedFirstKeepsItsSecondsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var wg sync.WaitGroup
		p, _, g := trialBatch(t, &wg, "held", time.Second) // outstanding while the test reads their order
		ctx, cancel := context.WithCancel(context.Background())
		wg.Go(func() { p.Exchange(ctx, newQuery("gone.example.", dns.TypeA)) })
		waitFor(t, "the trial's first query to be queued", func() bool { return p.Stats().Inflight == 2 })
		for i := range 2 {
			wg.Go(func() { exchange(p, fmt.Sprintf("held%d.example.", i)) })
			waitFor(t, "the query to be queued", func() bool { return p.Stats().Inflight == 3+i })
		}
		cancel() // given up while queued: the trial writes only its second query
		waitFor(t, "the query to be given up", func() bool { return p.Stats().Inflight == 3 })
		c := (*p.conns.Load())[0]
		c.mu.Lock()
		held := make([]*call, 2)
		for cl := range c.calls.all() {
			if n := cl.q.name; strings.HasPrefix(n, "held") {
				held[n[4]-'0'] = cl
			}
		}
		c.mu.Unlock()
		g.release()
		waitFor(t, "both held queries to be sent", func() bool { return held[1].sentAt.Load() != 0 })
		if !held[0].trial {
			t.Fatal("no record trial ran on the batch")
		}
		if a, b := held[0].seq, held[1].seq; a == b {
			t.Errorf("the trial's second query and the next share write order %d", a)
		}
		wg.Wait()
	})
}

// trialBatch starts a pool of one connection to a pipe server that holds the
// answers to names beginning with slowPrefix for slow (and answers others at
// once), warms it, and blocks its next write, first.example.'s, run on wg: the
// queries queued next go out after it as one batch, on which a record trial
// runs. g.release() lets the write go.
func trialBatch(t *testing.T, wg *sync.WaitGroup, slowPrefix string, slow time.Duration) (*Pool, *recorder, *gate) {
	t.Helper()
	delay := func(q dns.Question) time.Duration {
		if strings.HasPrefix(q.Name, slowPrefix) {
			return slow
		}
		return 0
	}
	s := startPipe(t, dottest.Options{Delay: delay})
	g := newPipeGate(s)
	p, rec := newTestPool(t, s, func(c *Config) { c.Dial = g.Dial; c.MaxConns = 1 })
	if _, err := exchange(p, "warm.example."); err != nil {
		t.Fatal(err)
	}
	g.hold()
	wg.Go(func() { exchange(p, "first.example.") })
	<-g.entered // the first query's write is blocked: the rest queue as one batch
	return p, rec, g
}
