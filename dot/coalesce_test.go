package dot

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// heldServer is a DoT server whose answers wait until the test opens it, so that
// queries are in flight together for as long as the test needs. It serves
// in-memory pipes: start it inside a synctest bubble.
type heldServer struct {
	*dottest.Server
	release chan struct{}
	once    sync.Once
}

func startHeld(t *testing.T, opts dottest.Options) *heldServer {
	t.Helper()
	h := &heldServer{release: make(chan struct{})}
	next := opts.Handler
	if next == nil {
		next = dottest.DefaultAnswer
	}
	opts.Handler = func(q *dns.Msg) *dns.Msg {
		<-h.release
		return next(q)
	}
	h.Server = startPipe(t, opts)
	t.Cleanup(h.open) // before the server's Close, which waits for held answers
	return h
}

// open lets every held and later answer go.
func (h *heldServer) open() { h.once.Do(func() { close(h.release) }) }

// waiting returns how many queries wait on p's open flights.
func waiting(p *Pool) int {
	if p.flights == nil {
		return 0
	}
	n := 0
	for i := range p.flights.shards {
		s := &p.flights.shards[i]
		s.mu.Lock()
		for _, sl := range s.slots {
			if sl.q != nil {
				n += int(sl.q.fl.joined)
			}
		}
		for _, l := range s.more {
			n += int(l.fl.joined)
		}
		s.mu.Unlock()
	}
	return n
}

// awaitInFlight waits until n queries have reached the server or a flight.
func awaitInFlight(t *testing.T, s *heldServer, p *Pool, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d queries to reach the upstream or a flight", n), func() bool {
		return s.Queries() > 0 && int(s.Queries())+waiting(p) == n
	})
}

// mixedCase spells name with the letters' case chosen by the bits of i.
func mixedCase(name string, i int) string {
	b := []byte(name)
	for j, c := range b {
		if 'a' <= c && c <= 'z' && (i>>(j%16))&1 == 1 {
			b[j] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// outcome is one query's result.
type outcome struct {
	q, r *dns.Msg
	err  error
}

// send runs the exchange of m in the background, bounded by deadline.
func send(p *Pool, ctx context.Context, m *dns.Msg, deadline time.Time, out chan<- outcome) {
	go func() {
		r, err := p.ExchangeDeadline(ctx, m, deadline)
		out <- outcome{m, r, err}
	}()
}

// checkOwnAnswer checks that r is an answer built for q: its ID, its question
// spelled as q spells it, owner names too, and an OPT only if q had one.
func checkOwnAnswer(t *testing.T, o outcome) {
	t.Helper()
	q, r := o.q, o.r
	name := q.Question[0].Name
	switch {
	case o.err != nil:
		t.Errorf("Query %d for %s: %v", q.Id, name, o.err)
	case r.Id != q.Id || r.Rcode != dns.RcodeSuccess:
		t.Errorf("Query %d for %s: answer ID %d, rcode %s", q.Id, name, r.Id, dns.RcodeToString[r.Rcode])
	case len(r.Question) != 1 || r.Question[0] != q.Question[0]:
		t.Errorf("Query %d: answer question %v, want %v", q.Id, r.Question, q.Question[0])
	case q.Question[0].Qtype == dns.TypeA && (len(r.Answer) != 1 || r.Answer[0].Header().Name != name):
		t.Errorf("Query %d for %s: answer records %v, want an owner spelled as the question", q.Id, name, r.Answer)
	case (r.IsEdns0() != nil) != (q.IsEdns0() != nil):
		t.Errorf("Query %d: OPT in the query %v, in the answer %v", q.Id, q.IsEdns0() != nil, r.IsEdns0() != nil)
	}
}

// Identical queries in flight together reach the upstream once, and each gets an
// answer of its own: its ID, its spelling of the name in the question and in the
// owner names (whether the upstream compresses them to the question or not), an
// OPT only if it sent one, and no message or record shared with another.
func TestCoalesceIdenticalQueries(t *testing.T) {
	for _, compress := range []bool{false, true} {
		t.Run(fmt.Sprintf("compress=%v", compress), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := startHeld(t, dottest.Options{Handler: func(q *dns.Msg) *dns.Msg {
					r := dottest.DefaultAnswer(q)
					r.Compress = compress
					return r
				}})
				p, rec := newTestPool(t, s.Server, nil)
				const n = 64
				out := make(chan outcome, n)
				for i := range n {
					m := newQuery(mixedCase("www.coalesce.example.", i*7919), dns.TypeA)
					m.Id = uint16(1000 + i)
					if i%2 == 1 {
						m.SetEdns0(1232, false) // the OPT the pool adds to the others: the same upstream query
					}
					send(p, context.Background(), m, time.Now().Add(10*time.Second), out)
				}
				awaitInFlight(t, s, p, n)
				s.open()
				msgs := map[*dns.Msg]bool{}
				rrs := map[dns.RR]bool{}
				for range n {
					o := <-out
					checkOwnAnswer(t, o)
					if o.r == nil {
						continue
					}
					if msgs[o.r] || len(o.r.Answer) > 0 && rrs[o.r.Answer[0]] {
						t.Errorf("Query %d got a message or record another query got too", o.q.Id)
					}
					msgs[o.r] = true
					for _, rr := range append(o.r.Answer, o.r.Extra...) {
						rrs[rr] = true
					}
				}
				if got := s.Queries(); got != 1 {
					t.Errorf("The upstream got %d queries, want 1 for %d identical ones in flight", got, n)
				}
				if got := rec.get(func(r *recorder) int { return r.coalesced }); got != n-1 {
					t.Errorf("Coalesced = %d, want %d", got, n-1)
				}
			})
		})
	}
}

