package dot

import (
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
)

// A "one per record" verdict holds 30 s, then twice as long with each one in a
// row, up to learnedTTL; a "shared" one holds learnedTTL and ends the streak.
func TestRecordVerdictTTL(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	p, rec := newTestPool(t, s, nil)
	// The pool clock may tick between the verdict and the check: allow a second.
	ttl := func() time.Duration { return time.Duration(p.learned.records.until.Load() - p.clock.Load()) }
	near := func(got, want time.Duration) bool { return got <= want && got > want-time.Second }
	want := []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 4 * time.Minute, 8 * time.Minute, learnedTTL, learnedTTL}
	for i, w := range want {
		p.endTrial(verdictOwn)
		if got := ttl(); !near(got, w) {
			t.Errorf("One-per-record verdict %d holds %v, want %v", i+1, got, w)
		}
	}
	p.endTrial(verdictShared)
	if got := ttl(); !near(got, learnedTTL) {
		t.Errorf("Shared verdict holds %v, want %v", got, learnedTTL)
	}
	p.endTrial(verdictOwn)
	if got := ttl(); !near(got, ownTTL) {
		t.Errorf("One-per-record verdict after a shared one holds %v, want %v", got, ownTTL)
	}
	if v := verdicts(rec); len(v) != 3 || v[0] || !v[1] || v[2] {
		t.Errorf("Verdicts reported = %v, want [false true false]: only changes", v)
	}
}
