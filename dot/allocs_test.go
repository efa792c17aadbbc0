package dot

import (
	"testing"
	"unsafe"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// The query path's allocations are designed, not found (issue 24): a client's
// query, padded to the default block, takes one allocation that holds its wire,
// its first call and its flight, in the 384-byte size class; its answer (an
// address and an OPT) takes one, holding the message, its question and records.
// BenchmarkPoolExchangeClient counts the rest of the exchange (2 allocs/op).
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
