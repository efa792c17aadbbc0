package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// RegimeRun is one measured run of the regimes phase (bench/run.sh
// phase_regimes): one mode in front of one kind of upstream at one offered rate.
type RegimeRun struct {
	Regime     string  `json:"regime"`
	Mode       string  `json:"mode"` // fwd-tls or dotforward
	Round      int     `json:"round"`
	CloseAfter int     `json:"close_after"` // the churn regime: 100, or 0 for its baseline
	OfferedQPS float64 `json:"offered_qps"` // dnsperf -Q; 0 is full speed
	Setup      string  `json:"setup"`       // the upstream, in words
	Load       string  `json:"load"`        // dnsperf's arguments

	Sent       int64   `json:"sent"`
	Completed  int64   `json:"completed"`
	Lost       int64   `json:"lost"`
	NotNoerror int64   `json:"not_noerror"`
	QPS        float64 `json:"qps"`
	RunTime    float64 `json:"run_time_s"`
	P50ms      float64 `json:"p50_ms"`
	P99ms      float64 `json:"p99_ms"`
	// With a split of the names (cut-slowtail): the fast names' and the slow
	// names' percentiles, and how many answers each had.
	FastSamples int64   `json:"fast_samples"`
	SlowSamples int64   `json:"slow_samples"`
	FastP50ms   float64 `json:"fast_p50_ms"`
	FastP99ms   float64 `json:"fast_p99_ms"`
	SlowP50ms   float64 `json:"slow_p50_ms"`
	SlowP99ms   float64 `json:"slow_p99_ms"`

	CPUusPerQuery   float64 `json:"cpu_us_per_query"`
	RSSkB           int64   `json:"rss_kb"`
	ConnsMedian     float64 `json:"conns_median"`        // established connections to the upstream, median of the samples
	ConnsMax        int     `json:"conns_max"`           // the most in one sample
	ConnSamples     string  `json:"conn_samples"`        // every sample, in order
	Dials           int64   `json:"dials"`               // connections the front opened during the run (its own metrics)
	UpstreamHS      int64   `json:"upstream_handshakes"` // TLS handshakes the upstream counted (fakedot only; -1: not known)
	UDPRcvbufErrors int64   `json:"udp_rcvbuf_errors"`   // machine-wide kernel UDP drops during the run
	Replays         int64   `json:"replays"`             // dotforward: coredns_dotforward_replays_total during the run
	Timeouts        int64   `json:"timeouts"`            // dotforward: coredns_dotforward_timeouts_total during the run
}

// regimeOrder is the order of the regimes in the report, as issue 14 lists them.
var regimeOrder = []string{"coredns-erratic", "dnsdist-slow", "cut-slowtail", "unbound", "churn"}

// RegimeSummary aggregates the rounds of one regime, mode and churn setting.
type RegimeSummary struct {
	Regime      string  `json:"regime"`
	Mode        string  `json:"mode"`
	CloseAfter  int     `json:"close_after"`
	Rounds      int     `json:"rounds"`
	OfferedQPS  float64 `json:"offered_qps"`
	Setup       string  `json:"setup"`
	Load        string  `json:"load"`
	Sent        int64   `json:"sent_total"`
	Completed   int64   `json:"completed_total"`
	Lost        int64   `json:"lost_total"`
	NotNoerror  int64   `json:"not_noerror_total"`
	UDPDrops    int64   `json:"udp_rcvbuf_errors_total"`
	QPS         float64 `json:"qps_median"`
	P50ms       float64 `json:"p50_ms_median"`
	P99ms       float64 `json:"p99_ms_median"`
	Split       bool    `json:"split"`
	FastP50ms   F       `json:"fast_p50_ms_median"`
	FastP99ms   F       `json:"fast_p99_ms_median"`
	SlowP50ms   F       `json:"slow_p50_ms_median"`
	SlowP99ms   F       `json:"slow_p99_ms_median"`
	CPUus       float64 `json:"cpu_us_per_query_median"`
	RSSMB       float64 `json:"rss_mb_max"`
	ConnsMedian float64 `json:"conns_median_median"`
	ConnsMax    int     `json:"conns_max"`
	ConnSamples string  `json:"conn_samples_last"`
	DialsPerSec float64 `json:"dials_per_s_median"`
	Dials       int64   `json:"dials_total"`
	UpstreamHS  int64   `json:"upstream_handshakes_total"` // -1: not known
	Replays     int64   `json:"replays_total"`
	Timeouts    int64   `json:"timeouts_total"`
}

