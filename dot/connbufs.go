package dot

import (
	"bufio"
	"sync"
)

// connBufs are a connection's buffers. They go from one connection to the next
// through the pool's bufs (spareBufs): against a server that cuts connections
// every few dozen queries, allocating them anew for each was a tenth of all
// allocation.
type connBufs struct {
	br    *bufio.Reader
	ahead *bufio.Reader // batchConn.ahead
	wbuf  []byte        // conn.wbuf
	bbuf  []byte        // batchConn.buf
	batch []*call       // the writer's batch
}

func newConnBufs() *connBufs {
	return &connBufs{br: bufio.NewReaderSize(nil, 16<<10), ahead: bufio.NewReaderSize(nil, readAheadSize)}
}

// spareBufs are the buffers of closed connections, kept for the next ones.
// Not a sync.Pool: one put on one P is not found by a get on another (its
// private slot), and the garbage collector empties it within two cycles.
// Against a server that cuts every connection after 100 queries, one new
// connection in five (857 of 3,999) got new buffers that way, 21 KB of
// garbage each, a fifth of all a redial leaves (its TLS handshake some 75 KB).
type spareBufs struct {
	mu   sync.Mutex
	free []*connBufs // guarded by mu
}

// maxSpareBufs bounds the spares. Connections filled in turn reach a query
// limit together, and their successors are dialled together: a dozen at
// once against such a server at full load. Kept only as many as were open
// at each close, they ran out in every such burst (a miss in three dials).
const maxSpareBufs = 16

func (s *spareBufs) get() *connBufs {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.free)
	if n == 0 {
		return newConnBufs()
	}
	b := s.free[n-1]
	s.free[n-1] = nil
	s.free = s.free[:n-1]
	return b
}

// put keeps b for the next connection. The last connection's close (open:
// none left open or being dialled) keeps one set only: a pool gone idle does
// not hold the buffers of its busiest moment.
func (s *spareBufs) put(b *connBufs, open int) {
	keep := maxSpareBufs
	if open == 0 {
		keep = 1
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.free) >= keep {
		s.free[len(s.free)-1] = nil
		s.free = s.free[:len(s.free)-1]
	}
	s.free = append(s.free, b)
}

// readAheadSize is the most the reader takes from the socket in one read(2): a
// few dozen answers, what a full connection's burst of queries brings back.
const readAheadSize = 16 << 10
