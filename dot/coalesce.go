package dot

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Coalescing. While a query's exchange with the upstream is open (its flight), a query
// that would get the same answer from the upstream waits for that answer instead
// of sending its own (a burst of pods asking for one name at its TTL's expiry
// costs one upstream query, not one each).
//
// "The same answer" is judged on the prepared wire, which is exactly what the
// upstream receives but for the connection-local ID: two queries share a flight
// only if their wires are equal byte for byte but for the ID and the case of the
// question name's letters. That covers every bit and option that can change the
// answer (opcode, RD, CD, AD, the DO bit, the buffer size, each forwarded EDNS
// option byte for byte, OPT or no OPT), and nothing the pool strips (the client's
// padding and keepalive) or adds the same for all. Only a plain QUERY with no
// record besides its OPT is shared: in doubt, queries are not merged.
//
// Each waiter gets a message of its own, built by the reader from the leader's
// answer frame as finishAnswer builds the leader's: its own ID, question and
// spelling of it, its own OPT handling. A waiter gives up at its own deadline
// without disturbing the others. If the leader's exchange fails, each waiter gets
// the error the upstream gave the leader, and fails over as it would have alone;
// if the leader's caller gave up (its deadline, its cancellation), which says
// nothing of the upstream, the waiters try again, one of them leading.

// flightShards spreads the open flights over independently locked tables, so
// that no lock is shared by all queries: a query locks one shard to join or
// lead, and the reader locks it once more to end the flight.
const flightShards = 64

// flightSlots is how many open flights a shard holds beside its lock, in the
// same two cache lines; more go to its map. Every query leads a flight, joined
// or not, and both processors write the shards (the caller at its join, the
// reader at the flight's end): in a map, a lookup and an insert or a delete
// touched the map's header and its group of slots besides the lock's line,
// cache misses all (0.9 µs a query in CoreDNS at full speed). A few hundred
// queries out over 64 shards leave a handful in each.
const flightSlots = 6

// maxJoiners bounds the waiters of one flight, and so what one answer costs the
// reader that builds their messages. A query that finds the flight full leads a
// new one, which the next queries join.
const maxJoiners = 1024

// flights are a pool's open flights.
type flights struct {
	shards [flightShards]flightShard // first: a shard's two lines are aligned with the allocation
	seed   maphash.Seed
	chans  *sync.Pool // the pool's result channels (see newRespChans), for waiters
}

// flightShard is one lock and the open flights whose key hashes to it: at most
// one leader per key hash, in slots or in more. mu is a leaf lock: nothing else
// is locked, and nothing sent, while it is held.
type flightShard struct {
	mu    sync.Mutex
	slots [flightSlots]flightSlot // guarded by mu
	more  map[uint64]*query       // guarded by mu: the leaders the slots had no room for; nil until then
	_     [16]byte                // two cache lines each: shards are locked from every CPU
}

// flightSlot is an open flight's leader and its key hash; q is nil if free.
// The hash is kept here, not read from the leader, whose query is in a cache
// line of its own.
type flightSlot struct {
	hash uint64
	q    *query
}

func newFlights(chans *sync.Pool) *flights {
	return &flights{seed: maphash.MakeSeed(), chans: chans}
}

func (fs *flights) shard(hash uint64) *flightShard { return &fs.shards[hash%flightShards] }

// leader returns the leader of the open flight of hash, or nil. s.mu must be held.
func (s *flightShard) leader(hash uint64) *query {
	for i := range s.slots {
		if sl := &s.slots[i]; sl.q != nil && sl.hash == hash {
			return sl.q
		}
	}
	if len(s.more) > 0 {
		return s.more[hash]
	}
	return nil
}

// lead makes q the leader of the open flight of hash, in place of the one
// there, if any (a full flight). s.mu must be held.
func (s *flightShard) lead(hash uint64, q *query) {
	free := -1
	for i := range s.slots {
		switch sl := &s.slots[i]; {
		case sl.q != nil && sl.hash == hash:
			sl.q = q
			return
		case sl.q == nil && free < 0:
			free = i
		}
	}
	switch _, there := s.more[hash]; { // a nil map reads as empty
	case free >= 0 && !there:
		s.slots[free] = flightSlot{hash: hash, q: q}
		return
	case s.more == nil:
		s.more = make(map[uint64]*query)
	}
	s.more[hash] = q
}

