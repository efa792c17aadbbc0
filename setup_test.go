package dotforward

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

var (
	pinA   = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	pinB   = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	pin31  = base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 31))
	cf     = "tls://1.1.1.1%cloudflare-dns.com"
	quad9  = "tls://9.9.9.9%dns.quad9.net"
	noName = "tls://192.0.2.53"
)

// setupCase is a Corefile and either the error substrings it must produce or a
// check of what it parses to.
type setupCase struct {
	name  string
	input string
	root  string   // the root plugin's directory, for relative tls paths
	err   []string // substrings the error must contain; nil: the input is valid
	not   []string // substrings the error must not contain
	check func(t *testing.T, fs []*DoTForward)
}

func setupCases(t testing.TB) []setupCase {
	dir := t.TempDir()
	cert, err := dottest.NewCert()
	if err != nil {
		t.Fatalf("Generating a test certificate: %v", err)
	}
	ca, crt, key := writeFile(t, dir, "ca.pem", cert.CAPEM), writeFile(t, dir, "cert.pem", cert.CertPEM), writeFile(t, dir, "key.pem", cert.KeyPEM)
	many := ""
	for i := range 16 {
		many += fmt.Sprintf(" tls://192.0.2.%d%%dns.example", i+1)
	}
	fifteen := many[:strings.LastIndex(many, " ")]

	return []setupCase{
		// Valid Corefiles and their parsed values.
		{name: "defaults", input: "dotforward . " + cf, check: func(t *testing.T, fs []*DoTForward) {
			f := only(t, fs)
			expect(t, "from", f.from, ".")
			expect(t, "policy", f.policy.String(), "random")
			expect(t, "timeout", f.timeout, defaultTimeout)
			expect(t, "max attempts", f.maxAttempts, 2)
			expect(t, "max concurrent", f.maxConcurrent, int64(0))
			expect(t, "failfast", f.failfast, false)
			expect(t, "health check", f.hc, healthCheck{interval: 500 * time.Millisecond, domain: "."})
			u := f.upstreams[0]
			expect(t, "addr", u.addr, "1.1.1.1:853")
			expect(t, "server name", u.cfg.TLS.ServerName, "cloudflare-dns.com")
			expect(t, "max fails", u.health.maxFails, int32(2))
			expect(t, "pins", len(u.cfg.Pins), 0)
			if u.cfg.TLS.RootCAs != nil || u.cfg.TLS.MinVersion != 0x0303 {
				t.Errorf("Expected system roots and TLS 1.2 minimum, got roots %v, min version %#x", u.cfg.TLS.RootCAs, u.cfg.TLS.MinVersion)
			}
			// Zero pool fields take the pool's documented defaults.
			c := u.cfg
			expect(t, "pool fields", [...]any{c.MaxConns, c.MaxInflight, c.DialTimeout, c.ReadTimeout, c.StallTimeout, c.IdleTimeout, c.MaxAge, c.PadBlock, c.NoKeepalive, c.NoCoalesce, c.Dial == nil},
				[...]any{0, 0, time.Duration(0), time.Duration(0), time.Duration(0), time.Duration(0), time.Duration(0), 0, false, false, true})
			if c.Observer == nil {
				t.Errorf("Expected a metrics observer on the pool configuration")
			}
		}},
		{name: "addresses", input: "dotforward example.org tls://1.1.1.1%a.example:8853 tls://[::1%b.example]:5353 tls://[2001:db8::2]%c.example:54 tls://2001:DB8::3%d.example tls://[2001:db8::4]%e.example tls://[2001:db8::5]:99 {\ntls_pin " + pinA + "\n}", check: func(t *testing.T, fs []*DoTForward) {
			f := only(t, fs)
			expect(t, "from", f.from, "example.org.")
			expect(t, "addrs", addrs(f), []string{"1.1.1.1:8853", "[::1]:5353", "[2001:db8::2]:54", "[2001:db8::3]:853", "[2001:db8::4]:853", "[2001:db8::5]:99"})
			expect(t, "names", names(f), []string{"a.example", "b.example", "c.example", "d.example", "e.example", ""})
			expect(t, "max attempts", f.maxAttempts, 12)
		}},
		{name: "every option", input: `dotforward . ` + cf + ` ` + quad9 + ` {
			except internal.example  corp.example
			except lab.example
			policy sequential
			health_check 2s no_rec domain Health.Example
			max_fails 5
			expire 20s
			max_age 1m
			max_concurrent 1000
			failover servfail REFUSED
			failfast_all_unhealthy_upstreams
			read_timeout 1500ms
			max_connect_attempts 3
			max_conns 8
			max_inflight 256
			dial_timeout 4s
			stall_timeout 3s
			timeout 7s
			tls_pin ` + pinA + ` ` + pinB + `
			no_padding
			no_keepalive
			no_coalesce
			source_address 127.0.0.1
		}`, check: func(t *testing.T, fs []*DoTForward) {
			f := only(t, fs)
			expect(t, "ignored", f.ignored, []string{"internal.example.", "corp.example.", "lab.example."})
			expect(t, "policy", f.policy.String(), "sequential")
			expect(t, "health check", f.hc, healthCheck{interval: 2 * time.Second, noRec: true, domain: "health.example."})
			expect(t, "max concurrent", f.maxConcurrent, int64(1000))
			expect(t, "failover", f.failover, map[int]bool{dns.RcodeServerFailure: true, dns.RcodeRefused: true})
			expect(t, "failfast", f.failfast, true)
			expect(t, "max attempts", f.maxAttempts, 3)
			expect(t, "timeout", f.timeout, 7*time.Second)
			for _, u := range f.upstreams {
				c := u.cfg
				expect(t, "max fails", u.health.maxFails, int32(5))
				expect(t, "health check", u.hc.interval, 2*time.Second)
				expect(t, "pool fields", [...]any{c.MaxConns, c.MaxInflight, c.DialTimeout, c.ReadTimeout, c.StallTimeout, c.IdleTimeout, c.MaxAge, c.PadBlock, c.NoKeepalive, c.NoCoalesce, c.Dial != nil, len(c.Pins)},
					[...]any{8, 256, 4 * time.Second, 1500 * time.Millisecond, 3 * time.Second, 20 * time.Second, time.Minute, -1, true, true, true, 2})
			}
			expect(t, "names", names(f), []string{"cloudflare-dns.com", "dns.quad9.net"})
		}},
		{name: "tls_servername", input: "dotforward . tls://192.0.2.1 tls://192.0.2.2:8853 {\n tls_servername dns.example\n}", check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "names", names(only(t, fs)), []string{"dns.example", "dns.example"})
		}},
		{name: "pins without a name", input: "dotforward . " + noName + " {\ntls_pin " + pinA + "\ntls_pin " + pinB + "\n}", check: func(t *testing.T, fs []*DoTForward) {
			u := only(t, fs).upstreams[0]
			expect(t, "pins", u.cfg.Pins, [][]byte{bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)})
			expect(t, "server name", u.cfg.TLS.ServerName, "")
		}},
		{name: "tls CA", input: "dotforward . " + cf + " {\ntls " + ca + "\n}", check: func(t *testing.T, fs []*DoTForward) {
			u := only(t, fs).upstreams[0]
			if u.cfg.TLS.RootCAs == nil || len(u.cfg.TLS.Certificates) != 0 {
				t.Errorf("Expected the CA file as roots and no client certificate")
			}
			expect(t, "server name", u.cfg.TLS.ServerName, "cloudflare-dns.com")
		}},
		{name: "tls client cert relative to root", root: dir, input: "dotforward . " + cf + " {\ntls cert.pem key.pem ca.pem\n}", check: func(t *testing.T, fs []*DoTForward) {
			c := only(t, fs).upstreams[0].cfg.TLS
			if c.RootCAs == nil || len(c.Certificates) != 1 {
				t.Errorf("Expected roots and one client certificate, got roots %v, %d certificates", c.RootCAs, len(c.Certificates))
			}
		}},
		{name: "tls client cert with system roots", input: "dotforward . " + cf + " {\ntls " + crt + " " + key + "\n}", check: func(t *testing.T, fs []*DoTForward) {
			c := only(t, fs).upstreams[0].cfg.TLS
			if c.RootCAs != nil || len(c.Certificates) != 1 {
				t.Errorf("Expected system roots and one client certificate")
			}
		}},
		{name: "tls without arguments", input: "dotforward . " + cf + " {\ntls\n}", check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "roots", only(t, fs).upstreams[0].cfg.TLS.RootCAs == nil, true)
		}},
		{name: "policy round_robin", input: "dotforward . " + cf + " {\npolicy round_robin\n}", check: policyIs("round_robin")},
		{name: "policy latency", input: "dotforward . " + cf + " {\npolicy latency\n}", check: policyIs("latency")},
		{name: "policy random", input: "dotforward . " + cf + " {\npolicy random\n}", check: policyIs("random")},
		{name: "health_check 0 and max_fails 0", input: "dotforward . " + cf + " {\nhealth_check 0\nmax_fails 0\n}", check: func(t *testing.T, fs []*DoTForward) {
			f := only(t, fs)
			expect(t, "interval", f.hc.interval, time.Duration(0))
			expect(t, "max fails", f.upstreams[0].health.maxFails, int32(0))
		}},
		{name: "forward-only options accepted", input: "dotforward . " + cf + " {\nforce_tcp\nprefer_udp\nmax_idle_conns 10\nmax_connect_attempts 0\n}", check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "max attempts", only(t, fs).maxAttempts, 0)
		}},
		{name: "two lines chain", input: "dotforward example.org " + cf + "\ndotforward . " + quad9, check: func(t *testing.T, fs []*DoTForward) {
			if len(fs) != 2 || fs[0].from != "example.org." || fs[1].from != "." {
				t.Fatalf("Expected two instances for example.org. and ., got %d", len(fs))
			}
		}},
		{name: "fifteen upstreams", input: "dotforward ." + fifteen, check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "upstreams", len(only(t, fs).upstreams), 15)
		}},
		{name: "hedge delay", input: "dotforward . " + cf + " " + quad9 + " {\nhedge 20ms\n}", check: func(t *testing.T, fs []*DoTForward) {
			f := only(t, fs)
			expect(t, "hedge delay", f.hedge.fixed, 20*time.Millisecond)
			expect(t, "hedge percent", f.hedge.budget.percent, int64(defaultHedgePercent))
			expect(t, "estimator", f.upstreams[0].answers.hedge == nil, true)
		}},
		{name: "hedge auto", input: "dotforward . " + cf + " " + quad9 + " {\nhedge auto\nread_timeout 1s\n}", check: func(t *testing.T, fs []*DoTForward) {
			f := only(t, fs)
			expect(t, "hedge delay", f.hedge.fixed, time.Duration(0))
			expect(t, "hedge percent", f.hedge.budget.percent, int64(5))
			for _, u := range f.upstreams {
				expect(t, "auto bounds", [2]time.Duration{u.answers.hedge.lo, u.answers.hedge.hi}, [2]time.Duration{hedgeMinDelay, 500 * time.Millisecond})
			}
		}},
		{name: "hedge auto with a budget", input: "dotforward . " + cf + " " + quad9 + " {\nhedge auto 10\n}", check: func(t *testing.T, fs []*DoTForward) {
			f := only(t, fs)
			expect(t, "hedge percent", f.hedge.budget.percent, int64(10))
			expect(t, "auto upper bound", f.upstreams[1].answers.hedge.hi, time.Second) // half the default read_timeout
		}},
		{name: "hedge auto bounded by timeout", input: "dotforward . " + cf + " " + quad9 + " {\nhedge auto\ntimeout 600ms\n}", check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "auto upper bound", only(t, fs).upstreams[0].answers.hedge.hi, 300*time.Millisecond)
		}},
		{name: "no hedge by default", input: "dotforward . " + cf + " " + quad9, check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "hedger", only(t, fs).hedge == nil, true)
		}},
		{name: "max_age equal to expire", input: "dotforward . " + cf + " {\nexpire 30s\nmax_age 30s\n}", check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "max age", only(t, fs).upstreams[0].cfg.MaxAge, 30*time.Second)
		}},

		// Invalid Corefiles: each error names the line and the bad value.
		{name: "no FROM", input: "dotforward", err: []string{"Testfile:1", "Wrong argument count"}},
		{name: "no TO", input: "dotforward .", err: []string{"Testfile:1", "Wrong argument count"}},
		{name: "dns upstream", input: "dotforward . dns://1.1.1.1", err: []string{"Testfile:1", `"dns://1.1.1.1"`, "only forwards over TLS"}},
		{name: "plain upstream", input: "dotforward . " + cf + " 8.8.8.8", err: []string{`"8.8.8.8"`, "only forwards over TLS"}},
		{name: "https upstream", input: "dotforward . https://dns.google/dns-query", err: []string{`"https://dns.google/dns-query"`, "only forwards over TLS"}},
		{name: "resolv.conf upstream", input: "dotforward . /etc/resolv.conf", err: []string{`"/etc/resolv.conf"`, "only forwards over TLS"}},
		{name: "host name upstream", input: "dotforward . tls://dns.google", err: []string{`"dns.google" is not an IP address`}},
		{name: "port before name", input: "dotforward . tls://1.1.1.1:853%a.example", err: []string{"Testfile:1", `"tls://1.1.1.1:853%a.example"`, "not an IP address"}},
		{name: "bad port", input: "dotforward . tls://1.1.1.1%a.example:99999", err: []string{`invalid port "99999"`}},
		{name: "empty port", input: "dotforward . tls://1.1.1.1:", err: []string{"empty port"}},
		{name: "empty server name", input: "dotforward . tls://1.1.1.1%", err: []string{"empty TLS server name"}},
		{name: "bad server name", input: "dotforward . tls://1.1.1.1%a..b", err: []string{`invalid TLS server name "a..b"`}},
		{name: "unclosed bracket", input: "dotforward . tls://[::1", err: []string{"missing ']'"}},
		{name: "junk after bracket", input: "dotforward . tls://[::1]x", err: []string{`unexpected "x"`}},
		{name: "two names", input: "dotforward . tls://[::1%a.example]%b.example", err: []string{"two TLS server names"}},
		{name: "empty after scheme", input: "dotforward . tls://", err: []string{"no address after tls://"}},
		{name: "missing server name", input: "dotforward . " + cf + " " + noName, err: []string{"Testfile:1", `"` + noName + `" has no TLS server name`}},
		{name: "missing server name, line of directive", input: "# upstreams\n\ndotforward . " + noName + " {\n    max_fails 3\n}", err: []string{"Testfile:3", "has no TLS server name"}},
		{name: "duplicate upstream", input: "dotforward . " + cf + " tls://1.1.1.1%other.example", err: []string{"1.1.1.1:853 is listed twice"}},
		{name: "sixteen upstreams", input: "dotforward ." + many, err: []string{"16 upstreams given, at most 15"}},
		{name: "tls_servername and %NAME", input: "dotforward . " + cf + " {\n\n tls_servername dns.example\n}", err: []string{"Testfile:3", `tls_servername "dns.example"`, cf}},
		{name: "bad tls_servername", input: "dotforward . " + noName + " {\ntls_servername a:b\n}", err: []string{"Testfile:2", `invalid server name "a:b"`}},
		{name: "pin not base64", input: "dotforward . " + cf + " {\ntls_pin not*base64\n}", err: []string{"Testfile:2", `"not*base64" is not base64`}},
		{name: "pin too short", input: "dotforward . " + cf + " {\ntls_pin " + pin31 + "\n}", err: []string{"Testfile:2", pin31, "decodes to 31 bytes"}},
		{name: "pin without value", input: "dotforward . " + cf + " {\ntls_pin\n}", err: []string{"Testfile:2", "Wrong argument count"}},
		{name: "unknown option", input: "dotforward . " + cf + " {\n max_fails 1\n bogus 1\n}", err: []string{"Testfile:3", `unknown property "bogus"`}},
		{name: "doh_method", input: "dotforward . " + cf + " {\ndoh_method GET\n}", err: []string{"Testfile:2", `"doh_method" is not supported`}},
		{name: "next", input: "dotforward . " + cf + " {\nnext NXDOMAIN\n}", err: []string{`"next" is not supported`}},
		{name: "resolver", input: "dotforward . " + cf + " {\nresolver 8.8.8.8\n}", err: []string{`"resolver" is not supported`}},
		{name: "option twice", input: "dotforward . " + cf + " {\nmax_fails 1\nmax_fails 2\n}", err: []string{"Testfile:3", `"max_fails" given twice (first on line 2)`}},
		{name: "unknown policy", input: "dotforward . " + cf + " {\npolicy fastest\n}", err: []string{"Testfile:2", `unknown policy "fastest"`}},
		{name: "policy without value", input: "dotforward . " + cf + " {\npolicy\n}", err: []string{"Wrong argument count"}},
		{name: "negative health_check", input: "dotforward . " + cf + " {\nhealth_check -1s\n}", err: []string{"Testfile:2", `"-1s" must be positive`}},
		{name: "bad health_check", input: "dotforward . " + cf + " {\nhealth_check often\n}", err: []string{`"often" is not a duration`}},
		{name: "health_check junk", input: "dotforward . " + cf + " {\nhealth_check 1s rec\n}", err: []string{`unknown argument "rec"`}},
		{name: "health_check domain missing", input: "dotforward . " + cf + " {\nhealth_check 1s domain\n}", err: []string{"Wrong argument count"}},
		{name: "health_check bad domain", input: "dotforward . " + cf + " {\nhealth_check 1s domain a..b\n}", err: []string{`invalid domain "a..b"`}},
		{name: "health_check without value", input: "dotforward . " + cf + " {\nhealth_check\n}", err: []string{"Wrong argument count"}},
		{name: "negative max_fails", input: "dotforward . " + cf + " {\nmax_fails -1\n}", err: []string{"Testfile:2", `max_fails: "-1" is not an integer from 0`}},
		{name: "max_fails word", input: "dotforward . " + cf + " {\nmax_fails two\n}", err: []string{`"two" is not an integer`}},
		{name: "max_fails two values", input: "dotforward . " + cf + " {\nmax_fails 1 2\n}", err: []string{"Wrong argument count"}},
		{name: "negative max_concurrent", input: "dotforward . " + cf + " {\nmax_concurrent -5\n}", err: []string{`max_concurrent: "-5"`}},
		{name: "max_conns 0", input: "dotforward . " + cf + " {\nmax_conns 0\n}", err: []string{`max_conns: "0" is neither auto nor an integer from 1 to 1024`}},
		{name: "max_conns auto", input: "dotforward . " + cf + " {\nmax_conns auto\n}", check: func(t *testing.T, fs []*DoTForward) {
			expect(t, "max conns", only(t, fs).upstreams[0].cfg.MaxConns, 0)
		}},
		{name: "max_conns auto twice", input: "dotforward . " + cf + " {\nmax_conns auto auto\n}", err: []string{"Wrong argument count"}},
		{name: "max_inflight too large", input: "dotforward . " + cf + " {\nmax_inflight 40000\n}", err: []string{`max_inflight: "40000" is not an integer from 1 to 32767`}},
		{name: "negative max_connect_attempts", input: "dotforward . " + cf + " {\nmax_connect_attempts -1\n}", err: []string{`max_connect_attempts: "-1"`}},
		{name: "expire 0", input: "dotforward . " + cf + " {\nexpire 0\n}", err: []string{"Testfile:2", `expire: "0" must be positive`}},
		{name: "read_timeout 0", input: "dotforward . " + cf + " {\nread_timeout 0s\n}", err: []string{`read_timeout: "0s" must be positive`}},
		{name: "bad dial_timeout", input: "dotforward . " + cf + " {\ndial_timeout soon\n}", err: []string{`dial_timeout: "soon" is not a duration`}},
		{name: "negative stall_timeout", input: "dotforward . " + cf + " {\nstall_timeout -1s\n}", err: []string{`stall_timeout: "-1s" must be positive`}},
		{name: "timeout 0", input: "dotforward . " + cf + " {\ntimeout 0\n}", err: []string{`timeout: "0" must be positive`}},
		{name: "negative max_age", input: "dotforward . " + cf + " {\nmax_age -1m\n}", err: []string{`max_age: "-1m" must be positive`}},
		{name: "max_age below expire", input: "dotforward . " + cf + " {\nexpire 10s\n\nmax_age 5s\n}", err: []string{"Testfile:4", "max_age 5s must not be less than expire 10s"}},
		{name: "max_age below default expire", input: "dotforward . " + cf + " {\nmax_age 1s\n}", err: []string{"Testfile:2", "must not be less than expire 8s"}},
		{name: "hedge 0", input: "dotforward . " + cf + " {\nhedge 0\n}", err: []string{"Testfile:2", `hedge: delay "0" must be positive`, "hedge 20ms", "remove the line to turn hedging off"}},
		{name: "negative hedge", input: "dotforward . " + cf + " {\nhedge -1s\n}", err: []string{"Testfile:2", `delay "-1s" must be positive`, "hedge DELAY [MAX_PERCENT]"}},
		{name: "hedge auto 0", input: "dotforward . " + cf + " {\nhedge auto 0\n}", err: []string{"Testfile:2", `MAX_PERCENT "0" is not an integer from 1 to 100`, "hedge auto [MAX_PERCENT]"}},
		{name: "hedge auto 101", input: "dotforward . " + cf + " {\n\nhedge auto 101\n}", err: []string{"Testfile:3", `MAX_PERCENT "101" is not an integer from 1 to 100`}},
		{name: "hedge word", input: "dotforward . " + cf + " {\nhedge abc\n}", err: []string{"Testfile:2", `"abc" is neither a duration (such as 20ms) nor auto`, "hedge auto"}},
		{name: "hedge without arguments", input: "dotforward . " + cf + " {\nhedge\n}", err: []string{"Testfile:2", "hedge takes a delay or auto", "got 0 arguments", "hedge DELAY [MAX_PERCENT]"}},
		{name: "hedge too many arguments", input: "dotforward . " + cf + " {\nhedge 20ms 5 5\n}", err: []string{"Testfile:2", "got 3 arguments"}},
		{name: "hedge twice", input: "dotforward . " + cf + " {\nhedge 20ms\nhedge auto\n}", err: []string{"Testfile:3", `"hedge" given twice (first on line 2)`}},
		{name: "hedge after read_timeout", input: "dotforward . " + cf + " {\nhedge 2s\n}", err: []string{"Testfile:2", "hedge 2s must be less than read_timeout 2s and timeout 5s", "hedge auto"}},
		{name: "hedge after timeout", input: "dotforward . " + cf + " {\nread_timeout 10s\nhedge 6s\ntimeout 6s\n}", err: []string{"Testfile:3", "hedge 6s must be less than read_timeout 10s and timeout 6s"}},
		{name: "failover NOERROR", input: "dotforward . " + cf + " {\nfailover SERVFAIL NOERROR\n}", err: []string{"Testfile:2", `"NOERROR" cannot be used`}},
		{name: "failover unknown rcode", input: "dotforward . " + cf + " {\nfailover BROKEN\n}", err: []string{`"BROKEN" is not an rcode`}},
		{name: "failover without rcode", input: "dotforward . " + cf + " {\nfailover\n}", err: []string{"Wrong argument count"}},
		{name: "flag with argument", input: "dotforward . " + cf + " {\nforce_tcp yes\n}", err: []string{"Testfile:2", `force_tcp takes no arguments, got "yes"`}},
		{name: "no_padding with argument", input: "dotforward . " + cf + " {\nno_padding 1\n}", err: []string{`no_padding takes no arguments, got "1"`}},
		{name: "no_coalesce with argument", input: "dotforward . " + cf + " {\nno_coalesce off\n}", err: []string{`no_coalesce takes no arguments, got "off"`}},
		{name: "negative max_idle_conns", input: "dotforward . " + cf + " {\nmax_idle_conns -1\n}", err: []string{`max_idle_conns: "-1"`}},
		{name: "bad source_address", input: "dotforward . " + cf + " {\nsource_address here\n}", err: []string{`source_address: "here" is not an IP address`}},
		{name: "too many tls arguments", input: "dotforward . " + cf + " {\ntls a b c d\n}", err: []string{"Testfile:2", "Wrong argument count"}},
		{name: "missing CA file", input: "dotforward . " + cf + " {\ntls /nonexistent/ca.pem\n}", err: []string{"Testfile:2", "tls /nonexistent/ca.pem"}},
		{name: "except without zone", input: "dotforward . " + cf + " {\nexcept\n}", err: []string{"Wrong argument count"}},
		{name: "error on a later line", input: "dotforward . " + cf + " {\n  policy random\n  max_fails 2\n  expire 1x\n}", err: []string{"Testfile:4", `expire: "1x" is not a duration`}},
		{name: "error in the second line", input: "dotforward example.org " + cf + "\ndotforward . dns://9.9.9.9", err: []string{"Testfile:2", "only forwards over TLS"}},

		// Errors that show the fix.
		{name: "port with a sign", input: "dotforward . tls://1.1.1.1%a.example:+853", err: []string{"Testfile:1", `"tls://1.1.1.1%a.example:+853"`, `invalid port "+853"`, "plain decimal from 1 to 65535"}},
		{name: "port with a leading zero", input: "dotforward . tls://1.1.1.1:0853", err: []string{"Testfile:1", `"tls://1.1.1.1:0853"`, `invalid port "0853"`, "plain decimal"}},
		{name: "port 0", input: "dotforward . tls://1.1.1.1:0", err: []string{`invalid port "0"`}},
		{name: "IPv6 port with a leading zero", input: "dotforward . tls://[::1]:0853", err: []string{`invalid port "0853"`}},
		{name: "IPv6 with a port, no brackets", input: "dotforward . tls://::1:853", err: []string{"Testfile:1", `"tls://::1:853"`, "ambiguous", "tls://[::1]:853"}},
		{name: "IPv6 with a port and name, no brackets", input: "dotforward . tls://2001:db8::1:853%dns.example", err: []string{`"tls://2001:db8::1:853%dns.example"`, "ambiguous", "tls://[2001:db8::1]%dns.example:853"}},
		{name: "host name", input: "dotforward . tls://dns.google", err: []string{"Testfile:1", `"tls://dns.google"`, "does not resolve host names", "tls://IP%dns.google"}},
		{name: "host name with port", input: "dotforward . tls://dns.google:8853", err: []string{`"tls://dns.google:8853"`, "tls://IP%dns.google:8853"}},
		{name: "host name with server name", input: "dotforward . tls://resolver.example%dns.example", err: []string{`"resolver.example" is not an IP address`, "tls://IP%dns.example"}},
		{name: "dns upstream shows the tls form", input: "dotforward . dns://9.9.9.9", err: []string{"Testfile:1", `"dns://9.9.9.9"`, "tls://9.9.9.9%NAME", "the name its certificate is for", "tls_pin"}},
		{name: "plain upstream shows the tls form", input: "# upstreams\ndotforward . 9.9.9.9:53", err: []string{"Testfile:2", `"9.9.9.9:53"`, "tls://9.9.9.9%NAME", "tls_pin"}},
		{name: "plain IPv6 upstream shows the tls form", input: "dotforward . dns://[2620:fe::fe]:53", err: []string{"tls://[2620:fe::fe]%NAME"}},
		{name: "https upstream shows the tls form", input: "dotforward . https://dns.google/dns-query", err: []string{"tls://IP%NAME"}},
		{name: "option close to a known one", input: "dotforward . " + cf + " {\n tls_server_name dns.example\n}", err: []string{"Testfile:2", `unknown property "tls_server_name"`, `did you mean "tls_servername"?`}},
		{name: "option one letter short", input: "dotforward . " + cf + " {\nmax_fail 3\n}", err: []string{`unknown property "max_fail"`, `did you mean "max_fails"?`}},
		{name: "option prefix", input: "dotforward . " + cf + " {\nhealth 1s\n}", err: []string{`unknown property "health"`, `did you mean "health_check"?`}},
		{name: "option in capitals", input: "dotforward . " + cf + " {\nPOLICY random\n}", err: []string{`did you mean "policy"?`}},
		{name: "option far from any", input: "dotforward . " + cf + " {\nbogus 1\n}", err: []string{`unknown property "bogus"`}, not: []string{"did you mean"}},
	}
}