// RegimeTarget is one of issue 14's targets checked in one regime.
type RegimeTarget struct {
	Regime string `json:"regime"`
	Name   string `json:"name"`
	Value  F      `json:"value"` // NaN (null) when not measured
	Op     string `json:"op"`
	Limit  F      `json:"limit"`
	Pass   bool   `json:"pass"`
}

// RegimeResults is bench/results/regimes.json.
type RegimeResults struct {
	Generated string            `json:"generated"`
	Label     string            `json:"label,omitempty"`
	Machine   map[string]string `json:"machine"`
	Summaries []RegimeSummary   `json:"summaries"`
	Targets   []RegimeTarget    `json:"targets"`
	Runs      []RegimeRun       `json:"runs"`
}

// regimesCmd turns the regimes phase's records into regimes.md, regimes.json and
// regimes.svg.
func regimesCmd(args []string) error {
	fs := flag.NewFlagSet("regimes", flag.ContinueOnError)
	in := fs.String("in", "", "regimes.jsonl written by run.sh")
	out := fs.String("out", "bench/results", "output directory")
	machine := fs.String("machine", "", "key=value lines describing the machine and the run")
	lbl := fs.String("label", "", "what this run is (printed at the top)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runs, err := readRegimeRuns(*in)
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		return fmt.Errorf("%s: no runs", *in)
	}
	res := RegimeResults{Generated: time.Now().UTC().Format(time.RFC3339), Label: *lbl, Runs: runs}
	if res.Machine, err = readKV(*machine); err != nil {
		return err
	}
	res.Summaries = summarizeRegimes(runs)
	res.Targets = regimeTargets(res.Summaries)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, "regimes.json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	var md strings.Builder
	writeRegimes(&md, &res)
	if err := os.WriteFile(filepath.Join(*out, "regimes.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "regimes.svg"), []byte(regimesSVG(&res)), 0o644)
}

func readRegimeRuns(path string) ([]RegimeRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var runs []RegimeRun
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		r := RegimeRun{UpstreamHS: -1}
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		runs = append(runs, r)
	}
	return runs, sc.Err()
}

type regimeKey struct {
	regime, mode string
	closeAfter   int
}

func regimeRank(r string) int {
	if i := slices.Index(regimeOrder, r); i >= 0 {
		return i
	}
	return len(regimeOrder)
}

func summarizeRegimes(runs []RegimeRun) []RegimeSummary {
	groups := map[regimeKey][]RegimeRun{}
	var keys []regimeKey
	for _, r := range runs {
		k := regimeKey{r.Regime, r.Mode, r.CloseAfter}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], r)
	}
	modeRank := func(m string) int {
		if i := slices.Index(modeOrder, m); i >= 0 {
			return i
		}
		return len(modeOrder)
	}
	slices.SortStableFunc(keys, func(a, b regimeKey) int {
		if d := regimeRank(a.regime) - regimeRank(b.regime); d != 0 {
			return d
		}
		if d := b.closeAfter - a.closeAfter; d != 0 {
			return d
		}
		return modeRank(a.mode) - modeRank(b.mode)
	})
	out := make([]RegimeSummary, 0, len(keys))
	for _, k := range keys {
		out = append(out, summarizeRegime(k, groups[k]))
	}
	return out
}

func summarizeRegime(k regimeKey, rs []RegimeRun) RegimeSummary {
	s := RegimeSummary{Regime: k.regime, Mode: k.mode, CloseAfter: k.closeAfter, Rounds: len(rs)}
	var qps, p50, p99, fp50, fp99, sp50, sp99, cpu, cmed, dps []float64
	for _, r := range rs {
		s.OfferedQPS, s.Setup, s.Load, s.ConnSamples = r.OfferedQPS, r.Setup, r.Load, r.ConnSamples
		s.Sent += r.Sent
		s.Completed += r.Completed
		s.Lost += r.Lost
		s.NotNoerror += r.NotNoerror
		s.UDPDrops += r.UDPRcvbufErrors
		s.RSSMB = math.Max(s.RSSMB, float64(r.RSSkB)/1024)
		s.ConnsMax = max(s.ConnsMax, r.ConnsMax)
		s.Dials += r.Dials
		s.Replays += r.Replays
		s.Timeouts += r.Timeouts
		qps = append(qps, r.QPS)
		p50 = append(p50, r.P50ms)
		p99 = append(p99, r.P99ms)
		cpu = append(cpu, r.CPUusPerQuery)
		cmed = append(cmed, r.ConnsMedian)
		dps = append(dps, ratio(float64(r.Dials), r.RunTime))
		if r.FastSamples+r.SlowSamples > 0 {
			s.Split = true
			fp50, fp99 = append(fp50, r.FastP50ms), append(fp99, r.FastP99ms)
			sp50, sp99 = append(sp50, r.SlowP50ms), append(sp99, r.SlowP99ms)
		}
	}
	s.UpstreamHS = 0
	for _, r := range rs {
		if r.UpstreamHS < 0 {
			s.UpstreamHS = -1
			break
		}
		s.UpstreamHS += r.UpstreamHS
	}
	s.QPS, s.P50ms, s.P99ms, s.CPUus = median(qps), median(p50), median(p99), median(cpu)
	s.ConnsMedian, s.DialsPerSec = median(cmed), median(dps)
	s.FastP50ms, s.FastP99ms = F(median(fp50)), F(median(fp99))
	s.SlowP50ms, s.SlowP99ms = F(median(sp50)), F(median(sp99))
	return s
}

