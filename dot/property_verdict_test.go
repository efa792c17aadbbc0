//go:build property

// The property test's verdicts on the pool (issue 21, item 4). They are behind
// the build tag property until the pool passes them: at 98a007a (the learning
// rework) 76-78 of 200 seeds fail, and so do the three upstreams of issue 21
// (dot/testdata/property_failures_c21c1a2.txt lists the failures before it).
// Run them with `make test-property` or
// `go test -tags property -run 'TestProperty' ./dot/`; the harness's own tests
// (the model judged against itself, the draws, the model of forward) run in
// every go test.

package dot

import (
	"fmt"
	"testing"
	"time"
)

func TestProperty(t *testing.T) {
	lim := drawLimits{maxQueries: *propertyMax, maxLength: 3 * time.Second}
	seeds := propertySeedList(t)
	var sum failSummary
	t.Cleanup(func() { sum.log(t) })
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			b, ld := drawSeed(seed, lim)
			model := runForward(t, &b, ld)
			pool := runPool(t, &b, ld)
			msg := judgeSeed(pool, model)
			sum.add(seed, msg)
			if msg != "" {
				t.Errorf("Seed %d: %s\n  upstream: %v\n  load: %v\n  pool:  %v\n  model: %v\n  replay: go test ./dot/ -run 'TestProperty$/seed=%d$'",
					seed, msg, b, ld, pool, model, seed)
			}
		})
	}
}

// The upstreams of issue 21, drawn by hand and judged as the seeds are: the
// distant in-order upstream at 2,000 QPS, alone and with a handshake storm
// that makes its answers four times slower for 300 ms (what flipped the mode
// and barred in-order for a minute), and a pipelining upstream whose every
// answer takes 300 ms.
func TestPropertyIssue21(t *testing.T) {
	every := func(n int, gap, deadline time.Duration) offeredLoad {
		ld := offeredLoad{qps: float64(time.Second / gap), deadline: deadline}
		for i := range n {
			ld.arrivals = append(ld.arrivals, time.Duration(i)*gap)
		}
		return ld
	}
	const handshake = 2 * time.Millisecond
	storm := []spell{{at: time.Second, length: 300 * time.Millisecond, factor: 4}}
	for _, tc := range []struct {
		name string
		b    behaviour
		ld   offeredLoad
	}{
		{"in order 30ms", behaviour{inOrder: true, scale: 30 * time.Millisecond, handshake: handshake},
			every(4000, 500*time.Microsecond, 5*time.Second)},
		{"in order 30ms storm", behaviour{inOrder: true, scale: 30 * time.Millisecond, handshake: handshake, storms: storm},
			every(4000, 500*time.Microsecond, 5*time.Second)},
		{"out of order 300ms", behaviour{scale: 300 * time.Millisecond, handshake: handshake},
			every(1000, time.Millisecond, 5*time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.b.seed = 21
			model := runForward(t, &tc.b, tc.ld)
			pool := runPool(t, &tc.b, tc.ld)
			if msg := judgeSeed(pool, model); msg != "" {
				t.Errorf("%s\n  upstream: %v\n  load: %v\n  pool:  %v\n  model: %v", msg, tc.b, tc.ld, pool, model)
			}
		})
	}
}
