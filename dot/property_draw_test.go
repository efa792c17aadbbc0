package dot

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// The property test (property_test.go) draws, from a seed, an upstream's
// behaviour and a load. Everything drawn is in these types, printed on a
// failure so that a seed can be read without replaying it.

// behaviour is how a drawn upstream serves, and how loaded the client's
// machine is. Times are virtual (a synctest bubble's).
type behaviour struct {
	seed      uint64
	inOrder   bool          // a connection's queries are answered one at a time, in order
	dist      answerDist    // the answer-time distribution of a name
	scale     time.Duration // its scale: 0.1 ms to 300 ms
	slowFrac  float64       // bimodal: the share of names that are slow
	slowTimes float64       // bimodal: how many times slower they are
	alpha     float64       // pareto: the tail index (smaller: heavier)
	sigma     float64       // lognormal: the spread
	jitter    float64       // each answer's time is scaled by 1±jitter, uniformly
	limit     int           // the server cuts a connection after this many answers; 0: never
	idle      time.Duration // the server closes a connection idle this long; 0: never
	keepalive bool          // the server tells its idle timeout (RFC 7828) to clients that ask
	handshake time.Duration // a dial's TCP and TLS round trips
	stalls    []spell       // the server answers nothing; answers due meanwhile come at the end
	storms    []spell       // answer times grow factor times (a handshake storm on a loaded upstream)
	loaded    []spell       // the client's machine is loaded: each read of a connection returns delay late, each dial 5×delay late
	silent    bool          // the server reads queries and answers none
	kind      steadyKind    // TestPropertySteady's kind of upstream (property_steady_test.go); kindNone for TestProperty's
	mix       *mixture      // TestPropertyMixed's backends, which replace inOrder (property_mixed_test.go); nil for the others
}

// spell is a spell of a behaviour, from at after the load's start.
type spell struct {
	at, length time.Duration
	factor     float64       // storms
	delay      time.Duration // loaded
}

func (w spell) covers(d time.Duration) bool { return d >= w.at && d < w.at+w.length }

// answerDist is a family of answer-time distributions.
type answerDist int

const (
	distConstant answerDist = iota
	distBimodal
	distPareto
	distLognormal
)

func (d answerDist) String() string {
	return [...]string{"constant", "bimodal", "pareto", "lognormal"}[d]
}

// maxAnswerTime caps a drawn answer time: beyond any client's deadline.
const maxAnswerTime = 10 * time.Second

// offeredLoad is an open-loop load: queries arrive at times fixed in advance, whatever
// happens to earlier ones.
type offeredLoad struct {
	qps      float64
	arrivals []time.Duration // from the load's start, ascending
	deadline time.Duration   // each query's, from its arrival (a client's or CoreDNS's timeout)
	paced    bool            // arrivals evenly spaced (a paced load generator), not Poisson
	heldFrom time.Duration   // from when the upstream samples the connections held (sampleHeld); 0: never
}

// drawLimits bound a drawn load; the flags of property_test.go raise them.
type drawLimits struct {
	maxQueries int           // queries at most
	maxLength  time.Duration // arrivals span at most this long
}

// drawSeed draws the behaviour and load of seed.
func drawSeed(seed uint64, lim drawLimits) (behaviour, offeredLoad) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := behaviour{seed: seed, inOrder: r.IntN(2) == 0, dist: answerDist(r.IntN(4))}
	b.scale = logUniform(r, 100*time.Microsecond, 300*time.Millisecond)
	b.slowFrac = 0.01 + 0.29*r.Float64()
	b.slowTimes = 5 + 95*r.Float64()
	b.alpha = 1.1 + 1.9*r.Float64()
	b.sigma = 0.3 + 1.2*r.Float64()
	if r.IntN(2) == 0 {
		b.jitter = 0.5 * r.Float64()
	}
	if r.IntN(5) < 2 {
		b.limit = int(logUniform(r, 5, 1000))
	}
	if r.IntN(5) < 2 {
		b.idle = logUniform(r, 50*time.Millisecond, 10*time.Second)
		b.keepalive = r.IntN(2) == 0
	}
	b.handshake = logUniform(r, 200*time.Microsecond, 60*time.Millisecond)

	var ld offeredLoad
	ld.qps = float64(logUniform(r, 20, 3000))
	length := logUniform(r, 300*time.Millisecond, lim.maxLength)
	ld.deadline = []time.Duration{time.Second, 2 * time.Second, 5 * time.Second}[r.IntN(3)]
	ld.arrivals = drawArrivals(r, ld.qps, length, lim.maxQueries)
	span := ld.arrivals[len(ld.arrivals)-1]

	b.stalls = drawSpells(r, span, func(w *spell) {
		w.length = logUniform(r, 10*time.Millisecond, time.Second)
	})
	b.storms = drawSpells(r, span, func(w *spell) {
		w.length = logUniform(r, 100*time.Millisecond, 2*time.Second)
		w.factor = 2 + 6*r.Float64()
	})
	b.loaded = drawSpells(r, span, func(w *spell) {
		w.length = logUniform(r, 50*time.Millisecond, time.Second)
		w.delay = logUniform(r, 200*time.Microsecond, 20*time.Millisecond)
	})
	// Drawn last, so that adding it changed no other seed's draw.
	b.silent = r.IntN(50) == 0
	return b, ld
}

