package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"text/template"
	"time"

	"github.com/miekg/dns"
)

// startTimeout bounds the wait for any server to answer its first query.
const startTimeout = 30 * time.Second

// render fills the template testdata/name with data and writes it to dir/out.
func render(t testing.TB, name, dir, out string, data any) string {
	t.Helper()
	tmpl, err := template.ParseFiles(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("Parse template %s: %v", name, err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, data); err != nil {
		t.Fatalf("Render template %s: %v", name, err)
	}
	return writeFile(t, dir, out, b.String())
}

// dotServer is a DoT upstream started by a test.
type dotServer struct {
	name  string
	addr  string // DoT "127.0.0.1:port"
	certs *certs
	p     *proc
	start func(t testing.TB) *proc // (re)starts the process with the same config
}

// restart starts the server again on the same address after it was killed.
func (s *dotServer) restart(t testing.TB) {
	t.Helper()
	s.p = s.start(t)
	s.waitReady(t)
}

// kill stops the server by its PID.
func (s *dotServer) kill() { s.p.kill() }

// waitReady polls the server with a real DoT query for a.e2e.test.
func (s *dotServer) waitReady(t testing.TB) {
	t.Helper()
	waitFor(t, s.name+" on "+s.addr, startTimeout, s.p, func() error {
		r, err := dotExchange(s.certs, s.addr, newQuery(aName, dns.TypeA))
		if err != nil {
			return err
		}
		return checkAnswer(r, dns.TypeA, aAddr)
	})
}

// unbound is an unbound serving DoT and plain DNS, with a control port for its
// statistics.
type unbound struct {
	*dotServer
	plain string // plain DNS "127.0.0.1:port"
	conf  string
}

type unboundOpts struct {
	// IdleTimeoutMS is tcp-idle-timeout: how long unbound keeps an idle DoT
	// connection open. Default 30000.
	IdleTimeoutMS int
	// KeepaliveMS, if set, turns on edns-tcp-keepalive with this timeout: unbound
	// then tells clients that send the option (RFC 7828) how long it keeps idle
	// connections, and closes them after that.
	KeepaliveMS int
}

func startUnbound(t testing.TB, c *certs, o unboundOpts) *unbound {
	t.Helper()
	bin := tool(t, "unbound")
	tool(t, "unbound-control")
	if o.IdleTimeoutMS == 0 {
		o.IdleTimeoutMS = 30000
	}
	dir := t.TempDir()
	tlsPort, plainPort := freePort(t), freePort(t)
	conf := render(t, "unbound.conf.tmpl", dir, "unbound.conf", map[string]any{
		"Dir": dir, "TLSPort": tlsPort, "PlainPort": plainPort, "ControlPort": freePort(t),
		"Cert": c.Cert, "Key": c.Key, "IdleTimeoutMS": o.IdleTimeoutMS, "KeepaliveMS": o.KeepaliveMS,
		"Records": zoneRecords(),
	})
	u := &unbound{plain: addr(plainPort), conf: conf}
	u.dotServer = &dotServer{name: "unbound", addr: addr(tlsPort), certs: c}
	u.start = func(t testing.TB) *proc {
		return startProc(t, "unbound", nil, bin, "-d", "-c", conf)
	}
	u.p = u.start(t)
	u.waitReady(t)
	return u
}

// stats returns unbound's cumulative statistics (unbound-control stats_noreset).
func (u *unbound) stats(t testing.TB) map[string]int64 {
	t.Helper()
	out, err := run(t, 10*time.Second, tool(t, "unbound-control"), "-c", u.conf, "stats_noreset")
	if err != nil {
		t.Fatalf("unbound-control stats_noreset: %v\n%s", err, out)
	}
	st := map[string]int64{}
	for line := range strings.Lines(out) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if !ok {
			continue
		}
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			st[k] = int64(n)
		}
	}
	if _, ok := st["total.num.queries"]; !ok {
		t.Fatalf("unbound-control stats_noreset has no total.num.queries:\n%s", out)
	}
	return st
}

// dnsdistOpts configures dnsdist beyond its defaults.
type dnsdistOpts struct {
	// MaxInFlight is addTLSLocal's maxInFlight: how many queries of one client
	// connection dnsdist processes at once. 0 keeps dnsdist's default, which
	// handles a connection's queries one at a time.
	MaxInFlight int
	// Extra are more lines of its Lua configuration.
	Extra []string
}

