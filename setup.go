package dotforward

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	pkgtls "github.com/coredns/coredns/plugin/pkg/tls"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

func init() { plugin.Register("dotforward", setup) }

// setup parses every dotforward line of a server block and chains the instances:
// like forward, a query that does not match one line's FROM (or matches its
// except) goes on to the next dotforward line, then to the next plugin.
func setup(c *caddy.Controller) error {
	fs, err := parse(c)
	if err != nil {
		return plugin.Error("dotforward", err)
	}
	for _, f := range fs {
		dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
			f.Next = next
			return f
		})
		c.OnStartup(f.OnStartup)
		c.OnShutdown(f.OnShutdown)
	}
	return nil
}

// parse returns one DoTForward per dotforward line.
func parse(c *caddy.Controller) ([]*DoTForward, error) {
	var fs []*DoTForward
	for c.Next() {
		f, err := parseStanza(c)
		if err != nil {
			return nil, err
		}
		fs = append(fs, f)
	}
	return fs, nil
}

// parseStanza parses `dotforward FROM TO... { options }`.
func parseStanza(c *caddy.Controller) (*DoTForward, error) {
	at := posOf(c)
	from, err := parseFrom(c)
	if err != nil {
		return nil, err
	}
	targets, err := parseTargets(c, c.RemainingArgs())
	if err != nil {
		return nil, err
	}
	o := defaultOptions()
	for c.NextBlock() {
		if err := parseOption(c, o); err != nil {
			return nil, err
		}
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	ups, err := o.upstreams(targets, at)
	if err != nil {
		return nil, err
	}
	return newDoTForward(from, ups, o), nil
}

func parseFrom(c *caddy.Controller) (string, error) {
	if !c.NextArg() {
		return "", c.ArgErr()
	}
	from := c.Val()
	zones := plugin.Host(from).NormalizeExact()
	if len(zones) == 0 {
		return "", c.Errf("invalid FROM zone %q", from)
	}
	if len(zones) > 1 {
		log.Warningf("FROM %q expands to %d zones; using only %q", from, len(zones), zones[0])
	}
	return zones[0], nil
}

// maxUpstreams caps the TO list, as forward does.
const maxUpstreams = 15

// target is one parsed TO: the upstream address and its optional TLS server name.
type target struct {
	raw        string
	addr       string // "IP:port", IPv6 in brackets
	serverName string // from tls://IP%NAME, empty if not given
}

func parseTargets(c *caddy.Controller, to []string) ([]target, error) {
	if len(to) == 0 {
		return nil, c.ArgErr()
	}
	if len(to) > maxUpstreams {
		return nil, c.Errf("%d upstreams given, at most %d are allowed", len(to), maxUpstreams)
	}
	seen := make(map[string]bool, len(to))
	ts := make([]target, 0, len(to))
	for _, s := range to {
		t, err := parseTarget(s)
		if err != nil {
			return nil, c.Errf("upstream %q: %v", s, err)
		}
		if seen[t.addr] {
			return nil, c.Errf("upstream %q: %s is listed twice", s, t.addr)
		}
		seen[t.addr] = true
		ts = append(ts, t)
	}
	return ts, nil
}

// parseTarget parses tls://IP[%NAME][:PORT]; IPv6 addresses are written in
// brackets when a port follows: tls://[::1]:853, tls://[::1%NAME]:853 or
// tls://[::1]%NAME:853.
func parseTarget(s string) (target, error) {
	rest, ok := strings.CutPrefix(s, "tls://")
	if !ok {
		return target{}, errNotTLS
	}
	host, name, port, err := splitTarget(rest)
	if err != nil {
		return target{}, err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return target{}, fmt.Errorf("%q is not an IP address (dotforward does not resolve host names)", host)
	}
	if port == "" {
		port = "853"
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return target{}, fmt.Errorf("invalid port %q", port)
	}
	if name != "" {
		if _, ok := dns.IsDomainName(name); !ok || strings.ContainsAny(name, "[]:/% ") {
			return target{}, fmt.Errorf("invalid TLS server name %q", name)
		}
	}
	return target{raw: s, addr: net.JoinHostPort(ip.String(), port), serverName: name}, nil
}

// splitTarget splits "host[%name][:port]" into its parts without validating them.
func splitTarget(s string) (host, name, port string, err error) {
	if s == "" {
		return "", "", "", fmt.Errorf("no address after tls://")
	}
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", "", fmt.Errorf("missing ']' in IPv6 address")
		}
		host, name, _ = strings.Cut(s[1:end], "%")
		after := s[end+1:]
		if rest, ok := strings.CutPrefix(after, "%"); ok {
			if name != "" {
				return "", "", "", fmt.Errorf("two TLS server names")
			}
			var hasPort bool
			name, port, hasPort = strings.Cut(rest, ":")
			if hasPort && port == "" {
				return "", "", "", fmt.Errorf("empty port")
			}
		} else if after != "" {
			p, ok := strings.CutPrefix(after, ":")
			if !ok || p == "" {
				return "", "", "", fmt.Errorf("unexpected %q after IPv6 address", after)
			}
			port = p
		}
		return host, name, port, checkName(s, name)
	}
	host, name, hasName := strings.Cut(s, "%")
	switch {
	case hasName:
		if i := strings.LastIndexByte(name, ':'); i >= 0 {
			name, port = name[:i], name[i+1:]
			if port == "" {
				return "", "", "", fmt.Errorf("empty port")
			}
		}
	case strings.Count(host, ":") == 1:
		host, port, _ = strings.Cut(host, ":")
		if port == "" {
			return "", "", "", fmt.Errorf("empty port")
		}
	}
	return host, name, port, checkName(s, name)
}

