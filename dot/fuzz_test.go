package dot

import (
	"bytes"
	"strings"
	"testing"
)

// FuzzReadFrames feeds arbitrary bytes to a connection's response reader with three
// queries outstanding: no panic, every call completes exactly once, and a call that
// gets an answer gets one to its own question.
func FuzzReadFrames(f *testing.F) {
	qs := []*query{mustPrepare(f, "a.example."), mustPrepare(f, "B.example."), mustPrepare(f, "c.example.")}
	f.Add(append(frame(answerFor(f, qs[0], 0)), frame(answerFor(f, qs[1], 1))...))
	f.Add(frame(answerFor(f, qs[2], 2)))
	f.Add(frame(answerFor(f, qs[2], 0)))
	f.Add([]byte{0, 12, 0, 0, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 1, 2, 3})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		c := newBareConn(t, 8)
		calls := make([]*call, len(qs))
		for i, q := range qs {
			calls[i] = newTestCall(q)
			if !c.register(calls[i]) {
				t.Fatal("register failed")
			}
			<-c.writeq
			calls[i].state.Store(callSent)
		}
		c.readFrames(bytes.NewReader(data))
		c.closeFor(errServerClosed, CloseServer)
		for i, cl := range calls {
			if n := cl.completions.Load(); n != 1 {
				t.Fatalf("Call %d completed %d times", i, n)
			}
			r := <-cl.resp
			if r.frame == nil {
				continue // an error: no answer delivered
			}
			if !answers(r.frame, cl.q.question) {
				t.Fatalf("Call %d got an answer to another question", i)
			}
			if r.err == nil && !strings.EqualFold(r.msg.Question[0].Name, cl.q.name) {
				t.Fatalf("Call %d: answer question %q, want %q", i, r.msg.Question[0].Name, cl.q.name)
			}
		}
	})
}
