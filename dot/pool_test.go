package dot

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func TestExchangeKeepsIDAndQuestionCase(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	p, _ := newTestPool(t, s, nil)
	m := newQuery("ExAmPle.ORG.", dns.TypeA)
	m.Id = 4242
	r, err := p.Exchange(context.Background(), m)
	if err != nil {
		t.Fatalf("Exchange: %v", err)
	}
	if r.Id != 4242 {
		t.Errorf("Answer ID = %d, want the client's 4242", r.Id)
	}
	if r.Question[0].Name != "ExAmPle.ORG." {
		t.Errorf("Answer question = %q, want the client's case", r.Question[0].Name)
	}
	if len(r.Answer) != 1 {
		t.Errorf("Answer has %d records, want 1", len(r.Answer))
	}
	if m.Id != 4242 || len(m.Extra) != 0 {
		t.Errorf("Exchange modified the query: id %d, extra %v", m.Id, m.Extra)
	}
}

// A slow answer must not hold back others on the same connection: pipelining with
// out-of-order answers.
func TestPipeliningOutOfOrder(t *testing.T) {
	release := make(chan struct{})
	s := dottest.Start(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		if strings.HasPrefix(q.Question[0].Name, "slow.") {
			<-release
		}
		return dottest.DefaultAnswer(q)
	}})
	p, _ := newTestPool(t, s, nil)
	if _, err := exchange(p, "warm.example."); err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		_, err := exchange(p, "slow.example.")
		slow <- err
	}()
	waitFor(t, "the slow query to reach the server", func() bool { return s.Queries() == 2 })
	for i := range 20 {
		if _, err := exchange(p, fmt.Sprintf("fast%d.example.", i)); err != nil {
			t.Fatalf("Fast query %d: %v", i, err)
		}
	}
	select {
	case err := <-slow:
		t.Fatalf("Slow query finished before it was released: %v", err)
	default:
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatalf("Slow query: %v", err)
	}
	if h := s.Handshakes(); h != 1 {
		t.Errorf("Handshakes = %d, want 1: everything should share one connection", h)
	}
}

// Queries queued while a write is in progress go out together in one write. The
// first such burst runs the record trial; later ones are framed by its verdict:
// shared records for a server that reads them, one record per query for one that
// reads only the first query of a record until more bytes come (dnsdist 1.7).
func TestWritesCoalesce(t *testing.T) {
	const n = 50
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("LazyRecords=%v", lazy), func(t *testing.T) {
			s := dottest.Start(t, dottest.Options{LazyRecords: lazy})
			g := newGate()
			p, rec := newTestPool(t, s, func(c *Config) { c.Dial = g.Dial; c.MaxConns = 1 })
			if _, err := exchange(p, "warm.example."); err != nil {
				t.Fatal(err)
			}
			// The trial: after the blocked write, one write with the first two
			// queries in one record, then the rest once the verdict is in.
			if w := gatedBurst(t, p, g, n); w != 3 {
				t.Errorf("Socket writes for the first burst of %d queries = %d, want 3 (the blocked one, the trial record, the rest)", n, w)
			}
			if v := verdicts(rec); len(v) != 1 || v[0] == lazy {
				t.Fatalf("Verdicts = %v, want [%v]", v, !lazy)
			}
			if w := gatedBurst(t, p, g, n); w != 2 {
				t.Errorf("Socket writes for %d queries = %d, want 2 (the blocked one, then one batch)", n, w)
			}
			g.mu.Lock()
			records := tlsRecords(g.last)
			g.mu.Unlock()
			switch {
			case lazy && records != n-1:
				t.Errorf("The batch write holds %d TLS records for %d queries, want one each", records, n-1)
			case !lazy && records != 2:
				t.Errorf("The batch write holds %d TLS records for %d queries, want 2 (the last query has its own)", records, n-1)
			}
			if to, re := rec.get(func(r *recorder) int { return r.timeouts }), rec.get(func(r *recorder) int { return r.replays }); to+re != 0 {
				t.Errorf("%d timeouts and %d replays, want none", to, re)
			}
			// Once the verdict expires, the next burst tries again.
			p.learned.records.until.Store(0)
			if w := gatedBurst(t, p, g, n); w != 3 {
				t.Errorf("Socket writes for a burst after the verdict expired = %d, want 3 (a new trial)", w)
			}
		})
	}
}

