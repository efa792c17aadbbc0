package dot

import (
	"strings"
	"testing"
	"time"
)

// A balancer of an out-of-order backend and an in-order one (mixed property
// seed 62): the pool's first connection, in order, is queued on in a storm,
// and the second, out of order, makes the address out of order. Its own
// answers then show the first serving in order (serial.go), and it takes a
// query only with nothing outstanding, as forward's would: the pool fares
// as the model of forward does: answers and p99, what the verdict is for
// (connections are the family's to judge: the pool's peak is the model's
// 7, or 8 in 4 runs of 100, 84 of 200 under the race detector). Without the
// connection's own verdict the first connection took nearly every query in
// turn (p99 51 ms against 3).
func TestBalancerInOrderBackendFaresAsForward(t *testing.T) {
	pool, model := runMixedBackends(t, 62, backend{depth: 0, speed: 1}, backend{depth: 1, speed: 0.61})
	if bad := judgeServed(pool, model); len(bad) > 0 {
		t.Errorf("%s\n  pool:  %v\n  model: %v", strings.Join(bad, "; "), pool, model)
	}
}

// A connection's own verdict, per answer: answers in write order, each a
// service time after the one before and queued behind the calls written
// before it, make it serial; one answer of its own that overtook clears it.
func TestConnServedInOrderIsSerialUntilItOvertakes(t *testing.T) {
	const s = 2 * time.Millisecond // the service time, and the answer time alone
	c := &conn{}
	base := int64(time.Hour)
	// Call 1 alone, then calls 2-9 written together behind it: in order,
	// each answered a service time after the one before.
	c.answers.note(1, base, base+int64(s), true)
	sent := base + int64(s) + int64(time.Microsecond)
	for seq := uint32(2); seq < 10; seq++ {
		noteAsReader(c, seq, sent, sent+int64(seq-1)*int64(s), int64(seq-2))
	}
	if !c.serial.Load() || c.overtaken.Load() {
		t.Fatalf("After 8 answers in turn: serial %v (weight %.2f), overtaken %v; want serial", c.serial.Load(), c.serialWeight, c.overtaken.Load())
	}
	c.judgeSerialLocked(0, true, true, false) // an answer that overtook
	if c.serial.Load() || !c.overtaken.Load() {
		t.Errorf("After an answer out of order: serial %v, overtaken %v; want overtaken", c.serial.Load(), c.overtaken.Load())
	}
}

// Out of order, a busy answer comes its own answer time after its write,
// however deep it was written: no evidence of in order, and the weight of
// one that came so fades.
func TestConnOutOfOrderAnswersShowNoSerial(t *testing.T) {
	const took = 2 * time.Millisecond
	c := &conn{}
	base := int64(time.Hour)
	c.answers.note(1, base, base+int64(took), true)
	for seq := uint32(2); seq < 40; seq++ {
		sent := base + int64(seq)*int64(200*time.Microsecond)
		noteAsReader(c, seq, sent, sent+int64(took), 8)
	}
	if c.serial.Load() || c.serialWeight != 0 {
		t.Errorf("Answers as far apart as written: serial %v, weight %.2f; want none", c.serial.Load(), c.serialWeight)
	}
}

// noteAsReader notes the answer to c's seq-th call, written at sent behind
// depth calls outstanding and read at now, and judges it as the reader does
// (dispatch).
func noteAsReader(c *conn, seq uint32, sent, now, depth int64) {
	l := &c.answers
	slow, waited, side, inv, busy := l.busySlow, l.waited, l.side, l.inversions, l.busy
	behind := l.queuedBehind(seq, sent, now, depth)
	l.note(seq, sent, now, true)
	c.judgeSerialLocked(l.busySlow-slow+l.waited-waited+behind, l.busy > busy, l.inversions > inv, l.side > side)
}