func TestSetup(t *testing.T) {
	for _, tc := range setupCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			c := caddy.NewTestController("dns", tc.input)
			dnsserver.GetConfig(c).Root = tc.root
			fs, err := parse(c)
			if tc.err == nil {
				if err != nil {
					t.Fatalf("Expected no error, got %v", err)
				}
				tc.check(t, fs)
				return
			}
			if err == nil {
				t.Fatalf("Expected an error containing %q, got none", tc.err)
			}
			for _, want := range tc.err {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Expected the error to contain %q, got %q", want, err)
				}
			}
			for _, unwanted := range tc.not {
				if strings.Contains(err.Error(), unwanted) {
					t.Errorf("Expected the error not to contain %q, got %q", unwanted, err)
				}
			}
		})
	}
}

// TestSetupRegisters checks the caddy entry point: errors carry the plugin prefix
// and a valid block adds the handler.
func TestSetupRegisters(t *testing.T) {
	c := caddy.NewTestController("dns", "dotforward . dns://1.1.1.1")
	if err := setup(c); err == nil || !strings.HasPrefix(err.Error(), "plugin/dotforward: ") {
		t.Errorf("Expected an error prefixed plugin/dotforward, got %v", err)
	}
	c = caddy.NewTestController("dns", "dotforward . "+cf+"\ndotforward example.org "+quad9)
	if err := setup(c); err != nil {
		t.Fatalf("Expected no error, got %v", err)
	}
	if n := len(dnsserver.GetConfig(c).Plugin); n != 2 {
		t.Errorf("Expected two handlers added, got %d", n)
	}
}

