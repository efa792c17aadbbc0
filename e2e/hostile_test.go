package e2e

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Hostile and unusual clients of the front, against real DoT upstreams whose own
// statistics show what reached them (issue #12): an oversized TCP query whose
// length must not wrap on its way upstream, CHAOS-class queries, TSIG-signed
// queries, and messages other than QUERY, which must not be sent twice.

// hostileTimeout bounds one exchange of these tests: longer than the front's
// 5-second forwarding timeout, so that its own answer (SERVFAIL included) comes
// in before the client gives up.
const hostileTimeout = 15 * time.Second

// rawExchange sends the DNS message msg as it is over "udp" or "tcp" (with its
// 2-octet length) to addr and returns the raw answer.
func rawExchange(network, addr string, msg []byte, timeout time.Duration) ([]byte, error) {
	conn, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	if network == "udp" {
		if _, err := conn.Write(msg); err != nil {
			return nil, err
		}
		buf := make([]byte, dns.MaxMsgSize)
		n, err := conn.Read(buf)
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	if len(msg) > dns.MaxMsgSize {
		return nil, fmt.Errorf("%d octets do not fit a TCP length", len(msg))
	}
	if _, err := conn.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(msg))), msg...)); err != nil {
		return nil, err
	}
	var n [2]byte
	if _, err := readFull(conn, n[:]); err != nil {
		return nil, fmt.Errorf("reading the answer's length: %w", err)
	}
	buf := make([]byte, binary.BigEndian.Uint16(n[:]))
	if _, err := readFull(conn, buf); err != nil {
		return nil, fmt.Errorf("reading a %d-octet answer: %w", len(buf), err)
	}
	return buf, nil
}

func readFull(conn net.Conn, buf []byte) (int, error) {
	got := 0
	for got < len(buf) {
		n, err := conn.Read(buf[got:])
		got += n
		if err != nil {
			return got, err
		}
	}
	return got, nil
}

// parseRaw checks a raw answer before anything else reads it: it has the ID the
// client sent, it unpacks, and its additional section has at most one OPT and at
// most one TSIG, the TSIG last.
func parseRaw(raw []byte, id uint16) (*dns.Msg, error) {
	if len(raw) < 12 {
		return nil, fmt.Errorf("a %d-octet answer, shorter than a DNS header", len(raw))
	}
	if got := binary.BigEndian.Uint16(raw); got != id {
		return nil, fmt.Errorf("answer has ID %d, the client sent %d", got, id)
	}
	r := new(dns.Msg)
	if err := r.Unpack(raw); err != nil {
		return nil, fmt.Errorf("answer does not unpack (%v): % x", err, raw[:min(len(raw), 64)])
	}
	opts, tsigs := 0, 0
	for i, rr := range r.Extra {
		switch rr.Header().Rrtype {
		case dns.TypeOPT:
			opts++
			if tsigs > 0 {
				return nil, fmt.Errorf("answer has an OPT after its TSIG: %v", r.Extra)
			}
		case dns.TypeTSIG:
			tsigs++
			if i != len(r.Extra)-1 {
				return nil, fmt.Errorf("answer's TSIG is not its last record: %v", r.Extra)
			}
		}
	}
	if opts > 1 || tsigs > 1 {
		return nil, fmt.Errorf("answer has %d OPT and %d TSIG records: %v", opts, tsigs, r.Extra)
	}
	return r, nil
}

// counter returns a real upstream's own cumulative counts of the requests it
// received: "total" (every request), "FORMERR" (answers it gave with that rcode)
// and one entry per query type by name ("A", "SRV", ...); absent counts are 0.
type counter func(t testing.TB) map[string]int64

func unboundCounter(u *unbound) counter {
	return func(t testing.TB) map[string]int64 {
		st := u.stats(t)
		c := map[string]int64{"total": st["total.num.queries"], "FORMERR": st["num.answer.rcode.FORMERR"]}
		for k, v := range st {
			if typ, ok := strings.CutPrefix(k, "num.query.type."); ok {
				c[typ] = v
			}
		}
		return c
	}
}

