package dot

// census counts a pool's connections by state (conn.avail) and load, from one
// snapshot: what dial, sizing, the sweeper and Stats read, so that they agree
// on which connections take queries. pick, on the hot path, reads each
// connection's avail itself and counts nothing it does not need.
type census struct {
	n        [availCount]int // connections in each state
	load     int             // queries outstanding on all of them, tombstones included
	used     int             // open connections (see avail.open) with queries outstanding
	busy     int             // connections taking queries, not near their end, with queries outstanding
	busyLoad int             // the queries outstanding on those
	idle     int             // connections taking queries (avail.takes) with none outstanding
}

// countConns takes the census of conns.
func countConns(conns []*conn) census {
	var s census
	for _, c := range conns {
		a, l := c.avail(), int(c.load.Load())
		s.n[a]++
		s.load += l
		if l > 0 && a.open() {
			s.used++
		}
		if l == 0 && a.takes() {
			s.idle++
		}
		if l > 0 && a <= availQuiet {
			s.busy++
			s.busyLoad += l
		}
	}
	return s
}

// takes is how many connections take new queries, near their end included:
// Stats.Taking and the conns_taking gauge (Sized).
func (s *census) takes() int { return s.n[availTaking] + s.n[availQuiet] + s.n[availNearEnd] }

// steady is how many take new queries and are not near their end: what the
// sizing counts against what the load wants (make before break).
func (s *census) steady() int { return s.n[availTaking] + s.n[availQuiet] }

// open is how many are open and will be used again: neither draining nor closed.
func (s *census) open() int { return s.takes() + s.n[availBlocked] }
