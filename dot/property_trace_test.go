package dot

import (
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// propertyTrace prints a replayed seed's pool events on the virtual clock:
// go test ./dot/ -run 'TestProperty$/seed=N$' -property.trace. For reading
// why a seed failed; no assertion reads it.
var propertyTrace = flag.Bool("property.trace", false, "print the pool's events (mode, sizing, dials, closes, rescues) of each seed run")

// tracingPool: the pool's run of a seed is under way with -property.trace:
// the slow answers printed (-property.slow, see loadOutcome.tally) are the
// pool's, else the model's. Meant for one seed at a time (-property.seed).
var tracingPool atomic.Bool

// traceObserver prints a pool's events with the virtual time since start.
type traceObserver struct {
	start time.Time
	mu    sync.Mutex
	sized [2]int // the last Sized figures printed
}

func newTraceObserver() *traceObserver { return &traceObserver{start: time.Now()} }

func (o *traceObserver) printf(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	fmt.Fprintf(os.Stderr, "%10.3fms "+format+"\n", append([]any{float64(time.Since(o.start).Microseconds()) / 1000}, args...)...)
}

func (o *traceObserver) Dialed(took time.Duration, _ bool, err error) {
	o.printf("dialed in %v err=%v", took, err)
}
func (o *traceObserver) Closed(r CloseReason)      { o.printf("closed: %v", r) }
func (o *traceObserver) Dropped(r DropReason)      { o.printf("dropped: %v", r) }
func (o *traceObserver) Replayed()                 { o.printf("replayed") }
func (o *traceObserver) TimedOut()                 { o.printf("timed out") }
func (o *traceObserver) Failed(err error)          { o.printf("failed: %v", err) }
func (o *traceObserver) SharedRecords(s bool)      { o.printf("shared records: %v", s) }
func (o *traceObserver) Rescued()                  { o.printf("rescued") }
func (o *traceObserver) ModeLearned(m Mode, n int) { o.printf("mode %v (%d per conn)", m, n) }
func (o *traceObserver) Sized(wanted, taking int) {
	o.printf("sized: wanted %d, taking %d", wanted, taking)
}

var _ SizeObserver = (*traceObserver)(nil)

// traceOpenLocked prints, with -property.trace, how many connections the
// upstream counts open, on each open and close: the peak the verdict compares
// is the upstream's count, and a connection the pool is closing counts until
// the upstream sees it closed. Printed for the pool's run and the model's
// alike (side), on each one's virtual clock, so that the moment the pool's
// count first passes the model's can be read off the two. u.mu must be held.
func (u *simUpstream) traceOpenLocked() {
	if *propertyTrace {
		fmt.Fprintf(os.Stderr, "%10.3fms upstream (%s): %d open\n", float64(u.since().Microseconds())/1000, u.side, len(u.conns))
	}
}

// traceTake prints, with -property.trace, each query the pool's upstream
// takes up: on which of its connections (numbered in dial order), when, and
// when its answer is due, after storms and stalls. The pool's own events do
// not say where a query went nor how long it waited behind others there: in
// order, a query taken an answer time after its write waited for the ones
// before it, and one due at a stall's end was taken before the stall
// (property seed 36: the first connection took the 30 queries written on it
// at 31 ms one per answer time, and the rescues of those left, at 153 ms,
// were taken 8 ms before a stall). The model's side is printed too: its
// query waits only for a dial, and a query the pool took later than the
// model (or sooner) shows in the two (property seed 131: two queries the
// pool took 12-22 ms after the model, waiting for connections the model
// had idle, were due in a stall that the model's had ended before, and held
// their connections through it, at the peak).
func (sc *simConn) traceTake(name string, d time.Duration) {
	if !*propertyTrace {
		return
	}
	now := sc.u.since()
	fmt.Fprintf(os.Stderr, "%10.3fms upstream (%s): connection %d takes %s, answers at %.3fms\n",
		float64(now.Microseconds())/1000, sc.u.side, sc.n, name, float64((now+d).Microseconds())/1000)
}

// traceIgnore prints, with -property.trace, each query the pool's upstream
// reads past its connection's query limit and ignores: traceTake shows only
// the ones it serves, and the pool learns of an ignored one only from the
// connection's silence or its cut, when it replays it. Where a query went
// before it was taken shows only here (property seed 19: the first
// connection ignored q0-q15, written after 22 later queries, and the 36
// replays of its silence at 240 ms went onto a connection that had taken
// 21, which ignored 35 of them again: answered at 485 ms, against the
// model's 140).
func (sc *simConn) traceIgnore(wire []byte) {
	if !*propertyTrace || sc.u.side != "pool" {
		return
	}
	q := new(dns.Msg)
	if q.Unpack(wire) != nil || len(q.Question) != 1 {
		return
	}
	fmt.Fprintf(os.Stderr, "%10.3fms upstream (pool): connection %d ignores %s (past its limit)\n",
		float64(sc.u.since().Microseconds())/1000, sc.n, q.Question[0].Name)
}