func checkName(s, name string) error {
	if strings.Contains(s, "%") && name == "" {
		return fmt.Errorf("empty TLS server name after '%%'")
	}
	return nil
}

// pos is a Corefile position, kept to report errors found after the block has
// been read, when the dispenser no longer points at the offending line.
type pos struct {
	file string
	line int
}

func posOf(c *caddy.Controller) pos { return pos{file: c.File(), line: c.Line()} }

// errf formats an error the way caddy's Dispenser.Errf does.
func (p pos) errf(format string, args ...any) error {
	return fmt.Errorf("%s:%d - Error during parsing: %s", p.file, p.line, fmt.Sprintf(format, args...))
}

// Defaults of the plugin-level options; the pool's own defaults are in dot/config.go.
const (
	defaultTimeout     = 5 * time.Second
	defaultMaxFails    = 2
	defaultHealthCheck = 500 * time.Millisecond
	defaultHCDomain    = "."
)

// options is what a dotforward block configures. pool is the template for every
// upstream's dot.Config; Addr, TLS and Pins are filled in per upstream.
type options struct {
	ignored       []string
	tlsConfig     *tls.Config
	tlsServerName string
	pins          [][]byte
	policy        Policy
	hc            healthCheck
	maxFails      int
	maxAttempts   int // 0: no cap other than the timeout
	maxConcurrent int // 0: unlimited
	failover      []int
	failfast      bool
	timeout       time.Duration
	pool          dot.Config
	seen          map[string]pos // where each option was given
}

// healthCheck is the health_check option, for the health prober.
type healthCheck struct {
	interval time.Duration // 0 disables active probes
	noRec    bool
	domain   string
}

func defaultOptions() *options {
	return &options{
		policy:      &random{},
		hc:          healthCheck{interval: defaultHealthCheck, domain: defaultHCDomain},
		maxFails:    defaultMaxFails,
		maxAttempts: -1, // resolved to 2 × upstreams once their number is known
		timeout:     defaultTimeout,
		seen:        make(map[string]pos),
	}
}

// optionFunc parses one option's arguments; the dispenser is on the option name.
type optionFunc func(c *caddy.Controller, o *options) error

