package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
	"unsafe"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	coretest "github.com/coredns/coredns/test"
	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// The query path's stack margin (issue 24, and 8602b42's lesson): CoreDNS serves
// each UDP query on a goroutine of its own, whose stack starts at the runtime's
// starting size, and a path deeper than the stack copies it on every query
// (runtime.newstack took 13-15 % of CPU when it did). Under load CoreDNS's
// goroutines start at 4 KB: the runtime's adaptive start (runtime/metrics
// /gc/stack/starting-size:bytes) is the average stack it scanned, which rounds
// to 4 KB there.
//
// The test makes that deterministic. It runs itself again in a process with the
// adaptive start off (GODEBUG=adaptivestackstart=0, which only the environment
// at start-up sets), so every goroutine starts at the fixed 2 KB, which
// CoreDNS's request handling (miekg/dns unpacking the query) grows once, to
// 4 KB, before the first plugin runs. A probe, first in the plugin chain on the
// real query goroutine, serves the rest of the chain below some padding frames
// and reports whether the stack grew: a local's address changes only when the
// stack is copied (the garbage collector, which could shrink it, is off
// meanwhile). Below the probe runs the real path: the plugins, dotforward, the
// pool, the answer written and packed by miekg/dns.
//
// The budget is the floor's: the stack whoami needs behind the same plugins
// (4 KB bare; behind errors, prometheus and cache, CoreDNS's own plugins already
// take it to 8 KB). dotforward must fit in the same stack, so that it adds no copy
// to the floor's; the margin is the padding that still fits.
const productionStart = 4 << 10

// probe is what the test tells the probe, and what the probe saw.
var probe = struct {
	grow    bool // grow the stack from 4 to 8 KB before padding (growTo8K)
	pad     int  // padLevel frames the probe adds above the chain
	results chan probeResult
}{results: make(chan probeResult, 1)}

type probeResult struct {
	padGrew   bool    // the stack grew under the padding alone
	chainGrew bool    // the stack grew while the chain served the query below it
	frame     uintptr // the size of one padLevel frame
}

func init() {
	plugin.Register("stackprobe", func(c *caddy.Controller) error {
		c.Next()
		dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler { return stackProbe{next} })
		return nil
	})
	dnsserver.Directives = append([]string{"stackprobe"}, dnsserver.Directives...)
}

// stackProbe is the first plugin of the chain.
type stackProbe struct{ next plugin.Handler }

func (stackProbe) Name() string { return "stackprobe" }

func (p stackProbe) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	var res probeResult
	if probe.grow {
		growTo8K()
	}
	var top byte // a pointer into the stack is moved with it: the bottom compares
	rc, err := padLevel(probe.pad, &res, &top, uintptr(unsafe.Pointer(&top)), 0, func() (int, error) { return p.next.ServeDNS(ctx, w, r) })
	select {
	case probe.results <- res:
	default:
	}
	return rc, err
}

// growTo8K has a frame that does not fit in a 4 KB stack, and does in an 8 KB
// one: the stack it returns to is 8 KB (stackMargin checks the room).
//
//go:noinline
func growTo8K() {
	var b [4000]byte
	sink(b[:])
}

//go:noinline
func sink(b []byte) { b[len(b)-1] = 1 }

// padLevel serves below n frames of its own. A local's address changes only if
// the stack is copied: at the bottom, top's tells whether the padding grew the
// stack, and after serve, the bottom's own whether the chain did.
//
//go:noinline
func padLevel(n int, res *probeResult, top *byte, topAt, above uintptr, serve func() (int, error)) (int, error) {
	var mark byte
	at := uintptr(unsafe.Pointer(&mark))
	if above != 0 {
		res.frame = above - at
	}
	if n > 0 {
		return padLevel(n-1, res, top, topAt, at, serve)
	}
	res.padGrew = uintptr(unsafe.Pointer(top)) != topAt
	rc, err := serve()
	res.chainGrew = uintptr(unsafe.Pointer(&mark)) != at
	return rc, err
}

// stackChildEnv marks the process that probes (see runStackChild).
const stackChildEnv = "DOTFORWARD_STACK_PROBE"

