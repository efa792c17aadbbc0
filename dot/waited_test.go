package dot

import (
	"cmp"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// A busy answer counts as waited when its call was written apart from the
// one before (not in its batch), waited waitedFactor usual times (and
// serialGap) for the previous answer, and then came a service time of its
// own after it; not when it came in a bunch read at once, as far apart as
// the two calls were written (side by side), sooner than minServiceGap
// after it (written at once after a pause), after a gap longer than twice
// the usual time, or after a short wait.
func TestAnswerLogWaited(t *testing.T) {
	us := int64(time.Microsecond)
	const usual = 300 // µs
	for _, tc := range []struct {
		name           string
		sent, answered int64 // µs: the second call's write and answer; the first is written at 0 and answered at 5,000
		want           bool
		usual          int64 // µs; 0: usual
	}{
		{"behind a slow answer, one service time after it", 1000, 5300, true, 0},
		{"written in the first one's batch", 0, 5300, false, 0},
		{"read in a bunch with the first", 1000, 5000, false, 0},
		{"as far apart as written (side by side)", 500, 5500, false, 0},
		{"long after the first answer (slow itself)", 1000, 5000 + 2*usual + 1, false, 0},
		{"a short wait", 4500, 5300, false, 0},
		{"a fast upstream's answer sooner than minServiceGap after (a pause)", 1000, 5040, false, 100},
		{"a fast upstream's answer a service time after", 1000, 5060, true, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := answerLog{usual: cmp.Or(tc.usual, usual) * us}
			l.note(1, 1, 5000*us, true) // written at 1 µs: 0 is "not written"
			l.note(2, max(tc.sent*us, 1), tc.answered*us, true)
			st := l.collect()
			if got := st.waited == 1; got != tc.want || st.busy != 1 {
				t.Errorf("Evidence %+v: waited %v, want %v (and one busy answer)", st.evidence, got, tc.want)
			}
		})
	}
}

// The mode is in order once minWaitedEvidence answers (decayed) waited
// behind another, waitedShare of the busy answers or more; fewer, or a
// smaller share, leave it unknown.
func TestServeModeWaited(t *testing.T) {
	var m serveMode
	ms := &modeSteps{t: t, m: &m, now: int64(time.Hour)}
	m.usual.Store(int64(300 * time.Microsecond))
	ms.step(evidence{busy: 10, waited: 3}, ModeUnknown)  // 3: too few
	ms.step(evidence{busy: 100, waited: 8}, ModeUnknown) // 10.6 of 108.8: under a quarter
	m.acc = evidence{}
	ms.step(evidence{busy: 12, waited: 4}, ModeInOrder)
}

// A fast upstream that answers a connection's queries one at a time, 200 µs
// each, but one name in 20 after 5 ms (less than any rescue delay), at
// 1,000 QPS (a fifth of what one connection serves): no answer comes a full
// serialGap beyond its send gap often enough to show in order, yet the
// queries written behind a slow one wait for it. The pool learns in order
// from them within the first 300 ms, and from then on a query is answered
// in its own time (a dial at most), not behind a slow one, as forward would
// answer it. (Issue 21, property seeds 76, 147: the pool kept one
// connection and a p99 of 11 ms against forward's 5.)
func TestFastInOrderSlowNamesLearned(t *testing.T) {
	const service, slow, handshake = 200 * time.Microsecond, 5 * time.Millisecond, time.Millisecond
	isSlow := func(name string) bool { return strings.HasPrefix(name, "s") }
	opts := dottest.Options{InOrder: true, Delay: func(q dns.Question) time.Duration {
		if isSlow(q.Name) {
			return slow
		}
		return service
	}}
	name := func(prefix string) func(i int) string {
		return func(i int) string {
			if i%20 == 19 {
				return fmt.Sprintf("s%s%d.example.", prefix, i)
			}
			return fmt.Sprintf("%s%d.example.", prefix, i)
		}
	}
	bubble(t, opts, handshake, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
		warm := offer(p, 300, time.Millisecond, name("w"))
		checkOutcomes(t, warm, func(string) time.Duration { return time.Second })
		if m := p.Stats().Mode; m != ModeInOrder {
			t.Fatalf("Mode after 300 ms of load = %v, want %v", m, ModeInOrder)
		}
		out := offer(p, 1000, time.Millisecond, name("q"))
		// Its own answer time, after a dial and one more answer at most
		// (a query that found every connection busy takes the first that
		// becomes idle); an order check may wait behind a slow one.
		limit := service + handshake + service
		late := 0
		for _, o := range out {
			if o.err != nil {
				t.Errorf("Query %s: %v", o.name, o.err)
			}
			if !isSlow(o.name) && o.took > limit {
				late++
			}
		}
		if checks := len(out)/orderCheckEvery + 1; late > checks {
			t.Errorf("%d of %d fast queries took more than %v, want %d at most (order checks)", late, len(out), limit, checks)
		}
	})
}