// Shared records end with a record of its own for the last query, so that a server
// that serves the queries left in its TLS buffer only when its socket is readable
// (dnsdist 1.7) serves them all: even such a server may be given shared records
// (the trial's verdict on it depends on timing) without any query waiting.
func TestSharedRecordsKeepLazyServerReading(t *testing.T) {
	s := dottest.Start(t, dottest.Options{LazyRecords: true})
	g := newGate()
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

// Every query is answered with its own question under concurrency, answers arrive
// in random order, and in-flight never exceeds the per-connection cap.
func TestConcurrentAnswersMatchQuestions(t *testing.T) {
	s := dottest.Start(t, dottest.Options{
		Delay: func(q dns.Question) time.Duration { return time.Duration(len(q.Name)%5) * time.Millisecond },
	})
	p, _ := newTestPool(t, s, func(c *Config) { c.MaxInflight = 8; c.MaxConns = 2 })
	runLoad(t, p, 40, 25, nil)
	if m := s.MaxOutstanding(); m > 8 {
		t.Errorf("Server saw %d queries outstanding on one connection, cap is 8", m)
	}
	if h := s.Handshakes(); h > 2 {
		t.Errorf("Handshakes = %d, want at most MaxConns = 2", h)
	}
}

// runLoad sends workers*per queries and fails the test on any error or mismatched
// answer. onErr, if set, is told about errors instead.
func runLoad(t *testing.T, p *Pool, workers, per int, onErr func(error)) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				name := fmt.Sprintf("w%d-q%d.Example.", w, i)
				r, err := exchange(p, name)
				if err != nil {
					if onErr != nil {
						onErr(err)
						continue
					}
					t.Errorf("Query %s: %v", name, err)
					return
				}
				if r.Question[0].Name != name || len(r.Answer) != 1 || r.Answer[0].Header().Name != name {
					t.Errorf("Query %s got the answer for %v", name, r.Question)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestMaxConnsNeverExceeded(t *testing.T) {
	var peak atomic.Int64
	var s *dottest.Server
	s = dottest.Start(t, dottest.Options{
		Delay: func(dns.Question) time.Duration {
			if n := int64(s.Conns()); n > peak.Load() {
				peak.Store(n)
			}
			return 5 * time.Millisecond
		},
	})
	p, _ := newTestPool(t, s, func(c *Config) { c.MaxInflight = 4; c.MaxConns = 2 })
	runLoad(t, p, 30, 10, nil)
	if got := peak.Load(); got > 2 {
		t.Errorf("Server saw %d connections at once, MaxConns is 2", got)
	}
	if got := s.Handshakes(); got > 2 {
		t.Errorf("Handshakes = %d, want <= 2", got)
	}
}

// A server that closes every connection after 50 answers, with queries pending,
// loses nothing: unwritten queries move, written ones are replayed once.
func TestServerClosingEvery50AnswersLosesNothing(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	s := dottest.Start(t, dottest.Options{
		CloseAfter: 50,
		OnQuery: func(wire []byte) {
			m := new(dns.Msg)
			if m.Unpack(wire) == nil {
				mu.Lock()
				seen[strings.ToLower(m.Question[0].Name)]++
				mu.Unlock()
			}
		},
	})
	p, rec := newTestPool(t, s, nil)
	runLoad(t, p, 50, 40, nil)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2000 {
		t.Errorf("Server saw %d distinct names, want 2000", len(seen))
	}
	for name, n := range seen {
		if n > 2 {
			t.Errorf("%s was written %d times, want at most 2", name, n)
		}
	}
	cuts := rec.get(func(r *recorder) int { return r.closes[CloseServer] })
	drained := rec.get(func(r *recorder) int { return r.closes[CloseLimit] })
	if cuts == 0 {
		t.Error("The server never cut a connection: the test tests nothing")
	}
	// After the first cut the pool knows the limit and drains connections before
	// the server cuts them.
	if drained < 30 || cuts > 5 {
		t.Errorf("Connections drained at the learned limit = %d, cut by the server = %d; want most drained", drained, cuts)
	}
	t.Logf("Handshakes %d (resumed %d), replays %d", s.Handshakes(), s.Resumed(), rec.get(func(r *recorder) int { return r.replays }))
}

// When a connection dies with queries not yet written, they move to another
// connection without counting as a replay.
func TestUnwrittenQueriesMoveAtNoCost(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	g := newGate()
	p, rec := newTestPool(t, s, func(c *Config) { c.Dial = g.Dial; c.MaxConns = 1 })
	if _, err := exchange(p, "warm.example."); err != nil {
		t.Fatal(err)
	}
	g.hold()
	const n = 10
	var wg sync.WaitGroup
	var failed atomic.Int64
	run := func(i int) {
		defer wg.Done()
		if _, err := exchange(p, fmt.Sprintf("q%d.example.", i)); err != nil {
			failed.Add(1)
			t.Logf("Query %d: %v", i, err)
		}
	}
	wg.Add(1)
	go run(0)
	<-g.entered // query 0 is in the blocked write; the rest will stay queued
	for i := 1; i < n; i++ {
		wg.Add(1)
		go run(i)
	}
	waitFor(t, "all queries to be queued", func() bool { return p.Stats().Inflight == n })
	g.mu.Lock()
	first := g.conns[0]
	g.mu.Unlock()
	first.Close() // the blocked write fails once released; the connection dies
	g.release()
	wg.Wait()
	if f := failed.Load(); f != 0 {
		t.Errorf("%d queries failed, want 0", f)
	}
	if r := rec.get(func(r *recorder) int { return r.replays }); r != 1 {
		t.Errorf("Replays = %d, want 1: only the query inside the failed write", r)
	}
}

func TestStalledConnectionIsReplaced(t *testing.T) {
	var seen sync.Map // names the server has received: it drops each the first time
	s := dottest.Start(t, dottest.Options{Drop: func(q dns.Question) bool {
		_, again := seen.LoadOrStore(q.Name, true)
		return !again && q.Name != "first.example."
	}})
	p, rec := newTestPool(t, s, func(c *Config) { c.StallTimeout = 100 * time.Millisecond })
	if _, err := exchange(p, "first.example."); err != nil {
		t.Fatal(err)
	}
	// The connection answers neither of the next two queries: the second is
	// rescued on a fresh connection (it waits behind the first with nothing
	// read), and the stall detector must close the connection and replay the first.
	var wg sync.WaitGroup
	for _, name := range []string{"second.example.", "third.example."} {
		wg.Go(func() {
			if _, err := exchange(p, name); err != nil {
				t.Errorf("%s after stall: %v", name, err)
			}
		})
	}
	wg.Wait()
	if got := rec.get(func(r *recorder) int { return r.closes[CloseStall] }); got != 1 {
		t.Errorf("Stall closes = %d, want 1", got)
	}
	if got := rec.get(func(r *recorder) int { return r.replays + r.rescues }); got != 2 {
		t.Errorf("Replays + rescues = %d, want 2", got)
	}
}

// One slow answer never closes a connection that keeps answering other queries.
func TestSlowAnswerDoesNotCloseLiveConnection(t *testing.T) {
	release := make(chan struct{})
	s := dottest.Start(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		if strings.HasPrefix(q.Question[0].Name, "slow.") {
			<-release
		}
		return dottest.DefaultAnswer(q)
	}})
	p, rec := newTestPool(t, s, func(c *Config) { c.StallTimeout = 50 * time.Millisecond })
	slow := make(chan error, 1)
	go func() {
		_, err := exchange(p, "slow.example.")
		slow <- err
	}()
	waitFor(t, "the slow query to reach the server", func() bool { return s.Queries() == 1 })
	// Keep the connection answering for several stall timeouts.
	for start := time.Now(); time.Since(start) < 300*time.Millisecond; {
		if _, err := exchange(p, "fast.example."); err != nil {
			t.Fatalf("Fast query: %v", err)
		}
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatalf("Slow query: %v", err)
	}
	// (A fast query stuck for a scheduling hiccup may be rescued on a second
	// connection: that one may be dialled, but none is closed.)
	if got := rec.get(func(r *recorder) int { return len(r.closes) }); got != 0 {
		t.Errorf("%d connections closed (by reason), want none", got)
	}
}

