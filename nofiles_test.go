package dotforward

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	clog "github.com/coredns/coredns/plugin/pkg/log"
	golog "log"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// An upstream whose dials fail for lack of file descriptors (a dialer hook
// returning EMFILE, as socket(2) does at RLIMIT_NOFILE) is not marked down and
// its failures are not counted, whatever the number of queries and probes; the
// process logs once that it is out of file descriptors, with the fix.
func TestOutOfFilesLoggedOnceNotCountedAgainstUpstream(t *testing.T) {
	logs := &lockedBuffer{}
	prev := golog.Writer()
	clog.SetOutput(logs)
	defer clog.SetOutput(prev)
	noFilesLogged.Store(0)

	emfile := func(context.Context, string, string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}
	hc := healthCheck{interval: time.Millisecond, domain: "."}
	u := newUpstream(dot.Config{Addr: "127.0.0.1:853", TLS: &tls.Config{ServerName: "dns.test"}, Dial: emfile}, 2, hc)
	if err := u.start(); err != nil {
		t.Fatal(err)
	}
	defer u.stop()
	waitFor(t, "the first probe round", u.probed)
	var last error
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, last = u.exchange(ctx, newMsg("example.org.", dns.TypeA), time.Now().Add(5*time.Second))
		cancel()
		if !errors.Is(last, dot.ErrNoFiles) {
			t.Fatalf("Query %d: error %v, want dot.ErrNoFiles", i, last)
		}
	}
	for range 3 { // more failed dials, as the pool's re-tests make them: no more lines
		u.cfg.Observer.Dialed(0, false, last)
	}
	if u.Down() || u.health.suspect() {
		t.Errorf("Upstream down %v, suspect %v after local dial failures, want neither", u.Down(), u.health.suspect())
	}
	if n := u.health.failedDials.Load(); n != 0 {
		t.Errorf("failedDials = %d, want 0: the prober would count its probe as failed", n)
	}
	if rtt := u.answers.mean.Load(); rtt != 0 {
		t.Errorf("Latency estimate = %v, want none: a local failure is no reading of the upstream", time.Duration(rtt))
	}
	got := strings.Count(logs.String(), "plugin/dotforward: The process is out of file descriptors")
	want := "The process is out of file descriptors (RLIMIT_NOFILE "
	if got != 1 || !strings.Contains(logs.String(), want) || !strings.Contains(logs.String(), "LimitNOFILE") || !strings.Contains(logs.String(), "too many open files") {
		t.Errorf("Log has the out-of-descriptors line %d times, want once with the limit and the fix; log:\n%s", got, logs.String())
	}
}