func bindCounter(b *bind) counter {
	return func(t testing.TB) map[string]int64 {
		st := b.statsOf(t)
		c := map[string]int64{"total": st.NSStats["Requestv4"], "FORMERR": st.Rcodes["FORMERR"]}
		for typ, v := range st.QTypes {
			c[typ] = v
		}
		return c
	}
}

// corednsCounter reads CoreDNS's coredns_dns_requests_total (by type: the types
// the metrics plugin names, SRV, SOA, TXT, A and NS among them) and
// coredns_dns_responses_total.
func corednsCounter(u *corednsUpstream) counter {
	return func(t testing.TB) map[string]int64 {
		text := scrape(t, u.metrics)
		c := map[string]int64{}
		total, _ := metricSum(text, "coredns_dns_requests_total")
		formerr, _ := metricSum(text, "coredns_dns_responses_total", label("rcode", "FORMERR"))
		c["total"], c["FORMERR"] = int64(total), int64(formerr)
		for line := range strings.Lines(text) {
			if !strings.HasPrefix(line, "coredns_dns_requests_total{") {
				continue
			}
			m := regexp.MustCompile(`type="([^"]+)"`).FindStringSubmatch(line)
			_, v, _ := cutLast(strings.TrimSpace(line), " ")
			if n, err := strconv.ParseFloat(v, 64); err == nil && m != nil {
				c[m[1]] += int64(n)
			}
		}
		return c
	}
}

// countingUpstream starts one kind of real DoT upstream and reads its counts.
type countingUpstream struct {
	name  string
	start func(t testing.TB, c *certs) (*dotServer, counter)
}

var countingUpstreams = []countingUpstream{
	{"unbound", func(t testing.TB, c *certs) (*dotServer, counter) {
		u := startUnbound(t, c, unboundOpts{})
		return u.dotServer, unboundCounter(u)
	}},
	{"named", func(t testing.TB, c *certs) (*dotServer, counter) {
		b := startBind(t, c)
		return b.dotServer, bindCounter(b)
	}},
	{"coredns", func(t testing.TB, c *certs) (*dotServer, counter) {
		u := startCoreDNSUpstream(t, c)
		return u.dotServer, corednsCounter(u)
	}},
}

// delta returns after[k] - before[k].
func delta(before, after map[string]int64, k string) int64 { return after[k] - before[k] }

// The oversized query: 65,532 octets, the most a client can send over TCP once
// the pool's 8 octets (an edns-tcp-keepalive option and an empty padding option,
// 4 each) are added, if they are: 65,540 octets, whose 2-octet length would be
// 65,540 mod 65,536 = 4.
const (
	oversizedLen = 65532
	poolOctets   = 8
	smuggledName = "smuggled.e2e.test."
	smuggledType = dns.TypeSRV // no other query of these tests is an SRV
	hostileName  = "hostile.e2e.test."
	localOption  = 65001 // an EDNS option code for local/experimental use (RFC 6891)
)

// smuggledQuery returns the first 50 octets of a query for smuggledName/SRV of
// size octets in all: header, question, and an OPT with one local option whose
// data is the rest. Whatever follows these 50 octets, the query is well-formed.
func smuggledQuery(size int) []byte {
	b := binary.BigEndian.AppendUint16(nil, 0xbeef)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1) // RD; one question, one additional
	name := make([]byte, 32)
	n, _ := dns.PackDomainName(smuggledName, name, 0, nil, false)
	b = append(b, name[:n]...)
	b = binary.BigEndian.AppendUint16(b, smuggledType)
	b = binary.BigEndian.AppendUint16(b, dns.ClassINET)
	b = append(b, 0, 0, byte(dns.TypeOPT), 0x10, 0x00, 0, 0, 0, 0) // root, OPT, 4096, no flags
	head := len(b) + 2 + 4
	b = binary.BigEndian.AppendUint16(b, uint16(size-len(b)-2))
	b = binary.BigEndian.AppendUint16(b, localOption)
	b = binary.BigEndian.AppendUint16(b, uint16(size-head))
	return b
}