// CoreDNS passes queries of a class other than IN (CH, ANY, NONE) only to server
// blocks with a plugin named in dnsserver.EnableChaos; forward is one.
func TestChaosClassEnabled(t *testing.T) {
	if _, ok := dnsserver.EnableChaos["dotforward"]; !ok {
		t.Error("Expected dotforward in dnsserver.EnableChaos, as forward is")
	}
}

// CoreDNS's server refuses queries of a class other than IN unless a plugin of the
// server block is listed in dnsserver.EnableChaos, as forward is: through a real
// server, a CH query reaches the upstream and its answer the client.
func TestServerForwardsChaosClass(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "", s.Addr)
	cfg := &dnsserver.Config{Zone: ".", Transport: "dns", ListenHosts: []string{"127.0.0.1"}, Port: "0"}
	cfg.AddPlugin(func(plugin.Handler) plugin.Handler { return f })
	srv, err := dnsserver.NewServer("dns://127.0.0.1:0", []*dnsserver.Config{cfg})
	if err != nil {
		t.Fatalf("Creating a CoreDNS server: %v", err)
	}
	for _, class := range []uint16{dns.ClassCHAOS, dns.ClassANY} {
		m := newMsg("version.bind.", dns.TypeTXT)
		m.Question[0].Qclass = class
		before := s.Queries()
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		srv.ServeDNS(context.Background(), rec, m)
		if rec.Msg == nil || rec.Msg.Rcode != dns.RcodeSuccess {
			t.Errorf("Class %s: expected the upstream's NOERROR answer, got %v", dns.ClassToString[class], rec.Msg)
		}
		if got := s.Queries() - before; got != 1 {
			t.Errorf("Class %s: expected the query forwarded once, the upstream got %d", dns.ClassToString[class], got)
		}
	}
}

// FuzzParse checks that no input makes the parser panic; the seeds are the table.
func FuzzParse(f *testing.F) {
	for _, tc := range setupCases(f) {
		f.Add(tc.input)
	}
	f.Fuzz(func(_ *testing.T, input string) {
		_, _ = parse(caddy.NewTestController("dns", input))
	})
}

func only(t *testing.T, fs []*DoTForward) *DoTForward {
	t.Helper()
	if len(fs) != 1 {
		t.Fatalf("Expected one dotforward instance, got %d", len(fs))
	}
	return fs[0]
}

func expect[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Expected %s %v, got %v", what, want, got)
	}
}

func addrs(f *DoTForward) []string {
	var out []string
	for _, u := range f.upstreams {
		out = append(out, u.addr)
	}
	return out
}

func names(f *DoTForward) []string {
	var out []string
	for _, u := range f.upstreams {
		out = append(out, u.cfg.TLS.ServerName)
	}
	return out
}

func policyIs(name string) func(t *testing.T, fs []*DoTForward) {
	return func(t *testing.T, fs []*DoTForward) {
		expect(t, "policy", only(t, fs).policy.String(), name)
	}
}
