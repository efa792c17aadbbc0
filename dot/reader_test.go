package dot

import (
	"bytes"
	"errors"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func TestWrongQuestionAndIDAreDroppedConnectionKept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startPipe(t, dottest.Options{Mutate: func(q, r *dns.Msg) {
			switch q.Question[0].Name {
			case "wrongq.example.":
				r.Question[0].Name = "other.example."
			case "wrongid.example.":
				r.Id ^= 0x8000
			}
		}})
		p, rec := newTestPool(t, s, func(c *Config) { c.ReadTimeout = 100 * time.Millisecond; c.TombstoneTTL = 50 * time.Millisecond })
		// An answer first: the pool knows the upstream is fast. Not yet
		// timed, it would close a connection whose only query timed out,
		// as forward does (see oneEach); what is tested here is the drop.
		if _, err := exchange(p, "first.example."); err != nil {
			t.Fatalf("First query: %v", err)
		}
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
	})
}

// Answers are timed by the read(2) that brought them, one clock read for all
// the answers of a read, not by the clock when each is dispatched.
func TestAnswersTimedByTheirRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		bc := &batchConn{Conn: a}
		go b.Write([]byte("answers"))
		if _, err := bc.readSocket(make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
		readAt := time.Now().UnixNano()
		time.Sleep(time.Millisecond)
		if got := bc.arrival(); got != readAt {
			t.Errorf("arrival = %d ns after the read, want the read's time", got-readAt)
		}

		c := newBareConn(t, 8)
		c.bc.readAt = readAt
		var in bytes.Buffer
		for i, name := range []string{"a.example.", "b.example."} {
			q := mustPrepare(t, name)
			cl := newTestCall(q)
			c.register(cl)
			<-c.writeq
			cl.seq = uint32(i + 1)
			cl.sentAt.Store(readAt - int64(time.Millisecond))
			cl.state.Store(callSent)
			in.Write(frame(answerFor(t, q, cl.id)))
		}
		time.Sleep(time.Millisecond)
		c.readFrames(&in)
		c.mu.Lock()
		lastAt := c.answers.lastAt
		c.mu.Unlock()
		if served := c.servedAt.Load(); served != readAt || lastAt != readAt {
			t.Errorf("Answers timed %d and %d ns after their read, want at it", served-readAt, lastAt-readAt)
		}
	})
}
