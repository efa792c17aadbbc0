package dot

import (
	"cmp"
	"slices"
	"time"
)

// Slow spells.
//
// An upstream may serve slowly for a spell (a storm of handshakes on a loaded
// server) and at its usual pace again after it. A query it took up in the
// spell is answered late however soon the spell ends: it is blocked by the
// spell, not slow itself, and the same query sent again once the spell is
// over is answered at the usual pace. Forward's one query a connection meets
// the spell where its own queries happen to meet it: in property seed 92 (in
// order, lognormal answers of 88 ms, a spell of ×6.3 from 146 to 310 ms) the
// pool, giving freed connections to its oldest waiters first, sent two
// queries at other times than forward did, one 22 ms later (into the spell),
// one 50 ms sooner (still in it), and lost both to the read timeout (answers
// due after 4.5 and 3.5 s) where forward's came after 0.7 and 0.6 s.
//
// A spell shows in the answers to queries alone on their connection (their
// answer time is the upstream's service, no queue): those written within
// spellNear of the stuck query took spellFactor times as long, by the median,
// as the latest written ones, written well after it. An upstream that is slow
// all the time, in order or not, shows no spell (its answers take as long
// whenever written), so its slow queries are not sent twice: only what is
// blocked is rescued. A query written in a spell that has waited longer than
// the median of those written near it gets a rescue notice (errRescued)
// once, as a stuck query does (rescue.go), with the budget's leave. Its
// rescue goes only to a connection idle at once, and only while half the
// open connections are idle: the load has ebbed, and the rescue takes no
// connection a new query needs (a dial for one, forward's model does not
// make). The rescue's attempt ends when the original's does: no query waits
// longer than its read timeout for a spell.
//
// A stall (the upstream answers nothing for a while, then everything due
// meanwhile at once) shows as a spell too: a query slow in its own right,
// written before the stall and still out after it, looks blocked and is
// sent again in vain (in two runs of property seeds 1-200, seeds 37, 51
// and 94, which have stalls and no storm, had 34, 1-3 and 9 such rescues; the
// storms' seeds 28, 77, 82, 92, 120, 127 and 151 had 0-20). The budget bounds
// what that costs; none of those seeds failed for it (77 and 94 fail on
// connections either way).
const (
	// spellNear: the answers to queries written this close to a query's
	// write show how fast the upstream served when it took that one up.
	spellNear = 50 * time.Millisecond
	// spellFactor: a spell's answers take this many times as long as
	// those after it, by the median.
	spellFactor = 3
	// spellMinSamples answers at least show a pace, spellLatest of them the
	// present pace.
	spellMinSamples = 5
	spellLatest     = 10
	// spellKeep: each connection keeps its latest this many alone answers.
	spellKeep = 16
	// spellIdleShare: rescues for spells only while one connection in this
	// many is idle, or more.
	spellIdleShare = 2
)

// spellSample is one answer to a query alone on its connection: when it was
// written and how long it took (unix ns, ns).
type spellSample struct{ sent, took int64 }

// spellSamples are a connection's latest alone answers, a ring. Guarded by
// conn.mu, as the answerLog that holds it.
type spellSamples struct {
	at [spellKeep]spellSample
	n  int
}

func (s *spellSamples) add(sent, took int64) {
	s.at[s.n%spellKeep] = spellSample{sent, took}
	s.n++
}

// appendTo appends the kept samples to out.
func (s *spellSamples) appendTo(out []spellSample) []spellSample {
	return append(out, s.at[:min(s.n, spellKeep)]...)
}

// spellPace is what the answers all (sorted by write time) say of a query
// written at sent: near, the median answer time of the queries written within
// spellNear of it, and now, that of the latest spellLatest written, if
// written after its spellNear and one more; 0 where too few answers show one.
func spellPace(all []spellSample, sent int64) (near, now int64) {
	from, _ := slices.BinarySearchFunc(all, sent-int64(spellNear), bySent)
	to, _ := slices.BinarySearchFunc(all, sent+int64(spellNear)+1, bySent)
	after, _ := slices.BinarySearchFunc(all, sent+2*int64(spellNear)+1, bySent)
	latest := max(after, len(all)-spellLatest)
	if to-from < spellMinSamples || len(all)-latest < spellMinSamples {
		return 0, 0
	}
	return medianTook(all[from:to]), medianTook(all[latest:])
}

func bySent(s spellSample, sent int64) int { return cmp.Compare(s.sent, sent) }

// medianTook is the median answer time of s (not empty).
func medianTook(s []spellSample) int64 {
	took := make([]int64, len(s))
	for i, x := range s {
		took[i] = x.took
	}
	slices.Sort(took)
	return took[len(took)/2]
}

// rescueSpells, on a full sweep (a spell lasts longer), rescues the queries
// that wait for a slow spell that has ended (see above). quiet is how long a
// connection waits with nothing read before its oldest query is looked at: a
// spell's answers take spellFactor usual times. Sweeper only.
func (p *Pool) rescueSpells(now int64, conns []*conn) {
	w := &stuckWatch{now: now, cost: rescueCost[p.learned.mode.get()], tokens: &p.sizer.tokens}
	quiet := max(int64(minJudgeLate), spellFactor*p.learned.mode.usual.Load())
	var waiting []*conn
	for _, c := range conns {
		if c.load.Load() > 0 && now-c.watch.since >= quiet {
			waiting = append(waiting, c)
		}
	}
	if len(waiting) == 0 || countConns(conns).idle*spellIdleShare < len(conns) || *w.tokens < w.cost {
		return
	}
	all := p.spellSamples[:0]
	for _, c := range conns {
		c.mu.Lock()
		all = c.answers.spell.appendTo(all)
		c.mu.Unlock()
	}
	slices.SortFunc(all, func(a, b spellSample) int { return cmp.Compare(a.sent, b.sent) })
	p.spellSamples = all
	for _, c := range waiting {
		c.rescueSpell(w, all, quiet)
	}
}

// rescueSpell gives c's oldest query a rescue notice if it was written in a
// spell that has ended (see above).
func (c *conn) rescueSpell(w *stuckWatch, all []spellSample, quiet int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := c.headLocked()
	if cl == nil || !cl.rescuable || cl.rescued || *w.tokens < w.cost {
		return
	}
	sent := cl.sentAt.Load()
	age := w.now - sent
	near, now := spellPace(all, sent)
	if now == 0 || near < spellFactor*now || age < max(near, quiet) || cl.deadline-w.now < 2*now {
		return
	}
	cl.spell = true // before the notice: the caller reads it once it has that
	if !w.tellLocked(cl) {
		cl.spell = false // no notice: the caller, completed, does not read it
	}
}

// headLocked is c's oldest written call still live, or nil. c.mu must be held.
func (c *conn) headLocked() *call {
	var head *call
	for cl := range c.calls.all() {
		if cl.tombUntil == 0 && cl.state.Load() == callSent && (head == nil || cl.seq < head.seq) {
			head = cl
		}
	}
	return head
}
