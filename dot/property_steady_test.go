package dot

import (
	"flag"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestPropertySteady is a second family of seeded upstreams, judged as
// TestProperty's are (property_verdict_test.go), with its own seeds and its
// own known failures. TestProperty's draw spreads its seeds over the whole
// space, and most of them draw a heavy-tailed distribution, a storm, a
// stall or a short load: an upstream users run every day (a steady load on
// answers that all take about as long) it draws rarely or never. make
// bench's dnsdist-slow is one: an in-order frontend before a 5 ms backend at
// 2,000 QPS, where the pool held 34-45 connections against forward's 20-22,
// and none of TestProperty's 200 seeds draws it. This family draws
// steady loads on constant or narrow answer times, weighted to the kinds of
// upstream of issue 21 and their neighbourhood (steadyRanges): no storms
// and no stalls; query limits, idle timeouts and a loaded client sometimes.
//
// Replay a seed with -run 'TestPropertySteady$/seed=N$' (-property.trace
// works as for TestProperty). More seeds, and longer loads:
// -property.steadyseeds=500 -property.steadyqueries=20000.
func TestPropertySteady(t *testing.T) {
	seeds := make([]uint64, 0, *propertySteadySeeds)
	for s := uint64(1); s <= uint64(*propertySteadySeeds); s++ {
		seeds = append(seeds, s)
	}
	judgeFamily(t, propertyFamily{
		name:      "TestPropertySteady",
		known:     steadyKnownFailuresFile,
		raceSeeds: steadyRaceSeeds,
		draw:      func(seed uint64) (behaviour, offeredLoad) { return drawSteady(seed, *propertySteadyMax) },
	}, seeds)
}

var (
	propertySteadySeeds = flag.Int("property.steadyseeds", 100, "how many seeds TestPropertySteady draws (from 1)")
	propertySteadyMax   = flag.Int("property.steadyqueries", 3000, "the most queries a TestPropertySteady seed offers")
)

// steadyKnownFailuresFile lists the seeds TestPropertySteady still fails,
// a ratchet as knownFailuresFile is TestProperty's.
const steadyKnownFailuresFile = "testdata/property_steady_known_failures.txt"

// steadyRaceSeeds is how many seeds TestPropertySteady draws under the race
// detector: TestProperty's race seeds check the same pool code, and a steady
// seed offers twice as many queries.
const steadyRaceSeeds = 5

// steadyKind is the kind of upstream a TestPropertySteady seed draws.
type steadyKind int

const (
	kindNone           steadyKind = iota // TestProperty's seeds
	kindNearInOrder                      // dnsdist-slow: an in-order frontend before a 5 ms backend
	kindDistantInOrder                   // inorder-distant: in order, every answer after 30 ms
	kindSlowPipelining                   // slow-pipelining: out of order, every answer after 300 ms
	kindFastPipelining                   // unbound: out of order, 0.1 ms answers, high load
	kindAnyScale                         // either order, any scale from 0.1 to 300 ms
)

func (k steadyKind) String() string {
	return [...]string{"", "near in order", "distant in order", "slow pipelining", "fast pipelining", "any scale"}[k]
}

// steadyRange is where a kind's upstream and load are drawn.
type steadyRange struct {
	order      int // 1: in order, 0: out of order, -1: either
	scaleRange [2]time.Duration
	qpsRange   [2]float64
}

// steadyRanges: each kind of issue 21's around its bench regime, and any
// scale at any moderate load between them.
var steadyRanges = map[steadyKind]steadyRange{
	kindNearInOrder:    {1, [2]time.Duration{2 * time.Millisecond, 10 * time.Millisecond}, [2]float64{1000, 4000}},
	kindDistantInOrder: {1, [2]time.Duration{15 * time.Millisecond, 60 * time.Millisecond}, [2]float64{1000, 4000}},
	kindSlowPipelining: {0, [2]time.Duration{100 * time.Millisecond, 300 * time.Millisecond}, [2]float64{200, 2000}},
	kindFastPipelining: {0, [2]time.Duration{100 * time.Microsecond, time.Millisecond}, [2]float64{3000, 40000}},
	kindAnyScale:       {-1, [2]time.Duration{100 * time.Microsecond, 300 * time.Millisecond}, [2]float64{200, 5000}},
}

// steadyDraws weighs the kinds: any scale twice, each of the others once.
var steadyDraws = []steadyKind{kindNearInOrder, kindDistantInOrder, kindSlowPipelining, kindFastPipelining, kindAnyScale, kindAnyScale}

// drawSteady draws the behaviour and load of a TestPropertySteady seed, at
// most maxQueries queries.
func drawSteady(seed uint64, maxQueries int) (behaviour, offeredLoad) {
	r := rand.New(rand.NewPCG(seed, 0x57eadc0ffee5eed5))
	kind := steadyDraws[r.IntN(len(steadyDraws))]
	rg := steadyRanges[kind]
	b := behaviour{seed: seed, kind: kind, inOrder: rg.order == 1 || rg.order == -1 && r.IntN(2) == 0}
	b.scale = logUniform(r, rg.scaleRange[0], rg.scaleRange[1])
	if r.IntN(2) == 0 {
		// Narrow: most answers within ±20 % of the scale.
		b.dist, b.sigma = distLognormal, 0.02+0.18*r.Float64()
	}
	b.jitter = 0.1 * r.Float64()
	b.handshake = logUniform(r, 500*time.Microsecond, 5*time.Millisecond)
	if r.IntN(5) == 0 {
		b.limit = int(logUniform(r, 20, 2000))
	}
	if r.IntN(5) == 0 {
		b.idle = logUniform(r, 100*time.Millisecond, 10*time.Second)
		b.keepalive = r.IntN(2) == 0
	}
	ld := drawSteadyLoad(r, rg, maxQueries)
	if r.IntN(6) == 0 {
		span := ld.arrivals[len(ld.arrivals)-1]
		b.loaded = []spell{{at: time.Duration(r.Int64N(int64(span) + 1)),
			length: logUniform(r, 10*time.Millisecond, 300*time.Millisecond),
			delay:  logUniform(r, 200*time.Microsecond, 5*time.Millisecond)}}
	}
	return b, ld
}

// drawSteadyLoad draws a steady load of 1-3 s at a rate of rg's: Poisson
// arrivals or evenly spaced ones (a paced load generator, as dnsperf -Q).
func drawSteadyLoad(r *rand.Rand, rg steadyRange, maxQueries int) offeredLoad {
	ld := offeredLoad{qps: logUniform(r, rg.qpsRange[0], rg.qpsRange[1])}
	ld.deadline = []time.Duration{2 * time.Second, 5 * time.Second}[r.IntN(2)]
	length := time.Second + time.Duration(r.Int64N(int64(2*time.Second)))
	ld.paced = r.IntN(2) == 0
	if !ld.paced {
		ld.arrivals = drawArrivals(r, ld.qps, length, maxQueries)
		return ld
	}
	gap := time.Duration(float64(time.Second) / ld.qps)
	for at := time.Duration(0); at <= length && len(ld.arrivals) < maxQueries; at += gap {
		ld.arrivals = append(ld.arrivals, at)
	}
	return ld
}

// The steady family draws what it is for: every kind several times, each
// near its bench regime (dnsdist-slow, inorder-distant, slow-pipelining and
// unbound), both orders, both distributions, both kinds of arrivals, each
// fault several times, and no storm nor stall; and a seed draws the same
// each time.
func TestPropertySteadyDrawsItsSpace(t *testing.T) {
	const seeds = 100
	counts := map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		b, ld := drawSteady(seed, *propertySteadyMax)
		if b2, ld2 := drawSteady(seed, *propertySteadyMax); b2.String() != b.String() || !slices.Equal(ld.arrivals, ld2.arrivals) {
			t.Fatalf("Seed %d drew %v, then %v", seed, b, b2)
		}
		if len(b.stalls)+len(b.storms) > 0 || b.silent || b.jitter > 0.1 || ld.qps < 200 || ld.qps > 40000 {
			t.Errorf("Seed %d drew %v, %v: not a steady upstream", seed, b, ld)
		}
		for what, drawn := range steadyFeatures(b, ld) {
			counts[what] += btoi(drawn)
		}
	}
	for what := range steadyFeatures(behaviour{}, offeredLoad{}) {
		if counts[what] < 2 {
			t.Errorf("%d of %d seeds draw %s, want 2 or more", counts[what], seeds, what)
		}
	}
}

