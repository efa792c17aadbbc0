// Command fakedot is the DoT upstream of the benchmark's churn run: the scriptable
// test server of dot/dottest as a process. It answers every A query with
// 192.0.2.1 and, with -close-after N, closes each connection right after its Nth
// answer, which no real server can be told to do, so that clients must reconnect
// (and, ideally, resume their TLS sessions). With -delay D it holds back the
// answers to the names that start with -delay-prefix (all names if that is
// empty) for D: a slow tail (the regimes phase's cut-slowtail).
//
// Its counters are served as key=value lines on http://STATS/stats and printed
// when it stops. It stops on SIGINT or SIGTERM, or by itself after -lifetime.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "fakedot:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:8853", "DoT listen address (127.0.0.1 only)")
	stats := flag.String("stats", "127.0.0.1:8854", "HTTP address serving the counters on /stats")
	certFile := flag.String("cert", "", "PEM certificate chain to present (required)")
	keyFile := flag.String("key", "", "PEM private key of -cert (required)")
	closeAfter := flag.Int("close-after", 0, "close each connection after this many answers (0: never)")
	inOrder := flag.Bool("in-order", false, "answer one query at a time per connection, in arrival order")
	drop := flag.Bool("drop", false, "never answer: read every query and drop it, keeping connections open (a black hole)")
	delay := flag.Duration("delay", 0, "hold back the answers to names starting with -delay-prefix for this long (0: none)")
	delayPrefix := flag.String("delay-prefix", "", "the names -delay applies to start with this (case-insensitive; empty: every name)")
	lifetime := flag.Duration("lifetime", 15*time.Minute, "exit by itself after this long")
	flag.Parse()

	if *certFile == "" || *keyFile == "" {
		return errors.New("-cert and -key are required")
	}
	if *closeAfter < 0 {
		return fmt.Errorf("-close-after %d: must be 0 or more", *closeAfter)
	}
	if *delay < 0 || *delay > time.Minute {
		return fmt.Errorf("-delay %v: must be between 0 and 1m", *delay)
	}
	for _, a := range []string{*addr, *stats} {
		if err := checkLoopback(a); err != nil {
			return err
		}
	}
	leaf, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		return fmt.Errorf("loading the certificate: %w", err)
	}

	opts := dottest.Options{
		Addr:       *addr,
		Cert:       &dottest.Cert{Leaf: leaf},
		CloseAfter: *closeAfter,
		InOrder:    *inOrder,
	}
	if *drop {
		opts.Drop = func(dns.Question) bool { return true }
	}
	if *delay > 0 {
		opts.Delay = delayFunc(*delay, *delayPrefix)
	}
	srv, err := dottest.New(opts)
	if err != nil {
		return err
	}
	defer srv.Close()

	ln, err := net.Listen("tcp", *stats)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) { writeStats(w, srv) })
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go hs.Serve(ln) //nolint:errcheck // Serve returns when Shutdown closes the listener.

	fmt.Printf("fakedot: serving DoT on %s, close-after %d, in-order %v, drop %v, delay %v for names starting with %q, stats on http://%s/stats\n",
		srv.Addr, *closeAfter, *inOrder, *drop, *delay, *delayPrefix, ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	select {
	case <-ctx.Done():
	case <-time.After(*lifetime):
		fmt.Println("fakedot: lifetime over")
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = hs.Shutdown(shutdown)
	writeStats(os.Stdout, srv)
	return nil
}

// delayFunc holds back the answers to the names starting with prefix (every name
// if prefix is empty) for d.
func delayFunc(d time.Duration, prefix string) func(dns.Question) time.Duration {
	prefix = strings.ToLower(prefix)
	return func(q dns.Question) time.Duration {
		if strings.HasPrefix(strings.ToLower(q.Name), prefix) {
			return d
		}
		return 0
	}
}

// writeStats prints the server's counters as key=value lines, easy to read from a
// shell without a JSON parser.
func writeStats(w io.Writer, s *dottest.Server) {
	fmt.Fprintf(w, "queries=%d\nanswers=%d\nhandshakes=%d\nresumed=%d\nconns=%d\n",
		s.Queries(), s.Answers(), s.Handshakes(), s.Resumed(), s.Conns())
}

// checkLoopback refuses listen addresses off 127.0.0.0/8: bench traffic stays local.
func checkLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() || ip.To4() == nil {
		return fmt.Errorf("address %q: want an IPv4 loopback address", addr)
	}
	return nil
}
