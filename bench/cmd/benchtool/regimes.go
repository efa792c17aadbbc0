package main

import (
	"flag"
	"fmt"
	"math"
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

// regimeOrder is the order of the regimes in the report, as issues 14 and 21 list them.
var regimeOrder = []string{"coredns-erratic", "dnsdist-slow", "cut-slowtail", "unbound", "churn", "inorder-distant", "slow-pipelining"}

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
	Generated string             `json:"generated"`
	Label     string             `json:"label,omitempty"`
	Machine   map[string]string  `json:"machine"`
	Summaries []RegimeSummary    `json:"summaries"`
	Targets   []RegimeTarget     `json:"targets"`
	Verdicts  []RegimeRunVerdict `json:"run_verdicts"` // every round of every regime judged on its own
	Runs      []RegimeRun        `json:"runs"`
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
	res.Verdicts = regimeRunVerdicts(res.Summaries, runs)
	var md strings.Builder
	writeRegimes(&md, &res)
	return writeResults(*out, "regimes", res, md.String(), "regimes.svg", regimesSVG(&res))
}

func readRegimeRuns(path string) ([]RegimeRun, error) {
	return readJSONL(path, func() RegimeRun { return RegimeRun{UpstreamHS: -1} })
}

type regimeKey struct {
	regime, mode string
	closeAfter   int
}

func regimeRank(r string) int { return rankIn(regimeOrder, r) }

func summarizeRegimes(runs []RegimeRun) []RegimeSummary {
	groups, keys := groupBy(runs, func(r RegimeRun) regimeKey { return regimeKey{r.Regime, r.Mode, r.CloseAfter} })
	modeRank := func(m string) int { return rankIn(modeOrder, m) }
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
