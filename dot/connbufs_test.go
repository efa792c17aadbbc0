package dot

import (
	"runtime"
	"testing"
)

// A spare outlives garbage collections: a sync.Pool is empty after two, and
// against a server that cuts connections every hundred queries one comes every
// few dozen connections.
func TestSpareBufsSurviveGC(t *testing.T) {
	var s spareBufs
	b := newConnBufs()
	s.put(b, 1)
	runtime.GC()
	runtime.GC()
	if got := s.get(); got != b {
		t.Fatal("the spare buffers were gone after two collections: the next connection allocated its own")
	}
}

// The successors of connections that reached a query limit together are
// dialled together: every set their closes gave back is there for them, even
// though fewer connections were open at each close than there were sets.
func TestSpareBufsCoverABurst(t *testing.T) {
	var s spareBufs
	const burst = 12
	given := make(map[*connBufs]bool)
	for open := burst; open > 0; open-- {
		b := newConnBufs()
		given[b] = true
		s.put(b, open) // open: those left, with the successors being dialled
	}
	for i := range burst {
		b := s.get()
		if !given[b] {
			t.Fatalf("dial %d of a burst of %d got new buffers", i+1, burst)
		}
		delete(given, b)
	}
}

// A pool whose last connection closed keeps one set, not a burst's worth.
func TestSpareBufsIdleKeepsOne(t *testing.T) {
	var s spareBufs
	for range 5 {
		s.put(newConnBufs(), 3)
	}
	last := newConnBufs()
	s.put(last, 0)
	if got := s.get(); got != last {
		t.Fatal("the last connection's buffers were not kept")
	}
	if len(s.free) != 0 {
		t.Fatalf("an idle pool kept %d more sets of buffers", len(s.free))
	}
}
