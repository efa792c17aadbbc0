package dot

import (
	"testing"
	"time"
)

// make bench's dnsdist-slow regime, in a bubble: dnsdist's DoT frontend
// serves one query of a connection at a time, in order, in front of a backend
// answering after about 5 ms, under a steady 2,000 QPS. forward holds about
// ten connections (2,000 QPS × 5 ms, and a dial now and then). The pool's
// first answer (5 ms) is under unknownSlow, so it pipelines the queries that
// come next while it learns the mode: the answers of a queue that grows on
// one connection show in order only one service time at a time, and the
// rescues of that queue, once in order is learned, take connections forward
// never opens (issue 21: 29-30 against the model's 13 before the fix).
func TestFastInOrderSteadyLoadNoMoreConnectionsThanForward(t *testing.T) {
	ld := offeredLoad{qps: 2000, deadline: 5 * time.Second}
	for i := range 2000 {
		ld.arrivals = append(ld.arrivals, time.Duration(i)*500*time.Microsecond)
	}
	for _, handshake := range []time.Duration{time.Millisecond, 3 * time.Millisecond} {
		t.Run(handshake.String(), func(t *testing.T) {
			b := behaviour{seed: 5, inOrder: true, scale: 5150 * time.Microsecond, jitter: 0.03, handshake: handshake}
			model := runForward(t, &b, ld)
			pool := runPool(t, &b, ld)
			t.Logf("pool:  %v\nmodel: %v", pool, model)
			if msg := judgeSeed(pool, model); msg != "" {
				t.Errorf("%s\n  upstream: %v\n  pool:  %v\n  model: %v", msg, b, pool, model)
			}
		})
	}
}
