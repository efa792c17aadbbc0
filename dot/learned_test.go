package dot

import (
	"bytes"
	"testing"
	"time"
)

// A cut teaches the query limit from every answer the server served on the
// connection, late ones included: answers to queries given up (tombstones)
// were served all the same, and counting only those delivered would teach a
// limit too low, or none.
func TestQueryLimitCountsLateAnswers(t *testing.T) {
	c := newBareConn(t, 64)
	var in bytes.Buffer
	for i := range 20 {
		q := mustPrepare(t, "a.example.")
		cl := newTestCall(q)
		if !c.register(cl) {
			t.Fatal("register failed")
		}
		<-c.writeq
		cl.seq = uint32(i + 1)
		cl.state.Store(callSent)
		if i%4 == 0 {
			c.mu.Lock()
			c.giveUpLocked(cl, nanotime()) // timed out: its answer will be late
			c.mu.Unlock()
		}
		in.Write(frame(answerFor(t, q, cl.id)))
	}
	outstanding := newTestCall(mustPrepare(t, "b.example."))
	c.register(outstanding)
	<-c.writeq
	outstanding.state.Store(callSent)
	c.readFrames(&in)
	c.closeFor(errServerClosed, CloseServer) // cut after 20 answers, 5 of them late
	if got, want := c.pool.learned.limit.get(), int32(20-1); got != want {
		t.Errorf("Query limit learned = %d, want %d (20 served, 1 in 50 margin, at least 1)", got, want)
	}
}

// The answer log tells answers out of write order, answers that waited behind
// the previous one (and whether a full serialGap after it) and answers to
// queries alone on the connection.
func TestAnswerLog(t *testing.T) {
	ms := int64(time.Millisecond)
	var l answerLog
	l.note(1, 10*ms, 12*ms) // alone: written after the previous answer (none)
	l.note(2, 11*ms, 15*ms) // written before the answer at 12: busy, 3 ms after it
	l.note(4, 14*ms, 15*ms) // skips 3 (dropped?): nothing learned, but the order moves on
	l.note(3, 13*ms, 16*ms) // written before 4, answered after it: out of order
	l.note(5, 20*ms, 21*ms) // alone
	e, sum, n := l.collect()
	want := evidence{inversions: 1, busy: 1, busySlow: 1}
	if e != want || n != 2 || sum != 3*ms {
		t.Errorf("Evidence %+v, alone %d answers taking %v in all; want %+v, 2 answers taking 3ms", e, n, time.Duration(sum), want)
	}
	if e, _, n := l.collect(); e != (evidence{}) || n != 0 {
		t.Errorf("A second collect got %+v and %d answers, want nothing", e, n)
	}
}

// The mode: out of order at the first answer out of order; in order on
// rescues that won, but only a second after the last answer out of order;
// unknown again learnedTTL after the last evidence.
func TestServeModeUpdate(t *testing.T) {
	var m serveMode
	now := int64(time.Hour)
	step := func(e evidence, want Mode) {
		t.Helper()
		now += int64(100 * time.Millisecond)
		if got, _ := m.update(e, now); got != want {
			t.Fatalf("Mode after %+v = %v, want %v", e, got, want)
		}
	}
	step(evidence{}, ModeUnknown)
	step(evidence{inversions: 1}, ModeOutOfOrder)
	step(evidence{rescued: 2}, ModeOutOfOrder) // too soon after the answer out of order
	for range 9 {
		step(evidence{}, ModeOutOfOrder)
	}
	step(evidence{rescued: 2}, ModeInOrder)
	step(evidence{busy: 10, busySlow: 10}, ModeInOrder)
	step(evidence{inversions: 1}, ModeOutOfOrder)
	now += int64(learnedTTL)
	step(evidence{}, ModeUnknown)
	// Answers a full serialGap apart, most of those that waited, are in order too.
	now += int64(outOfOrderQuiet)
	step(evidence{busy: 10, busySlow: 9}, ModeInOrder)
}