// optionTable lists every option dotforward accepts. forward's options keep their
// meaning; the ones that cannot apply to DoT are in ignoredOptions or refused in
// unsupportedOptions.
var optionTable = map[string]optionFunc{
	"except":                           parseExcept,
	"tls":                              parseTLS,
	"tls_servername":                   parseTLSServerName,
	"tls_pin":                          parseTLSPin,
	"policy":                           parsePolicy,
	"health_check":                     parseHealthCheck,
	"failover":                         parseFailover,
	"source_address":                   parseSourceAddress,
	"max_idle_conns":                   parseMaxIdleConns,
	"force_tcp":                        ignoredFlag("force_tcp", "DoT always runs over TCP"),
	"prefer_udp":                       ignoredFlag("prefer_udp", "DoT never uses UDP"),
	"failfast_all_unhealthy_upstreams": flagOption(func(o *options) { o.failfast = true }),
	"no_padding":                       flagOption(func(o *options) { o.pool.PadBlock = -1 }),
	"no_keepalive":                     flagOption(func(o *options) { o.pool.NoKeepalive = true }),
	"max_fails":                        intOption(0, math.MaxInt32, func(o *options, n int) { o.maxFails = n }),
	"max_connect_attempts":             intOption(0, math.MaxInt32, func(o *options, n int) { o.maxAttempts = n }),
	"max_concurrent":                   intOption(0, math.MaxInt32, func(o *options, n int) { o.maxConcurrent = n }),
	"max_conns":                        parseMaxConns,
	"max_inflight":                     intOption(1, maxInflight, func(o *options, n int) { o.pool.MaxInflight = n }),
	"expire":                           durationOption(false, func(o *options, d time.Duration) { o.pool.IdleTimeout = d }),
	"max_age":                          durationOption(true, func(o *options, d time.Duration) { o.pool.MaxAge = d }),
	"read_timeout":                     durationOption(false, func(o *options, d time.Duration) { o.pool.ReadTimeout = d }),
	"dial_timeout":                     durationOption(false, func(o *options, d time.Duration) { o.pool.DialTimeout = d }),
	"stall_timeout":                    durationOption(false, func(o *options, d time.Duration) { o.pool.StallTimeout = d }),
	"timeout":                          durationOption(false, func(o *options, d time.Duration) { o.timeout = d }),
}

// unsupportedOptions are forward options that have no meaning for DoT upstreams;
// they are refused rather than silently ignored because they change behaviour.
var unsupportedOptions = map[string]string{
	"doh_method":     "it applies to DNS-over-HTTPS upstreams only",
	"resolver":       "dotforward takes upstream IP addresses and resolves no host names",
	"next":           "dotforward hands no answers to the next plugin; use failover",
	"next_on_nodata": "dotforward hands no answers to the next plugin",
}

// repeatable options add to what earlier lines gave; any other option may appear once.
var repeatable = map[string]bool{"except": true, "tls_pin": true, "failover": true}

// Limits of the pool options, checked here to report them with their Corefile line.
const (
	maxConns    = 1024
	maxInflight = 65535 / 2
)

func parseOption(c *caddy.Controller, o *options) error {
	name := c.Val()
	if why, ok := unsupportedOptions[name]; ok {
		return c.Errf("option %q is not supported: %s", name, why)
	}
	parse, ok := optionTable[name]
	if !ok {
		return c.Errf("unknown property %q", name)
	}
	if first, dup := o.seen[name]; dup && !repeatable[name] {
		return c.Errf("option %q given twice (first on line %d)", name, first.line)
	}
	o.seen[name] = posOf(c)
	return parse(c, o)
}

func flagOption(set func(*options)) optionFunc {
	return func(c *caddy.Controller, o *options) error {
		name := c.Val()
		if c.NextArg() {
			return c.Errf("%s takes no arguments, got %q", name, c.Val())
		}
		set(o)
		return nil
	}
}

func ignoredFlag(name, why string) optionFunc {
	return flagOption(func(*options) {
		log.Warningf("Ignoring %s: %s", name, why)
	})
}