func TestBlackHoleTimesOut(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Drop: func(dns.Question) bool { return true }})
	p, rec := newTestPool(t, s, func(c *Config) { c.ReadTimeout = 100 * time.Millisecond })
	_, err := exchange(p, "void.example.")
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("Exchange error = %v, want ErrTimeout", err)
	}
	if got := rec.get(func(r *recorder) int { return r.timeouts }); got != 1 {
		t.Errorf("Timeouts = %d, want 1", got)
	}
}

// A late answer to a query that timed out is dropped, never handed to anyone.
func TestLateAnswerIsDropped(t *testing.T) {
	release := make(chan struct{})
	s := dottest.Start(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
		if strings.HasPrefix(q.Question[0].Name, "late.") {
			<-release
		}
		return dottest.DefaultAnswer(q)
	}})
	p, rec := newTestPool(t, s, func(c *Config) { c.ReadTimeout = 100 * time.Millisecond })
	if _, err := exchange(p, "warm.example."); err != nil {
		t.Fatal(err)
	}
	if _, err := exchange(p, "late.example."); !errors.Is(err, ErrTimeout) {
		t.Fatalf("Late query error = %v, want ErrTimeout", err)
	}
	if got := p.Stats().Inflight; got != 1 {
		t.Errorf("In flight after timeout = %d, want 1 (the tombstone)", got)
	}
	close(release)
	waitFor(t, "the late answer to be dropped", func() bool {
		return rec.get(func(r *recorder) int { return r.drops[DropLate] }) == 1
	})
	if got := p.Stats().Inflight; got != 0 {
		t.Errorf("In flight after the late answer = %d, want 0", got)
	}
	r, err := exchange(p, "next.example.")
	if err != nil || r.Question[0].Name != "next.example." {
		t.Fatalf("Next query: %v %v", r, err)
	}
}

