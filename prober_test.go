package dotforward

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// Probes ride the pool's connection: a suspect upstream is probed over the open
// connection, not through a new TLS handshake each time.
func TestProbesReusePooledConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		var probes atomic.Int64
		s := startPipe(t, cert, dottest.Options{OnQuery: countProbes(&probes)})
		f := newPipeForward(t, cert, "health_check 20ms\nmax_fails 100", s)
		waitFor(t, "the first probe", f.Ready)
		u := f.upstreams[0]
		for i := range 5 {
			u.health.failure(fmt.Errorf("suspect %d", i)) // as the pool would on a failure
			waitFor(t, "a probe to clear the suspicion", func() bool { return u.health.fails.Load() == 0 })
		}
		if p := probes.Load(); p < 6 {
			t.Errorf("Expected at least 6 probes (startup and 5 suspicions), got %d", p)
		}
		if h := s.Handshakes(); h != 1 {
			t.Errorf("Expected every probe over 1 connection, got %d handshakes", h)
		}
	})
}

// Client answers prove health as well as probes: a busy upstream is not probed.
func TestNoProbesWhileAnswersFlow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		var probes atomic.Int64
		s := startPipe(t, cert, dottest.Options{OnQuery: countProbes(&probes)})
		f := newPipeForward(t, cert, "health_check 50ms", s)
		waitFor(t, "the first probe", f.Ready)
		before := probes.Load()
		// A query every millisecond for 300ms of the bubble's clock: its time
		// moves only while every goroutine waits, so the pacing is the sleep.
		for range 300 {
			if _, rcode, err := serve(f, newMsg("busy.example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
				t.Fatalf("Query failed: rcode %d, %v", rcode, err)
			}
			time.Sleep(time.Millisecond)
		}
		if got := probes.Load() - before; got > 1 {
			t.Errorf("Expected no probes while answers flow, got %d in 300ms", got)
		}
	})
}

// Ready means started and first probe round done, not "an upstream is up": it
// stays true when the upstream goes away.
func TestReadyDoesNotFollowUpstreamHealth(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		s := startPipe(t, cert, dottest.Options{})
		f := newPipeForward(t, cert, "health_check 20ms\nmax_fails 1", s)
		waitFor(t, "ready", f.Ready)
		s.Close()
		// A healthy idle upstream is not probed: the next client query finds it gone.
		serve(f, newMsg("gone.example.org.", dns.TypeA))
		waitFor(t, "the upstream marked down", f.upstreams[0].Down)
		if !f.Ready() {
			t.Error("Expected ready to stay true while the only upstream is down")
		}
	})
}

// Killing one of two upstreams under steady load fails (almost) nothing, and the
// upstream takes queries again soon after it restarts. Real sockets are the
// point here, so its waitFor calls run on the wall clock: the kill closes real
// TCP connections under load, and the restart listens on the same port again,
// which the pool must find by dialing the same address.
func TestFailoverAndRecoveryUnderLoad(t *testing.T) {
	cert := testCert(t)
	a := startServer(t, cert, dottest.Options{})
	b := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "policy round_robin\nhealth_check 100ms", a.Addr, b.Addr)
	waitFor(t, "ready", f.Ready)

	var sent, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent.Add(1)
				if _, rcode, _ := serve(f, newMsg(fmt.Sprintf("w%d-%d.example.org.", w, i), dns.TypeA)); rcode != dns.RcodeSuccess {
					failed.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	})
	waitFor(t, "load on both upstreams", func() bool { return a.Queries() > 200 && b.Queries() > 200 })
	a.Close()
	killedAt := time.Now()
	waitFor(t, "the killed upstream marked down", f.upstreams[0].Down)
	t.Logf("Marked down %v after the kill", time.Since(killedAt).Round(time.Millisecond))
	waitFor(t, "more load on the survivor", func() bool { return b.Queries() > 2000 })

	restarted, err := dottest.New(dottest.Options{Cert: cert, Addr: a.Addr})
	if err != nil {
		t.Fatalf("Restarting the upstream on %s: %v", a.Addr, err)
	}
	defer restarted.Close()
	restartedAt := time.Now()
	waitFor(t, "client queries at the restarted upstream", func() bool { return restarted.Queries() > 100 })
	t.Logf("Restarted upstream took 100 queries %v after its restart", time.Since(restartedAt).Round(time.Millisecond))
	close(stop)
	wg.Wait()

	if ratio := float64(failed.Load()) / float64(sent.Load()); ratio > 0.005 {
		t.Errorf("Expected at most 0.5%% failed queries, got %d of %d", failed.Load(), sent.Load())
	}
	t.Logf("Failed %d of %d queries", failed.Load(), sent.Load())
}

// A server that accepts TLS and closes at once does not cause a reconnect storm,
// probes included: the pool's backoff only resets on an answer.
func TestHandshakeThenCloseDoesNotStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		s := startPipe(t, cert, dottest.Options{CloseAfterHandshake: true})
		f := newPipeForward(t, cert, "health_check 10ms", s)
		waitFor(t, "ready", f.Ready)
		// A query every millisecond for a second of the bubble's clock (see
		// TestNoProbesWhileAnswersFlow).
		for range 1000 {
			serve(f, newMsg("storm.example.org.", dns.TypeA))
			time.Sleep(time.Millisecond)
		}
		if h := s.Handshakes(); h > 8 {
			t.Errorf("Expected a handful of handshakes in a second of queries and probes, got %d", h)
		}
		if !f.upstreams[0].Down() {
			t.Error("Expected the upstream down")
		}
	})
}

// countProbes returns an OnQuery hook counting health probes (NS queries).
func countProbes(n *atomic.Int64) func(wire []byte) {
	return func(wire []byte) {
		m := new(dns.Msg)
		if m.Unpack(wire) == nil && m.Question[0].Qtype == dns.TypeNS {
			n.Add(1)
		}
	}
}

// healthcheck_failures_total counts the probes that tried the upstream. A probe
// that finds the pool waiting out its reconnect backoff sends nothing and is not
// counted; the probe whose dial failed is. Against an unreachable upstream probed
// every 10ms, that is one failure per failed dial, not one per tick.
func TestHealthCheckFailuresCountProbesThatTried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cert := testCert(t)
		dead := deadPipe(t, cert)
		failures, dialErrors := healthcheckFailures.WithLabelValues(dead.Addr), dialsTotal.WithLabelValues(dead.Addr, "error")
		failures0, dials0 := metricValue(t, failures), metricValue(t, dialErrors)
		f := newPipeForward(t, cert, "health_check 10ms\nmax_fails 1", dead)
		waitFor(t, "three failed dials", func() bool { return metricValue(t, dialErrors)-dials0 >= 3 })
		// The probe whose dial failed counts its failure after the pool reports the
		// dial; waitFor may see the dial first when both wake at the same instant.
		synctest.Wait()
		fails, dials := metricValue(t, failures)-failures0, metricValue(t, dialErrors)-dials0
		if err := f.OnShutdown(); err != nil {
			t.Fatalf("Shutting down: %v", err)
		}
		// The first probe's failed dial leaves one more at once (the first strike's
		// retry), which that probe waits for: one failure for its two dials.
		if fails != dials-1 {
			t.Errorf("Expected one health check failure per failed dial but the first strike's retry, got %v failures for %v failed dials", fails, dials)
		}
	})
}