// oversizedQuery builds a 65,532-octet query for <63 octets>.hostile.e2e.test/TXT
// with an OPT carrying one local option of 65,419 octets, crafted so that if the
// pool's 8 octets make its TCP length wrap to 4, the upstream reads, after four
// short messages (4, 1, 0 and 0 octets), two well-formed queries for
// smuggledName/SRV that the client chose: one of 319 octets that begins in the
// QNAME's first label (its length, 63, and the ARCOUNT octet before it make the
// length 0x013f), and one of 65,206 octets that runs to the end of the stream,
// the pool's 8 octets included.
func oversizedQuery(t testing.TB, id uint16) (wire []byte, q dns.Question) {
	t.Helper()
	const (
		firstAt   = 13           // the first smuggled query starts after ARCOUNT's low octet and the label length
		firstLen  = 0x01<<8 | 63 // ARCOUNT's low octet (1), then the first label's length
		secondAt  = firstAt + firstLen + 2
		streamLen = oversizedLen + poolOctets
	)
	first := smuggledQuery(firstLen)
	label1 := append(first, strings.Repeat("x", 63-len(first))...)
	qname := append([]byte{63}, label1...)
	rest := make([]byte, 64)
	n, _ := dns.PackDomainName(hostileName, rest, 0, nil, false)
	qname = append(qname, rest[:n]...)

	b := binary.BigEndian.AppendUint16(nil, id)
	b = append(b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1)
	b = append(b, qname...)
	b = binary.BigEndian.AppendUint16(b, dns.TypeTXT)
	b = binary.BigEndian.AppendUint16(b, dns.ClassINET)
	b = append(b, 0, 0, byte(dns.TypeOPT), 0x10, 0x00, 0, 0, 0, 0)
	dataAt := len(b) + 2 + 4
	b = binary.BigEndian.AppendUint16(b, uint16(oversizedLen-len(b)-2))
	b = binary.BigEndian.AppendUint16(b, localOption)
	b = binary.BigEndian.AppendUint16(b, uint16(oversizedLen-dataAt))
	b = append(b, make([]byte, oversizedLen-len(b))...)
	// The second smuggled query, behind its own length, inside the option's data.
	second := smuggledQuery(streamLen - secondAt)
	binary.BigEndian.PutUint16(b[secondAt-2:], uint16(streamLen-secondAt))
	copy(b[secondAt:], second)
	if len(b) != oversizedLen || dataAt > secondAt-2 {
		t.Fatalf("Oversized query built wrong: %d octets, option data at %d", len(b), dataAt)
	}
	m := new(dns.Msg)
	if err := m.Unpack(b); err != nil || len(m.Question) != 1 {
		t.Fatalf("Oversized query does not unpack: %v", err)
	}
	// The smuggled queries, read the way the upstream would, are well-formed.
	for _, s := range [][]byte{b[firstAt : firstAt+firstLen], slices.Concat(b[secondAt:], make([]byte, poolOctets))} {
		sm := new(dns.Msg)
		if err := sm.Unpack(s); err != nil || sm.Question[0].Name != smuggledName || sm.Question[0].Qtype != smuggledType {
			t.Fatalf("Smuggled query of %d octets is not a query for %s: %v %v", len(s), smuggledName, err, sm.Question)
		}
	}
	return b, m.Question[0]
}