func TestWrongQuestionAndIDAreDroppedConnectionKept(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Mutate: func(q, r *dns.Msg) {
		switch q.Question[0].Name {
		case "wrongq.example.":
			r.Question[0].Name = "other.example."
		case "wrongid.example.":
			r.Id ^= 0x8000
		}
	}})
	p, rec := newTestPool(t, s, func(c *Config) { c.ReadTimeout = 100 * time.Millisecond; c.TombstoneTTL = 50 * time.Millisecond })
	for _, name := range []string{"wrongq.example.", "wrongid.example."} {
		if _, err := exchange(p, name); !errors.Is(err, ErrTimeout) {
			t.Errorf("%s: error = %v, want ErrTimeout (its answer must be dropped)", name, err)
		}
		// Its tombstone gone, the next query is not stuck behind it (and rescued).
		waitFor(t, "the tombstone to expire", func() bool { return p.Stats().Inflight == 0 })
	}
	if got := rec.get(func(r *recorder) int { return r.drops[DropWrongQuestion] }); got != 1 {
		t.Errorf("Wrong-question drops = %d, want 1", got)
	}
	if got := rec.get(func(r *recorder) int { return r.drops[DropUnknownID] }); got != 1 {
		t.Errorf("Unknown-ID drops = %d, want 1", got)
	}
	if _, err := exchange(p, "fine.example."); err != nil {
		t.Fatalf("Query after drops: %v", err)
	}
	if h := s.Handshakes(); h != 1 {
		t.Errorf("Handshakes = %d, want 1: drops must not close the connection", h)
	}
}