// drawArrivals draws Poisson arrivals at qps for length, at most maxQueries of them
// and at least one.
func drawArrivals(r *rand.Rand, qps float64, length time.Duration, maxQueries int) []time.Duration {
	var at time.Duration
	out := []time.Duration{0}
	for len(out) < maxQueries {
		at += time.Duration(r.ExpFloat64() / qps * float64(time.Second))
		if at > length {
			break
		}
		out = append(out, at)
	}
	return out
}

// drawSpells draws none (most often), one or two spells within span.
func drawSpells(r *rand.Rand, span time.Duration, shape func(*spell)) []spell {
	n := 0
	if r.IntN(10) < 3 {
		n = 1 + r.IntN(2)
	}
	out := make([]spell, n)
	for i := range out {
		out[i].at = time.Duration(r.Int64N(int64(span) + 1))
		shape(&out[i])
	}
	return out
}

// logUniform draws from lo to hi, uniformly on a log scale.
func logUniform[T ~int64 | ~int | ~float64](r *rand.Rand, lo, hi T) T {
	l, h := math.Log(float64(lo)), math.Log(float64(hi))
	return T(math.Exp(l + (h-l)*r.Float64()))
}

// baseTime is how long the upstream takes to answer name, before jitter,
// storms and stalls: a property of the name (a cached or an uncached one), so
// that the pool and the model of forward, asking the same names, wait the same.
func (b *behaviour) baseTime(name string) time.Duration {
	h := fnv.New64a()
	h.Write([]byte(strings.ToLower(name)))
	r := rand.New(rand.NewPCG(b.seed, h.Sum64()))
	f := 1.0
	switch b.dist {
	case distBimodal:
		if r.Float64() < b.slowFrac {
			f = b.slowTimes
		}
	case distPareto:
		f = math.Pow(1-r.Float64(), -1/b.alpha)
	case distLognormal:
		f = math.Exp(b.sigma * r.NormFloat64())
	}
	return min(time.Duration(f*float64(b.scale)), maxAnswerTime)
}

// answerTime is how long after since (the load's start) an answer taken up at
// at is written: its base time, jittered by j (in [-1, 1]), grown in a storm,
// and pushed to the end of a stall it would fall in.
func (b *behaviour) answerTime(name string, at time.Duration, j float64) time.Duration {
	return b.answerTimeAt(name, at, j, 1)
}

// answerTimeAt is answerTime on a backend whose answers take speed times the
// drawn base time (a mixed upstream's, see backend): before storms and
// stalls, which the address's every backend shares (a loaded network, a
// stalled balancer). A speed of 1 is answerTime exactly.
func (b *behaviour) answerTimeAt(name string, at time.Duration, j, speed float64) time.Duration {
	d := float64(b.baseTime(name)) * speed * (1 + b.jitter*j)
	for _, w := range b.storms {
		if w.covers(at) {
			d *= w.factor
		}
	}
	done := at + min(time.Duration(d), maxAnswerTime)
	for _, w := range b.stalls {
		if w.covers(done) {
			done = w.at + w.length
		}
	}
	return done - at
}

// readDelay is how late a read on the client's machine returns at at.
func (b *behaviour) readDelay(at time.Duration) time.Duration {
	var d time.Duration
	for _, w := range b.loaded {
		if w.covers(at) {
			d = max(d, w.delay)
		}
	}
	return d
}