// TestHostileOversizedTCPQuery sends a 65,532-octet query over TCP to the front
// and requires FORMERR or an answer to its one question, and, by the upstream's
// own statistics, that no more than that query reached the upstream: not the
// queries for smuggledName/SRV hidden in it, which the upstream would read if
// the length the pool puts in front of it wrapped. A normal query right after
// must still be answered correctly.
func TestHostileOversizedTCPQuery(t *testing.T) {
	for _, k := range countingUpstreams {
		t.Run(k.name, func(t *testing.T) {
			c := newCerts(t)
			up, counts := k.start(t, c)
			f := startFront(t, c, frontOpts{Upstreams: []string{up.addr}})
			before := counts(t)

			id := uint16(rand.N(1 << 16))
			wire, q := oversizedQuery(t, id)
			raw, err := rawExchange("tcp", f.addr, wire, hostileTimeout)
			if err == nil {
				var r *dns.Msg
				if r, err = parseRaw(raw, id); err == nil {
					t.Logf("Oversized query answered %s", dns.RcodeToString[r.Rcode])
					err = oversizedAnswerOK(r, q)
				}
			}
			if err != nil {
				t.Errorf("Oversized query over TCP: %v; want FORMERR or an answer to its question", err)
			}

			r, err := exchange("tcp", f.addr, nil, newQuery(aName, dns.TypeA))
			if err == nil {
				err = checkAnswer(r, dns.TypeA, aAddr)
			}
			if err != nil {
				t.Errorf("Normal query after the oversized one: %v", err)
			}

			after := counts(t)
			smuggled := delta(before, after, dns.TypeToString[smuggledType])
			// Health probes (NS) may come and go; every other request is ours.
			others := delta(before, after, "total") - delta(before, after, "NS")
			t.Logf("%s counted: %d requests other than NS (oversized query and the normal one), %d %s, %d FORMERR answers",
				k.name, others, smuggled, dns.TypeToString[smuggledType], delta(before, after, "FORMERR"))
			if smuggled != 0 {
				t.Errorf("%s received %d queries for %s %s, smuggled in the oversized query's tail: its TCP length wrapped",
					k.name, smuggled, smuggledName, dns.TypeToString[smuggledType])
			}
			if others > 2 {
				t.Errorf("%s received %d requests, want at most 2: the oversized query (if forwarded at all) and the normal one", k.name, others)
			}
			if d := delta(before, after, "FORMERR"); d != 0 {
				t.Errorf("%s answered %d requests with FORMERR: a malformed message reached it", k.name, d)
			}
		})
	}
}

// oversizedAnswerOK accepts FORMERR, or an answer to the oversized query's own
// question (the name is under e2e.test and does not exist).
func oversizedAnswerOK(r *dns.Msg, q dns.Question) error {
	switch {
	case !r.Response:
		return fmt.Errorf("QR not set")
	case r.Rcode == dns.RcodeFormatError:
		return nil
	case r.Rcode != dns.RcodeNameError && r.Rcode != dns.RcodeSuccess:
		return fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
	case len(r.Question) != 1 || r.Question[0] != q:
		return fmt.Errorf("%s answer to another question: %v", dns.RcodeToString[r.Rcode], r.Question)
	}
	return nil
}

// chaosQuery returns a query for version.bind TXT in class CHAOS.
func chaosQuery() *dns.Msg {
	m := newQuery("version.bind.", dns.TypeTXT)
	m.Question[0].Qclass = dns.ClassCHAOS
	return m
}

