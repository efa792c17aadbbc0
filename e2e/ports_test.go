package e2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The servers the tests start bind ports the test chose beforehand, so a port
// may be taken between the choice and the bind. A port from the kernel's
// ephemeral range (what 127.0.0.1:0 hands out) is the one most likely to be:
// every outgoing connection of this machine takes its local port from that
// range (dnsperf's, CoreDNS's dials, another package's tests), and one did,
// once, in CI (kresd: "bind: address already in use"). So freePort picks below
// the ephemeral range, where only explicit binds land; ports handed out in
// this run are never handed out again.

var (
	portsMu sync.Mutex
	ports   = map[int]bool{} // guarded by portsMu: ports handed out in this run
)

// portSpan is how many ports below the ephemeral range freePort draws from.
const portSpan = 10000

// freePort returns a port on 127.0.0.1, below the ephemeral range, that is
// free for both TCP and UDP now.
func freePort(t testing.TB) int {
	t.Helper()
	low := ephemeralLow(t)
	first := max(1024, low-portSpan)
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 200 {
		port := first + rand.IntN(low-first)
		if !ports[port] && bindable(port) {
			ports[port] = true
			return port
		}
	}
	t.Fatalf("No port in %d-%d free for both TCP and UDP after 200 tries", first, low-1)
	return 0
}

// bindable reports whether port is free on 127.0.0.1 for both TCP and UDP.
func bindable(port int) bool {
	l, err := net.Listen("tcp", addr(port))
	if err != nil {
		return false
	}
	defer l.Close()
	u, err := net.ListenPacket("udp", addr(port))
	if err != nil {
		return false
	}
	u.Close()
	return true
}

// ephemeralLow returns the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), or Linux's default where the file is absent.
func ephemeralLow(t testing.TB) int {
	t.Helper()
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if os.IsNotExist(err) {
		return 32768
	}
	if err != nil {
		t.Fatalf("Reading the ephemeral port range: %v", err)
	}
	fields := strings.Fields(string(data))
	if len(fields) != 2 {
		t.Fatalf("ip_local_port_range is %q: want two ports", data)
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil || low <= 1024+100 {
		t.Fatalf("ip_local_port_range starts at %q: want a port above 1124 to draw test ports below it", fields[0])
	}
	return low
}

func addr(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
