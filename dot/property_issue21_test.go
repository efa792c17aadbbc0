//go:build property

// The upstreams of issue 21, judged as TestProperty's seeds are. Behind the
// build tag property until the pool passes them. On 2038994 (session 18, 4
// runs): in order 5 ms (make bench's dnsdist-slow) fails every run, 29
// connections against the model's 15 (see TestPropertySteady's known
// failures, kind A); with a storm, 1 run in 4; the others pass. Run them
// with `make test-property` or
// `go test -tags property -run 'TestPropertyIssue21' ./dot/`.

package dot

import (
	"testing"
	"time"
)

// The upstreams of issue 21, drawn by hand and judged as the seeds are: the
// distant in-order upstream at 2,000 QPS, alone and with a handshake storm
// that makes its answers four times slower for 300 ms (what flipped the mode
// and barred in-order for a minute), a pipelining upstream whose every
// answer takes 300 ms, and dnsdist-slow's in-order frontend before a 5 ms
// backend at 2,000 QPS, each with a 2 ms handshake.
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
		{"in order 5ms", behaviour{inOrder: true, scale: 5 * time.Millisecond, jitter: 0.03, handshake: handshake},
			every(4000, 500*time.Microsecond, 2*time.Second)},
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
