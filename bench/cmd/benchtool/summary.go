package main

import (
	"math"
	"slices"
)

// modeOrder is the order of modes in tables and the chart.
var modeOrder = []string{"whoami", "whoami-paced", "fwd-udp", "fwd-tls", "dotforward", "dotforward-nocoalesce", "dotforward-base", "unbound",
	"mission-whoami", "mission-fwd-udp", "mission-fwd-tls", "mission-dotforward"}

// modeLabel describes each mode for readers of the report.
var modeLabel = map[string]string{
	"whoami":     "CoreDNS whoami (no forwarding)",
	"fwd-udp":    "CoreDNS forward, UDP",
	"fwd-tls":    "CoreDNS forward, tls://",
	"dotforward": "CoreDNS dotforward, tls://",
	// The same with no_coalesce: what coalescing costs on distinct names.
	"dotforward-nocoalesce": "CoreDNS dotforward, tls://, no_coalesce",
	// The same Corefile on another build (BENCH_BASE_COREDNS), named in the report.
	"dotforward-base": "CoreDNS dotforward, tls://, base build",
	"unbound":         "Unbound forward-tls-upstream",
	// whoami offered, with dnsperf -Q, the QPS dotforward answered at full
	// speed in the same round, right after it: the floor at its rate.
	"whoami-paced": "CoreDNS whoami at dotforward's QPS",
	// The mission's Corefile: errors, prometheus, cache 30, then the forwarder.
	"mission-whoami":     "whoami behind errors, prometheus, cache",
	"mission-fwd-udp":    "forward UDP behind errors, prometheus, cache",
	"mission-fwd-tls":    "forward tls:// behind errors, prometheus, cache",
	"mission-dotforward": "dotforward behind errors, prometheus, cache",
}

// Summary aggregates the rounds of one kind, mode (and churn setting).
type Summary struct {
	Kind       string  `json:"kind"`
	Mode       string  `json:"mode"`
	CloseAfter int     `json:"close_after"`
	Rounds     int     `json:"rounds"`
	OfferedQPS float64 `json:"offered_qps,omitempty"`
	QPS        float64 `json:"qps_median"`
	QPSMin     float64 `json:"qps_min"`
	QPSMax     float64 `json:"qps_max"`
	Lost       int64   `json:"lost_total"`
	NotNoerror int64   `json:"not_noerror_total"`
	UDPDrops   int64   `json:"udp_rcvbuf_errors_total"`
	// ReadsPerQuery and WritesPerQuery are read(2)/write(2) syscalls of the
	// forwarding process per answered query: its upstream side, since the UDP front
	// uses recvmsg/sendmsg, which /proc/PID/io does not count.
	UpstreamCPU    float64 `json:"upstream_cpu_util_median"`
	ReadsPerQuery  F       `json:"read_syscalls_per_query"`
	WritesPerQuery F       `json:"write_syscalls_per_query"`
	P50ms          float64 `json:"p50_ms_median"`
	P99ms          float64 `json:"p99_ms_median"`
	CPUus          float64 `json:"cpu_us_per_query_median"`
	RSSMB          float64 `json:"rss_mb_max"`
	ConnsMid       int     `json:"upstream_conns_mid_max"`
	ConnsMax       int     `json:"upstream_conns_max"`
	// UpstreamShare is the upstream's query count over the answered queries (1.0:
	// every query was forwarded once).
	UpstreamShare      F     `json:"upstream_share"`
	ForwarderCacheHits int64 `json:"forwarder_cache_hits_total"`
	HandshakesPer1k    F     `json:"handshakes_per_1k_queries"`
	ResumedShare       F     `json:"resumed_share"`
	MetricResumedShare F     `json:"metric_resumed_share"`
	Replays            int64 `json:"replays_total"`
	// CPUxFloor is CPUus over that of the floor of the same kind and run
	// (floorMode): what forwarding costs above CoreDNS's own work.
	CPUxFloor F `json:"cpu_x_whoami"`
	// CacheHitShare is the cache's hits over its lookups (mission runs).
	CacheHitShare F `json:"cache_hit_share"`
}

type groupKey struct {
	kind, mode string
	closeAfter int
}

// summarize groups runs by kind, mode and churn setting, in mode order.
func summarize(runs []Run) []Summary {
	groups, keys := groupBy(runs, func(r Run) groupKey { return groupKey{r.Kind, r.Mode, r.CloseAfter} })
	rank := func(m string) int { return rankIn(modeOrder, m) }
	kindRank := map[string]int{"throughput": 0, "latency": 1, "churn": 2, "mission": 3}
	slices.SortStableFunc(keys, func(a, b groupKey) int {
		if d := kindRank[a.kind] - kindRank[b.kind]; d != 0 {
			return d
		}
		if d := rank(a.mode) - rank(b.mode); d != 0 {
			return d
		}
		return b.closeAfter - a.closeAfter
	})
	out := make([]Summary, 0, len(keys))
	for _, k := range keys {
		out = append(out, summarizeGroup(k, groups[k]))
	}
	addFloor(out)
	return out
}

