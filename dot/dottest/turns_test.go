package dottest

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/miekg/dns"
)

// One thread serves the connections in turn: three connections with a query
// each are answered a turn apart, where three queries on one connection are
// answered together, in one turn.
func TestTurnsServeConnectionsInTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const turn = time.Millisecond
		s := Start(t, Options{Pipe: true, Turns: &Turns{PerTurn: turn}})
		var conns []*tls.Conn
		for range 3 {
			raw, err := s.Dial(context.Background(), "tcp", s.Addr)
			if err != nil {
				t.Fatal(err)
			}
			c := tls.Client(raw, s.ClientTLS())
			defer c.Close()
			if err := c.Handshake(); err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		start := time.Now()
		for _, c := range conns {
			writeQueries(t, c, 1)
		}
		took := make([]time.Duration, len(conns))
		var wg sync.WaitGroup
		for i, c := range conns {
			wg.Go(func() {
				readAnswers(t, c, 1)
				took[i] = time.Since(start)
			})
		}
		wg.Wait()
		slices.Sort(took)
		if want := []time.Duration{turn, 2 * turn, 3 * turn}; !slices.Equal(took, want) {
			t.Errorf("The connections' answers came after %v, want %v (a turn each, in turn)", took, want)
		}
		start = time.Now()
		writeQueries(t, conns[0], 3)
		readAnswers(t, conns[0], 3)
		if got := time.Since(start); got != turn {
			t.Errorf("Three queries on one connection answered after %v, want %v (one turn)", got, turn)
		}
	})
}

// writeQueries writes n A queries in one write.
func writeQueries(t *testing.T, c *tls.Conn, n int) {
	t.Helper()
	var buf []byte
	for i := range n {
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn("q"+string(rune('a'+i))+".example"), dns.TypeA)
		wire, err := q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		buf = binary.BigEndian.AppendUint16(buf, uint16(len(wire)))
		buf = append(buf, wire...)
	}
	if _, err := c.Write(buf); err != nil {
		t.Fatal(err)
	}
}

// readAnswers reads n length-prefixed answers (from any goroutine: it fails
// the test with Error).
func readAnswers(t *testing.T, c *tls.Conn, n int) {
	t.Helper()
	for range n {
		var hdr [2]byte
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			t.Error(err)
			return
		}
		if _, err := io.ReadFull(c, make([]byte, binary.BigEndian.Uint16(hdr[:]))); err != nil {
			t.Error(err)
			return
		}
	}
}
