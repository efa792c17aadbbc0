package e2e

import (
	"fmt"
	"strings"
)

// The test zone e2e.test is served by every upstream: unbound and CoreDNS hold it
// themselves, dnsdist and Knot Resolver pass queries on to an unbound holding it.
// fail.test answers SERVFAIL at once everywhere.
const (
	zone      = "e2e.test."
	failZone  = "fail.test."
	failName  = "x.fail.test."
	aName     = "a.e2e.test."
	mxName    = "mx.e2e.test."
	txtName   = "txt.e2e.test."
	bigName   = "big.e2e.test."  // TXT answer over 512 octets
	hugeName  = "huge.e2e.test." // TXT answer near 4 KB
	nxName    = "nx.e2e.test."
	hostCount = 200 // h0..h199.e2e.test. with distinct A records, for load tests
)

const (
	aAddr    = "192.0.2.1"
	aaaaAddr = "2001:db8::1"
	mxHost   = "mail.e2e.test."
	txtText  = "hello from e2e.test"
)

// bigStrings and hugeStrings are the character strings of the large TXT records:
// 3×200 octets (answer ~650 octets) and 15×250 octets (answer ~3.9 KB).
var (
	bigStrings  = txtStrings("big", 3, 200)
	hugeStrings = txtStrings("huge", 15, 250)
)

func txtStrings(tag string, n, size int) []string {
	out := make([]string, n)
	for i := range out {
		s := fmt.Sprintf("%s-%02d-", tag, i)
		out[i] = s + strings.Repeat(string(rune('a'+i%26)), size-len(s))
	}
	return out
}

// hostName and hostAddr are the i-th load-test name and its A record.
func hostName(i int) string { return fmt.Sprintf("h%d.%s", i, zone) }
func hostAddr(i int) string { return fmt.Sprintf("10.0.%d.%d", i/256, i%256) }

// zoneRecords returns the zone's data as master-file lines (no SOA/NS).
func zoneRecords() []string {
	quote := func(ss []string) string { return `"` + strings.Join(ss, `" "`) + `"` }
	rr := []string{
		aName + " 300 IN A " + aAddr,
		aName + " 300 IN AAAA " + aaaaAddr,
		mxName + " 300 IN MX 10 " + mxHost,
		mxHost + " 300 IN A 192.0.2.25",
		txtName + ` 300 IN TXT "` + txtText + `"`,
		bigName + " 300 IN TXT " + quote(bigStrings),
		hugeName + " 300 IN TXT " + quote(hugeStrings),
	}
	for i := range hostCount {
		rr = append(rr, fmt.Sprintf("%s 300 IN A %s", hostName(i), hostAddr(i)))
	}
	return rr
}

// zoneFile returns e2e.test as a master file, for CoreDNS's file plugin.
func zoneFile() string {
	var b strings.Builder
	b.WriteString("$ORIGIN " + zone + "\n")
	b.WriteString(zone + " 300 IN SOA ns.e2e.test. hostmaster.e2e.test. 1 7200 3600 1209600 300\n")
	b.WriteString(zone + " 300 IN NS ns.e2e.test.\n")
	b.WriteString("ns.e2e.test. 300 IN A 127.0.0.1\n")
	for _, r := range zoneRecords() {
		b.WriteString(r + "\n")
	}
	return b.String()
}