// ecs and cookie are EDNS options a query may carry.
func ecs(ip string) dns.EDNS0 {
	return &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.ParseIP(ip).To4()}
}

func cookie(c string) dns.EDNS0 { return &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: c} }

func withOption(o dns.EDNS0) func(*dns.Msg) {
	return func(m *dns.Msg) { m.IsEdns0().Option = append(m.IsEdns0().Option, o) }
}

// Queries that differ in anything that can change the upstream's answer are never
// merged; a third query that differs from the first only in the name's case is,
// so each case sends exactly two queries upstream.
func TestCoalesceKeepsDifferentQueriesApart(t *testing.T) {
	cases := []struct {
		name    string
		base    func(*dns.Msg) // applied to all three
		variant func(*dns.Msg)
	}{
		{name: "DO", variant: func(m *dns.Msg) { m.IsEdns0().SetDo() }},
		{name: "CD", variant: func(m *dns.Msg) { m.CheckingDisabled = true }},
		{name: "RD", variant: func(m *dns.Msg) { m.RecursionDesired = false }},
		{name: "AD", variant: func(m *dns.Msg) { m.AuthenticatedData = true }},
		{name: "buffer size", variant: func(m *dns.Msg) { m.IsEdns0().SetUDPSize(4096) }},
		{name: "ECS", variant: withOption(ecs("192.0.2.0"))},
		{name: "ECS subnet", base: withOption(ecs("192.0.2.0")), variant: func(m *dns.Msg) {
			m.IsEdns0().Option[0] = ecs("198.51.100.0")
		}},
		{name: "cookie", variant: withOption(cookie("0102030405060708"))},
		{name: "cookie value", base: withOption(cookie("0102030405060708")), variant: func(m *dns.Msg) {
			m.IsEdns0().Option[0] = cookie("0807060504030201")
		}},
		{name: "type", variant: func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA }},
		{name: "class", variant: func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS }},
		{name: "name", variant: func(m *dns.Msg) { m.Question[0].Name = "kez.example." }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := startHeld(t, dottest.Options{})
				p, _ := newTestPool(t, s.Server, nil)
				build := func(id uint16, name string, mod func(*dns.Msg)) *dns.Msg {
					m := newQuery(name, dns.TypeA)
					m.Id = id
					m.SetEdns0(1232, false)
					for _, f := range []func(*dns.Msg){tc.base, mod} {
						if f != nil {
							f(m)
						}
					}
					return m
				}
				out := make(chan outcome, 3)
				deadline := time.Now().Add(10 * time.Second)
				send(p, context.Background(), build(1, "key.example.", nil), deadline, out)
				waitFor(t, "the first query upstream", func() bool { return s.Queries() == 1 })
				send(p, context.Background(), build(2, "KeY.example.", nil), deadline, out)
				send(p, context.Background(), build(3, "key.example.", tc.variant), deadline, out)
				awaitInFlight(t, s, p, 3)
				s.open()
				for range 3 {
					checkOwnAnswer(t, <-out)
				}
				if got := s.Queries(); got != 2 {
					t.Errorf("The upstream got %d queries, want 2: the variant alone, the other two merged", got)
				}
			})
		})
	}
}

