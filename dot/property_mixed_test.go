package dot

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPropertyMixed is a third family of seeded upstreams, judged as
// TestProperty's are (property_verdict_test.go), with its own seeds and its
// own known failures. TestProperty's and TestPropertySteady's upstreams
// serve every connection alike, one way for the whole run. Behind one
// address real ones do not:
//
//   - a load balancer (dnsdist, a cloud balancer, an anycast address) sends
//     each connection to one of several backends, some in order, some
//     pipelining, some slower;
//   - the server behind the address changes mid-run (a failover, a restart,
//     a proxy's backend replaced): in order becomes out of order or the
//     reverse, and answer times change;
//   - a server pipelines up to a bound: it works on at most k of a
//     connection's queries at once (k from 2 to 8) and leaves the rest
//     queued, in order.
//
// What the pool learned of the upstream is then true of some connections,
// or until some moment: each belief must be re-tested by what the pool
// measures, and a wrong one corrected within seconds. Each seed is
// TestProperty's seed of the same number (drawSeed: answer times, faults,
// load) with one or more of these drawn over it (drawMixture), so that a
// seed failing here and passing there fails by the mix.
//
// Replay a seed with -run 'TestPropertyMixed$/seed=N$' (-property.trace
// works as for TestProperty). More seeds: -property.mixedseeds=500.
func TestPropertyMixed(t *testing.T) {
	seeds := make([]uint64, 0, *propertyMixedSeeds)
	for s := uint64(1); s <= uint64(*propertyMixedSeeds); s++ {
		seeds = append(seeds, s)
	}
	judgeFamily(t, propertyFamily{
		name:      "TestPropertyMixed",
		known:     mixedKnownFailuresFile,
		raceSeeds: mixedRaceSeeds,
		draw:      drawMixed,
	}, seeds)
}

var propertyMixedSeeds = flag.Int("property.mixedseeds", 100, "how many seeds TestPropertyMixed draws (from 1)")

// mixedKnownFailuresFile lists the seeds TestPropertyMixed still fails, a
// ratchet as knownFailuresFile is TestProperty's.
const mixedKnownFailuresFile = "testdata/property_mixed_known_failures.txt"

// mixedRaceSeeds is how many seeds TestPropertyMixed draws under the race
// detector: the simulated upstream's new paths, not the pool's, are what
// this family adds there.
const mixedRaceSeeds = 5

// backend is how one server behind a mixed upstream's address serves a
// connection.
type backend struct {
	depth int     // the connection's queries worked on at once: 1 in order, 0 any number (out of order), 2-8 bounded pipelining
	speed float64 // its answers take speed times the drawn answer time
}

func (be backend) String() string {
	switch be.depth {
	case 0:
		return fmt.Sprintf("out of order ×%.2f", be.speed)
	case 1:
		return fmt.Sprintf("in order ×%.2f", be.speed)
	}
	return fmt.Sprintf("%d at once ×%.2f", be.depth, be.speed)
}

// switchStyle is what a mixed upstream's switch does to the connections
// open at it.
type switchStyle int

const (
	switchKeeps   switchStyle = iota // a balancer: open connections keep their old backend, new ones get the new
	switchCuts                       // a failover or restart: every open connection is cut, busy or not
	switchInPlace                    // a proxy whose backend was replaced: open connections are served by the new one
)

func (s switchStyle) String() string {
	return [...]string{"keeps open connections", "cuts open connections", "in place"}[s]
}

// mixture is what TestPropertyMixed draws over an upstream: its backends
// before and after a switch.
type mixture struct {
	seed     uint64
	before   []backend     // a connection gets one of these, by its dial's number (backendOf)
	switchAt time.Duration // from the load's start; 0: no switch
	after    []backend     // from switchAt on
	style    switchStyle
}

// backendOf is the backend serving the upstream's n-th connection, dialled
// at dialedAt, at now. The draw of a connection's backend is the seed's and
// n's alone, so the pool's n-th connection and the model's get the same one,
// whatever order their goroutines ran in.
func (m *mixture) backendOf(n int, dialedAt, now time.Duration) backend {
	set := m.before
	if m.switchAt > 0 && (dialedAt >= m.switchAt || m.style == switchInPlace && now >= m.switchAt) {
		set = m.after
	}
	r := rand.New(rand.NewPCG(m.seed, uint64(n)*0x9e3779b97f4a7c15))
	return set[r.IntN(len(set))]
}

func (m *mixture) String() string {
	var s strings.Builder
	fmt.Fprintf(&s, "backends %v", m.before)
	if m.switchAt > 0 {
		fmt.Fprintf(&s, ", at %v switched to %v (%v)", m.switchAt.Round(time.Millisecond), m.after, m.style)
	}
	return s.String()
}

// drawMixed draws the behaviour and load of a TestPropertyMixed seed:
// TestProperty's seed of the same number, with a mixture over it.
func drawMixed(seed uint64) (behaviour, offeredLoad) {
	b, ld := drawSeed(seed, drawLimits{maxQueries: *propertyMax, maxLength: 3 * time.Second})
	b.mix = drawMixture(seed, b.inOrder, ld.arrivals[len(ld.arrivals)-1])
	b.inOrder = b.mix.before[0].depth == 1 // printed: the first backend's order
	return b, ld
}

