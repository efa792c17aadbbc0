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
	l := answerLog{meanCeiling: 3 * ms}
	l.note(1, 10*ms, 12*ms, true)  // alone: written after the previous answer (none)
	l.note(2, 11*ms, 15*ms, true)  // written before the answer at 12: busy, 3 ms after it
	l.note(4, 14*ms, 15*ms, true)  // skips 3 (dropped?): nothing learned, but the order moves on
	l.note(3, 13*ms, 16*ms, true)  // written before 4, answered after it: out of order
	l.note(5, 20*ms, 21*ms, true)  // alone
	l.note(6, 20*ms, 90*ms, false) // late: its caller gave up; not in the mean
	st := l.collect()
	want := evidence{inversions: 1, busy: 2, busySlow: 2}
	if st.evidence != want || st.aloneN != 2 || st.aloneSum != 3*ms {
		t.Errorf("Evidence %+v, alone %d answers taking %v in all; want %+v, 2 answers taking 3ms", st.evidence, st.aloneN, time.Duration(st.aloneSum), want)
	}
	if st.n != 5 || st.sum != (2+3+1+3+1)*ms {
		t.Errorf("Answers delivered: %d taking %v (each at most 3ms), want 5 taking 10ms", st.n, time.Duration(st.sum))
	}
	if st := l.collect(); st != (answerStats{}) {
		t.Errorf("A second collect got %+v, want nothing", st)
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
	// In order before any query was answered alone: the usual time learnt
	// later is the one to compare with.
	step(evidence{rescued: 2}, ModeInOrder)
	m.usual.Store(int64(6 * time.Millisecond))
	step(evidence{rescued: 1}, ModeInOrder)
	step(evidence{}, ModeInOrder)
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
	m.usual.Store(int64(time.Millisecond))
	m.acc = evidence{}
	step(evidence{busy: 10, busySlow: 9}, ModeInOrder)
	// In order, queries alone on a connection answered four times as slowly
	// (and 2 ms more): a busy upstream taken for in-order; barred for a while.
	m.usual.Store(int64(4 * time.Millisecond))
	step(evidence{}, ModeInOrder)
	m.usual.Store(int64(5 * time.Millisecond))
	step(evidence{}, ModeUnknown)
	step(evidence{rescued: 10}, ModeUnknown)
	now += int64(learnedTTL / 10)
	step(evidence{rescued: 10}, ModeInOrder)
}