func summarizeGroup(k groupKey, rs []Run) Summary {
	s := Summary{Kind: k.kind, Mode: k.mode, CloseAfter: k.closeAfter, Rounds: len(rs)}
	var qps, p50, p99, cpu, offered, upcpu []float64
	var completed, upstream, hs, resumed, mhs, mres, rd, wr, hits, misses int64
	s.QPSMin = math.Inf(1)
	for _, r := range rs {
		qps = append(qps, r.QPS)
		p50 = append(p50, r.P50ms)
		p99 = append(p99, r.P99ms)
		cpu = append(cpu, r.CPUusPerQuery)
		offered = append(offered, r.OfferedQPS)
		upcpu = append(upcpu, r.UpstreamCPUUtil)
		s.QPSMin = math.Min(s.QPSMin, r.QPS)
		s.QPSMax = math.Max(s.QPSMax, r.QPS)
		s.Lost += r.Lost
		s.NotNoerror += r.NotNoerror
		s.UDPDrops += r.UDPRcvbufErrors
		s.RSSMB = math.Max(s.RSSMB, float64(r.RSSkB)/1024)
		s.ConnsMid = max(s.ConnsMid, r.ConnsMid)
		s.ConnsMax = max(s.ConnsMax, r.ConnsMax)
		s.ForwarderCacheHits += r.ForwarderCacheHits
		s.Replays += r.Replays
		completed += r.Completed
		rd += r.ReadSyscalls
		wr += r.WriteSyscalls
		upstream += r.UpstreamQueries
		hs += r.Handshakes
		resumed += r.Resumed
		mhs += r.MetricHandshakes
		mres += r.MetricResumed
		hits += r.CacheHits
		misses += r.CacheMisses
	}
	s.QPS, s.P50ms, s.P99ms, s.CPUus, s.OfferedQPS = median(qps), median(p50), median(p99), median(cpu), median(offered)
	s.UpstreamCPU = median(upcpu)
	s.UpstreamShare = F(ratio(float64(upstream), float64(completed)))
	s.ReadsPerQuery = F(ratio(float64(rd), float64(completed)))
	s.WritesPerQuery = F(ratio(float64(wr), float64(completed)))
	s.HandshakesPer1k = F(ratio(float64(hs)*1000, float64(completed)))
	s.ResumedShare = F(ratio(float64(resumed), float64(hs)))
	s.MetricResumedShare = F(ratio(float64(mres), float64(mhs)))
	s.CacheHitShare = F(ratio(float64(hits), float64(hits+misses)))
	s.CPUxFloor = F(math.NaN())
	return s
}

func ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

func find(ss []Summary, kind, mode string, closeAfter int) *Summary {
	for i := range ss {
		if ss[i].Kind == kind && ss[i].Mode == mode && ss[i].CloseAfter == closeAfter {
			return &ss[i]
		}
	}
	return nil
}

// Target is one of issue 5's performance targets, checked against this run.
type Target struct {
	Name  string  `json:"name"`
	Value F       `json:"value"` // NaN (null in JSON) when not measured
	Op    string  `json:"op"`    // ">=" or "<="
	Limit float64 `json:"limit"`
	Pass  bool    `json:"pass"`
}

// Ratio is a ratio between two modes of the throughput run: of their medians, and
// the range of the ratios within each round (modes of one round ran back to back,
// so those show how steady the ratio was while the machine's load drifted).
type Ratio struct {
	Name     string `json:"name"`
	Value    F      `json:"value"`
	RoundMin F      `json:"round_min"`
	RoundMax F      `json:"round_max"`
}

// ratioDef is a Ratio to compute: mode a's QPS, or CPU per query, over b's.
type ratioDef struct {
	name, a, b string
	cpu        bool
	optional   bool // left out when a mode did not run
}

func throughputRatios(ss []Summary, runs []Run) []Ratio {
	defs := []ratioDef{
		{"QPS dotforward / forward tls://", "dotforward", "fwd-tls", false, false},
		{"QPS dotforward / forward UDP", "dotforward", "fwd-udp", false, false},
		{"QPS dotforward / Unbound", "dotforward", "unbound", false, false},
		{"QPS forward tls:// / forward UDP", "fwd-tls", "fwd-udp", false, false},
		{"QPS Unbound / forward UDP", "unbound", "fwd-udp", false, false},
		{"CPU per query dotforward / forward UDP", "dotforward", "fwd-udp", true, false},
		{"CPU per query dotforward / forward tls://", "dotforward", "fwd-tls", true, false},
		{"CPU per query dotforward / whoami", "dotforward", "whoami", true, false},
		{"CPU per query forward UDP / whoami", "fwd-udp", "whoami", true, false},
		{"CPU per query dotforward / whoami at dotforward's QPS", "dotforward", "whoami-paced", true, true},
		{"QPS dotforward / dotforward no_coalesce", "dotforward", "dotforward-nocoalesce", false, true},
		{"CPU per query dotforward / dotforward no_coalesce", "dotforward", "dotforward-nocoalesce", true, true},
		{"QPS dotforward / dotforward base build", "dotforward", "dotforward-base", false, true},
		{"CPU per query dotforward / dotforward base build", "dotforward", "dotforward-base", true, true},
	}
	return ratiosOf("throughput", defs, ss, runs)
}