func findRegime(ss []RegimeSummary, regime, mode string, closeAfter int) *RegimeSummary {
	for i := range ss {
		if ss[i].Regime == regime && ss[i].Mode == mode && ss[i].CloseAfter == closeAfter {
			return &ss[i]
		}
	}
	return nil
}

// regimeNames lists the regimes present, in report order.
func regimeNames(ss []RegimeSummary) []string {
	var names []string
	for _, s := range ss {
		if !slices.Contains(names, s.Regime) {
			names = append(names, s.Regime)
		}
	}
	return names
}

// mainCut is the churn setting the targets compare in a regime: the cutting
// upstream where a regime also has a baseline without cuts.
func mainCut(ss []RegimeSummary, regime string) int {
	cut := 0
	for _, s := range ss {
		if s.Regime == regime {
			cut = max(cut, s.CloseAfter)
		}
	}
	return cut
}

// regimeLoss is what the target "loses nothing" counts: queries dnsperf got no
// answer to beyond the datagrams the kernel dropped meanwhile (as in results.md),
// plus answers other than NOERROR.
func regimeLoss(s *RegimeSummary) int64 { return max(0, s.Lost-s.UDPDrops) + s.NotNoerror }

// regimeTargets checks issue 14's targets in every regime: dotforward against
// forward tls:// at the same offered load.
func regimeTargets(ss []RegimeSummary) []RegimeTarget {
	var ts []RegimeTarget
	nan := F(math.NaN())
	for _, reg := range regimeNames(ss) {
		cut := mainCut(ss, reg)
		d, f := findRegime(ss, reg, "dotforward", cut), findRegime(ss, reg, "fwd-tls", cut)
		add := func(name string, value F, op string, limit F) {
			ts = append(ts, RegimeTarget{Regime: reg, Name: name, Value: value, Op: op, Limit: limit})
		}
		if d == nil {
			add("dotforward ran", nan, ">=", 1)
			continue
		}
		if f != nil {
			add("queries answered / forward's", F(ratio(d.QPS, f.QPS)), ">=", 0.98)
			add("p50 ms (≤ forward's + 1 ms)", F(d.P50ms), "<=", F(f.P50ms+1))
			add("p99 ms (≤ 1.2 × forward's + 5 ms)", F(d.P99ms), "<=", F(1.2*f.P99ms+5))
		} else {
			add("forward tls:// ran", nan, ">=", 1)
		}
		add("lost (beyond kernel UDP drops) + not NOERROR", F(float64(regimeLoss(d))), "<=", 0)
		if f != nil {
			add("upstream connections, max sampled (≤ forward's)", F(float64(d.ConnsMax)), "<=", F(float64(f.ConnsMax)))
		}
		if reg == "unbound" {
			add("upstream connections, max sampled", F(float64(d.ConnsMax)), "<=", 4)
		}
		if cut > 0 {
			cost := func(mode string) F {
				c, b := findRegime(ss, reg, mode, cut), findRegime(ss, reg, mode, 0)
				if c == nil || b == nil {
					return nan
				}
				return F(1 - ratio(c.QPS, b.QPS))
			}
			add(fmt.Sprintf("QPS lost to the cuts every %d answers (≤ forward's)", cut), cost("dotforward"), "<=", cost("fwd-tls"))
		}
	}
	for i := range ts {
		t := &ts[i]
		v, l := float64(t.Value), float64(t.Limit)
		switch {
		case math.IsNaN(v) || math.IsNaN(l):
		case t.Op == ">=":
			t.Pass = v >= l
		default:
			t.Pass = v <= l
		}
	}
	return ts
}