func (b behaviour) String() string {
	var s strings.Builder
	if b.kind != kindNone {
		fmt.Fprintf(&s, "[%v] ", b.kind)
	}
	order := "out of order"
	if b.inOrder {
		order = "in order"
	}
	fmt.Fprintf(&s, "%s, %s answer times of scale %v", order, b.dist, b.scale)
	switch b.dist {
	case distBimodal:
		fmt.Fprintf(&s, " (%.0f%% of names %.0f× slower)", 100*b.slowFrac, b.slowTimes)
	case distPareto:
		fmt.Fprintf(&s, " (alpha %.2f)", b.alpha)
	case distLognormal:
		fmt.Fprintf(&s, " (sigma %.2f)", b.sigma)
	}
	fmt.Fprintf(&s, ", jitter ±%.0f%%, handshake %v", 100*b.jitter, b.handshake)
	if b.limit > 0 {
		fmt.Fprintf(&s, ", cuts after %d answers", b.limit)
	}
	if b.idle > 0 {
		fmt.Fprintf(&s, ", idle timeout %v (keepalive told: %v)", b.idle, b.keepalive)
	}
	for _, w := range b.stalls {
		fmt.Fprintf(&s, ", stall %v+%v", w.at, w.length)
	}
	for _, w := range b.storms {
		fmt.Fprintf(&s, ", storm %v+%v ×%.1f", w.at, w.length, w.factor)
	}
	for _, w := range b.loaded {
		fmt.Fprintf(&s, ", loaded client %v+%v (reads %v late)", w.at, w.length, w.delay)
	}
	if b.silent {
		s.WriteString(", answers nothing")
	}
	if b.mix != nil {
		s.WriteString(", " + b.mix.String())
	}
	return s.String()
}

func (l offeredLoad) String() string {
	span := l.arrivals[len(l.arrivals)-1]
	paced := ""
	if l.paced {
		paced = " paced"
	}
	return fmt.Sprintf("%d queries at %.0f QPS%s over %v, deadline %v", len(l.arrivals), l.qps, paced, span.Round(time.Millisecond), l.deadline)
}

// The default seeds cover the space: both orders, every distribution, answer
// times and loads from one end of their ranges to the other, and each fault
// several times; and a seed draws the same each time (a replay is the same
// upstream).
func TestPropertyDrawsTheWholeSpace(t *testing.T) {
	lim := drawLimits{maxQueries: *propertyMax, maxLength: 3 * time.Second}
	var inOrder, limited, idle, stalls, storms, loaded, silent int
	dists := map[answerDist]int{}
	minScale, maxScale := time.Hour, time.Duration(0)
	minQPS, maxQPS := 1e9, 0.0
	for seed := uint64(1); seed <= 200; seed++ {
		b, ld := drawSeed(seed, lim)
		if b2, ld2 := drawSeed(seed, lim); b2.String() != b.String() || !slices.Equal(ld.arrivals, ld2.arrivals) {
			t.Fatalf("Seed %d drew %v, then %v", seed, b, b2)
		}
		inOrder += btoi(b.inOrder)
		limited += btoi(b.limit > 0)
		idle += btoi(b.idle > 0)
		stalls += btoi(len(b.stalls) > 0)
		storms += btoi(len(b.storms) > 0)
		loaded += btoi(len(b.loaded) > 0)
		silent += btoi(b.silent)
		dists[b.dist]++
		minScale, maxScale = min(minScale, b.scale), max(maxScale, b.scale)
		minQPS, maxQPS = min(minQPS, ld.qps), max(maxQPS, ld.qps)
	}
	for what, n := range map[string]int{"in order": inOrder, "out of order": 200 - inOrder, "query limits": limited,
		"idle timeouts": idle, "stalls": stalls, "storms": storms, "loaded clients": loaded, "silent upstreams": silent,
		"constant": dists[distConstant], "bimodal": dists[distBimodal], "pareto": dists[distPareto], "lognormal": dists[distLognormal]} {
		if n < 3 {
			t.Errorf("%d of 200 seeds draw %s, want 3 or more", n, what)
		}
	}
	if minScale > 200*time.Microsecond || maxScale < 200*time.Millisecond {
		t.Errorf("Answer-time scales drawn from %v to %v, want from 0.2 ms or less to 200 ms or more", minScale, maxScale)
	}
	if minQPS > 30 || maxQPS < 2500 {
		t.Errorf("Loads drawn from %.0f to %.0f QPS, want from 30 QPS or less to 2,500 or more", minQPS, maxQPS)
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
