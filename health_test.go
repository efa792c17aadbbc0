package dotforward

import (
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot"
)

func TestDownAfterMaxFailsUpAtAnswer(t *testing.T) {
	u := testUpstreams(1)[0]
	if u.Down() {
		t.Fatal("Expected a new upstream up")
	}
	u.health.failure(dot.ErrDial)
	if u.Down() {
		t.Errorf("Expected an upstream up after 1 of max_fails 2 failures")
	}
	u.health.failure(dot.ErrDial)
	if !u.Down() {
		t.Errorf("Expected an upstream down after exactly max_fails 2 failures")
	}
	u.health.answered()
	if u.Down() || u.health.fails.Load() != 0 {
		t.Errorf("Expected an answer to bring the upstream back, fails reset")
	}
	// Errors of single exchanges are not health failures: the pool reports the
	// upstream's own failures separately.
	for _, err := range []error{dot.ErrTimeout, dot.ErrUnavailable, dot.ErrConnLost} {
		u.answers.missed(err, time.Millisecond)
	}
	if u.Down() || u.health.fails.Load() != 0 {
		t.Errorf("Expected exchange errors not to count as health failures")
	}

	never := newUpstream(dot.Config{Addr: "192.0.2.9:853"}, 0, healthCheck{})
	for range 10 {
		never.health.failure(dot.ErrDial)
	}
	if never.Down() {
		t.Errorf("Expected max_fails 0 never to mark an upstream down")
	}
}