// startDnsdist starts dnsdist with a DoT frontend in front of the plain-DNS
// address backend.
func startDnsdist(t testing.TB, c *certs, backend string, o dnsdistOpts) *dotServer {
	t.Helper()
	bin := tool(t, "dnsdist")
	dir := t.TempDir()
	port := freePort(t)
	conf := render(t, "dnsdist.conf.tmpl", dir, "dnsdist.conf", map[string]any{
		"TLSPort": port, "Cert": c.Cert, "Key": c.Key, "Backend": backend,
		"MaxInFlight": o.MaxInFlight, "Extra": o.Extra,
	})
	s := &dotServer{name: "dnsdist", addr: addr(port), certs: c}
	s.start = func(t testing.TB) *proc {
		return startProc(t, "dnsdist", nil, bin, "--supervised", "--disable-syslog", "-C", conf)
	}
	s.p = s.start(t)
	s.waitReady(t)
	return s
}

// startKresd starts Knot Resolver with DoT, sending every query on to the
// plain-DNS address stub.
func startKresd(t testing.TB, c *certs, stub string) *dotServer {
	t.Helper()
	bin := tool(t, "kresd")
	dir := t.TempDir()
	port := freePort(t)
	conf := render(t, "kresd.conf.tmpl", dir, "kresd.conf", map[string]any{
		"TLSPort": port, "Cert": c.Cert, "Key": c.Key, "Dir": dir,
		"Stub": strings.Replace(stub, ":", "@", 1),
	})
	s := &dotServer{name: "kresd", addr: addr(port), certs: c}
	s.start = func(t testing.TB) *proc {
		return startProc(t, "kresd", nil, bin, "-n", "-c", conf, dir)
	}
	s.p = s.start(t)
	s.waitReady(t)
	return s
}

// bind is a BIND 9 named serving the test zones authoritatively over DoT and
// plain DNS, with a statistics channel.
type bind struct {
	*dotServer
	plain string // plain DNS "127.0.0.1:port"
	stats string // statistics channel "127.0.0.1:port"
}

// startBind starts named in the foreground (-g) with its own configuration and
// directory. It runs as the test's user: without -u it does not switch users, so
// it can read the test's files even when the tests run as root.
func startBind(t testing.TB, c *certs) *bind {
	t.Helper()
	bin := tool(t, "named")
	dir := t.TempDir()
	tlsPort, plainPort, statsPort := freePort(t), freePort(t), freePort(t)
	conf := render(t, "named.conf.tmpl", dir, "named.conf", map[string]any{
		"Dir": dir, "TLSPort": tlsPort, "PlainPort": plainPort, "StatsPort": statsPort,
		"Cert": c.Cert, "Key": c.Key, "ZoneFile": writeFile(t, dir, "db.e2e.test", zoneFile()),
	})
	b := &bind{plain: addr(plainPort), stats: addr(statsPort)}
	b.dotServer = &dotServer{name: "named", addr: addr(tlsPort), certs: c}
	b.start = func(t testing.TB) *proc {
		return startProc(t, "named", nil, bin, "-g", "-4", "-c", conf)
	}
	b.p = b.start(t)
	b.waitReady(t)
	waitFor(t, "named's statistics channel on "+b.stats, startTimeout, b.p, func() error {
		_, err := b.fetchStats()
		return err
	})
	return b
}

// bindStats is the part of named's JSON statistics (/json/v1/server) the tests
// read: requests by opcode, answers by rcode, and the name server's counters
// (Requestv4, ReqTCP, ReqTSIG, ReqBadSIG, ...), all cumulative.
type bindStats struct {
	Opcodes map[string]int64 `json:"opcodes"`
	Rcodes  map[string]int64 `json:"rcodes"`
	NSStats map[string]int64 `json:"nsstats"`
	QTypes  map[string]int64 `json:"qtypes"`
}

func (b *bind) fetchStats() (*bindStats, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + b.stats + "/json/v1/server")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /json/v1/server: %s", resp.Status)
	}
	st := &bindStats{}
	if err := json.NewDecoder(resp.Body).Decode(st); err != nil {
		return nil, fmt.Errorf("decode /json/v1/server: %w", err)
	}
	return st, nil
}

// statsOf returns named's cumulative statistics; a counter named has not yet
// counted is absent, which reads as 0.
func (b *bind) statsOf(t testing.TB) *bindStats {
	t.Helper()
	st, err := b.fetchStats()
	if err != nil {
		t.Fatalf("named statistics from %s: %v", b.stats, err)
	}
	return st
}

