package dot

import (
	"flag"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestProperty judges the pool against the model of forward on seeded
// upstreams and loads (property_test.go has the harness and the verdict).
//
// The pool does not pass every seed yet (issue 21): the seeds it still fails
// are listed in knownFailuresFile, and in go test they are a ratchet. A
// listed seed that fails is logged, not failed; a seed not listed that fails
// is a regression and fails the test, unless a replay passes (a seed near a
// margin can go either way, see property_test.go: it is then logged as
// such). The log ends with how many listed seeds still fail and which now
// pass (take those off the list). -property.strict (make test-property)
// fails every seed that fails: the verdict.
//
// Under the race detector goroutines are scheduled otherwise, and seeds near
// a margin go the other way more often: there the test is a race check of the
// pool on raceSeeds drawn upstreams, one at a time, and its verdicts are
// logged, not failed, but for a lost query (which no scheduling excuses). make test runs it once more without the detector, where
// they count (see the Makefile).
func TestProperty(t *testing.T) {
	lim := drawLimits{maxQueries: *propertyMax, maxLength: 3 * time.Second}
	known := readSeedsFile(t, knownFailuresFile)
	var sum failSummary
	var r ratchet
	t.Cleanup(func() { sum.log(t); r.log(t, known) })
	seeds := propertySeedList(t)
	if raceEnabled {
		seeds = seeds[:min(len(seeds), raceSeeds)]
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			if !raceEnabled {
				// Under the race detector one at a time: on both cores
				// at once the seeds starve the e2e tests that go test
				// runs beside this package (a record trial of named's
				// timed out that way).
				t.Parallel()
			}
			b, ld := drawSeed(seed, lim)
			judge := func() (string, loadOutcome, loadOutcome) {
				model := runForward(t, &b, ld)
				pool := runPool(t, &b, ld)
				return judgeSeed(pool, model), pool, model
			}
			msg, pool, model := judge()
			sum.add(seed, msg)
			report := fmt.Sprintf("Seed %d: %s\n  upstream: %v\n  load: %v\n  pool:  %v\n  model: %v\n  replay: go test ./dot/ -run 'TestProperty$/seed=%d$'",
				seed, msg, b, ld, pool, model, seed)
			switch {
			case msg == "":
				r.passed(seed)
			case raceEnabled && len(pool.lost) == 0:
				t.Log("Under the race detector, not judged: " + report)
			case raceEnabled:
				t.Error("Queries lost (under the race detector too, a loss is a bug): " + report)
			case *propertyStrict:
				if slices.Contains(known, seed) {
					r.knownFailed(seed) // counted in the log, failed all the same
				}
				t.Error(report)
			case slices.Contains(known, seed):
				r.knownFailed(seed)
				t.Log("Known failure (" + knownFailuresFile + "): " + report)
			default:
				for range propertyReplays {
					if again, _, _ := judge(); again == "" {
						t.Log("Failed once, passed on a replay (near a margin): " + report)
						return
					}
				}
				t.Error("Regression (not in " + knownFailuresFile + "; failed on every replay): " + report)
			}
		})
	}
}

var propertyStrict = flag.Bool("property.strict", false, "TestProperty fails every seed that fails, the known failures too")

// knownFailuresFile lists the seeds TestProperty still fails (issue 21).
const knownFailuresFile = "testdata/property_known_failures.txt"

// raceSeeds is how many seeds TestProperty draws under the race detector.
const raceSeeds = 50

// propertyReplays is how often a seed not known to fail is replayed before
// its failure counts.
const propertyReplays = 3

// ratchet tallies the known failures of a TestProperty run.
type ratchet struct {
	mu     sync.Mutex
	failed []uint64 // guarded by mu: listed seeds that failed
	passes []uint64 // guarded by mu: seeds that passed
}

func (r *ratchet) knownFailed(seed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, seed)
}

func (r *ratchet) passed(seed uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.passes = append(r.passes, seed)
}

// log says how many listed seeds still fail and which listed ones now pass.
func (r *ratchet) log(t *testing.T, known []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var now []uint64
	for _, s := range r.passes {
		if slices.Contains(known, s) {
			now = append(now, s)
		}
	}
	slices.Sort(now)
	t.Logf("Known failures (%s, issue 21): %d of %d listed still fail; now pass, to take off the list: %v",
		knownFailuresFile, len(r.failed), len(known), now)
}