// remove takes q out if it still leads the open flight of hash (a full flight's
// leader was replaced by the next one's). s.mu must be held.
func (s *flightShard) remove(hash uint64, q *query) {
	for i := range s.slots {
		if s.slots[i].q == q {
			s.slots[i] = flightSlot{}
			return
		}
	}
	if s.more[hash] == q {
		delete(s.more, hash)
	}
}

// flight is the part of a query that leads one: an exchange other queries may
// join. The leader is in its shard's table from its join until the flight ends (one
// leader per key hash at most), and the flight ends once, when the reader
// delivers the leader's answer or the leader's exchange returns without one. It
// is small and in the query's allocation: a query that nobody joins costs no
// allocation.
type flight struct {
	hash    uint64      // the key's hash: the table's key, and the shard
	waiters *waiter     // guarded by the shard's mu: the last to join, linked to the earlier ones
	joined  int32       // guarded by the shard's mu: how many joined
	ended   atomic.Bool // written under the shard's mu; read without it by the leader after its exchange
	leads   bool        // set by join before the query's first call: the query leads a flight
}

// waiter is a query waiting for another's answer.
type waiter struct {
	q     *query
	resp  chan result // from chans: the flight's end sends to each of its waiters once
	chans *sync.Pool  // the pool's result channels, where resp goes back
	gone  atomic.Bool // the waiter gave up: building its answer is wasted work
	next  *waiter     // the one that joined before, immutable once joined
}

// CoalesceObserver is an Observer that also counts coalesced queries. It is a
// separate interface so that Observers written before coalescing still are ones.
type CoalesceObserver interface {
	// Coalesced reports a query answered by another query's exchange, which it
	// waited for instead of sending its own.
	Coalesced()
}

// errLeaderGone is what waiters get when their leader's caller gave up before the
// answer came: they try again.
var errLeaderGone = errors.New("dot: the query shared gave up")

// errWaitDeadline is what a waiter gets at its own deadline, like a query of its own
// reaching the caller's deadline.
var errWaitDeadline = fmt.Errorf("%w: %w", ErrTimeout, context.DeadlineExceeded)

// joinFlight waits for the leader of the flight q joins, and a waiter whose
// leader gave up tries again while it has time. done is false when q is to run
// its exchange itself, as the leader of a new flight or alone; the caller then
// calls flights.fail with its outcome.
func (p *Pool) joinFlight(ctx context.Context, q *query, deadline time.Time) (r *dns.Msg, done bool, err error) {
	for {
		w := p.flights.join(q)
		if w == nil {
			return nil, false, nil
		}
		r, err := w.wait(ctx, deadline)
		switch {
		case err == nil:
			// Received from the flight's end, which read q (w.q) last to
			// build this answer; q made no call: nothing else holds it.
			q.free = true
			if o, ok := p.obs.(CoalesceObserver); ok {
				o.Coalesced()
			}
			return r, true, nil
		case !errors.Is(err, errLeaderGone):
			return nil, true, err
		case ctx.Err() != nil:
			return nil, true, ctx.Err()
		case !deadline.IsZero() && !time.Now().Before(deadline):
			return nil, true, errWaitDeadline
		}
	}
}

// join makes q a waiter of the open flight of its key and returns the waiter, or
// returns nil for q to run its exchange itself: as the leader of a new flight
// (q.fl.leads set), or alone if q is not shared or another key holds its hash.
func (fs *flights) join(q *query) *waiter {
	h, ok := fs.key(q)
	if !ok {
		return nil
	}
	s := fs.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leader(h)
	switch {
	case l == nil:
	case !sameKey(l, q):
		return nil // a hash collision: in doubt, alone
	case l.fl.joined < maxJoiners:
		w := &waiter{q: q, resp: fs.chans.Get().(chan result), chans: fs.chans, next: l.fl.waiters}
		l.fl.waiters = w
		l.fl.joined++
		return w
	}
	// No flight, or a full one: q leads the next. A full flight stays valid for
	// its waiters, only out of the table.
	q.fl.hash, q.fl.leads = h, true
	s.lead(h, q)
	return nil
}

// end ends the flight q leads and returns its waiters, the first time it is
// called; nil after that. The leader leaves the table, so later queries start a
// new flight.
func (fs *flights) end(q *query) *waiter {
	s := fs.shard(q.fl.hash)
	s.mu.Lock()
	defer s.mu.Unlock()
	if q.fl.ended.Load() {
		return nil
	}
	q.fl.ended.Store(true)
	s.remove(q.fl.hash, q)
	ws := q.fl.waiters
	q.fl.waiters = nil
	return ws
}