func targetResult(t RegimeTarget) string {
	switch {
	case math.IsNaN(float64(t.Value)) || math.IsNaN(float64(t.Limit)):
		return "not measured"
	case t.Pass:
		return "pass"
	}
	return "**FAIL**"
}

// regimeVerdict is PASS when every target of the regime passed.
func regimeVerdict(ts []RegimeTarget, regime string) (string, []string) {
	var failed []string
	n := 0
	for _, t := range ts {
		if t.Regime != regime {
			continue
		}
		n++
		if !t.Pass {
			failed = append(failed, t.Name)
		}
	}
	if n == 0 {
		return "not measured", nil
	}
	if len(failed) == 0 {
		return "PASS", nil
	}
	return "FAIL", failed
}

func modeShort(m string) string {
	switch m {
	case "fwd-tls":
		return "forward tls://"
	case "dotforward":
		return "dotforward"
	}
	return m
}

func writeRegimes(w io.Writer, r *RegimeResults) {
	m := r.Machine
	fmt.Fprintf(w, "# dotforward against upstreams unlike unbound (issue 14)\n\n")
	if r.Label != "" {
		fmt.Fprintf(w, "**%s**\n\n", r.Label)
	}
	fmt.Fprintf(w, "Generated %s by bench/run.sh, phase `regimes` (`make bench-regimes`). Machine: %s CPUs (%s), kernel %s, %s; %s; %s; %s.",
		r.Generated, m["nproc"], m["cpu"], m["kernel"], m["go"], m["coredns"], m["dnsperf"], m["dnsdist"])
	if m["regimes_seconds_total"] != "" {
		fmt.Fprintf(w, " The phase took %s s.", m["regimes_seconds_total"])
	}
	if m["loadavg_start"] != "" {
		fmt.Fprintf(w, " Load average (1, 5, 15 min) at its start: %s; at its end: %s.", m["loadavg_start"], m["loadavg_end"])
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w)
	if o := m["dotforward_opts"]; o != "" {
		fmt.Fprintf(w, "dotforward's extra options (`BENCH_DOTFORWARD_OPTS`): `%s`\n\n", strings.ReplaceAll(o, "\n", "; "))
	} else {
		fmt.Fprintf(w, "dotforward ran with its defaults (`BENCH_DOTFORWARD_OPTS` empty).\n\n")
	}
	fmt.Fprintf(w, "Each regime puts CoreDNS with *forward* `tls://` (stock CoreDNS %s) and CoreDNS with *dotforward* "+
		"in front of the same kind of upstream, one after the other (the upstream started afresh for each), "+
		"at the same offered load, all on 127.0.0.1. Everything, the load generator included, shares "+
		"this machine with other work, so absolute figures are noisy; the comparison is between the two modes "+
		"of one regime in this one run.\n\n", strings.TrimPrefix(m["coredns"], "CoreDNS-"))
	fmt.Fprintf(w, "How each figure is taken:\n\n"+
		"- **QPS**: queries answered per second, dnsperf's `Queries per second` (answers ÷ its run time). dnsperf keeps "+
		"at most `-q` queries outstanding, so it sends a front that answers slowly fewer queries than offered (*sent*).\n"+
		"- **p50, p99**: nearest-rank percentiles of the latencies of the answered queries, from dnsperf `-v`'s "+
		"line per answer (dnsperf 2.10 prints only the average and standard deviation); lost queries are not in them "+
		"but counted under *lost*. Where the names are split (cut-slowtail), the fast and the slow names' percentiles "+
		"are also given apart.\n"+
		"- **lost**: queries dnsperf had no answer to within its 5 s; **UDP drops**: datagrams the kernel dropped "+
		"machine-wide (RcvbufErrors) meanwhile; **not NOERROR**: SERVFAIL and other failed answers.\n"+
		"- **conns**: established TCP connections from the front to the upstream's DoT port (`ss`, client side), "+
		"sampled once a second during the measured run: median (max) of the samples.\n"+
		"- **dials/s**: connections the front opened during the run ÷ the run's length, from the front's own metrics: "+
		"`coredns_dotforward_dials_total` for dotforward, `coredns_proxy_conn_cache_misses_total` for forward "+
		"(in CoreDNS 1.15 forward dials exactly when its connection cache misses). **upstream TLS handshakes**: "+
		"the upstream's own count, where it has one (fakedot).\n"+
		"- **CPU µs/q**: user+system CPU time of the front (/proc/PID/stat) over the run ÷ answers; RSS is its peak.\n\n")

	fmt.Fprintf(w, "![p50 and p99 per regime and mode](regimes.svg)\n\n")

	fmt.Fprintf(w, "## Verdict (issue 14's targets: dotforward against forward tls:// in each regime)\n\n")
	fmt.Fprintf(w, "Targets: answers ≥ 0.98 × forward's; p50 ≤ forward's + 1 ms; p99 ≤ 1.2 × forward's + 5 ms; loses nothing; "+
		"never more upstream connections than forward; against unbound ≤ 4 connections; churn costs dotforward no more "+
		"QPS than it costs forward.\n\n")
	fmt.Fprintf(w, "| regime | offered | QPS dotforward / forward | p50 ms dotforward / forward | p99 ms dotforward / forward | conns dotforward / forward | lost+failed dotforward | verdict | failed targets |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, reg := range regimeNames(r.Summaries) {
		cut := mainCut(r.Summaries, reg)
		d, f := findRegime(r.Summaries, reg, "dotforward", cut), findRegime(r.Summaries, reg, "fwd-tls", cut)
		v, failed := regimeVerdict(r.Targets, reg)
		if v == "FAIL" {
			v = "**FAIL**"
		}
		pair := func(get func(*RegimeSummary) float64, prec int) string {
			a, b := math.NaN(), math.NaN()
			if d != nil {
				a = get(d)
			}
			if f != nil {
				b = get(f)
			}
			return num(a, prec) + " / " + num(b, prec)
		}
		lost := "–"
		offered := "–"
		if d != nil {
			lost = fmt.Sprint(regimeLoss(d))
			offered = offeredText(d.OfferedQPS)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", reg, offered,
			pair(func(s *RegimeSummary) float64 { return s.QPS }, 0),
			pair(func(s *RegimeSummary) float64 { return s.P50ms }, 2),
			pair(func(s *RegimeSummary) float64 { return s.P99ms }, 1),
			pair(func(s *RegimeSummary) float64 { return float64(s.ConnsMax) }, 0),
			lost, v, strings.Join(failed, "; "))
	}
	fmt.Fprintln(w)

	for _, reg := range regimeNames(r.Summaries) {
		writeRegime(w, r, reg)
	}
	writeRegimeRuns(w, r.Runs)
}

