package dot

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"net"
	"testing"

	"github.com/miekg/dns"
)

// newBareConn returns a connection that is registered with nothing and has no
// goroutines, for white-box tests of its table and dispatch.
func newBareConn(t testing.TB, maxInflight int) *conn {
	t.Helper()
	p, err := New(Config{Addr: "127.0.0.1:853", TLS: &tls.Config{ServerName: "dot.test"}, MaxInflight: maxInflight, Observer: newRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	bc := &batchConn{Conn: a}
	return newConn(p, tls.Client(bc, p.tls), bc)
}

func mustPrepare(t testing.TB, name string) *query {
	q, err := prepareQuery(newQuery(name, dns.TypeA), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func newTestCall(q *query) *call {
	return &call{q: q, deadline: nanotime() + int64(1e12), resp: make(chan result, 1)}
}

// IDs are never live twice on a connection, and a tombstoned ID is skipped until
// its tombstone goes, even when the counter wraps onto it.
func TestIDsSkipLiveAndTombstonedIDs(t *testing.T) {
	c := newBareConn(t, 8)
	q := mustPrepare(t, "a.example.")
	first := newTestCall(q)
	if !c.register(first) {
		t.Fatal("register failed on an empty connection")
	}
	<-c.writeq
	first.state.Store(callSent)
	c.mu.Lock()
	c.giveUpLocked(first, nanotime()) // sent, then the caller gave up: a tombstone
	c.nextID = first.id               // the counter wraps around onto it
	c.mu.Unlock()

	seen := map[uint16]bool{first.id: true}
	for range 7 {
		cl := newTestCall(q)
		if !c.register(cl) {
			t.Fatal("register failed below the cap")
		}
		<-c.writeq
		if seen[cl.id] {
			t.Fatalf("ID %d handed out while live or tombstoned", cl.id)
		}
		seen[cl.id] = true
	}
	if c.register(newTestCall(q)) {
		t.Error("register went past MaxInflight; the tombstone must count against it")
	}
}

// frame prefixes msg with its length.
func frame(msg []byte) []byte {
	return append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)
}

func answerFor(t testing.TB, q *query, id uint16) []byte {
	m := new(dns.Msg)
	if err := m.Unpack(q.wire[2:]); err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	r.SetReply(m)
	r.Id = id
	b, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Each call is completed exactly once whatever the reader is fed, and only with an
// answer to its own question.
func TestDispatchCompletesEachCallOnce(t *testing.T) {
	c := newBareConn(t, 8)
	qa, qb := mustPrepare(t, "a.example."), mustPrepare(t, "b.example.")
	a, b := newTestCall(qa), newTestCall(qb)
	for _, cl := range []*call{a, b} {
		c.register(cl)
		<-c.writeq
		cl.state.Store(callSent)
	}
	var in bytes.Buffer
	in.Write(frame(answerFor(t, qa, a.id)))
	in.Write(frame(answerFor(t, qa, a.id))) // duplicate: unknown ID by now
	in.Write(frame(answerFor(t, qa, b.id))) // b's ID with a's question
	in.Write(frame([]byte{1, 2, 3}))        // runt
	c.readFrames(&in)
	c.closeFor(errServerClosed, CloseServer)

	if r := <-a.resp; r.err != nil || r.msg == nil || r.msg.Id != qa.origID {
		t.Errorf("Call a got %v, want its answer", r.err)
	}
	if r := <-b.resp; r.err == nil {
		t.Error("Call b got an answer to another question")
	}
	for _, cl := range []*call{a, b} {
		if n := cl.completions.Load(); n != 1 {
			t.Errorf("Call %d completed %d times", cl.id, n)
		}
	}
	rec := c.pool.obs.(*recorder)
	if rec.drops[DropUnknownID] != 1 || rec.drops[DropWrongQuestion] != 1 || rec.drops[DropMalformed] != 1 {
		t.Errorf("Drops = %v, want one unknown ID, one wrong question, one malformed", rec.drops)
	}
}