func intOption(lo, hi int, set func(*options, int)) optionFunc {
	return func(c *caddy.Controller, o *options) error {
		name := c.Val()
		v, err := oneArg(c)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return c.Errf("%s: %q is not an integer from %d to %d", name, v, lo, hi)
		}
		set(o, n)
		return nil
	}
}

// parseMaxConns takes `auto`, the default (the pool sizes itself:
// dot.Config.MaxConns 0), or a number of connections.
func parseMaxConns(c *caddy.Controller, o *options) error {
	v, err := oneArg(c)
	if err != nil {
		return err
	}
	if v == "auto" {
		o.pool.MaxConns = 0
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxConns {
		return c.Errf("max_conns: %q is neither auto nor an integer from 1 to %d", v, maxConns)
	}
	o.pool.MaxConns = n
	return nil
}

func durationOption(allowZero bool, set func(*options, time.Duration)) optionFunc {
	return func(c *caddy.Controller, o *options) error {
		name := c.Val()
		v, err := oneArg(c)
		if err != nil {
			return err
		}
		d, err := parseDuration(v, allowZero)
		if err != nil {
			return c.Errf("%s: %v", name, err)
		}
		set(o, d)
		return nil
	}
}

func parseDuration(v string, allowZero bool) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not a duration (examples: 500ms, 10s, 1m)", v)
	case d < 0, d == 0 && !allowZero:
		return 0, fmt.Errorf("%q must be positive", v)
	}
	return d, nil
}

// oneArg returns the single argument of the current option.
func oneArg(c *caddy.Controller) (string, error) {
	args := c.RemainingArgs()
	if len(args) != 1 {
		return "", c.ArgErr()
	}
	return args[0], nil
}

func parseExcept(c *caddy.Controller, o *options) error {
	args := c.RemainingArgs()
	if len(args) == 0 {
		return c.ArgErr()
	}
	for _, a := range args {
		zones := plugin.Host(a).NormalizeExact()
		if len(zones) == 0 {
			return c.Errf("except: invalid zone %q", a)
		}
		o.ignored = append(o.ignored, zones...)
	}
	return nil
}

// parseTLS reads `tls [CERT KEY [CA]]` (or `tls CA`) like forward: relative paths
// are taken from the root plugin's directory.
func parseTLS(c *caddy.Controller, o *options) error {
	args := c.RemainingArgs()
	if len(args) > 3 {
		return c.ArgErr()
	}
	root := dnsserver.GetConfig(c).Root
	for i := range args {
		if !filepath.IsAbs(args[i]) && root != "" {
			args[i] = filepath.Join(root, args[i])
		}
	}
	cfg, err := pkgtls.NewTLSConfigFromArgs(args...)
	if err != nil {
		return c.Errf("tls %s: %v", strings.Join(args, " "), err)
	}
	o.tlsConfig = cfg
	return nil
}

func parseTLSServerName(c *caddy.Controller, o *options) error {
	v, err := oneArg(c)
	if err != nil {
		return err
	}
	if _, ok := dns.IsDomainName(v); !ok || strings.ContainsAny(v, "[]:/% ") {
		return c.Errf("tls_servername: invalid server name %q", v)
	}
	o.tlsServerName = v
	return nil
}

// parseTLSPin reads base64 SHA-256 digests of SubjectPublicKeyInfos (RFC 7469 form).
func parseTLSPin(c *caddy.Controller, o *options) error {
	args := c.RemainingArgs()
	if len(args) == 0 {
		return c.ArgErr()
	}
	for _, a := range args {
		pin, err := base64.StdEncoding.DecodeString(a)
		if err != nil {
			return c.Errf("tls_pin: %q is not base64", a)
		}
		if len(pin) != sha256.Size {
			return c.Errf("tls_pin: %q decodes to %d bytes, want a %d-byte SHA-256 SPKI digest", a, len(pin), sha256.Size)
		}
		o.pins = append(o.pins, pin)
	}
	return nil
}

