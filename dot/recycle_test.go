package dot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// nonceOption is the EDNS option a stress query carries its nonce in; the
// server puts the nonce in its answer's address, so that an answer given to
// any other query than its own shows, whatever the question.
const nonceOption = 65001

// TestRecycledQueriesAnswerTheirOwn runs queries whose calls outlive their
// callers in every way the pool knows while the pool recycles queries (see
// Pool.recycle): timeouts whose late answers come to tombstones, callers that
// cancel, connections cut by the server after 40 answers or at any moment by
// the network (replays, and queued calls moved at no cost), identical
// queries that coalesce, and rescues whose losing attempt leaves a
// tombstone. Every answer must be the one to its own query: its ID, its
// question as the client spelled it, and the nonce of its query (or of its
// flight's, for coalesced ones, which share it) in the address. A query
// recycled while anything still holds one of its calls makes the race
// detector report the reuse, or takes another query's answer, or hands one
// over, or leaves the reader a zeroed question.
func TestRecycledQueriesAnswerTheirOwn(t *testing.T) {
	t.Run("cuts", func(t *testing.T) {
		// Out of order, connections cut after 40 answers by the server or at
		// any moment by the network.
		st := stress(t, dottest.Options{Handler: nonceAnswer, Delay: stressDelay, CloseAfter: 40}, cutSoon, 30*time.Millisecond)
		switch {
		case st.late == 0:
			t.Error("no late answer came to a tombstone")
		case st.coalesced == 0:
			t.Error("no query coalesced")
		case st.cuts == 0 || st.replays == 0:
			t.Errorf("%d connections cut, %d queries replayed", st.cuts, st.replays)
		}
	})
	t.Run("rescues", func(t *testing.T) {
		// In order: the slow name blocks the queries behind it, which are
		// rescued; the attempt that loses leaves a tombstone.
		st := stress(t, dottest.Options{Handler: nonceAnswer, Delay: blockingDelay, InOrder: true}, nil, 100*time.Millisecond)
		if st.rescues == 0 {
			t.Error("no query rescued")
		}
	})
	t.Run("duplicates", func(t *testing.T) {
		// An upstream that answers twice, the second copy read as its
		// query is being recycled, and that first sends an answer of the
		// call's ID to another question, read against the live call's.
		st := stress(t, dottest.Options{Handler: nonceAnswer, Delay: stressDelay, Raw: duplicateAnswers}, nil, 30*time.Millisecond)
		if st.duplicates == 0 || st.wrongQuestions == 0 {
			t.Errorf("%d duplicate answers dropped, %d to another question", st.duplicates, st.wrongQuestions)
		}
	})
}

// duplicateAnswers sends an answer once, twice, or twice behind a frame of
// its ID that answers another question.
func duplicateAnswers(q *dns.Msg, answer []byte) [][]byte {
	switch rand.IntN(3) {
	case 0:
		return [][]byte{answer}
	case 1:
		return [][]byte{answer, answer}
	}
	other := new(dns.Msg)
	other.SetQuestion("elsewhere.example.", dns.TypeA)
	other.Id, other.Response = q.Id, true
	wrong, err := other.Pack()
	if err != nil {
		panic(err)
	}
	return [][]byte{wrong, answer, answer}
}

// stressStats is what a stress run counted.
type stressStats struct {
	late, coalesced, cuts, replays, rescues int
	duplicates, wrongQuestions              int // answers dropped: of no call (a duplicate's), of another question
}

// stress runs the queries of the stress test against a server scripted by
// opts, over connections dial makes (nil: TCP), each attempt timing out after
// timeout, and checks every answer.
func stress(t *testing.T, opts dottest.Options, dial func(context.Context, string, string) (net.Conn, error),
	timeout time.Duration) stressStats {
	s := dottest.Start(t, opts)
	p, rec := newTestPool(t, s, func(c *Config) {
		c.ReadTimeout = timeout
		c.MaxConns = 4
		c.Dial = dial
	})
	var made atomic.Int64 // queries the pool had to allocate: not recycled
	p.queries.New = func() any { made.Add(1); return new(query) }

	const workers, each = 12, 250
	var answered atomic.Int64
	var nonces atomic.Uint32
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range each {
				q := stressQuery(rnd, i, &nonces)
				r, err := stressExchange(p, rnd, q.msg)
				if errors.Is(err, ErrUnavailable) {
					time.Sleep(5 * time.Millisecond) // in backoff after a cut before a first answer
				}
				if err != nil {
					continue // a timeout, a cut, a cancellation: no answer to check
				}
				if msg := q.wrongAnswer(r); msg != "" {
					t.Errorf("worker %d, query %d: %s", w, i, msg)
					return
				}
				answered.Add(1)
			}
		}()
	}
	wg.Wait()
	total := int64(workers * each)
	rec.mu.Lock()
	st := stressStats{late: rec.drops[DropLate] + rec.drops[DropRescued], coalesced: rec.coalesced,
		cuts: rec.closes[CloseServer] + rec.closes[CloseError], replays: rec.replays, rescues: rec.rescues,
		duplicates: rec.drops[DropUnknownID], wrongQuestions: rec.drops[DropWrongQuestion]}
	timeouts := rec.timeouts
	rec.mu.Unlock()
	t.Logf("%d of %d answered, %d queries allocated; %d timed out, %+v", answered.Load(), total, made.Load(), timeouts, st)
	// The mix must have happened, or the test proves nothing. Under the race
	// detector, sync.Pool drops a quarter of what it is given.
	switch {
	case answered.Load() < total/5:
		t.Errorf("only %d of %d queries answered", answered.Load(), total)
	case made.Load() > total-answered.Load()/2:
		t.Errorf("%d of %d queries allocated, %d answered: few were recycled", made.Load(), total, answered.Load())
	}
	return st
}

