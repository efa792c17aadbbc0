package dot

import (
	"testing"
	"time"
)

// As a pause of an in-order upstream ends, every connection it held frees at
// once, and the queries waiting take those: the dials under way for them,
// started in the pause's last handshake, serve nobody and are dropped before
// they are done (dropSurplusDials). forward's queries each wait for the
// connection they dialled, which the upstream counts open: here 8 dials of
// 16 ms come in the pause's last 16 ms (500 QPS, a query every 2 ms). The
// pool opened 102-103 connections at once against the model's 110; without
// the drops, 109-110.
func TestPauseEndDropsTheWaitersDials(t *testing.T) {
	const service, handshake = 20 * time.Millisecond, 16 * time.Millisecond
	b := behaviour{seed: 1, inOrder: true, scale: service, handshake: handshake,
		stalls: []spell{{at: 200 * time.Millisecond, length: 200 * time.Millisecond}}}
	ld := offeredLoad{qps: 500, deadline: 2 * time.Second}
	for i := range 300 {
		ld.arrivals = append(ld.arrivals, time.Duration(i)*2*time.Millisecond)
	}
	model, pool := runForward(t, &b, ld), runPool(t, &b, ld)
	if pool.answered != len(ld.arrivals) {
		t.Errorf("Answered %d of %d: %v", pool.answered, len(ld.arrivals), pool)
	}
	if pool.p99() > model.p99() {
		t.Errorf("p99 %v, want at most the model's %v", pool.p99(), model.p99())
	}
	if pool.peak > model.peak-4 {
		t.Errorf("%d connections at once, want at most %d, 4 fewer than the model's %d: %v", pool.peak, model.peak-4, model.peak, pool)
	}
}