func parsePolicy(c *caddy.Controller, o *options) error {
	v, err := oneArg(c)
	if err != nil {
		return err
	}
	p := newPolicy(v)
	if p == nil {
		return c.Errf("unknown policy %q (want random, round_robin, sequential or latency)", v)
	}
	o.policy = p
	return nil
}

// parseHealthCheck reads `health_check DURATION [no_rec] [domain FQDN]`.
func parseHealthCheck(c *caddy.Controller, o *options) error {
	if !c.NextArg() {
		return c.ArgErr()
	}
	d, err := parseDuration(c.Val(), true)
	if err != nil {
		return c.Errf("health_check: %v", err)
	}
	o.hc.interval = d
	for c.NextArg() {
		switch v := c.Val(); v {
		case "no_rec":
			o.hc.noRec = true
		case "domain":
			if !c.NextArg() {
				return c.ArgErr()
			}
			if _, ok := dns.IsDomainName(c.Val()); !ok {
				return c.Errf("health_check: invalid domain %q", c.Val())
			}
			o.hc.domain = plugin.Name(c.Val()).Normalize()
		default:
			return c.Errf("health_check: unknown argument %q (want no_rec or domain FQDN)", v)
		}
	}
	return nil
}

func parseFailover(c *caddy.Controller, o *options) error {
	args := c.RemainingArgs()
	if len(args) == 0 {
		return c.ArgErr()
	}
	for _, a := range args {
		rc, ok := dns.StringToRcode[strings.ToUpper(a)]
		if !ok {
			return c.Errf("failover: %q is not an rcode", a)
		}
		if rc == dns.RcodeSuccess {
			return c.Errf("failover: %q cannot be used: answers are not retried", a)
		}
		o.failover = append(o.failover, rc)
	}
	return nil
}

func parseSourceAddress(c *caddy.Controller, o *options) error {
	v, err := oneArg(c)
	if err != nil {
		return err
	}
	ip := net.ParseIP(v)
	if ip == nil {
		return c.Errf("source_address: %q is not an IP address", v)
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}
	o.pool.Dial = d.DialContext
	return nil
}

// parseMaxIdleConns accepts forward's max_idle_conns so that forward Corefiles
// keep working; the pool keeps at most max_conns connections, idle or not.
func parseMaxIdleConns(c *caddy.Controller, o *options) error {
	v, err := oneArg(c)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(v); err != nil || n < 0 {
		return c.Errf("max_idle_conns: %q is not a non-negative integer", v)
	}
	log.Warningf("Ignoring max_idle_conns %s: the pool is bounded by max_conns", v)
	return nil
}

// check validates what depends on several options.
func (o *options) check() error {
	expire := o.pool.IdleTimeout
	if expire == 0 {
		expire = dot.DefaultIdleTimeout
	}
	if o.pool.MaxAge > 0 && o.pool.MaxAge < expire {
		return o.seen["max_age"].errf("max_age %s must not be less than expire %s", o.pool.MaxAge, expire)
	}
	return nil
}

// upstreams builds each upstream's pool configuration. at is the directive's line.
func (o *options) upstreams(ts []target, at pos) ([]*upstream, error) {
	base := o.tlsConfig
	if base == nil {
		base = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	ups := make([]*upstream, 0, len(ts))
	for _, t := range ts {
		name := t.serverName
		if o.tlsServerName != "" {
			if name != "" {
				return nil, o.seen["tls_servername"].errf("tls_servername %q and the server name of upstream %q are both set; keep one", o.tlsServerName, t.raw)
			}
			name = o.tlsServerName
		}
		if name == "" && len(o.pins) == 0 {
			return nil, at.errf("upstream %q has no TLS server name to verify: write tls://IP%%NAME, set tls_servername, or pin its key with tls_pin", t.raw)
		}
		cfg := o.pool
		cfg.Addr = t.addr
		cfg.TLS = base.Clone()
		cfg.TLS.ServerName = name
		cfg.Pins = o.pins
		ups = append(ups, newUpstream(cfg, o.maxFails, o.hc))
	}
	return ups, nil
}
