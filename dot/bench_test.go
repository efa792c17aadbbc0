package dot

import (
	"context"
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

func BenchmarkPoolExchange(b *testing.B) {
	s := benchServer(b)
	p, err := New(Config{Addr: s.Addr, TLS: s.ClientTLS()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	var n atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(benchParallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			m := newQuery(fmt.Sprintf("q%d.example.", n.Add(1)%1000), dns.TypeA)
			if _, err := p.Exchange(ctx, m); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(s.Handshakes()), "conns")
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