// runMixedBackends runs a TestPropertyMixed seed's load against its upstream
// served from the start by backends alone (in order as the first is, as
// drawMixed prints it), on the forward model and on the pool: for the tests
// that pin one seed's mix to named backends.
func runMixedBackends(t *testing.T, seed uint64, backends ...backend) (pool, model loadOutcome) {
	b, ld := drawMixed(seed)
	b.mix = &mixture{seed: seed, before: backends}
	b.inOrder = backends[0].depth == 1
	model = runForward(t, &b, ld)
	return runPool(t, &b, ld), model
}

// Which of the mix's behaviours a seed draws, at least one: bits of a
// number from 1 to 7.
const (
	mixSwitch = 1 << iota
	mixPerConn
	mixBounded
)

// drawMixture draws, from its own stream (TestProperty's draw is not
// touched), a mixture over an upstream drawn inOrder whose load spans span.
func drawMixture(seed uint64, inOrder bool, span time.Duration) *mixture {
	r := rand.New(rand.NewPCG(seed, 0x3c6ef372fe94f82b))
	what := 1 + r.IntN(7)
	first := backend{depth: 0, speed: 1}
	if inOrder {
		first.depth = 1
	}
	if what&mixBounded != 0 {
		first.depth = 2 + r.IntN(7)
	}
	m := &mixture{seed: seed, before: []backend{first}}
	if what&mixPerConn != 0 {
		for range 1 + r.IntN(2) {
			m.before = append(m.before, drawBackend(r))
		}
	}
	if what&mixSwitch != 0 {
		m.switchAt = span/10 + time.Duration(r.Int64N(int64(span*8/10)+1))
		m.style = switchStyle(r.IntN(3))
		for _, be := range m.before {
			m.after = append(m.after, flipped(r, be))
		}
	}
	return m
}

// drawBackend draws one more backend of a balancer: in order, out of order
// or bounded, a third each, from 3 times faster to 3 times slower.
func drawBackend(r *rand.Rand) backend {
	be := backend{depth: []int{0, 1, 2 + r.IntN(7)}[r.IntN(3)]}
	be.speed = logUniform(r, 1.0/3, 3)
	return be
}

// flipped is the server that replaces be at a switch: in order if be
// pipelines, pipelining (without or with a bound) if be is in order, and
// from 5 times faster to 5 times slower.
func flipped(r *rand.Rand, be backend) backend {
	out := backend{depth: 1, speed: be.speed * logUniform(r, 0.2, 5)}
	if be.depth == 1 {
		out.depth = []int{0, 2 + r.IntN(7)}[r.IntN(2)]
	}
	return out
}

// The mixed family draws what it is for: each behaviour of the mix several
// times (switches of every style, balancers mixing orders, bounded
// pipelining), switches both ways, both orders; and a seed draws the same
// each time, its TestProperty seed's upstream and load under the mix.
func TestPropertyMixedDrawsItsSpace(t *testing.T) {
	const seeds = 100
	lim := drawLimits{maxQueries: *propertyMax, maxLength: 3 * time.Second}
	counts := map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		b, ld := drawMixed(seed)
		if b2, ld2 := drawMixed(seed); b2.String() != b.String() || !slices.Equal(ld.arrivals, ld2.arrivals) {
			t.Fatalf("Seed %d drew %v, then %v", seed, b, b2)
		}
		if _, base := drawSeed(seed, lim); !slices.Equal(ld.arrivals, base.arrivals) {
			t.Fatalf("Seed %d's load is not TestProperty's seed %d's", seed, seed)
		}
		for what, drawn := range mixedFeatures(b.mix) {
			counts[what] += btoi(drawn)
		}
	}
	for what := range mixedFeatures(&mixture{before: []backend{{}}}) {
		if counts[what] < 3 {
			t.Errorf("%d of %d seeds draw %s, want 3 or more", counts[what], seeds, what)
		}
	}
}

// mixedFeatures says which of the features TestPropertyMixedDrawsItsSpace
// wants drawn a mixture has.
func mixedFeatures(m *mixture) map[string]bool {
	orders := func(set []backend) (in, out bool) {
		for _, be := range set {
			in, out = in || be.depth == 1, out || be.depth != 1
		}
		return in, out
	}
	in, out := orders(m.before)
	bounded := slices.ContainsFunc(append(slices.Clone(m.before), m.after...), func(be backend) bool { return be.depth > 1 })
	sw := m.switchAt > 0
	return map[string]bool{
		"a balancer mixing orders":                   in && out,
		"bounded pipelining":                         bounded,
		"a switch from in order":                     sw && m.before[0].depth == 1,
		"a switch to in order":                       sw && m.before[0].depth != 1,
		"a switch keeping connections":               sw && m.style == switchKeeps,
		"a switch cutting connections":               sw && m.style == switchCuts,
		"a switch in place":                          sw && m.style == switchInPlace,
		"one backend, no switch, bounded pipelining": !sw && len(m.before) == 1 && m.before[0].depth > 1,
	}
}