// A queue written at once and answered in write order, each answer a
// service time (5 ms) after the one before, with many calls still
// outstanding behind it: out of order, the next answer would be the next
// call in write order about once in as many times as calls wait, so two
// such answers are as much evidence of in order as minSlowEvidence slow
// gaps (orderWeight). Their weight beyond the gaps' is no busy answer more
// (busy counts the gaps alone); behind fewer than minOrderedQueue calls, or
// from a slow upstream (usual unknownSlow or more), a slow gap weighs what
// it did.
func TestOrderedQueueWeighsAsInOrder(t *testing.T) {
	ms := int64(time.Millisecond)
	deep := math.Log2(39) + math.Log2(38) // behind 38, then 37
	if deep < minSlowEvidence {
		t.Fatalf("Two ordered answers behind 38 and 37 weigh %v, want minSlowEvidence (%v) at least", deep, float64(minSlowEvidence))
	}
	for _, tc := range []struct {
		name     string
		queued   int   // calls written together
		usual    int64 // ms
		busySlow float64
	}{
		{"behind a deep queue", 40, 5, deep},
		{"behind a short one", minOrderedQueue, 5, 2},
		{"from a slow upstream", 40, unknownSlow.Milliseconds(), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := answerLog{usual: tc.usual * ms}
			for i := range 3 { // the first alone (written after no answer), then two busy ones 5 ms apart
				l.others = tc.queued - 1 - i
				l.note(uint32(i+1), 1, int64(5*(i+1))*ms, true)
			}
			st := l.collect()
			if st.busy != 2 || st.busySlow != tc.busySlow {
				t.Errorf("Evidence %+v, want busy 2, slow %v", st.evidence, tc.busySlow)
			}
		})
	}
}

// A slow gap weighs as evidence of in order only up to one usual answer
// time (ownSpan): beyond it, the answer was slow in itself, which an
// out-of-order upstream shows as well when two answers happen to come in
// write order. Property seed 70: two queries written together, answered 9
// and 72 ms later (usual 23 ms), weighed minSlowEvidence alone.
func TestSlowGapWeighsOneUsualTime(t *testing.T) {
	ms := int64(time.Millisecond)
	l := answerLog{usual: 23 * ms}
	l.note(1, 1*ms, 10*ms, true) // alone
	l.note(2, 1*ms, 73*ms, true) // written with it, 63 ms after its answer
	st := l.collect()
	if want := slowWeight(23 * ms); st.busy != want || st.busySlow != want {
		t.Errorf("Evidence %+v, want busy and slow %v (one usual time), not %v", st.evidence, want, slowWeight(63*ms))
	}
	fresh := answerLog{} // no usual time yet: the gap weighs whole
	fresh.note(1, 1*ms, 10*ms, true)
	fresh.note(2, 1*ms, 73*ms, true)
	if st := fresh.collect(); st.busySlow != slowWeight(63*ms) {
		t.Errorf("Evidence %+v with no usual time, want slow %v", st.evidence, slowWeight(63*ms))
	}
}
