package dot

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// The query path's allocations are designed, not found (issue 24): a client's
// query, padded to the default block, takes one allocation that holds its wire,
// its first call and its flight, in the 384-byte size class, and none once a
// Pool recycles it (see Pool.recycle); its answer (an address and an OPT)
// takes one, holding the message, its question and records.
// BenchmarkPoolExchangeClient counts the rest of the exchange (1 allocs/op:
// the answer); TestSequentialQueriesAreRecycled, the queries a pool allocates.
func TestQueryAndAnswerAllocateOnceEach(t *testing.T) {
	m := newQuery("www.example.org.", dns.TypeA)
	m.SetEdns0(1232, true)
	r := dottest.DefaultAnswer(m)
	r.Compress = true // as servers send it: the owner a pointer to the question
	answer, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	var q *query
	if n := testing.AllocsPerRun(100, func() { q, err = prepareQuery(m, DefaultPadBlock, true) }); n != 1 || err != nil {
		t.Errorf("prepareQuery: %v allocations (%v), want 1", n, err)
	}
	if len(q.wire) != 2+DefaultPadBlock || &q.wire[0] != &q.room[0] {
		t.Errorf("the padded query (%d octets) is not in the query's room", len(q.wire))
	}
	free := &sync.Pool{New: func() any { return new(query) }}
	if n := testing.AllocsPerRun(100, func() {
		q, err := prepareInto(free, m, DefaultPadBlock, true)
		if err == nil {
			*q = query{} // as recycle leaves it
			free.Put(q)
		}
	}); n != 0 || err != nil {
		t.Errorf("prepareInto a recycled query: %v allocations (%v), want 0", n, err)
	}
	if size := unsafe.Sizeof(query{}); size > 384 {
		t.Errorf("a query is %d bytes: past the 384-byte size class", size)
	}
	frame := make([]byte, len(answer))
	n := testing.AllocsPerRun(100, func() {
		copy(frame, answer) // finishAnswer edits its frame
		if _, _, err := finishAnswer(q, frame); err != nil {
			t.Fatal(err)
		}
	})
	if n != 1 {
		t.Errorf("finishAnswer: %v allocations, want 1", n)
	}
}

// TestSequentialQueriesAreRecycled: one query after the other (no
// coalescing, no tombstone), each query is recycled for the next, and the
// pool allocates none after the first. (What else a lone exchange allocates
// is crypto/tls's, a reader per socket read, shared by the answers a read
// brings under load.)
func TestSequentialQueriesAreRecycled(t *testing.T) {
	if raceEnabled {
		t.Skip("under the race detector, sync.Pool drops a quarter of what it is given")
	}
	s := startWireServer(t)
	p, err := New(Config{Addr: s.Addr, TLS: s.clientTLS()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var made atomic.Int64
	p.queries.New = func() any { made.Add(1); return new(query) }
	ctx := context.Background()
	for i, m := range benchQueries()[:200] {
		if _, err := p.Exchange(ctx, m); err != nil {
			t.Fatalf("query %d: %v", i, err)
		}
	}
	// A garbage collection between two queries may empty the sync.Pool.
	if n := made.Load(); n > 3 {
		t.Errorf("200 queries one after the other allocated %d queries, want 1", n)
	}
}