// Callers beyond the pool's capacity wait, bounded by their context.
func TestBackPressureIsBoundedByContext(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Drop: func(dns.Question) bool { return true }})
	p, _ := newTestPool(t, s, func(c *Config) { c.MaxConns = 1; c.MaxInflight = 2; c.ReadTimeout = 5 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Exchange(ctx, newQuery("fill.example.", dns.TypeA))
		}()
	}
	waitFor(t, "the connection to fill", func() bool { return p.Stats().Inflight == 2 })
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	_, err := p.Exchange(short, newQuery("waits.example.", dns.TypeA))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Third query error = %v, want context.DeadlineExceeded", err)
	}
	if got := p.Stats().Inflight; got != 2 {
		t.Errorf("In flight = %d, want the cap 2", got)
	}
	cancel()
	wg.Wait()
}

// A dial is shared by all waiters and not cancelled when one of them gives up.
func TestDialIsSharedAndSurvivesCallerCancel(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	hold := make(chan struct{})
	var dials atomic.Int64
	p, _ := newTestPool(t, s, func(c *Config) {
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			<-hold
			return newGate().Dial(ctx, network, addr)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() {
		_, err := p.Exchange(ctx, newQuery("first.example.", dns.TypeA))
		first <- err
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := exchange(p, fmt.Sprintf("w%d.example.", i)); err != nil {
				errs <- err
			}
		}()
	}
	waitFor(t, "the dial to start", func() bool { return dials.Load() == 1 })
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("Cancelled caller error = %v, want context.Canceled", err)
	}
	close(hold)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Waiter failed: %v", err)
	}
	if d := dials.Load(); d != 1 {
		t.Errorf("Dials = %d, want 1 shared dial", d)
	}
}

func TestIdleConnectionCloses(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	p, rec := newTestPool(t, s, func(c *Config) { c.IdleTimeout = 50 * time.Millisecond })
	if _, err := exchange(p, "a.example."); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the idle close", func() bool { return p.Stats().Conns == 0 && s.Conns() == 0 })
	if got := rec.get(func(r *recorder) int { return r.closes[CloseIdle] }); got != 1 {
		t.Errorf("Idle closes = %d, want 1", got)
	}
	// The next dial resumes the TLS session.
	if _, err := exchange(p, "b.example."); err != nil {
		t.Fatal(err)
	}
	if s.Resumed() != 1 || rec.get(func(r *recorder) int { return r.resumed }) != 1 {
		t.Errorf("Resumed handshakes: server %d, pool %d, want 1", s.Resumed(), rec.get(func(r *recorder) int { return r.resumed }))
	}
}

func TestMaxAgeDrainsConnection(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	p, rec := newTestPool(t, s, func(c *Config) { c.MaxAge = 50 * time.Millisecond })
	if _, err := exchange(p, "a.example."); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the max-age close", func() bool { return rec.get(func(r *recorder) int { return r.closes[CloseMaxAge] }) == 1 })
	if _, err := exchange(p, "b.example."); err != nil {
		t.Fatal(err)
	}
	if h := s.Handshakes(); h != 2 {
		t.Errorf("Handshakes = %d, want 2", h)
	}
}

// A server that completes the handshake and closes at once is not redialled in a
// tight loop: a handshake alone does not reset the backoff.
func TestHandshakeThenCloseBacksOff(t *testing.T) {
	s := dottest.Start(t, dottest.Options{CloseAfterHandshake: true})
	b := Backoff{Base: 100 * time.Millisecond, Jitter: 0.01}
	p, _ := newTestPool(t, s, func(c *Config) { c.Backoff = b })
	var unavailable int
	// Until four handshakes (three backoffs) are in, bounded in count and time;
	// a query that fails fast in backoff is followed by a millisecond's pause, the
	// pace at which the test probes the backoff.
	for i, start := 0, time.Now(); i < 10000 && s.Handshakes() < 4 && time.Since(start) < 10*time.Second; i++ {
		_, err := exchange(p, "x.example.")
		switch {
		case err == nil:
			t.Fatal("Query succeeded against a server that closes every connection")
		case errors.Is(err, ErrUnavailable):
			unavailable++
			time.Sleep(time.Millisecond)
		case !errors.Is(err, ErrConnLost) && !errors.Is(err, ErrTimeout):
			t.Fatalf("Error = %v, want ErrConnLost, ErrUnavailable or ErrTimeout", err)
		}
	}
	// Each dial waits out the backoff of the failures before it: 100ms, 160ms,
	// 256ms (±1%). A lower bound, so a slow machine cannot break it.
	times := s.HandshakeTimes()
	if len(times) < 3 {
		t.Fatalf("%d handshakes, want at least 3", len(times))
	}
	for i := 1; i < len(times); i++ {
		least := time.Duration(float64(b.Base) * math.Pow(DefaultBackoffMultiplier, float64(i-1)) * 0.99)
		if gap := times[i].Sub(times[i-1]); gap < least {
			t.Errorf("Handshake %d came %v after the one before, want at least the backoff of %v", i+1, gap, least)
		}
	}
	if unavailable == 0 {
		t.Error("No query failed fast with ErrUnavailable during backoff")
	}
	if p.Stats().Strikes < 2 {
		t.Errorf("Consecutive failures = %d, want >= 2", p.Stats().Strikes)
	}
}