func offeredText(q float64) string {
	if q <= 0 {
		return "full speed"
	}
	return num(q, 0) + " QPS"
}

func writeRegime(w io.Writer, r *RegimeResults, reg string) {
	var rows []RegimeSummary
	for _, s := range r.Summaries {
		if s.Regime == reg {
			rows = append(rows, s)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## %s\n\n%s\n\nLoad: `dnsperf %s` (%s).\n\n", reg, rows[0].Setup, rows[0].Load, offeredText(rows[0].OfferedQPS))
	split := false
	churn := false
	for _, s := range rows {
		split = split || s.Split
		churn = churn || s.CloseAfter > 0
	}
	hdr := "| mode |"
	sep := "|---|"
	if churn {
		hdr += " cut after |"
		sep += "---:|"
	}
	hdr += " QPS | sent | lost | UDP drops | not NOERROR | p50 ms | p99 ms |"
	sep += "---:|---:|---:|---:|---:|---:|---:|"
	if split {
		hdr += " fast names p50 / p99 ms | slow names p50 / p99 ms |"
		sep += "---:|---:|"
	}
	if churn {
		hdr += " QPS vs no cuts |"
		sep += "---:|"
	}
	hdr += " conns median (max) | dials/s | upstream TLS handshakes | CPU µs/q | RSS MB |"
	sep += "---:|---:|---:|---:|---:|"
	if slices.ContainsFunc(rows, func(s RegimeSummary) bool { return s.Mode == "dotforward" }) {
		hdr += " dotforward replays / read timeouts |"
		sep += "---:|"
	}
	fmt.Fprintln(w, hdr)
	fmt.Fprintln(w, sep)
	dotCol := strings.Contains(hdr, "replays")
	for _, s := range rows {
		line := "| " + modeShort(s.Mode) + " |"
		if churn {
			cut := "never"
			if s.CloseAfter > 0 {
				cut = fmt.Sprint(s.CloseAfter)
			}
			line += " " + cut + " |"
		}
		line += fmt.Sprintf(" %s | %d | %d | %d | %d | %s | %s |", num(s.QPS, 0), s.Sent, s.Lost, s.UDPDrops, s.NotNoerror, num(s.P50ms, 2), num(s.P99ms, 1))
		if split {
			line += fmt.Sprintf(" %s / %s | %s / %s |", num(float64(s.FastP50ms), 2), num(float64(s.FastP99ms), 1), num(float64(s.SlowP50ms), 1), num(float64(s.SlowP99ms), 1))
		}
		if churn {
			vs := "–"
			if s.CloseAfter > 0 {
				if b := findRegime(r.Summaries, reg, s.Mode, 0); b != nil {
					vs = num(100*(s.QPS/b.QPS-1), 1) + " %"
				}
			}
			line += " " + vs + " |"
		}
		hs := "–"
		if s.UpstreamHS >= 0 {
			hs = fmt.Sprint(s.UpstreamHS)
		}
		line += fmt.Sprintf(" %s (%d) | %s | %s | %s | %s |", num(s.ConnsMedian, 0), s.ConnsMax, num(s.DialsPerSec, 1), hs, num(s.CPUus, 1), num(s.RSSMB, 0))
		if dotCol {
			if s.Mode == "dotforward" {
				line += fmt.Sprintf(" %d / %d |", s.Replays, s.Timeouts)
			} else {
				line += " – |"
			}
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "| target | dotforward | limit | result |\n|---|---:|---:|---|\n")
	for _, t := range r.Targets {
		if t.Regime != reg {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s %s | %s |\n", t.Name, num(float64(t.Value), 2), t.Op, num(float64(t.Limit), 2), targetResult(t))
	}
	fmt.Fprintln(w)
}

func writeRegimeRuns(w io.Writer, runs []RegimeRun) {
	fmt.Fprintf(w, "<details><summary>Every run</summary>\n\n")
	fmt.Fprintf(w, "| regime | mode | cut after | round | offered | QPS | sent | completed | lost | not NOERROR | p50 ms | p99 ms | conn samples | dials | run s |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, r := range runs {
		fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %s | %d | %d | %d | %d | %s | %s | %s | %d | %s |\n",
			r.Regime, r.Mode, r.CloseAfter, r.Round, num(r.OfferedQPS, 0), num(r.QPS, 0), r.Sent, r.Completed, r.Lost, r.NotNoerror,
			num(r.P50ms, 3), num(r.P99ms, 3), r.ConnSamples, r.Dials, num(r.RunTime, 1))
	}
	fmt.Fprintf(w, "\n</details>\n")
}

// regimesSVG draws p50 and p99 per regime and mode on logarithmic axes (the
// figures span four decades).
func regimesSVG(r *RegimeResults) string {
	var p50, p99 []bar
	for _, reg := range regimeNames(r.Summaries) {
		cut := mainCut(r.Summaries, reg)
		for _, mode := range []string{"fwd-tls", "dotforward"} {
			s := findRegime(r.Summaries, reg, mode, cut)
			if s == nil {
				continue
			}
			l := reg + ": " + modeShort(mode)
			hl := mode == "dotforward"
			p50 = append(p50, bar{label: l, v: s.P50ms, lo: math.NaN(), hi: math.NaN(), highlight: hl})
			p99 = append(p99, bar{label: l, v: s.P99ms, lo: math.NaN(), hi: math.NaN(), highlight: hl})
		}
	}
	m := r.Machine
	subtitles := []string{fmt.Sprintf("%s CPUs, %s, kernel %s; one run per regime and mode, %s s each", m["nproc"], m["cpu"], m["kernel"], m["regime_seconds"])}
	if r.Label != "" {
		subtitles = append([]string{r.Label}, subtitles...)
	}
	var b strings.Builder
	height := svgOpen(&b, len(p50), 10, "dotforward vs CoreDNS forward tls:// per kind of upstream (issue 14)", subtitles...)
	barPanel(&b, chartLeftPad, "p50 latency, ms (log scale)", p50, " ms", 2, true)
	barPanel(&b, chartLeftPad+chartPanelW+30, "p99 latency, ms (log scale)", p99, " ms", 1, true)
	svgClose(&b, height, "Latencies of answered queries (dnsperf -v); lost queries are counted in regimes.md. Same offered load for both modes of a regime.")
	return b.String()
}
