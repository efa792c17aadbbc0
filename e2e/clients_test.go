package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// clientTimeout bounds one run of dig or kdig.
const clientTimeout = 20 * time.Second

// TestClients proves that real DNS clients get correct answers from CoreDNS with
// dotforward in front of unbound: dig over UDP and TCP (including its automatic
// retry over TCP when a UDP answer is truncated), kdig, and dnsperf in UDP and
// TCP modes with nothing lost.
func TestClients(t *testing.T) {
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{})
	f := startFront(t, c, frontOpts{Upstreams: []string{u.addr}})
	host, port, _ := strings.Cut(f.addr, ":")

	t.Run("dig", func(t *testing.T) {
		dig := tool(t, "dig")
		base := []string{"@" + host, "-p", port, "+tries=1", "+time=5"}
		for _, mode := range []string{"+notcp", "+tcp"} {
			out := mustRun(t, dig, append(base, mode, "+short", aName, "A")...)
			if strings.TrimSpace(out) != aAddr {
				t.Errorf("dig %s A: %q, want %s", mode, out, aAddr)
			}
			out = mustRun(t, dig, append(base, mode, "+short", mxName, "MX")...)
			if strings.TrimSpace(out) != "10 "+mxHost {
				t.Errorf("dig %s MX: %q", mode, out)
			}
			out = mustRun(t, dig, append(base, mode, nxName, "A")...)
			if !strings.Contains(out, "status: NXDOMAIN") {
				t.Errorf("dig %s %s: no NXDOMAIN in\n%s", mode, nxName, out)
			}
		}
	})
	t.Run("dig/TruncatedRetriesOverTCP", func(t *testing.T) {
		out := mustRun(t, tool(t, "dig"), "@"+host, "-p", port, "+tries=1", "+time=5", "+noedns", bigName, "TXT")
		if !strings.Contains(out, "Truncated, retrying in TCP mode") {
			t.Fatalf("dig over UDP without EDNS did not get TC for %s:\n%s", bigName, out)
		}
		if !strings.Contains(out, "status: NOERROR") || !strings.Contains(out, "(TCP)") {
			t.Fatalf("dig's TCP retry did not succeed:\n%s", out)
		}
		for _, s := range bigStrings {
			if !strings.Contains(out, `"`+s+`"`) {
				t.Fatalf("dig's TCP retry lacks the TXT string %.20q...:\n%s", s, out)
			}
		}
	})
	t.Run("dig/NearFourKBOverTCP", func(t *testing.T) {
		out := mustRun(t, tool(t, "dig"), "@"+host, "-p", port, "+tries=1", "+time=5", "+tcp", "+short", hugeName, "TXT")
		for _, s := range hugeStrings {
			if !strings.Contains(out, `"`+s+`"`) {
				t.Fatalf("dig +tcp %s lacks the TXT string %.20q...", hugeName, s)
			}
		}
	})
	t.Run("kdig", func(t *testing.T) {
		kdig := tool(t, "kdig")
		for _, mode := range []string{"+notcp", "+tcp"} {
			// kdig lowers the case of names itself; TestSemantics checks case.
			out := mustRun(t, kdig, "@"+host, "-p", port, "+timeout=5", "+retry=0", mode, aName, "AAAA")
			if !strings.Contains(out, "status: NOERROR") || !regexp.MustCompile(`(?m)^a\.e2e\.test\.\s.*AAAA\s+`+regexp.QuoteMeta(aaaaAddr)+`$`).MatchString(out) {
				t.Errorf("kdig %s AAAA:\n%s", mode, out)
			}
			out = mustRun(t, kdig, "@"+host, "-p", port, "+timeout=5", "+retry=0", mode, txtName, "TXT")
			if !strings.Contains(out, `"`+txtText+`"`) {
				t.Errorf("kdig %s TXT:\n%s", mode, out)
			}
			out = mustRun(t, kdig, "@"+host, "-p", port, "+timeout=5", "+retry=0", mode, failName, "A")
			if !strings.Contains(out, "status: SERVFAIL") {
				t.Errorf("kdig %s %s: no SERVFAIL in\n%s", mode, failName, out)
			}
		}
	})
	for _, mode := range []string{"udp", "tcp"} {
		t.Run("dnsperf/"+mode, func(t *testing.T) {
			runDnsperf(t, host, port, mode)
		})
	}
}

// mustRun runs a client and fails the test if it does not exit cleanly.
func mustRun(t *testing.T, bin string, args ...string) string {
	t.Helper()
	out, err := run(t, clientTimeout, bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return out
}

// dnsperfRuns is how many times dnsperf goes through the load-test names.
const dnsperfRuns = 25

// runDnsperf sends every h*.e2e.test name dnsperfRuns times and requires every
// query completed, none lost, all NOERROR.
func runDnsperf(t *testing.T, host, port, mode string) {
	var data strings.Builder
	for i := range hostCount {
		fmt.Fprintf(&data, "%s A\n", hostName(i))
	}
	file := writeFile(t, t.TempDir(), "queries.txt", data.String())
	want := hostCount * dnsperfRuns
	out, err := run(t, 60*time.Second, tool(t, "dnsperf"), "-m", mode, "-s", host, "-p", port,
		"-d", file, "-n", strconv.Itoa(dnsperfRuns), "-l", "30", "-c", "4", "-q", "50", "-t", "5")
	if err != nil {
		t.Fatalf("dnsperf -m %s: %v\n%s", mode, err, out)
	}
	sent := dnsperfStat(t, out, `Queries sent:\s+(\d+)`)
	completed := dnsperfStat(t, out, `Queries completed:\s+(\d+)`)
	lost := dnsperfStat(t, out, `Queries lost:\s+(\d+)`)
	noerror := dnsperfStat(t, out, `Response codes:\s+NOERROR (\d+)`)
	if sent != want || completed != want || lost != 0 || noerror != want {
		t.Fatalf("dnsperf -m %s: sent %d, completed %d, lost %d, NOERROR %d; want %d, %d, 0, %d\n%s",
			mode, sent, completed, lost, noerror, want, want, want, out)
	}
	t.Logf("dnsperf -m %s: %d queries, all completed NOERROR, 0 lost (%s)", mode, want,
		strings.TrimSpace(regexp.MustCompile(`Queries per second:\s+\S+`).FindString(out)))
}

func dnsperfStat(t *testing.T, out, pattern string) int {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("dnsperf output has no %q:\n%s", pattern, out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