// ratiosOf computes defs over the runs of one kind.
func ratiosOf(kind string, defs []ratioDef, ss []Summary, runs []Run) []Ratio {
	metric := func(cpu bool, qps, us float64) float64 {
		if cpu {
			return us
		}
		return qps
	}
	byRound := map[string]map[int]Run{}
	for _, r := range runs {
		if r.Kind != kind {
			continue
		}
		if byRound[r.Mode] == nil {
			byRound[r.Mode] = map[int]Run{}
		}
		byRound[r.Mode][r.Round] = r
	}
	out := make([]Ratio, 0, len(defs))
	for _, d := range defs {
		r := Ratio{Name: d.name, Value: F(math.NaN()), RoundMin: F(math.NaN()), RoundMax: F(math.NaN())}
		x, y := find(ss, kind, d.a, 0), find(ss, kind, d.b, 0)
		if d.optional && (x == nil || y == nil) {
			continue
		}
		if x != nil && y != nil {
			r.Value = F(ratio(metric(d.cpu, x.QPS, x.CPUus), metric(d.cpu, y.QPS, y.CPUus)))
		}
		lo, hi := math.Inf(1), math.Inf(-1)
		for round, ra := range byRound[d.a] {
			rb, ok := byRound[d.b][round]
			if !ok {
				continue
			}
			v := ratio(metric(d.cpu, ra.QPS, ra.CPUusPerQuery), metric(d.cpu, rb.QPS, rb.CPUusPerQuery))
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
		if lo <= hi {
			r.RoundMin, r.RoundMax = F(lo), F(hi)
		}
		out = append(out, r)
	}
	return out
}

func targets(ss []Summary, rs []Ratio) []Target {
	byName := map[string]F{}
	for _, r := range rs {
		byName[r.Name] = r.Value
	}
	nan := F(math.NaN())
	conns, lost := nan, nan
	if d := find(ss, "throughput", "dotforward", 0); d != nil {
		conns, lost = F(d.ConnsMax), F(unexplainedLoss(d))
	}
	resumed, churnLost := nan, nan
	if c := churnSummary(ss, "dotforward"); c != nil {
		resumed, churnLost = c.ResumedShare, F(unexplainedLoss(c))
	}
	ts := []Target{
		{Name: "QPS dotforward / forward tls://", Value: byName["QPS dotforward / forward tls://"], Op: ">=", Limit: 1.6},
		{Name: "QPS dotforward / forward UDP", Value: byName["QPS dotforward / forward UDP"], Op: ">=", Limit: 1.1},
		{Name: "QPS dotforward / Unbound", Value: byName["QPS dotforward / Unbound"], Op: ">=", Limit: 1.0},
		{Name: "CPU per query dotforward / forward UDP", Value: byName["CPU per query dotforward / forward UDP"], Op: "<=", Limit: 0.75},
		{Name: "dotforward upstream connections (max sampled)", Value: conns, Op: "<=", Limit: 4},
		{Name: "dotforward lost (beyond kernel UDP drops) + failed queries", Value: lost, Op: "<=", Limit: 0},
		{Name: "churn: share of reconnect handshakes resumed", Value: resumed, Op: ">=", Limit: 0.95},
		{Name: "churn: dotforward lost (beyond kernel UDP drops) + failed queries", Value: churnLost, Op: "<=", Limit: 0},
	}
	passes(ts)
	return ts
}

// passes sets each target's Pass: measured and within its limit.
func passes(ts []Target) {
	for i := range ts {
		t := &ts[i]
		switch {
		case math.IsNaN(float64(t.Value)):
			t.Pass = false
		case t.Op == ">=":
			t.Pass = float64(t.Value) >= t.Limit
		default:
			t.Pass = float64(t.Value) <= t.Limit
		}
	}
}

// churnSummary is the churn run of mode against the closing upstream.
func churnSummary(ss []Summary, mode string) *Summary {
	for i := range ss {
		if ss[i].Kind == "churn" && ss[i].Mode == mode && ss[i].CloseAfter > 0 {
			return &ss[i]
		}
	}
	return nil
}

// unexplainedLoss counts the queries dnsperf lost beyond the datagrams the kernel
// dropped on full UDP receive buffers meanwhile (loopback losses no forwarder can
// prevent), plus the answers that were not NOERROR.
func unexplainedLoss(s *Summary) int64 {
	return max(0, s.Lost-s.UDPDrops) + s.NotNoerror
}

// groupBy groups items by key, and returns the keys in the order first seen.
func groupBy[K comparable, T any](items []T, key func(T) K) (map[K][]T, []K) {
	groups := map[K][]T{}
	var keys []K
	for _, it := range items {
		k := key(it)
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], it)
	}
	return groups, keys
}

// rankIn is s's place in order, past the end if it is not there.
func rankIn(order []string, s string) int {
	if i := slices.Index(order, s); i >= 0 {
		return i
	}
	return len(order)
}
