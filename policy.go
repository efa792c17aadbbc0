package dotforward

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
)

// Policy orders the upstreams for one query: the handler tries them in that
// order, skipping down ones. List returns a new slice; it never reorders its
// argument.
type Policy interface {
	List(ups []*upstream) []*upstream
	String() string
}

// newPolicy returns the policy called name, or nil.
func newPolicy(name string) Policy {
	switch name {
	case "random":
		return &random{}
	case "round_robin":
		return &roundRobin{}
	case "sequential":
		return &sequential{}
	case "latency":
		return newLatency()
	}
	return nil
}

// random is a new random order per query (forward's default).
type random struct{}

func (*random) String() string { return "random" }

func (*random) List(ups []*upstream) []*upstream {
	out := slices.Clone(ups)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// roundRobin rotates the configured order by one per query.
type roundRobin struct {
	next atomic.Uint64
}

func (*roundRobin) String() string { return "round_robin" }

func (p *roundRobin) List(ups []*upstream) []*upstream {
	if len(ups) == 0 {
		return nil
	}
	i := int((p.next.Add(1) - 1) % uint64(len(ups)))
	out := make([]*upstream, 0, len(ups))
	return append(append(out, ups[i:]...), ups[:i]...)
}

// sequential is the configured order: the first upstream takes every query while
// it is up.
type sequential struct{}

func (*sequential) String() string { return "sequential" }

func (*sequential) List(ups []*upstream) []*upstream { return slices.Clone(ups) }

// latency prefers the upstream expected to answer first: the lowest EWMA of
// answer time (failures count as a read timeout), scaled by the queries already
// waiting on it so that a burst spreads out instead of piling onto one server.
// Unmeasured upstreams score lowest and are tried first. One query in
// exploreEvery puts a random other upstream first, so that a server that was
// slow once gets measured again.
type latency struct {
	explore func() bool     // whether this query explores
	pick    func(n int) int // a random index in [0, n)
}

const exploreEvery = 20

func newLatency() *latency {
	return &latency{
		explore: func() bool { return rand.IntN(exploreEvery) == 0 },
		pick:    rand.IntN,
	}
}

func (*latency) String() string { return "latency" }

func (p *latency) List(ups []*upstream) []*upstream {
	ranked := make([]scored, len(ups))
	for i, u := range ups {
		ranked[i] = scored{u: u, score: score(u)}
	}
	// Shuffle first so that equal scores (all unmeasured, say) come in random order.
	rand.Shuffle(len(ranked), func(i, j int) { ranked[i], ranked[j] = ranked[j], ranked[i] })
	slices.SortStableFunc(ranked, func(a, b scored) int { return cmp.Compare(a.score, b.score) })
	out := make([]*upstream, len(ranked))
	for i := range ranked {
		out[i] = ranked[i].u
	}
	if len(out) > 1 && p.explore() {
		i := 1 + p.pick(len(out)-1)
		out[0], out[i] = out[i], out[0]
	}
	return out
}

type scored struct {
	u     *upstream
	score float64
}

// score is the expected wait in ns: answer time times the queue ahead, plus one.
func score(u *upstream) float64 {
	mean := max(u.answers.mean.Load(), int64(time.Microsecond))
	return float64(mean) * float64(u.pending.Load()+1)
}