// TestHostileChaosVersionBind proves that a CHAOS-class query (version.bind TXT)
// is forwarded like any other, as CoreDNS's forward does: dig, kdig and a Go
// client over UDP and TCP get the upstream's own answer, which the test first
// asks the upstream for directly on its plain-DNS port. unbound (without
// hide-version) and named both answer it.
func TestHostileChaosVersionBind(t *testing.T) {
	for _, k := range []struct {
		name  string
		start func(t testing.TB, c *certs) (dot, plain string)
	}{
		{"unbound", func(t testing.TB, c *certs) (string, string) {
			u := startUnbound(t, c, unboundOpts{})
			return u.addr, u.plain
		}},
		{"named", func(t testing.TB, c *certs) (string, string) {
			b := startBind(t, c)
			return b.addr, b.plain
		}},
	} {
		t.Run(k.name, func(t *testing.T) {
			c := newCerts(t)
			dotAddr, plain := k.start(t, c)
			direct, err := exchange("udp", plain, nil, chaosQuery())
			if err != nil || direct.Rcode != dns.RcodeSuccess || len(txtData(direct)) != 1 {
				t.Fatalf("%s asked directly for version.bind CH TXT: %v %v", k.name, err, direct)
			}
			version := txtData(direct)[0]
			t.Logf("%s's version.bind: %q", k.name, version)
			f := startFront(t, c, frontOpts{Upstreams: []string{dotAddr}})
			host, port, _ := strings.Cut(f.addr, ":")

			for _, network := range []string{"udp", "tcp"} {
				r, err := exchange(network, f.addr, nil, chaosQuery())
				switch {
				case err != nil:
					t.Errorf("Go client over %s: %v", network, err)
				case r.Rcode != dns.RcodeSuccess:
					t.Errorf("Go client over %s: rcode %s, want NOERROR with %s's version", network, dns.RcodeToString[r.Rcode], k.name)
				case !slices.Equal(txtData(r), []string{version}) || r.Answer[0].Header().Class != dns.ClassCHAOS:
					t.Errorf("Go client over %s: answer %v, want CH TXT %q", network, r.Answer, version)
				}
			}
			want := regexp.MustCompile(`(?mi)^version\.bind\.\s+\d+\s+CH\s+TXT\s+"` + regexp.QuoteMeta(version) + `"$`)
			for _, mode := range []string{"+notcp", "+tcp"} {
				out, err := run(t, clientTimeout, tool(t, "dig"), "@"+host, "-p", port, "+tries=1", "+time=5", mode, "version.bind", "TXT", "-c", "CH")
				if err != nil || !strings.Contains(out, "status: NOERROR") || !want.MatchString(out) {
					t.Errorf("dig %s version.bind TXT -c CH (%v), want NOERROR and %q:\n%s", mode, err, version, out)
				}
				out, err = run(t, clientTimeout, tool(t, "kdig"), "@"+host, "-p", port, "+timeout=5", "+retry=0", mode, "-c", "CH", "version.bind", "TXT")
				if err != nil || !strings.Contains(out, "status: NOERROR") || !want.MatchString(out) {
					t.Errorf("kdig %s -c CH version.bind TXT (%v), want NOERROR and %q:\n%s", mode, err, version, out)
				}
			}
		})
	}
}

// The TSIG key of the TSIG tests; named knows no key at all.
const (
	tsigKey    = "somekey."
	tsigSecret = "c29tZSBzZWNyZXQgdGhlIHVwc3RyZWFtIGRvZXMgbm90IGtub3c="
)

// signedQuery returns a query for name/A signed with tsigKey, with an OPT
// carrying a local option if opt; the TSIG comes after the OPT, as RFC 8945 has
// it.
func signedQuery(t testing.TB, name string, opt bool) ([]byte, uint16) {
	t.Helper()
	m := newQuery(name, dns.TypeA)
	if opt {
		m.SetEdns0(1232, false)
		e := m.IsEdns0()
		e.Option = append(e.Option, &dns.EDNS0_LOCAL{Code: localOption, Data: []byte("hostile")})
	}
	m.SetTsig(tsigKey, dns.HmacSHA256, 300, time.Now().Unix())
	wire, _, err := dns.TsigGenerate(m, tsigSecret, "", false)
	if err != nil {
		t.Fatalf("Sign query: %v", err)
	}
	return wire, m.Id
}

