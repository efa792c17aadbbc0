package dot

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// A shard's table holds at most one leader per key hash, in its slots or, once
// they are taken, in its map, and finds each as a map alone would: checked
// against a map through random leads (new flights, and full flights' next
// leaders) and ends, over more hashes than the slots hold.
func TestFlightTableAgreesWithAMap(t *testing.T) {
	var s flightShard
	model := map[uint64]*query{}
	rng := rand.New(rand.NewPCG(1, 2))
	hashes := make([]uint64, 3*flightSlots)
	for i := range hashes {
		hashes[i] = rng.Uint64()
	}
	for step := range 5000 {
		h := hashes[rng.IntN(len(hashes))]
		switch l := model[h]; {
		case rng.IntN(2) == 0:
			q := new(query)
			s.lead(h, q)
			model[h] = q
		case l != nil && rng.IntN(4) == 0:
			s.remove(h, new(query)) // a leader replaced since: it stays
		case l != nil:
			s.remove(h, l)
			delete(model, h)
		}
		for _, h := range hashes {
			if got, want := s.leader(h), model[h]; got != want {
				t.Fatalf("Step %d: leader of %x = %p, want %p", step, h, got, want)
			}
			n := 0
			for _, sl := range s.slots {
				if sl.q != nil && sl.hash == h {
					n++
				}
			}
			if _, ok := s.more[h]; ok {
				n++
			}
			want := 0
			if model[h] != nil {
				want = 1
			}
			if n != want {
				t.Fatalf("Step %d: hash %x held %d times, want %d", step, h, n, want)
			}
		}
	}
	if len(s.more) == 0 {
		t.Error("The map was never used: the test did not fill the slots")
	}
}

// Each shard is two whole cache lines, and the first starts the allocation: a
// shard written from one CPU shares no line with its neighbours.
func TestFlightShardsFillCacheLines(t *testing.T) {
	if size := unsafe.Sizeof(flightShard{}); size != 128 {
		t.Errorf("A flight shard is %d bytes, want 128", size)
	}
	if off := unsafe.Offsetof(flights{}.shards); off != 0 {
		t.Errorf("The shards start at %d, want 0", off)
	}
}