// Only a plain QUERY without records besides its OPT is shared: identical queries
// of another opcode, or carrying another record, each go upstream.
func TestCoalesceOnlyPlainQueries(t *testing.T) {
	glue := &dns.A{Hdr: dns.RR_Header{Name: "glue.example.", Rrtype: dns.TypeA, Class: dns.ClassINET}, A: net.IPv4(192, 0, 2, 9)}
	cases := map[string]func(*dns.Msg){
		"NOTIFY":       func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify },
		"extra record": func(m *dns.Msg) { m.Extra = append(m.Extra, glue) },
	}
	for name, mod := range cases {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := startHeld(t, dottest.Options{})
				p, _ := newTestPool(t, s.Server, nil)
				out := make(chan outcome, 2)
				for i := range 2 {
					m := newQuery("plain.example.", dns.TypeA)
					m.Id = uint16(i + 1)
					mod(m)
					send(p, context.Background(), m, time.Now().Add(10*time.Second), out)
				}
				awaitInFlight(t, s, p, 2)
				s.open()
				for range 2 {
					if o := <-out; o.err != nil || o.r.Id != o.q.Id {
						t.Errorf("Query %d: %v", o.q.Id, o.err)
					}
				}
				if got := s.Queries(); got != 2 {
					t.Errorf("The upstream got %d queries, want 2", got)
				}
			})
		})
	}
}

// A waiter whose deadline passes, or whose context is cancelled, gets its error
// at once; the leader and the other waiter still get the answer, from one
// upstream query.
func TestCoalesceWaiterDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startHeld(t, dottest.Options{})
		p, _ := newTestPool(t, s.Server, nil)
		long := time.Now().Add(10 * time.Second)
		out := make(chan outcome, 2)
		send(p, context.Background(), newQuery("deadline.example.", dns.TypeA), long, out)
		waitFor(t, "the leader upstream", func() bool { return s.Queries() == 1 })
		send(p, context.Background(), newQuery("Deadline.example.", dns.TypeA), long, out)

		ctx, cancel := context.WithCancel(context.Background())
		cancelled := make(chan error, 1)
		go func() {
			_, err := p.ExchangeDeadline(ctx, newQuery("deadline.EXAMPLE.", dns.TypeA), long)
			cancelled <- err
		}()
		awaitInFlight(t, s, p, 3)
		start := time.Now()
		_, err := p.ExchangeDeadline(context.Background(), newQuery("DEADLINE.example.", dns.TypeA), start.Add(100*time.Millisecond))
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, ErrTimeout) {
			t.Errorf("Waiter past its deadline: %v, want ErrTimeout and context.DeadlineExceeded", err)
		}
		// The bubble's clock moves only while every goroutine waits: the
		// waiter returns at its deadline exactly.
		if took := time.Since(start); took != 100*time.Millisecond {
			t.Errorf("Waiter returned after %v, want its deadline, 100ms", took)
		}
		cancel()
		if err := <-cancelled; !errors.Is(err, context.Canceled) {
			t.Errorf("Cancelled waiter: %v, want context.Canceled", err)
		}
		s.open()
		for range 2 {
			checkOwnAnswer(t, <-out)
		}
		if got := s.Queries(); got != 1 {
			t.Errorf("The upstream got %d queries, want 1", got)
		}
	})
}

// When the leader's caller gives up, its waiters are not failed with it: they try
// again, one of them leading, and get the answer of the second upstream query.
func TestCoalesceLeaderGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startHeld(t, dottest.Options{})
		p, rec := newTestPool(t, s.Server, nil)
		ctx, cancel := context.WithCancel(context.Background())
		leader := make(chan error, 1)
		go func() {
			_, err := p.ExchangeDeadline(ctx, newQuery("giveup.example.", dns.TypeA), time.Time{})
			leader <- err
		}()
		waitFor(t, "the leader upstream", func() bool { return s.Queries() == 1 })
		const n = 8
		out := make(chan outcome, n)
		for i := range n {
			m := newQuery(mixedCase("giveup.example.", i+1), dns.TypeA)
			m.Id = uint16(100 + i)
			send(p, context.Background(), m, time.Now().Add(10*time.Second), out)
		}
		awaitInFlight(t, s, p, n+1)
		cancel()
		if err := <-leader; !errors.Is(err, context.Canceled) {
			t.Errorf("Leader: %v, want context.Canceled", err)
		}
		waitFor(t, "a waiter to lead a new query", func() bool { return s.Queries() == 2 && waiting(p) == n-1 })
		s.open()
		for range n {
			checkOwnAnswer(t, <-out)
		}
		if got := s.Queries(); got != 2 {
			t.Errorf("The upstream got %d queries, want 2", got)
		}
		if got := rec.get(func(r *recorder) int { return r.coalesced }); got != n-1 {
			t.Errorf("Coalesced = %d, want %d", got, n-1)
		}
	})
}

