package dot

import (
	"fmt"
	"testing"
	"time"
)

// A hiccup of a loaded client in mid-run: an in-order upstream answering in
// 5.15 ms, 2,000 QPS paced, 5 ms handshakes; 3 s after the warm-up's end
// every read comes late (5 or 10 ms) for 50 ms, and each handshake five
// times that. forward keeps the 21 connections of its cold start (it takes
// them in turn, none idles out) and absorbs the hiccup with them, dialling
// for the rest; the pool had closed what its cold start opened beyond what
// the load then needed (14), and each query of the hiccup that found none
// idle dialled, handshakes 30-55 ms long that were done after the reads had
// resumed (make bench's dnsdist-slow, where a round's most connections were
// over forward's: session 23's trace). Judged as the property test judges a
// seed, but for hiccupDials connections over forward's. Before takenOpen: 43
// connections against forward's 21 (reads 5 ms late), and 60 against 51 with
// a p99 of 24.3 ms against 15.1 (10 ms late); with it, under -race (240
// runs): 21-24 and 50-54, p99 10.0-10.3 and 15.8-19.1 ms.
// hiccupDials is how many connections over forward's the pool may open in
// TestLoadedClientHiccupFaresAsForward: its cold start opened one fewer
// than forward's (20 against 21), and the late reads need about one more
// than that; the queries that find none idle dial, and whether a dial or a
// connection freeing serves them first turns on the order in which
// goroutines woken at one virtual instant run: up to 3 more in 240 runs
// under -race (54 in 10 of 200), and two more for the runs not seen. Without
// takenOpen the pool opened 22-25 and 6-9 more (and the 10 ms p99 was over).
const hiccupDials = 5

func TestLoadedClientHiccupFaresAsForward(t *testing.T) {
	const gap, warmUp = 500 * time.Millisecond, 2 * time.Second
	const qps, answer = 2000, 5150 * time.Microsecond
	ld := offeredLoad{qps: qps, deadline: 5 * time.Second, paced: true, heldFrom: gap + warmUp}
	ld.arrivals = append(ld.arrivals, 0) // a probe: the pool's first connection, then a pause
	for i := range 8000 {
		ld.arrivals = append(ld.arrivals, gap+time.Duration(i)*time.Second/qps)
	}
	for _, late := range []time.Duration{5 * time.Millisecond, 10 * time.Millisecond} {
		t.Run(fmt.Sprintf("late=%v", late), func(t *testing.T) {
			b := behaviour{seed: 5, inOrder: true, scale: answer, jitter: 0.03, handshake: 5 * time.Millisecond,
				loaded: []spell{{at: gap + 3*time.Second, length: 50 * time.Millisecond, delay: late}}}
			model := runForward(t, &b, ld)
			pool := runPool(t, &b, ld)
			t.Logf("pool:  %v\nmodel: %v", pool, model)
			allowed := model
			allowed.peak += hiccupDials
			if msg := judgeSeed(pool, allowed); msg != "" {
				t.Errorf("%s (%d over forward allowed)\n  upstream: %v\n  pool:  %v\n  model: %v", msg, hiccupDials, b, pool, model)
			}
		})
	}
}
