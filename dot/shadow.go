package dot

import (
	"sync/atomic"
	"time"
)

// forward's connection count, replayed from the pool's own queries.
//
// Issue 21 asks that the pool is never worse than forward. forward dials a
// connection for each query that finds none idle, the query waits for that
// dial (not for one that frees meanwhile), and a connection it opened stays
// until unused for expire (10 s). So after a burst forward holds more
// connections than the burst's queries needed at once, and the next burst
// finds them idle. The pool, whose waiting queries take the first connection
// that frees and whose early queries may queue behind others before the mode
// is known, can come out of the same burst with fewer: property seed 131 (in
// order, lognormal 36.6 ms answers, a 56 ms handshake) left its cold start
// with 54 connections against forward's 59, met a storm 1.9 s later with 50
// (it had closed the idle ones beyond its own need), and its queries waited
// up to 22 ms for dials that forward's found idle; four of them were then
// taken up just before a stall, and held four more connections through it
// than forward's (304 against 302). With 59-60 held, 6 replays in 9 pass.
//
// forwardShadow replays each query (its arrival and how long an attempt
// held its connection) through forward's rule, in the order they came, and
// keeps the count of connections forward would have open. An in-order pool
// keeps at least as many (sweepAll) and dials idle ones up to it (size):
// never more than forward opened for the same queries.

// shadowSlots is how many queries the replay may lag behind: a query still
// outstanding holds back those after it (they are replayed in order), and
// one this far behind is replayed as if its answer came now.
const shadowSlots = 1 << 12

// forwardShadow is the replay (see above). Queries note themselves in slots
// lock-free (begin, end); the sweeper replays them (replay).
type forwardShadow struct {
	tickets atomic.Uint64 // queries noted so far
	slots   [shadowSlots]shadowSlot
	count   atomic.Int32 // connections forward would have open, as of the last replay

	// closedAfter: ns, the shortest a connection sat unused before the
	// server closed it (its idle timeout, told or not; 1 for a cut of a busy
	// one); 0: none seen. forward's connections close as soon.
	closedAfter atomic.Int64

	head uint64    // sweeper only: the next ticket to replay
	busy busyUntil // sweeper only: forward's busy connections, by when each frees (unix ns)
	idle []int64   // sweeper only: forward's idle connections, when each freed, the last freed on top
}

// shadowSlot is one query's note: its ticket (plus one, once its arrival is
// written), when it came, and how long its answering attempt held a
// connection (0 while outstanding).
type shadowSlot struct {
	ticket atomic.Uint64
	at     atomic.Int64
	dial   atomic.Int64 // the smoothed dial time when it came: a later one (a loaded client's slow handshakes) would be forward's for none of the queries before
	hold   atomic.Int64
}

// begin notes a query's arrival at now, when a dial takes dial, and returns
// its ticket.
func (s *forwardShadow) begin(now, dial int64) uint64 {
	t := s.tickets.Add(1) - 1
	slot := &s.slots[t%shadowSlots]
	slot.hold.Store(0)
	slot.at.Store(now)
	slot.dial.Store(dial)
	slot.ticket.Store(t + 1)
	return t
}

// end notes that ticket t's query was done with its connection after hold.
func (s *forwardShadow) end(t uint64, hold int64) {
	slot := &s.slots[t%shadowSlots]
	if slot.ticket.Load() == t+1 {
		slot.hold.Store(max(hold, 1))
	}
}

// replay takes the queries noted since the last replay through forward's
// rule, in the order they came, as far as the first one still outstanding,
// and closes the connections unused for expire by then (now, if all are
// replayed). Sweeper only.
func (s *forwardShadow) replay(now int64, dial, expire time.Duration) int {
	for s.head < s.tickets.Load() {
		slot := &s.slots[s.head%shadowSlots]
		switch tk := slot.ticket.Load(); {
		case tk > s.head+1:
			s.head++ // its slot was taken by a later query: left out
			continue
		case tk < s.head+1:
			return s.counted(now, int64(expire)) // its arrival is being written
		}
		at, hold := slot.at.Load(), slot.hold.Load()
		if hold == 0 {
			if s.tickets.Load()-s.head < shadowSlots/2 {
				return s.counted(min(now, at), int64(expire))
			}
			hold = max(now-at, 1) // outstanding so long that later slots are needed
		}
		d := slot.dial.Load()
		if d == 0 {
			d = int64(dial) // it came before the first dial was timed
		}
		s.place(at, hold, d, int64(expire))
		s.head++
	}
	return s.counted(now, int64(expire))
}

// counted closes the connections unused for expire at at, and stores and
// returns how many connections forward has open.
func (s *forwardShadow) counted(at, expire int64) int {
	s.freeBy(at, expire)
	n := min(len(s.busy)+len(s.idle), AutoMaxConnsInOrder)
	s.count.Store(int32(n))
	return n
}

// place gives the query that came at at a connection of forward's: the one
// freed last (forward's idle connections are a stack), or a new one, dialled
// for it.
func (s *forwardShadow) place(at, hold, dial, expire int64) {
	s.freeBy(at, expire)
	if n := len(s.idle); n > 0 {
		s.idle = s.idle[:n-1]
		s.busy.push(at + hold)
		return
	}
	s.busy.push(at + dial + hold)
}

// freeBy moves the connections free by at onto the idle stack, in the order
// they freed, and closes those unused for expire (the bottom of the stack).
func (s *forwardShadow) freeBy(at, expire int64) {
	for len(s.busy) > 0 && s.busy[0] <= at {
		s.idle = append(s.idle, s.busy.pop())
	}
	gone := 0
	for gone < len(s.idle) && s.idle[gone] < at-expire {
		gone++
	}
	s.idle = append(s.idle[:0], s.idle[gone:]...)
}

// serverClosed notes that the server closed a connection unused for unused.
func (s *forwardShadow) serverClosed(unused int64) {
	unused = max(unused, 1)
	for old := s.closedAfter.Load(); old == 0 || unused < old; old = s.closedAfter.Load() {
		if s.closedAfter.CompareAndSwap(old, unused) {
			return
		}
	}
}

// busyUntil is a min-heap of when forward's busy connections are free. Typed,
// not container/heap's: boxing each time into an interface allocated twice a
// query (BenchmarkPoolExchange: 6 allocations a query against 4).
type busyUntil []int64

// push adds t.
func (h *busyUntil) push(t int64) {
	*h = append(*h, t)
	a := *h
	for i := len(a) - 1; i > 0; {
		up := (i - 1) / 2
		if a[up] <= a[i] {
			break
		}
		a[up], a[i] = a[i], a[up]
		i = up
	}
}

// pop removes and returns the earliest.
func (h *busyUntil) pop() int64 {
	a := *h
	top, last := a[0], len(a)-1
	a[0] = a[last]
	*h = a[:last]
	a = a[:last]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(a) && a[l] < a[least] {
			least = l
		}
		if r < len(a) && a[r] < a[least] {
			least = r
		}
		if least == i {
			return top
		}
		a[i], a[least] = a[least], a[i]
		i = least
	}
}