// When the upstream fails the leader's exchange (its connection closes before the
// answer, or no answer comes within ReadTimeout), every waiter gets that error at
// once, with its own deadline still open, and can fail over as if it had sent the
// query itself.
func TestCoalesceUpstreamFailure(t *testing.T) {
	cases := []struct {
		name string
		fail func(s *heldServer)
		want error
	}{
		{"connection closed", func(s *heldServer) { s.CloseConns() }, ErrConnLost},
		{"timeout", func(*heldServer) {}, ErrTimeout},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := startHeld(t, dottest.Options{})
				p, _ := newTestPool(t, s.Server, func(c *Config) { c.ReadTimeout = 500 * time.Millisecond })
				const n = 8
				out := make(chan outcome, n)
				deadline := time.Now().Add(10 * time.Second)
				for i := range n {
					send(p, context.Background(), newQuery(mixedCase("fail.example.", i), dns.TypeA), deadline, out)
				}
				awaitInFlight(t, s, p, n)
				tc.fail(s)
				for range n {
					o := <-out
					if !errors.Is(o.err, tc.want) || errors.Is(o.err, context.DeadlineExceeded) {
						t.Errorf("Query for %s: %v, want %v, not the caller's deadline", o.q.Question[0].Name, o.err, tc.want)
					}
				}
				if time.Now().After(deadline) {
					t.Error("The waiters waited for their deadline")
				}
				if got := s.Queries(); got != 1 {
					t.Errorf("The upstream got %d queries, want 1", got)
				}
			})
		})
	}
}

// Closing the pool ends the flight: leader and waiters return with an error.
func TestCoalescePoolClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startHeld(t, dottest.Options{})
		p, _ := newTestPool(t, s.Server, nil)
		const n = 8
		out := make(chan outcome, n)
		for range n {
			send(p, context.Background(), newQuery("close.example.", dns.TypeA), time.Time{}, out)
		}
		awaitInFlight(t, s, p, n)
		p.Close()
		for range n {
			if o := <-out; !errors.Is(o.err, ErrPoolClosed) && !errors.Is(o.err, ErrConnLost) {
				t.Errorf("After Close: %v, want ErrPoolClosed or ErrConnLost", o.err)
			}
		}
		if got := s.Queries(); got != 1 {
			t.Errorf("The upstream got %d queries, want 1", got)
		}
	})
}

// A flight takes at most maxJoiners waiters; the next query leads a new one.
func TestCoalesceJoinersAreBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startHeld(t, dottest.Options{})
		p, _ := newTestPool(t, s.Server, nil)
		const n = maxJoiners + 3 // a leader and its waiters, then a second leader and a waiter
		out := make(chan outcome, n)
		for range n {
			send(p, context.Background(), newQuery("bounded.example.", dns.TypeA), time.Now().Add(10*time.Second), out)
		}
		// The full flight is out of the map: only the second one's waiter is seen.
		waitFor(t, "two flights", func() bool { return s.Queries() == 2 && waiting(p) == 1 })
		s.open()
		for range n {
			if o := <-out; o.err != nil {
				t.Errorf("Query: %v", o.err)
			}
		}
		if got := s.Queries(); got != 2 {
			t.Errorf("The upstream got %d queries, want 2 for %d identical ones", got, n)
		}
	})
}

// Without coalescing, identical queries in flight each go upstream.
func TestNoCoalesce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startHeld(t, dottest.Options{})
		p, rec := newTestPool(t, s.Server, func(c *Config) { c.NoCoalesce = true })
		const n = 8
		out := make(chan outcome, n)
		for range n {
			send(p, context.Background(), newQuery("each.example.", dns.TypeA), time.Now().Add(10*time.Second), out)
		}
		// At least: the pool may rescue some of them, held behind the first, onto
		// another connection.
		waitFor(t, "every query upstream", func() bool { return s.Queries() >= n })
		s.open()
		for range n {
			checkOwnAnswer(t, <-out)
		}
		if got := rec.get(func(r *recorder) int { return r.coalesced }); got != 0 {
			t.Errorf("Coalesced = %d, want 0", got)
		}
	})
}