// land gives the waiters of the flight q leads their answers from frame, the
// answer to one of q's calls. The reader calls it before it builds q's own answer,
// which edits frame in place. It does nothing for a query that leads no flight
// (fs is nil when the pool does not coalesce, and then no query leads one).
func (fs *flights) land(q *query, frame []byte) {
	if q.fl.leads {
		fs.landSlow(q, frame)
	}
}

func (fs *flights) landSlow(q *query, frame []byte) {
	ws := fs.end(q)
	if ws == nil {
		return
	}
	// finishAnswer edits its frame (it cuts hop-by-hop options): each waiter's
	// answer is built from a fresh copy of the leader's untouched frame. The
	// messages share nothing mutable: miekg/dns copies what it keeps.
	scratch := make([]byte, len(frame))
	for w := ws; w != nil; w = w.next {
		if w.gone.Load() {
			continue
		}
		copy(scratch, frame)
		r, _, err := finishAnswerFor(w.q, q, scratch)
		w.send(result{msg: r, err: err})
	}
}

// fail ends the flight of a leader whose exchange returned err. If the reader
// delivered the answer, the flight has ended already and there is nothing to do.
func (fs *flights) fail(q *query, err error) {
	if !q.fl.leads || q.fl.ended.Load() {
		return
	}
	ws := fs.end(q)
	if err == nil {
		err = errLeaderGone // cannot happen: an answer comes through land
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The leader's caller gave up, not the upstream: the waiters still have
		// their own time, and try again.
		err = errLeaderGone
	}
	for w := ws; w != nil; w = w.next {
		w.send(result{err: err})
	}
}

// send completes the waiter. It never blocks: the channel has room for the one
// result the flight's end sends to each waiter.
func (w *waiter) send(r result) {
	select {
	case w.resp <- r:
	default:
	}
}

// wait waits for the flight's result, ctx or the caller's deadline.
func (w *waiter) wait(ctx context.Context, deadline time.Time) (*dns.Msg, error) {
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case r := <-w.resp:
		w.chans.Put(w.resp) // received its one result: idle
		return r.msg, r.err
	case <-ctx.Done():
		w.gone.Store(true)
		return nil, ctx.Err()
	case <-expired:
		w.gone.Store(true)
		return nil, errWaitDeadline
	}
}

// key returns the hash of q's flight key, or false if q is not to be shared: not
// a QUERY, or carrying a record besides its OPT (one that points at the question
// name would carry its case, which the key ignores). The hash covers the wire but
// for the ID, with the question name's letters folded to lower case.
func (fs *flights) key(q *query) (uint64, bool) {
	msg := q.wire[2:]
	n := len(q.question) - 4 // the name's length
	if q.opcode != dns.OpcodeQuery || !onlyOPT(msg, 12+len(q.question)) {
		return 0, false
	}
	h := maphash.Bytes(fs.seed, msg[2:12]) ^ maphash.Bytes(fs.seed, msg[12+n:])<<1
	for _, c := range msg[12 : 12+n] {
		h = (h ^ uint64(lower(c))) * 0x100000001b3 // FNV-1a's step, from the seeded hash
	}
	return h, true
}

// onlyOPT reports whether msg has no answer or authority record and, in the
// additional section, nothing or only an OPT, at off.
func onlyOPT(msg []byte, off int) bool {
	if binary.BigEndian.Uint16(msg[6:]) != 0 || binary.BigEndian.Uint16(msg[8:]) != 0 {
		return false
	}
	switch binary.BigEndian.Uint16(msg[10:]) {
	case 0:
		return true
	case 1: // the root name, then type OPT
		return len(msg) >= off+3 && msg[off] == 0 && binary.BigEndian.Uint16(msg[off+1:]) == dns.TypeOPT
	}
	return false
}

// sameKey reports whether a and b are the same upstream query: their wires are
// equal but for the ID and the case of the question name's letters. A label
// length (below 64) folds to itself and no letter folds to one, so the names'
// label structure is compared exactly.
func sameKey(a, b *query) bool {
	x, y := a.wire[4:], b.wire[4:] // past the length prefix and the ID
	n := len(a.question) - 4
	if len(x) != len(y) || len(a.question) != len(b.question) {
		return false
	}
	if !bytes.Equal(x[:10], y[:10]) || !bytes.Equal(x[10+n:], y[10+n:]) {
		return false
	}
	for i, c := range x[10 : 10+n] {
		if d := y[10+i]; c != d && lower(c) != lower(d) {
			return false
		}
	}
	return true
}
