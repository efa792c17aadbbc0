package dot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
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

// Every query is answered with its own question under concurrency, answers arrive
// in random order, and in-flight never exceeds the per-connection cap.
func TestConcurrentAnswersMatchQuestions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{
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
	})
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
	synctest.Test(t, func(t *testing.T) {
		var peak atomic.Int64
		var s *dottest.Server
		s = startPipe(t, dottest.Options{
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
	})
}

// A server that closes every connection after 50 answers, with queries pending,
// loses nothing: unwritten queries move, written ones are replayed once.
func TestServerClosingEvery50AnswersLosesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		seen := map[string]int{}
		s := startPipe(t, dottest.Options{
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
	})
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
	synctest.Test(t, func(t *testing.T) {
		var seen sync.Map // names the server has received: it drops each the first time
		s := startPipe(t, dottest.Options{Drop: func(q dns.Question) bool {
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
	})
}

// One slow answer never closes a connection that keeps answering other queries.
func TestSlowAnswerDoesNotCloseLiveConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		s := startPipe(t, dottest.Options{
			Handler: func(q *dns.Msg) *dns.Msg {
				if strings.HasPrefix(q.Question[0].Name, "slow.") {
					<-release
				}
				return dottest.DefaultAnswer(q)
			},
			// A fast answer takes a millisecond (of the bubble's clock), so
			// that the sweeper's ticks find a fast query outstanding behind
			// the slow one, as they do now and then on a real clock.
			Delay: func(q dns.Question) time.Duration {
				if strings.HasPrefix(q.Name, "fast.") {
					return time.Millisecond
				}
				return 0
			},
		})
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
	})
}

// Callers beyond the pool's capacity wait, bounded by their context.
func TestBackPressureIsBoundedByContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{Drop: func(dns.Question) bool { return true }})
		p, _ := newTestPool(t, s, func(c *Config) { c.MaxConns = 1; c.MaxInflight = 2; c.ReadTimeout = 5 * time.Second })
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Distinct names: identical ones would share one upstream query.
				p.Exchange(ctx, newQuery(fmt.Sprintf("fill%d.example.", i), dns.TypeA))
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
	})
}

// A dial is shared by all waiters and not cancelled when one of them gives up.
// In a bubble, so that the queries come together however slow the machine,
// and a dial that is never released cannot hang the pool's Close (the test
// held its dials on a channel until it ended, and a failed wait never
// released them).
func TestDialIsSharedAndSurvivesCallerCancel(t *testing.T) {
	var dials atomic.Int64
	count := func(c *Config) {
		dial := c.Dial
		c.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return dial(ctx, network, addr)
		}
	}
	bubble(t, dottest.Options{}, 50*time.Millisecond, count, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		ctx, cancel := context.WithCancel(context.Background())
		first := make(chan error, 1)
		go func() {
			_, err := p.Exchange(ctx, newQuery("first.example.", dns.TypeA))
			first <- err
		}()
		var wg sync.WaitGroup
		errs := make(chan error, 5)
		for i := range 5 {
			wg.Go(func() {
				if _, err := exchange(p, fmt.Sprintf("w%d.example.", i)); err != nil {
					errs <- err
				}
			})
		}
		synctest.Wait() // every query waits for the dial under way
		if d := dials.Load(); d != 1 {
			t.Fatalf("Dials under way = %d, want 1 shared dial", d)
		}
		cancel()
		if err := <-first; !errors.Is(err, context.Canceled) {
			t.Errorf("Cancelled caller error = %v, want context.Canceled", err)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("Waiter failed: %v", err)
		}
		if d := dials.Load(); d != 1 {
			t.Errorf("Dials = %d, want 1 shared dial", d)
		}
	})
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

// (Over TCP, not in a synctest bubble: Close waits for its writer, which holds
// the socket's batch lock in the blocked write while tls.Conn.Close waits for
// that lock to send close_notify. A goroutine waiting for a mutex is not
// durably blocked, so a bubble's clock would never reach closeGrace.)
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
	var filled atomic.Int64
	fill := func(n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Distinct names: identical ones would share one upstream query.
				p.Exchange(ctx, newQuery(fmt.Sprintf("fill%d.example.", filled.Add(1)), dns.TypeA))
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
