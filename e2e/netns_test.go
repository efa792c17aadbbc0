package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// netns is a private network namespace made by a test (`ip netns add`) and
// deleted when it ends: only its loopback interface, up, so nothing sent in it
// leaves it, and its ports (53 among them) are free whatever the host runs.
type netns struct {
	name string
	ip   string // the ip binary
}

var netnsSeq atomic.Int64

// newNetns makes a namespace with lo up. It needs root, and fails without it.
func newNetns(t testing.TB) *netns {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("making a network namespace needs root: run the tests as root (sudo make test)")
	}
	n := &netns{name: fmt.Sprintf("dotforward-e2e-%d-%d", os.Getpid(), netnsSeq.Add(1)), ip: tool(t, "ip")}
	n.ipCmd(t, "netns", "add", n.name)
	t.Cleanup(func() {
		if out, err := run(t, 30*time.Second, n.ip, "netns", "del", n.name); err != nil {
			t.Errorf("ip netns del %s: %v\n%s", n.name, err, out)
		}
	})
	n.ipCmd(t, "-n", n.name, "link", "set", "lo", "up")
	return n
}

// ipCmd runs ip with args and fails the test if it fails.
func (n *netns) ipCmd(t testing.TB, args ...string) {
	t.Helper()
	if out, err := run(t, 30*time.Second, n.ip, args...); err != nil {
		t.Fatalf("ip %v: %v\n%s", args, err, out)
	}
}

// start starts bin with args inside the namespace. `ip netns exec` execs bin, so
// the process's PID is bin's.
func (n *netns) start(t testing.TB, name, bin string, args ...string) *proc {
	t.Helper()
	return startProc(t, name, nil, n.ip, append([]string{"netns", "exec", n.name, bin}, args...)...)
}

// dial connects to address from inside the namespace. The socket is made by a
// thread that joined the namespace and belongs to it from then on, whichever
// thread uses it later. That thread stays locked, so Go ends it with its
// goroutine instead of reusing it in the wrong namespace.
func (n *netns) dial(network, address string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + n.name)
		if err != nil {
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("setns %s: %w", n.name, err)}
			return
		}
		c, err := net.DialTimeout(network, address, queryTimeout)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// exchange sends m over "udp", "tcp" or "tcp-tls" (with tlsConf) to address
// inside the namespace.
func (n *netns) exchange(network, address string, tlsConf *tls.Config, m *dns.Msg) (*dns.Msg, error) {
	dialNet := network
	if network == "tcp-tls" {
		dialNet = "tcp"
	}
	c, err := n.dial(dialNet, address)
	if err != nil {
		return nil, err
	}
	if network == "tcp-tls" {
		c = tls.Client(c, tlsConf)
	}
	co := &dns.Conn{Conn: c, UDPSize: 4096}
	defer co.Close()
	if err := c.SetDeadline(time.Now().Add(queryTimeout)); err != nil {
		return nil, err
	}
	if err := co.WriteMsg(m); err != nil {
		return nil, err
	}
	return co.ReadMsg()
}

// httpClient is an HTTP client whose connections are made inside the namespace.
func (n *netns) httpClient() *http.Client {
	return &http.Client{
		Timeout: queryTimeout,
		Transport: &http.Transport{DialContext: func(_ context.Context, network, address string) (net.Conn, error) {
			return n.dial(network, address)
		}},
	}
}