// stressQ is a query of the stress test and the nonce its answer carries.
type stressQ struct {
	msg    *dns.Msg
	nonce  uint32
	shared bool
}

var stressNames = []string{"fast.example.", "quick.example.", "slow.example.", "late.example.", "other.example."}

// stressQuery returns a query of one of a few names, in a random case, with a
// nonce of its own, or (one in three) with its name's shared nonce, so that
// identical ones coalesce.
func stressQuery(rnd *rand.Rand, i int, nonces *atomic.Uint32) stressQ {
	k := rnd.IntN(len(stressNames))
	name := []byte(stressNames[k])
	for j := range name {
		if rnd.IntN(2) == 0 {
			name[j] = byte(strings.ToUpper(string(name[j]))[0])
		}
	}
	q := stressQ{nonce: nonces.Add(1), shared: rnd.IntN(3) == 0}
	if q.shared {
		q.nonce = 0xff000000 | uint32(k) // the same for every query of the name: they coalesce
	}
	m := newQuery(string(name), dns.TypeA)
	m.Id = uint16(i)
	m.SetEdns0(1232, false)
	opt := m.IsEdns0()
	data := binary.BigEndian.AppendUint32(nil, q.nonce)
	opt.Option = append(opt.Option, &dns.EDNS0_LOCAL{Code: nonceOption, Data: data})
	q.msg = m
	return q
}

// stressExchange runs m as CoreDNS would (a context never cancelled, a
// deadline of its own), or, one in four, with a context cancelled at a
// random moment.
func stressExchange(p *Pool, rnd *rand.Rand, m *dns.Msg) (*dns.Msg, error) {
	if rnd.IntN(4) > 0 {
		return p.ExchangeDeadline(context.Background(), m, time.Now().Add(200*time.Millisecond))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t := time.AfterFunc(time.Duration(rnd.IntN(40))*time.Millisecond, cancel)
	defer t.Stop()
	return p.Exchange(ctx, m)
}

// wrongAnswer says what is wrong with r as the answer to q, or "".
func (q stressQ) wrongAnswer(r *dns.Msg) string {
	m := q.msg
	switch {
	case r.Id != m.Id:
		return fmt.Sprintf("answer of ID %d to ID %d", r.Id, m.Id)
	case len(r.Question) != 1 || r.Question[0].Name != m.Question[0].Name:
		return "answer to another question: " + r.String()
	case len(r.Answer) != 1:
		return "not one address: " + r.String()
	}
	a, ok := r.Answer[0].(*dns.A)
	if !ok || a.Hdr.Name != m.Question[0].Name {
		return "not its name's address: " + r.String()
	}
	if got := binary.BigEndian.Uint32(a.A.To4()); got != q.nonce {
		return fmt.Sprintf("the answer to nonce %#x given to nonce %#x", got, q.nonce)
	}
	return ""
}

// nonceAnswer answers a query with one address: the nonce it carries.
func nonceAnswer(q *dns.Msg) *dns.Msg {
	r := new(dns.Msg)
	r.SetReply(q)
	var nonce []byte
	if opt := q.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if l, ok := o.(*dns.EDNS0_LOCAL); ok && l.Code == nonceOption {
				nonce = l.Data
			}
		}
	}
	if len(nonce) != 4 {
		r.Rcode = dns.RcodeFormatError
		return r
	}
	r.Answer = []dns.RR{&dns.A{
		Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
		A:   net.IP(append([]byte(nil), nonce...)),
	}}
	return r
}

// stressDelay: slow names are answered past the pool's read timeout (30 ms),
// late ones past it at times; the rest at once or within a few milliseconds.
func stressDelay(q dns.Question) time.Duration {
	switch strings.ToLower(q.Name) {
	case "slow.example.":
		return 45 * time.Millisecond
	case "late.example.":
		return time.Duration(rand.IntN(50)) * time.Millisecond
	case "quick.example.":
		return time.Duration(rand.IntN(3)) * time.Millisecond
	}
	return 0
}

// cutSoon dials a TCP connection that the network cuts 60 to 200 ms later,
// whatever it carries then.
func cutSoon(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := new(net.Dialer).DialContext(ctx, network, addr)
	if err == nil {
		time.AfterFunc(time.Duration(60+rand.IntN(140))*time.Millisecond, func() { c.Close() })
	}
	return c, err
}

// blockingDelay holds one in four answers to the slow name back 40 ms: on an
// in-order server, the queries behind it wait, and are rescued.
func blockingDelay(q dns.Question) time.Duration {
	if strings.EqualFold(q.Name, "slow.example.") && rand.IntN(4) == 0 {
		return 40 * time.Millisecond
	}
	return 0
}
