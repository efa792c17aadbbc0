package dotforward

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"math"
	"net"
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

func init() {
	plugin.Register("dotforward", setup)
	// CoreDNS refuses queries of a class other than IN (CH, ANY, NONE) unless a
	// plugin of the server block is listed here. forward is, and a forwarder has
	// no reason to refuse them: the upstream answers (version.bind CH TXT).
	dnsserver.EnableChaos["dotforward"] = struct{}{}
}

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
	hedge         *hedgeConfig // nil: no hedging (the default)
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
	"hedge":                            parseHedge,
	"source_address":                   parseSourceAddress,
	"max_idle_conns":                   parseMaxIdleConns,
	"force_tcp":                        ignoredFlag("force_tcp", "DoT always runs over TCP"),
	"prefer_udp":                       ignoredFlag("prefer_udp", "DoT never uses UDP"),
	"failfast_all_unhealthy_upstreams": flagOption(func(o *options) { o.failfast = true }),
	"no_padding":                       flagOption(func(o *options) { o.pool.PadBlock = -1 }),
	"no_keepalive":                     flagOption(func(o *options) { o.pool.NoKeepalive = true }),
	"no_coalesce":                      flagOption(func(o *options) { o.pool.NoCoalesce = true }),
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
	maxConns    = dot.MaxMaxConns
	maxInflight = dot.MaxMaxInflight
)

func parseOption(c *caddy.Controller, o *options) error {
	name := c.Val()
	if why, ok := unsupportedOptions[name]; ok {
		return c.Errf("option %q is not supported: %s", name, why)
	}
	parse, ok := optionTable[name]
	if !ok {
		if near := nearestOption(name); near != "" {
			return c.Errf("unknown property %q; did you mean %q?", name, near)
		}
		return c.Errf("unknown property %q", name)
	}
	if first, dup := o.seen[name]; dup && !repeatable[name] {
		return c.Errf("option %q given twice (first on line %d)", name, first.line)
	}
	o.seen[name] = posOf(c)
	return parse(c, o)
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

// hedgeUsage is the form of the hedge option, for its errors.
const hedgeUsage = "write hedge DELAY [MAX_PERCENT] (such as hedge 20ms) or hedge auto [MAX_PERCENT], MAX_PERCENT from 1 to 100 (default 5); remove the line to turn hedging off"

// parseHedge reads `hedge DELAY|auto [MAX_PERCENT]`.
func parseHedge(c *caddy.Controller, o *options) error {
	args := c.RemainingArgs()
	if len(args) == 0 || len(args) > 2 {
		return c.Errf("hedge takes a delay or auto and an optional MAX_PERCENT, got %d arguments: %s", len(args), hedgeUsage)
	}
	h := &hedgeConfig{percent: defaultHedgePercent}
	if args[0] == "auto" {
		h.auto = true
	} else {
		d, err := time.ParseDuration(args[0])
		switch {
		case err != nil:
			return c.Errf("hedge: %q is neither a duration (such as 20ms) nor auto: %s", args[0], hedgeUsage)
		case d <= 0:
			return c.Errf("hedge: delay %q must be positive: %s", args[0], hedgeUsage)
		}
		h.delay = d
	}
	if len(args) == 2 {
		n, err := strconv.Atoi(args[1])
		if err != nil || n < 1 || n > 100 {
			return c.Errf("hedge: MAX_PERCENT %q is not an integer from 1 to 100 (the largest share of queries that may be hedged): %s", args[1], hedgeUsage)
		}
		h.percent = n
	}
	o.hedge = h
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

// check validates what depends on several options.
func (o *options) check() error {
	expire := o.pool.WithDefaults().IdleTimeout
	if o.pool.MaxAge > 0 && o.pool.MaxAge < expire {
		return o.seen["max_age"].errf("max_age %s must not be less than expire %s", o.pool.MaxAge, expire)
	}
	return o.checkHedge()
}

// checkHedge refuses a fixed hedge delay that could never fire before the
// attempt it hedges ends: by then the query has failed over, or failed.
func (o *options) checkHedge() error {
	if o.hedge == nil || o.hedge.auto {
		return nil
	}
	readTimeout := o.pool.ReadTimeout
	if readTimeout == 0 {
		readTimeout = dot.DefaultReadTimeout
	}
	if limit := min(readTimeout, o.timeout); o.hedge.delay >= limit {
		return o.seen["hedge"].errf("hedge %s must be less than read_timeout %s and timeout %s, or no query is ever hedged: use a delay about the upstream's 95th percentile answer time, or hedge auto", o.hedge.delay, readTimeout, o.timeout)
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
