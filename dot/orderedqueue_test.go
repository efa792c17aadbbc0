package dot

import (
	"testing"
)

// The queries written before the pool bounds a connection move: mixed
// property seed 29's upstream (handshakes of 37 ms, answers of about 6 ms,
// 4 at once on a connection and the rest queued in order) is learned out of
// order at about 46 ms, and its oldest connections filled in turn held
// 100-130 queries each before the depth cost bounded them (99-185 ms). Found
// per connection as an ordered queue (orderedqueue.go), those connections are
// bounded and their queries rescued, and few answers come late. Judged by
// the answers slower than half as much again as the model's p99, not by the
// property's p99 bound, which the seed meets in plain runs but misses by up
// to 12 ms under -race (8 runs in about 100): with the fix 2-5 of the 1,500
// answers are that slow; without it (watchOrderedQueues returning at once)
// 35-190, and the p99 was 116-240 ms against the model's 66.
func TestOrderedQueueWrittenBeforeTheBoundMoves(t *testing.T) {
	pool, model := runMixedBackends(t, 29, backend{depth: 4, speed: 1})
	late, slow := 0, model.p99()*3/2
	for _, d := range pool.took {
		if d > slow {
			late++
		}
	}
	if pool.answered*100 < model.answered*98 || late*100 > pool.answered*2 {
		t.Errorf("4 at once: answered %d against %d, %d slower than %v (the model's p99 %v)\n  pool:  %v\n  model: %v",
			pool.answered, model.answered, late, slow, model.p99(), pool, model)
	}
}
