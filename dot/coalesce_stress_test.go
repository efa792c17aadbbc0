package dot

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// leaderErr is what the stress test's leaders end their flights with, so that
// each waiter can tell whose flight it joined.
type leaderErr struct{ q *query }

func (leaderErr) Error() string { return "the stress test's leader ended" }

// Joins and ends from several goroutines at once, over more open flights than
// the shards' slots hold: every waiter hears from exactly the leader it
// joined, which has its key (the name's case aside); no query is lost to a
// flight that ended as it joined; and the table never holds a hash twice, an
// ended leader, or, once all flights ended, anything. The single-goroutine
// walk (TestFlightTableAgreesWithAMap) checks the table's bookkeeping; this
// checks join and end against each other under the race detector.
func TestFlightsConcurrentJoinsAndEnds(t *testing.T) {
	fs := newFlights(newRespChans())
	workers, rounds := 8, 120
	if raceEnabled {
		rounds = 30
	}
	stop := make(chan struct{})
	checked := make(chan int)
	go func() { checked <- checkFlightTables(t, fs, stop) }()

	var joined, waited atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(10 * time.Second) // one for all: lost waiters are not waited for one by one
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 16))
			for r := 0; r < rounds && !t.Failed(); r++ {
				leaders, waiters := joinBatch(t, fs, rng, 96)
				joined.Add(int64(len(leaders) + len(waiters)))
				rng.Shuffle(len(leaders), func(i, j int) { leaders[i], leaders[j] = leaders[j], leaders[i] })
				for _, q := range leaders {
					fs.fail(q, leaderErr{q})
				}
				for _, wt := range waiters {
					checkWaiterHeard(t, wt, deadline)
				}
				waited.Add(int64(len(waiters)))
			}
		})
	}
	wg.Wait()
	close(stop)
	scans := <-checked
	if want := int64(workers * rounds * 96); joined.Load() != want && !t.Failed() {
		t.Errorf("%d queries led or joined, want %d: the others ran alone", joined.Load(), want)
	}
	if (waited.Load() == 0 || scans == 0) && !t.Failed() {
		t.Errorf("%d waiters, %d scans of the table: the test tests nothing", waited.Load(), scans)
	}
	checkFlightsEmpty(t, fs)
}