// corednsUpstream is CoreDNS's own tls:// server holding e2e.test, signed on the
// fly by the dnssec plugin.
type corednsUpstream struct {
	*dotServer
	metrics string // prometheus "127.0.0.1:port"
}

func startCoreDNSUpstream(t testing.TB, c *certs) *corednsUpstream {
	t.Helper()
	dir := t.TempDir()
	port, mport := freePort(t), freePort(t)
	zoneFile := writeFile(t, dir, "db.e2e.test", zoneFile())
	conf := render(t, "upstream.Corefile.tmpl", dir, "Corefile", map[string]any{
		"TLSPort": port, "MetricsPort": mport, "Cert": c.Cert, "Key": c.Key,
		"KeyFile": writeDNSSECKey(t, dir), "ZoneFile": zoneFile,
	})
	u := &corednsUpstream{metrics: addr(mport)}
	u.dotServer = &dotServer{name: "coredns-upstream", addr: addr(port), certs: c}
	u.start = func(t testing.TB) *proc {
		return startProc(t, "coredns-upstream", nil, corednsBinary(t), "-conf", conf)
	}
	u.p = u.start(t)
	u.waitReady(t)
	return u
}

// writeDNSSECKey writes a fresh ECDSA P-256 key-signing key for e2e.test in BIND's
// K*.key / K*.private format and returns the file's base name, for the dnssec
// plugin.
func writeDNSSECKey(t testing.TB, dir string) string {
	t.Helper()
	k := &dns.DNSKEY{
		Hdr:       dns.RR_Header{Name: zone, Rrtype: dns.TypeDNSKEY, Class: dns.ClassINET, Ttl: 300},
		Flags:     257,
		Protocol:  3,
		Algorithm: dns.ECDSAP256SHA256,
	}
	priv, err := k.Generate(256)
	if err != nil {
		t.Fatalf("Generate DNSSEC key: %v", err)
	}
	base := filepath.Join(dir, fmt.Sprintf("K%s+%03d+%05d", zone, k.Algorithm, k.KeyTag()))
	writeFile(t, dir, filepath.Base(base)+".key", k.String()+"\n")
	writeFile(t, dir, filepath.Base(base)+".private", k.PrivateKeyString(priv))
	return base
}

// front is the CoreDNS under test, with dotforward forwarding to DoT upstreams.
type front struct {
	addr    string // UDP and TCP "127.0.0.1:port"
	metrics string // prometheus "127.0.0.1:port", if enabled
	p       *proc
}

type frontOpts struct {
	Upstreams  []string // DoT addresses, "127.0.0.1:port", written tls://IP%dot.test:PORT
	Targets    []string // TO arguments written as given, after Upstreams
	Cache      bool     // put cache in front
	Prometheus bool     // put prometheus in front
	NoCA       bool     // no `tls CA` line: the system roots
	Options    []string // extra lines inside the dotforward block
	// Failing: the upstreams are expected to be unusable, so the front is ready
	// when it answers at all (SERVFAIL included).
	Failing bool
}

func startFront(t testing.TB, c *certs, o frontOpts) *front {
	t.Helper()
	dir := t.TempDir()
	port, mport := freePort(t), freePort(t)
	var ups []string
	for _, u := range o.Upstreams {
		host, p, _ := strings.Cut(u, ":")
		ups = append(ups, "tls://"+host+"%"+serverName+":"+p)
	}
	ups = append(ups, o.Targets...)
	ca := c.CA
	if o.NoCA {
		ca = ""
	}
	conf := render(t, "front.Corefile.tmpl", dir, "Corefile", map[string]any{
		"Port": port, "MetricsPort": mport, "Prometheus": o.Prometheus, "Cache": o.Cache,
		"Upstreams": ups, "CA": ca, "Options": o.Options,
	})
	t.Cleanup(func() {
		if data, err := os.ReadFile(conf); err == nil && t.Failed() {
			t.Logf("--- front Corefile:\n%s", data)
		}
	})
	f := &front{addr: addr(port), p: startProc(t, "coredns-front", nil, corednsBinary(t), "-conf", conf)}
	if o.Prometheus {
		f.metrics = addr(mport)
	}
	waitFor(t, "coredns front on "+f.addr, startTimeout, f.p, func() error {
		r, err := exchange("udp", f.addr, nil, newQuery(aName, dns.TypeA))
		if err != nil || o.Failing {
			return err
		}
		return checkAnswer(r, dns.TypeA, aAddr)
	})
	return f
}
