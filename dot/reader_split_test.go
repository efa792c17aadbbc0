package dot

import (
	"bytes"
	"crypto/tls"
	"net"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
)

// recordTap is a server's end of a connection that, once tapped, keeps each
// write (one TLS record) instead of sending it, so that the test sends the
// records in pieces of its own choosing.
type recordTap struct {
	net.Conn
	tapped  bool
	records [][]byte
}

func (r *recordTap) Write(p []byte) (int, error) {
	if !r.tapped {
		return r.Conn.Write(p)
	}
	r.records = append(r.records, bytes.Clone(p))
	return len(p), nil
}

// Answers whose frames and TLS records are split across reads are each timed
// by the read that completed their record: the reader dispatches every frame a
// read completes before it reads the socket again (so no frame takes a later
// read's time), and frames whose records the read-ahead buffer holds complete
// keep the time of the read that brought them, however long after it they are
// dispatched. Records, in order: answer 1 and the start of 2; the rest of 2 and
// 3; then 4, 5 and 6 one each. The pieces, a millisecond apart, cut the first
// record's header, its body, the second record after its header, and the third
// a byte short of its end, the last piece bringing the rest with it.
func TestSplitAnswersTimedByTheReadThatCompletedThem(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, tap, raw := newTLSConnPair(t)
		sentAt := time.Now().UnixNano()
		frames := sentFrames(t, c, sentAt, 6)
		for _, p := range [][]byte{
			append(frames[0], frames[1][:5]...), append(frames[1][5:], frames[2]...),
			frames[3], frames[4], frames[5],
		} {
			if _, err := tap.srv.Write(p); err != nil {
				t.Fatal(err)
			}
		}
		ends := recordEnds(tap.records)
		wire := bytes.Join(tap.records, nil)
		cuts := []int{3, ends[0] - 10, ends[0] + 20, ends[2] - 1, len(wire)}
		answerRecord := []int{0, 1, 1, 2, 3, 4}

		go c.readFrames(c.br)
		var wantSum int64
		from := 0
		for k, cut := range cuts {
			at := time.Now().UnixNano()
			if _, err := raw.Write(wire[from:cut]); err != nil {
				t.Fatal(err)
			}
			synctest.Wait() // the reader dispatched what the piece completed, and reads again
			want := int64(0)
			for _, r := range answerRecord {
				if pieceOf(cuts, ends[r]) == k {
					want = at
					wantSum += at - sentAt
				}
			}
			if got := c.servedAt.Load(); want != 0 && got != want {
				t.Errorf("After piece %d: the latest answer timed %d ns after the piece's read, want at it", k, got-want)
			}
			from = cut
			time.Sleep(time.Millisecond)
		}
		c.mu.Lock()
		sum, n := c.answers.sum, c.answers.n
		c.mu.Unlock()
		if n != len(frames) || sum != wantSum {
			t.Errorf("%d answers taking %v in all, want %d taking %v", n, time.Duration(sum), len(frames), time.Duration(wantSum))
		}
		raw.Close()
	})
}

// tlsServer is the server's end of newTLSConnPair's connection.
type tlsServer struct {
	*recordTap
	srv *tls.Conn
}

// newTLSConnPair returns a pool's connection over TLS to a server whose
// records the test sends (tapped, from the server's raw end).
func newTLSConnPair(t *testing.T) (*conn, *tlsServer, net.Conn) {
	cert, err := dottest.NewCert()
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Addr: "127.0.0.1:853", TLS: cert.ClientTLS(dottest.ServerName), MaxInflight: 8, Observer: newRecorder()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	a, b := dottest.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	tap := &recordTap{Conn: b}
	scfg := cert.ServerTLS()
	scfg.SessionTicketsDisabled = true // no record the test did not write
	srv := tls.Server(tap, scfg)
	errc := make(chan error, 1)
	go func() { errc <- srv.Handshake() }()
	bc := &batchConn{Conn: a}
	tc := tls.Client(bc, p.tls)
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	tap.tapped = true
	return newConn(p, tc, bc), &tlsServer{tap, srv}, b
}

// sentFrames registers n calls on c as written at sentAt and returns their
// answers' frames, in write order.
func sentFrames(t *testing.T, c *conn, sentAt int64, n int) [][]byte {
	var frames [][]byte
	for i := range n {
		q := mustPrepare(t, string(rune('a'+i))+".example.")
		cl := newTestCall(q)
		if !c.register(cl) {
			t.Fatal("register failed")
		}
		<-c.writeq
		cl.seq = uint32(i + 1)
		cl.sentAt.Store(sentAt)
		cl.state.Store(callSent)
		frames = append(frames, frame(answerFor(t, q, cl.id)))
	}
	return frames
}

// recordEnds returns where each record ends on the wire.
func recordEnds(records [][]byte) []int {
	var ends []int
	end := 0
	for _, r := range records {
		end += len(r)
		ends = append(ends, end)
	}
	return ends
}

// pieceOf returns the index of the piece that brings the wire's byte before off.
func pieceOf(cuts []int, off int) int {
	for k, cut := range cuts {
		if off <= cut {
			return k
		}
	}
	return -1
}
