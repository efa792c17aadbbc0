package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fdLimitLine is dotforward's line when the process is out of file descriptors.
const fdLimitLine = "plugin/dotforward: The process is out of file descriptors"

// startLimitedFront starts CoreDNS under a real RLIMIT_NOFILE of nofile (prlimit
// sets it and execs CoreDNS) with plugin ("forward" or "dotforward") in front of
// the DoT upstream up.
func startLimitedFront(t *testing.T, c *certs, plugin, up string, nofile int) (string, *proc) {
	t.Helper()
	port := freePort(t)
	_, upPort, _ := strings.Cut(up, ":")
	conf := writeFile(t, t.TempDir(), "Corefile", fmt.Sprintf(`.:%d {
    bind 127.0.0.1
    errors
    %s . tls://127.0.0.1:%s {
        tls %s
        tls_servername %s
    }
}
`, port, plugin, upPort, c.CA, serverName))
	p := startProc(t, "coredns-"+plugin+"-nofile", nil, tool(t, "prlimit"), fmt.Sprintf("--nofile=%d:%d", nofile, nofile),
		corednsBinary(t), "-conf", conf)
	waitFor(t, plugin+" under RLIMIT_NOFILE", startTimeout, p, func() error {
		r, err := exchange("udp", addr(port), nil, newQuery("ready.e2e.test.", dns.TypeA))
		if err != nil {
			return err
		}
		return checkAnswer(r, dns.TypeA, "192.0.2.53")
	})
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", p.cmd.Process.Pid))
	if err != nil || !strings.Contains(string(limits), "Max open files            "+strconv.Itoa(nofile)+" ") {
		t.Fatalf("CoreDNS under prlimit: /proc/PID/limits %v, want Max open files %d:\n%s", err, nofile, limits)
	}
	return addr(port), p
}

// goodAnswers offers qps queries/s for secs seconds to front and returns the
// NOERROR answers.
func goodAnswers(t *testing.T, front string, qps, secs int) int {
	t.Helper()
	var names strings.Builder
	for i := range qps * secs {
		fmt.Fprintf(&names, "q%06d.e2e.test A\n", i)
	}
	file := writeFile(t, t.TempDir(), "queries.txt", names.String())
	host, port, _ := strings.Cut(front, ":")
	out, err := run(t, time.Duration(secs+30)*time.Second, tool(t, "dnsperf"), "-s", host, "-p", port, "-d", file,
		"-c", "10", "-q", "1000", "-Q", strconv.Itoa(qps), "-l", strconv.Itoa(secs), "-t", "5")
	if err != nil {
		t.Fatalf("dnsperf: %v\n%s", err, out)
	}
	if !strings.Contains(out, "NOERROR") {
		return 0
	}
	return dnsperfStat(t, out, `NOERROR (\d+)`)
}

// CoreDNS short of file descriptors (RLIMIT_NOFILE 40) in front of a distant
// in-order upstream (CoreDNS tls://, every answer after 30 ms, one at a time
// per connection) at 1,000 QPS: the load needs about 30 connections, about what
// the process can open. dotforward answers at least as many queries as forward,
// logs once, with the fix, that the process is out of file descriptors, and does
// not mark the upstream down for it (issue 21).
func TestOutOfFileDescriptors(t *testing.T) {
	c := newCerts(t)
	up := startSlowUpstream(t, c, 30*time.Millisecond)
	const nofile, qps, secs = 40, 1000, 5

	fwdAddr, fwd := startLimitedFront(t, c, "forward", up.addr, nofile)
	fwdGood := goodAnswers(t, fwdAddr, qps, secs)
	fwd.kill()

	dotAddr, dot := startLimitedFront(t, c, "dotforward", up.addr, nofile)
	dotGood := goodAnswers(t, dotAddr, qps, secs)
	t.Logf("NOERROR answers of %d offered under RLIMIT_NOFILE %d: forward %d, dotforward %d", qps*secs, nofile, fwdGood, dotGood)
	if dotGood < fwdGood {
		t.Errorf("dotforward answered %d queries NOERROR, forward %d: want at least forward's", dotGood, fwdGood)
	}
	dot.kill()
	log, err := os.ReadFile(dot.log)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), fdLimitLine); n != 1 || !strings.Contains(string(log), "LimitNOFILE") {
		t.Errorf("dotforward's log has %q %d times, want once with the fix", fdLimitLine, n)
	}
	if strings.Contains(string(log), "is down") {
		t.Errorf("dotforward marked the upstream down for a local lack of file descriptors")
	}
}
