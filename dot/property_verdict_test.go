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
	judgeFamily(t, propertyFamily{
		name:      "TestProperty",
		known:     knownFailuresFile,
		raceSeeds: raceSeeds,
		draw:      func(seed uint64) (behaviour, offeredLoad) { return drawSeed(seed, lim) },
	}, propertySeedList(t))
}

// propertyFamily is a family of seeded upstreams and loads, judged seed by
// seed against the model of forward with a ratchet on its own known failures:
// TestProperty's, and TestPropertySteady's (property_steady_test.go).
type propertyFamily struct {
	name      string // the test's, for the replay line
	known     string // its known-failures file
	raceSeeds int    // how many seeds it runs under the race detector
	draw      func(seed uint64) (behaviour, offeredLoad)
}

// judgeFamily judges fam's seeds, each in a subtest of its own.
func judgeFamily(t *testing.T, fam propertyFamily, seeds []uint64) {
	known := readSeedsFile(t, fam.known)
	var sum failSummary
	var r ratchet
	t.Cleanup(func() { sum.log(t); r.log(t, fam.known, known) })
	if raceEnabled {
		seeds = seeds[:min(len(seeds), fam.raceSeeds)]
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
			judgeFamilySeed(t, fam, seed, slices.Contains(known, seed), &sum, &r)
		})
	}
}

// judgeFamilySeed judges one seed of fam; listed says it is a known failure.
func judgeFamilySeed(t *testing.T, fam propertyFamily, seed uint64, listed bool, sum *failSummary, r *ratchet) {
	b, ld := fam.draw(seed)
	judge := func() (string, loadOutcome, loadOutcome) {
		model := runForward(t, &b, ld)
		pool := runPool(t, &b, ld)
		return judgeSeed(pool, model), pool, model
	}
	msg, pool, model := judge()
	sum.add(seed, msg)
	report := fmt.Sprintf("Seed %d: %s\n  upstream: %v\n  load: %v\n  pool:  %v\n  model: %v\n  replay: go test ./dot/ -run '%s$/seed=%d$'",
		seed, msg, b, ld, pool, model, fam.name, seed)
	switch {
	case msg == "":
		r.passed(seed)
	case raceEnabled && len(pool.lost) == 0:
		t.Log("Under the race detector, not judged: " + report)
	case raceEnabled:
		t.Error("Queries lost (under the race detector too, a loss is a bug): " + report)
	case *propertyStrict:
		if listed {
			r.knownFailed(seed) // counted in the log, failed all the same
		}
		t.Error(report)
	case listed:
		r.knownFailed(seed)
		t.Log("Known failure (" + fam.known + "): " + report)
	default:
		for range propertyReplays {
			if again, _, _ := judge(); again == "" {
				t.Log("Failed once, passed on a replay (near a margin): " + report)
				return
			}
		}
		t.Error("Regression (not in " + fam.known + "; failed on every replay): " + report)
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

// ratchet tallies the known failures of a run of a family's seeds.
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
func (r *ratchet) log(t *testing.T, file string, known []uint64) {
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
		file, len(r.failed), len(known), now)
}