// TestHostileTSIGQuery sends TSIG-signed queries with a key the upstream (named)
// does not know, over UDP and TCP, with and without an EDNS option, with and
// without cache in front. The defined behaviour: the TSIG is removed before the
// query goes upstream (named counts no TSIG request: ReqTSIG stays), and none
// comes back; the client gets the upstream's normal answer, with its own ID,
// well-formed. dig and kdig with -y must report no ID mismatch and no malformed
// answer. Each client asks for a name of its own (h<i>.e2e.test, each with its
// own address), so that with cache in front its first query is a miss that goes
// upstream; the Go client asks twice, the second time from the cache.
func TestHostileTSIGQuery(t *testing.T) {
	c := newCerts(t)
	b := startBind(t, c)
	next := 0
	host := func() int { next++; return next }
	for _, cache := range []bool{false, true} {
		t.Run(map[bool]string{false: "NoCache", true: "Cache"}[cache], func(t *testing.T) {
			f := startFront(t, c, frontOpts{Upstreams: []string{b.addr}, Cache: cache})
			before := b.statsOf(t).NSStats["ReqTSIG"]
			for _, opt := range []bool{false, true} {
				for _, network := range []string{"udp", "tcp"} {
					name := network + map[bool]string{false: "", true: "/EDNSOption"}[opt]
					t.Run(name, func(t *testing.T) {
						h := host()
						for i := range 2 { // the second from the cache, if there is one
							wire, id := signedQuery(t, hostName(h), opt)
							raw, err := rawExchange(network, f.addr, wire, hostileTimeout)
							var r *dns.Msg
							if err == nil {
								r, err = parseRaw(raw, id)
							}
							if err == nil {
								err = unsignedAnswer(r, hostAddr(h), opt)
							}
							if err != nil {
								t.Errorf("Signed query %d: %v", i, err)
							}
						}
					})
				}
			}
			ip, port, _ := strings.Cut(f.addr, ":")
			key := "hmac-sha256:" + strings.TrimSuffix(tsigKey, ".") + ":" + tsigSecret
			for _, mode := range []string{"+notcp", "+tcp"} {
				for _, opt := range []string{"+noednsopt", "+ednsopt=65001:686f7374696c65"} {
					h := host()
					out, err := run(t, clientTimeout, tool(t, "dig"), "@"+ip, "-p", port, "+tries=1", "+time=5", mode, opt, "-y", key, hostName(h), "A")
					checkSignedDig(t, "dig "+mode+" "+opt+" -y", out, err, h)
				}
				h := host()
				out, err := run(t, clientTimeout, tool(t, "kdig"), "@"+ip, "-p", port, "+timeout=5", "+retry=0", mode, "-y", key, hostName(h), "A")
				checkSignedDig(t, "kdig "+mode+" -y", out, err, h)
			}
			if d := b.statsOf(t).NSStats["ReqTSIG"] - before; d != 0 {
				t.Errorf("named received %d TSIG-signed requests: the client's TSIG was forwarded", d)
			}
		})
	}
}

// unsignedAnswer checks the answer to a signed query: NOERROR with the A record
// addr, no TSIG, and an OPT if and only if the client sent one.
func unsignedAnswer(r *dns.Msg, addr string, opt bool) error {
	if t := r.IsTsig(); t != nil {
		return fmt.Errorf("answer carries a TSIG (error %s): %v", dns.RcodeToString[int(t.Error)], t)
	}
	if err := checkAnswer(r, dns.TypeA, addr); err != nil {
		return err
	}
	if (r.IsEdns0() != nil) != opt {
		return fmt.Errorf("answer's OPT %v, the client sent one: %v", r.IsEdns0(), opt)
	}
	return nil
}

// checkSignedDig checks dig's or kdig's output for a signed query for the h-th
// load-test name: it got a NOERROR answer with the name's A record, parsed it,
// and saw its own ID. An unsigned answer to a signed query is expected: its
// warning is not an error.
func checkSignedDig(t *testing.T, what, out string, err error, h int) {
	t.Helper()
	for _, bad := range []string{"ID mismatch", "malformed", "Got bad packet", "parse", "timed out", "no servers could be reached"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s reports %q (exit: %v):\n%s", what, bad, err, out)
			return
		}
	}
	a := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(hostName(h)) + `\s+\d+\s+IN\s+A\s+` + regexp.QuoteMeta(hostAddr(h)) + `$`)
	if !strings.Contains(out, "status: NOERROR") || !a.MatchString(out) {
		t.Errorf("%s: no NOERROR answer with %s A %s (exit: %v):\n%s", what, hostName(h), hostAddr(h), err, out)
	}
}