func TestQueryPathStackMargin(t *testing.T) {
	if os.Getenv(stackChildEnv) == "" {
		runStackChild(t)
		return
	}
	sample := []metrics.Sample{{Name: "/gc/stack/starting-size:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 || sample[0].Value.Uint64() != 2<<10 {
		t.Fatalf("runtime/metrics %s = %v, want the fixed 2 KB start (adaptivestackstart=0)", sample[0].Name, sample[0].Value)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(-1)) // no stack shrinks while probing
	up := dottest.Start(t, dottest.Options{})
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, up.Cert.CAPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	fwd := fmt.Sprintf("dotforward . tls://%s {\n\t\ttls_servername %s\n\t\ttls %s\n\t}", up.Addr, dottest.ServerName, ca)
	for _, c := range []struct{ name, plugins string }{
		{"bare", ""},
		{"mission", "errors\n\tprometheus 127.0.0.1:0\n\tcache 30\n\t"},
	} {
		t.Run(c.name, func(t *testing.T) {
			// Without dotforward: the directives' order, not the Corefile's, puts
			// it before whoami.
			floor := probeCorefile(t, c.plugins+"whoami")
			budget := productionStart
			if _, fits := bestMargin(t, floor, budget); !fits {
				budget *= 2
				if _, fits = bestMargin(t, floor, budget); !fits {
					t.Fatalf("whoami behind %q does not fit in %d bytes", c.plugins, budget)
				}
			}
			margin, fits := bestMargin(t, probeCorefile(t, c.plugins+fwd), budget)
			if !fits {
				t.Fatalf("dotforward's query path exceeds the %d-byte stack whoami needs in the same Corefile: the stack grows (a copy per query)", budget)
			}
			t.Logf("%s: the floor needs a %d-byte stack; dotforward leaves %d bytes of it", c.name, budget, margin)
		})
	}
}

// probeCorefile starts CoreDNS with the probe and then plugins, and returns its
// UDP address.
func probeCorefile(t *testing.T, plugins string) string {
	t.Helper()
	corefile := fmt.Sprintf(".:0 {\n\tbind 127.0.0.1\n\tstackprobe\n\t%s\n}\n", plugins)
	inst, addr, _, err := coretest.CoreDNSServerAndPorts(corefile)
	if err != nil {
		t.Fatalf("CoreDNS with\n%s: %v", corefile, err)
	}
	t.Cleanup(func() { inst.Stop() })
	return addr
}

// bestMargin is the best of attempts stackMargin measurements: a path that
// fits fits in every one, but now and then a query takes a deeper way than the
// steady state's (one in about ten runs of the floor alone did).
func bestMargin(t *testing.T, addr string, size int) (int, bool) {
	t.Helper()
	best, fits := -1, false
	for range attempts {
		m, ok := stackMargin(t, addr, size)
		if ok {
			best, fits = max(best, m), true
		}
	}
	return best, fits
}

// stackMargin serves queries through the probe at addr on a stack of size
// (4 or 8 KB) with more and more padding above the chain, and returns the
// padding that still fitted, and whether the chain fitted at all. It fails the
// test if the stack the chain runs on is not size: the room the padding alone
// finds must be under it.
//
// The pool dials on the first query, a deeper path than the steady state's:
// warmUp queries go first, and each padding is tried probesPerPad times.
func stackMargin(t *testing.T, addr string, size int) (int, bool) {
	t.Helper()
	client := &dns.Client{Timeout: 5 * time.Second}
	probe.grow = size > productionStart
	for range warmUp {
		serveProbed(t, client, addr, 0)
	}
	margin, frame := -1, 0
	for pad := 0; pad <= maxPad; pad++ {
		var res probeResult
		for range probesPerPad {
			r := serveProbed(t, client, addr, pad)
			res.padGrew, res.chainGrew = res.padGrew || r.padGrew, res.chainGrew || r.chainGrew
			if pad > 1 && !r.padGrew && !r.chainGrew {
				frame = int(r.frame) // measured where nothing moved
			}
		}
		switch {
		case res.padGrew:
			if room := (pad - 1) * frame; room >= size {
				t.Fatalf("%d bytes of room above the chain: its stack is larger than %d bytes", room, size)
			}
			if margin < 0 {
				t.Fatal("the padding grew the stack before the chain did: the probe does not see the chain's growth")
			}
			return margin, true
		case res.chainGrew && pad == 0:
			return -1, false
		case res.chainGrew && margin < 0:
			margin = (pad - 1) * frame
		}
	}
	t.Fatalf("%d pad frames still fit: the probe does not see the stack grow", maxPad)
	return 0, false
}

const (
	maxPad       = 160 // more 64-byte frames than fit in 8 KB
	warmUp       = 20
	probesPerPad = 3
	attempts     = 3
)

// serveProbed sends one query (a name of its own, so that cache misses) and
// returns what the probe saw.
func serveProbed(t *testing.T, client *dns.Client, addr string, pad int) probeResult {
	t.Helper()
	probe.pad = pad
	m := new(dns.Msg)
	m.SetQuestion(fmt.Sprintf("p%d-%d.example.", pad, time.Now().UnixNano()), dns.TypeA)
	r, _, err := client.Exchange(m, addr)
	if err != nil || r.Rcode != dns.RcodeSuccess || len(r.Answer)+len(r.Extra) == 0 { // whoami answers in Extra
		t.Fatalf("query through the probe: %v, %v", r, err)
	}
	select {
	case res := <-probe.results:
		return res
	case <-time.After(5 * time.Second):
		t.Fatal("the probe did not report")
	}
	return probeResult{}
}

// runStackChild runs TestQueryPathStackMargin in a process of its own whose
// goroutines all start at the fixed 2 KB, and fails as it fails. The frames
// measured must be a production build's: a test binary with the race detector
// (make test) builds one without it for the child.
func runStackChild(t *testing.T) {
	bin := os.Args[0]
	if raceEnabled {
		bin = filepath.Join(t.TempDir(), "coredns.test")
		build := exec.Command("go", "test", "-c", "-o", bin, ".")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building the probe's test binary without the race detector: %v\n%s", err, out)
		}
	}
	cmd := exec.Command(bin, "-test.run=^TestQueryPathStackMargin$", "-test.v", "-test.count=1", "-test.timeout=2m")
	cmd.Env = append(os.Environ(), "GODEBUG=adaptivestackstart=0", stackChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("the probing process:\n%s", out)
	if err != nil {
		t.Fatalf("the probing process failed: %v", err)
	}
}