func TestDialFailureIsUnavailableUntilBackoffPasses(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	addr := s.Addr
	s.Close() // nothing listens there now
	p, err := New(Config{Addr: addr, TLS: s.ClientTLS(), Backoff: Backoff{Base: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := exchange(p, "a.example."); !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrDial) {
		t.Errorf("First error = %v, want ErrUnavailable wrapping ErrDial", err)
	}
	if _, err := exchange(p, "b.example."); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Second error = %v, want ErrUnavailable at once", err)
	}
}

func TestCloseFailsWaitersAndLeavesNoGoroutines(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Drop: func(dns.Question) bool { return true }})
	p, err := New(Config{Addr: s.Addr, TLS: s.ClientTLS(), ReadTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := exchange(p, fmt.Sprintf("q%d.example.", i))
			errs <- err
		}()
	}
	waitFor(t, "queries in flight", func() bool { return p.Stats().Inflight == n })
	p.Close()
	for range n {
		if err := <-errs; !errors.Is(err, ErrPoolClosed) {
			t.Errorf("Waiter error = %v, want ErrPoolClosed", err)
		}
	}
	if _, err := exchange(p, "after.example."); !errors.Is(err, ErrPoolClosed) {
		t.Errorf("Exchange after Close = %v, want ErrPoolClosed", err)
	}
	checkNoPoolGoroutines(t)
}

func TestCloseDoesNotHangOnDeadPeer(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Drop: func(dns.Question) bool { return true }})
	g := newGate()
	p, err := New(Config{Addr: s.Addr, TLS: s.ClientTLS(), Dial: g.Dial, ReadTimeout: time.Minute, WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	go exchange(p, "warm.example.")
	waitFor(t, "the query to be written", func() bool { return s.Queries() == 1 })
	g.hold() // every further write blocks forever, like a peer that stopped reading
	go exchange(p, "stuck.example.")
	<-g.entered
	done := make(chan struct{})
	go func() {
		p.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung on a peer that does not read")
	}
	g.release()
	checkNoPoolGoroutines(t)
}

// Callers beyond the slots wait, but only as many as there are slots: the rest
// fail at once instead of piling up.
func TestWaitersAreBounded(t *testing.T) {
	s := dottest.Start(t, dottest.Options{Drop: func(dns.Question) bool { return true }})
	p, _ := newTestPool(t, s, func(c *Config) { c.MaxConns = 1; c.MaxInflight = 2; c.ReadTimeout = 5 * time.Second })
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	fill := func(n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.Exchange(ctx, newQuery("fill.example.", dns.TypeA))
			}()
		}
	}
	fill(2)
	waitFor(t, "the slots to fill", func() bool { return p.Stats().Inflight == 2 })
	fill(2 * maxWaitersPerSlot)
	waitFor(t, "the slots and the waiting room to fill", func() bool {
		return p.Stats().Inflight == 2 && p.waiters.Load() == 2*maxWaitersPerSlot
	})
	_, err := exchange(p, "one-too-many.example.")
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("One caller too many: error = %v, want ErrUnavailable at once", err)
	}
	cancel()
	wg.Wait()
}
