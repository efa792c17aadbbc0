package dot

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// The benchmarks run the same parallel load (b.SetParallelism(benchParallelism)
// goroutines per CPU, each with one query outstanding) against the same fake DoT
// server, through the pool and through miekg/dns used the way CoreDNS's forward
// uses it: one query per connection at a time.
const benchParallelism = 32

func benchServer(b *testing.B) *dottest.Server {
	return dottest.Start(b, dottest.Options{})
}

// benchQueries are the benchmarks' 1000 distinct queries, built before the timer
// starts: a client's query arrives unpacked, and building it is not the pool's
// cost. Exchange does not modify them, so the goroutines share them.
func benchQueries() []*dns.Msg {
	qs := make([]*dns.Msg, 1000)
	for i := range qs {
		qs[i] = newQuery(fmt.Sprintf("q%d.example.", i), dns.TypeA)
	}
	return qs
}

// BenchmarkPoolExchange is the pool's exchange with an in-process server whose
// allocations (dottest's, answering on the wire) are counted too.
func BenchmarkPoolExchange(b *testing.B) {
	s := benchServer(b)
	benchPoolExchange(b, s.Addr, s.ClientTLS())
	b.ReportMetric(float64(s.Handshakes()), "conns")
}

// BenchmarkPoolExchangeClient counts the client's side alone: its server
// (wireServer) allocates nothing per query.
func BenchmarkPoolExchangeClient(b *testing.B) {
	s := startWireServer(b)
	benchPoolExchange(b, s.Addr, s.clientTLS())
}

func benchPoolExchange(b *testing.B, addr string, cfg *tls.Config) {
	p, err := New(Config{Addr: addr, TLS: cfg})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	qs := benchQueries()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	cpu := processCPU()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := p.Exchange(ctx, qs[n.Add(1)%int64(len(qs))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	// The process's CPU per exchange (its in-process server's included): on a
	// shared machine, steadier than ns/op for comparing two builds.
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N), "cpu-ns/op")
}

// BenchmarkExclusiveConns is forward's model: a connection carries one query at a
// time, so concurrency costs connections.
func BenchmarkExclusiveConns(b *testing.B) {
	s := benchServer(b)
	client := &dns.Client{Net: "tcp-tls", TLSConfig: s.ClientTLS(), Timeout: 5 * time.Second}
	client.TLSConfig.ClientSessionCache = nil
	idle := make(chan *dns.Conn, 1024)
	defer func() {
		close(idle)
		for c := range idle {
			c.Close()
		}
	}()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			var co *dns.Conn
			select {
			case co = <-idle:
			default:
				var err error
				if co, err = client.Dial(s.Addr); err != nil {
					b.Error(err)
					return
				}
			}
			m := newQuery(fmt.Sprintf("q%d.example.", n.Add(1)%1000), dns.TypeA)
			if _, _, err := client.ExchangeWithConnContext(ctx, m, co); err != nil {
				b.Error(err)
				co.Close()
				return
			}
			idle <- co
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(s.Handshakes()), "conns")
}

// BenchmarkDialPerQuery is miekg/dns Client.Exchange: a new TLS connection (with
// session resumption) for every query.
func BenchmarkDialPerQuery(b *testing.B) {
	s := benchServer(b)
	cfg := s.ClientTLS()
	client := &dns.Client{Net: "tcp-tls", TLSConfig: cfg, Timeout: 5 * time.Second}
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m := newQuery(fmt.Sprintf("q%d.example.", n.Add(1)%1000), dns.TypeA)
			if _, _, err := client.Exchange(m, s.Addr); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkPrepareAndFinish is the per-query CPU cost of the pool outside I/O:
// packing with padding and keepalive, matching and unpacking the answer.
func BenchmarkPrepareAndFinish(b *testing.B) {
	m := newQuery("www.example.org.", dns.TypeA)
	m.SetEdns0(1232, true)
	answer, _ := dottest.DefaultAnswer(m).Pack()
	b.ReportAllocs()
	for b.Loop() {
		q, err := prepareQuery(m, 128, true)
		if err != nil {
			b.Fatal(err)
		}
		if !answers(answer, q.question) {
			b.Fatal("no match")
		}
		if _, _, err := finishAnswer(q, answer); err != nil {
			b.Fatal(err)
		}
	}
}
