package dot

import (
	"strings"
	"testing"
	"time"
)

// A server that works on 4 queries of a connection at once and queues the
// rest in order (dnsdist's maxInFlight) answers the 4 out of order, and the
// pool learns it out of order; TestProperty's seed 85 upstream (lognormal
// answers of 16 ms, a limit of 28 queries, storms, 530 QPS) served so must
// fare as the forward model does. Filled in turn, its connections held
// dozens each (p99 1.6 s against the model's 459 ms); the depth cost
// (depthcost.go) bounds them: with depthBound returning the slots, this
// failed in 4 runs of 4 (p99 1.62 s), and passed in 6 of 6 with it. It
// judges the answers and their p99, what the bound is for: the connections
// at once (78 against the model's 76 in two whole-package runs under -race,
// where goroutines run in other orders) are TestPropertyMixed's to judge.
func TestBoundedPipeliningFaresAsForward(t *testing.T) {
	pool, model := runMixedBackends(t, 85, backend{depth: 4, speed: 1})
	if bad := judgeServed(pool, model); len(bad) > 0 {
		t.Errorf("4 at once: %s\n  pool:  %v\n  model: %v", strings.Join(bad, "; "), pool, model)
	}
}

// The fit of answer times against depth: a slope only from enough answers
// spread over depths, and none where it stands within a few standard errors
// of none.
func TestDepthFitSlope(t *testing.T) {
	var line, flat, few, one depthFit
	for i := range 64 {
		d := int64(i % 16)
		noise := int64(i%3-1) * int64(100*time.Microsecond)
		line.add(d, int64(time.Millisecond)+d*int64(time.Millisecond)+noise)
		flat.add(d, int64(time.Millisecond)+noise*int64(i%5))
		one.add(4, int64(time.Millisecond)+d*int64(time.Millisecond))
	}
	for i := range minDepthFit - 1 {
		few.add(int64(i), int64(i)*int64(time.Millisecond))
	}
	if c, ok := line.slope(); !ok || c < int64(900*time.Microsecond) || c > int64(1100*time.Microsecond) {
		t.Errorf("A millisecond a query ahead: slope %v, %v", time.Duration(c), ok)
	}
	if c, ok := flat.slope(); !ok || c != 0 {
		t.Errorf("No growth with depth: slope %v, %v; want none", time.Duration(c), ok)
	}
	if _, ok := few.slope(); ok {
		t.Errorf("%d answers made a fit", minDepthFit-1)
	}
	if _, ok := one.slope(); ok {
		t.Error("Answers all at one depth made a fit")
	}
}