// TestHostileNonQueryOpcodes proves that a message other than a QUERY reaches
// the upstream exactly once: a NOTIFY to named, which answers it; an UPDATE to
// named, whose zone allows none (CoreDNS itself answers NOTIMP to an UPDATE when
// no plugin of the server block takes updates: then it must not arrive at all,
// else exactly once); and a NOTIFY to CoreDNS's DoT server, which never answers
// a NOTIFY from a host that is not a primary of the zone, so that the front
// waits out its read timeout and must not send the NOTIFY again.
func TestHostileNonQueryOpcodes(t *testing.T) {
	c := newCerts(t)
	notify := func() *dns.Msg {
		m := new(dns.Msg)
		m.SetNotify(zone)
		return m
	}
	t.Run("named", func(t *testing.T) {
		b := startBind(t, c)
		f := startFront(t, c, frontOpts{Upstreams: []string{b.addr}})

		before := b.statsOf(t).Opcodes
		m := notify()
		r, err := exchange("udp", f.addr, nil, m)
		if err != nil || r.Id != m.Id || r.Opcode != dns.OpcodeNotify || r.Rcode != dns.RcodeSuccess {
			t.Errorf("NOTIFY through the front: %v, want named's NOERROR answer:\n%v", err, r)
		}
		if d := b.statsOf(t).Opcodes["NOTIFY"] - before["NOTIFY"]; d != 1 {
			t.Errorf("named received the NOTIFY %d times, want once", d)
		}

		before = b.statsOf(t).Opcodes
		u := new(dns.Msg)
		u.SetUpdate(zone)
		rr, _ := dns.NewRR("new.e2e.test. 300 IN A 192.0.2.99")
		u.Insert([]dns.RR{rr})
		r, err = exchange("tcp", f.addr, nil, u)
		if err != nil {
			t.Fatalf("UPDATE through the front: %v", err)
		}
		want := map[int]int64{dns.RcodeNotImplemented: 0, dns.RcodeRefused: 1}[r.Rcode]
		if d := b.statsOf(t).Opcodes["UPDATE"] - before["UPDATE"]; d != want || (r.Rcode != dns.RcodeNotImplemented && r.Rcode != dns.RcodeRefused) {
			t.Errorf("UPDATE answered %s; named received it %d times, want %d (NOTIMP: CoreDNS refused the opcode; REFUSED: named's answer, once)",
				dns.RcodeToString[r.Rcode], d, want)
		}
		t.Logf("UPDATE answered %s", dns.RcodeToString[r.Rcode])
		r, err = exchange("udp", f.addr, nil, newQuery("new.e2e.test.", dns.TypeA))
		if err != nil || r.Rcode != dns.RcodeNameError {
			t.Errorf("After the UPDATE, new.e2e.test: %v %v, want NXDOMAIN", err, r)
		}
	})
	t.Run("coredns", func(t *testing.T) {
		up := startCoreDNSUpstream(t, c)
		counts := corednsCounter(up)
		f := startFront(t, c, frontOpts{Upstreams: []string{up.addr}, Options: []string{"read_timeout 500ms"}})
		before := counts(t)
		m := notify()
		raw, err := rawExchange("udp", f.addr, mustPack(t, m), hostileTimeout)
		if err != nil {
			t.Fatalf("NOTIFY through the front: %v", err)
		}
		r, err := parseRaw(raw, m.Id)
		if err != nil {
			t.Fatalf("NOTIFY through the front: %v", err)
		}
		if d := delta(before, counts(t), "SOA"); d != 1 {
			t.Errorf("CoreDNS received the NOTIFY (SOA) %d times, want once (the front answered %s)", d, dns.RcodeToString[r.Rcode])
		}
	})
}

func mustPack(t testing.TB, m *dns.Msg) []byte {
	t.Helper()
	wire, err := m.Pack()
	if err != nil {
		t.Fatalf("Pack: %v", err)
	}
	return wire
}
