package dotforward

import (
	"context"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
)

// A panic in the pool, which CoreDNS recovers per query, must not leave the query
// counted as pending: the latency policy and the inflight gauge read that count.
// A nil message, a caller's bug that CoreDNS never makes, is the one input left
// that makes the pool panic (hostile records are refused as errors).
func TestExchangePanicLeavesNothingInFlight(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "", s.Addr)
	u := f.upstreams[0]
	samplesBefore := histogramCount(t, s.Addr) // metrics are keyed by address, which tests may reuse
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("Expected the pool to panic on a nil message")
			}
		}()
		u.exchange(context.Background(), nil, time.Now().Add(time.Second))
	}()
	if n := u.pending.Load(); n != 0 {
		t.Errorf("Expected no query pending after the panic, got %d", n)
	}
	if g := metricValue(t, inflight.WithLabelValues(s.Addr)); g != 0 {
		t.Errorf("Expected the inflight gauge 0 after the panic, got %v", g)
	}
	if n := histogramCount(t, s.Addr) - samplesBefore; n != 1 {
		t.Errorf("Expected the panicked exchange in request_duration_seconds, got %d samples", n)
	}
}