// steadyFeatures says which of the features TestPropertySteadyDrawsItsSpace
// wants drawn a seed draws.
func steadyFeatures(b behaviour, ld offeredLoad) map[string]bool {
	near := func(d, at time.Duration, qps float64) bool {
		return d >= at*7/10 && d <= at*13/10 && qps >= 1400 && qps <= 2600
	}
	return map[string]bool{
		"in order": b.inOrder, "out of order": !b.inOrder,
		"constant": b.dist == distConstant, "lognormal": b.dist == distLognormal,
		"paced": ld.paced, "Poisson": !ld.paced,
		"query limits": b.limit > 0, "idle timeouts": b.idle > 0, "loaded clients": len(b.loaded) > 0,
		"dnsdist-slow (in order, 5 ms, 2,000 QPS)":     b.inOrder && b.limit == 0 && near(b.scale, 5*time.Millisecond, ld.qps),
		"inorder-distant (in order, 30 ms, 2,000 QPS)": b.inOrder && b.limit == 0 && near(b.scale, 30*time.Millisecond, ld.qps),
		"slow pipelining (out of order, 200 ms+)":      !b.inOrder && b.scale >= 200*time.Millisecond,
		"unbound (out of order, 0.2 ms, 3,000 QPS+)":   !b.inOrder && b.scale <= 200*time.Microsecond && ld.qps >= 3000,
	}
}
