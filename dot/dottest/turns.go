package dottest

import (
	"sync"
	"time"
)

// Turns scripts a server with one thread that serves every connection in turn,
// as unbound with num-threads 1 does: a turn on a connection answers, in
// order, the queries the connection had read when the turn began, and costs
// PerTurn and PerQuery for each of them. A connection with queries waits for
// the turns of all the others that have some: the more connections carry the
// same queries, the more turns they cost, and the longer every answer takes.
type Turns struct {
	PerTurn  time.Duration // the cost of a turn on a connection (a read and a write)
	PerQuery time.Duration // the cost of a query in a turn
}

// turnQuery is a query read and not yet served.
type turnQuery struct {
	wire     []byte
	received int // its place on the connection, from 1
}

// turnQueue is a Turns server's thread and what waits for it.
type turnQueue struct {
	mu     sync.Mutex
	cond   *sync.Cond // signalled when a connection gets queries or the server closes
	ready  []*serverConn
	queued map[*serverConn][]turnQuery // guarded by mu: what each connection in ready waits with
	closed bool                        // guarded by mu
}

// startTurns starts the server's thread.
func (s *Server) startTurns() {
	q := &turnQueue{queued: map[*serverConn][]turnQuery{}}
	q.cond = sync.NewCond(&q.mu)
	s.turns = q
	s.wg.Add(1)
	go s.serveTurns()
}

// queue queues a connection's queries for its next turn.
func (q *turnQueue) queue(sc *serverConn, qs []turnQuery) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, waiting := q.queued[sc]; !waiting {
		q.ready = append(q.ready, sc)
	}
	q.queued[sc] = append(q.queued[sc], qs...)
	q.cond.Signal()
}

// next waits for the next connection with queries and takes them; nil once the
// server closed.
func (q *turnQueue) next() (*serverConn, []turnQuery) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.ready) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return nil, nil
	}
	sc := q.ready[0]
	q.ready = q.ready[1:]
	qs := q.queued[sc]
	delete(q.queued, sc)
	return sc, qs
}

func (q *turnQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

// serveTurns is the server's one thread.
func (s *Server) serveTurns() {
	defer s.wg.Done()
	t := s.opts.Turns
	for {
		sc, qs := s.turns.next()
		if sc == nil {
			return
		}
		time.Sleep(t.PerTurn + time.Duration(len(qs))*t.PerQuery) // the thread's work, on the (virtual) clock
		for _, tq := range qs {
			sc.query(tq.wire, tq.received) // in order, on this thread: see serverConn.query
		}
	}
}