// joinBatch joins n random queries (names of few enough to be shared, in random
// case, with and without an OPT and its DO bit) and returns those that lead
// and the waiters.
func joinBatch(t *testing.T, fs *flights, rng *rand.Rand, n int) (leaders []*query, waiters []*waiter) {
	for range n {
		m := newQuery(mixedCase(fmt.Sprintf("n%d.example.", rng.IntN(1500)), rng.IntN(1<<16)), dns.TypeA)
		if rng.IntN(2) == 0 {
			m.SetEdns0(1232, rng.IntN(2) == 0)
		}
		q, err := prepareQuery(m, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		switch w := fs.join(q); {
		case w != nil:
			waiters = append(waiters, w)
		case q.fl.leads:
			leaders = append(leaders, q)
		}
	}
	return leaders, waiters
}

// checkWaiterHeard waits for w's result: its leader's leaderErr, from a leader
// of the same key, not itself.
func checkWaiterHeard(t *testing.T, w *waiter, deadline time.Time) {
	_, err := w.wait(context.Background(), deadline)
	var le leaderErr
	switch {
	case errors.Is(err, errWaitDeadline):
		t.Errorf("A waiter for %s never heard from its leader: lost", w.q.name)
	case !errors.As(err, &le):
		t.Errorf("A waiter for %s got %v, want its leader's end", w.q.name, err)
	case le.q == w.q || !sameKey(le.q, w.q):
		t.Errorf("A waiter for %s heard from the leader of %s", w.q.name, le.q.name)
	}
}

// checkFlightTables scans every shard until stop and returns how many scans it
// made: each leader held once, under its own hash and shard, and not ended.
func checkFlightTables(t *testing.T, fs *flights, stop <-chan struct{}) int {
	for scans := 0; ; scans++ {
		select {
		case <-stop:
			return scans
		default:
		}
		for i := range fs.shards {
			if err := checkShard(&fs.shards[i], i); err != nil {
				t.Error(err)
				return scans
			}
		}
	}
}

// checkShard checks one shard's table, locking it.
func checkShard(s *flightShard, index int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[uint64]bool{}
	check := func(h uint64, q *query) error {
		switch {
		case seen[h]:
			return fmt.Errorf("Shard %d holds hash %x twice", index, h)
		case q.fl.ended.Load():
			return fmt.Errorf("Shard %d holds an ended flight for %s", index, q.name)
		case q.fl.hash != h || int(h%flightShards) != index:
			return fmt.Errorf("Shard %d holds %s under hash %x, its own %x", index, q.name, h, q.fl.hash)
		}
		seen[h] = true
		return nil
	}
	for _, sl := range s.slots {
		if sl.q != nil {
			if err := check(sl.hash, sl.q); err != nil {
				return err
			}
		}
	}
	for h, q := range s.more {
		if err := check(h, q); err != nil {
			return err
		}
	}
	return nil
}

// checkFlightsEmpty checks that every flight left the table once it ended, and
// that some shard had more open flights than slots (its map exists).
func checkFlightsEmpty(t *testing.T, fs *flights) {
	overflowed := false
	for i := range fs.shards {
		s := &fs.shards[i]
		s.mu.Lock()
		n := len(s.more)
		for _, sl := range s.slots {
			if sl.q != nil {
				n++
			}
		}
		overflowed = overflowed || s.more != nil
		s.mu.Unlock()
		if n != 0 {
			t.Errorf("Shard %d holds %d flights after all ended", i, n)
		}
	}
	if !overflowed {
		t.Error("No shard's slots overflowed to its map: the test did not fill them")
	}
}

// A query whose key hash is held by a leader of another key runs alone, in
// the slots and in the map alike: a different name of the same length, the DO
// bit, the class, the type. The same query with its name in another case
// joins.
func TestFlightHashCollisionsRunAlone(t *testing.T) {
	base := func() *dns.Msg {
		m := newQuery("name.example.", dns.TypeA)
		m.SetEdns0(1232, false)
		return m
	}
	variants := map[string]func(*dns.Msg){
		"another name": func(m *dns.Msg) { m.Question[0].Name = "nbme.example." },
		"the DO bit":   func(m *dns.Msg) { m.IsEdns0().SetDo() },
		"the class":    func(m *dns.Msg) { m.Question[0].Qclass = dns.ClassCHAOS },
		"the type":     func(m *dns.Msg) { m.Question[0].Qtype = dns.TypeAAAA },
		"0x20":         func(m *dns.Msg) { m.Question[0].Name = "nAmE.ExAMple." },
	}
	for what, mod := range variants {
		for _, inMap := range []bool{false, true} {
			fs := newFlights(newRespChans())
			leader := mustPrepareMsg(t, base())
			m := base()
			mod(m)
			q := mustPrepareMsg(t, m)
			h, _ := fs.key(q)
			leadCollision(fs, h, leader, inMap)
			w := fs.join(q)
			joins := what == "0x20"
			if (w != nil) != joins || q.fl.leads || int(leader.fl.joined) != btoi(joins) {
				t.Errorf("Differing in %s (leader in the map %v): joined %v, leads %v, leader's waiters %d; want joined %v",
					what, inMap, w != nil, q.fl.leads, leader.fl.joined, joins)
			}
			s := fs.shard(h)
			s.mu.Lock()
			if l := s.leader(h); l != leader || inMap != (s.more[h] == leader) {
				t.Errorf("Differing in %s (leader in the map %v): the hash's leader replaced or moved", what, inMap)
			}
			s.mu.Unlock()
		}
	}
}

// leadCollision makes leader the leader of hash h in fs, as though its own key
// hashed to h; in the shard's map if inMap, behind slots full of other hashes.
func leadCollision(fs *flights, h uint64, leader *query, inMap bool) {
	s := fs.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if inMap {
		for i := range flightSlots {
			s.lead(h+uint64(i+1)*flightShards, new(query))
		}
	}
	leader.fl.hash, leader.fl.leads = h, true
	s.lead(h, leader)
}

func mustPrepareMsg(t *testing.T, m *dns.Msg) *query {
	t.Helper()
	q, err := prepareQuery(m, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	return q
}
