package main

import (
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// HedgeRun is one measured run of the hedge phase (bench/run.sh phase_hedge):
// dotforward with policy sequential in front of upstream A, which answers 1 name
// in 20 after 300 ms, and upstream B, which answers every name at once, with one
// hedge setting.
type HedgeRun struct {
	Hedge      string  `json:"hedge"` // the hedge option's arguments; "off" without the option
	Round      int     `json:"round"`
	OfferedQPS float64 `json:"offered_qps"`
	Load       string  `json:"load"`

	Sent        int64   `json:"sent"`
	Completed   int64   `json:"completed"`
	Lost        int64   `json:"lost"`
	NotNoerror  int64   `json:"not_noerror"`
	QPS         float64 `json:"qps"`
	P50ms       float64 `json:"p50_ms"`
	P99ms       float64 `json:"p99_ms"`
	P999ms      float64 `json:"p999_ms"`
	SlowSamples int64   `json:"slow_samples"`
	SlowP50ms   float64 `json:"slow_p50_ms"`
	SlowP99ms   float64 `json:"slow_p99_ms"`
	FastP99ms   float64 `json:"fast_p99_ms"`

	AQueries        int64   `json:"a_queries"`        // queries upstream A received during the run (fakedot's count)
	BQueries        int64   `json:"b_queries"`        // queries upstream B received during the run
	Hedges          int64   `json:"hedges"`           // coredns_dotforward_hedges_total during the run
	WinsFirst       int64   `json:"wins_first"`       // hedge_wins_total{winner="first"}
	WinsHedge       int64   `json:"wins_hedge"`       // hedge_wins_total{winner="hedge"}
	BudgetExhausted int64   `json:"budget_exhausted"` // hedge_budget_exhausted_total
	LateDrops       int64   `json:"late_drops"`       // dropped_total{reason="late"}: abandoned exchanges' answers
	AutoDelayMs     float64 `json:"auto_delay_ms"`    // A's hedge_delay_seconds at the end of the run (ms)
	CPUusPerQuery   float64 `json:"cpu_us_per_query"`
	UDPRcvbufErrors int64   `json:"udp_rcvbuf_errors"`
}

// loss counts as regimeLoss does: no answer beyond the kernel's UDP drops, plus
// answers other than NOERROR.
func (r *HedgeRun) loss() int64 { return max(0, r.Lost-r.UDPRcvbufErrors) + r.NotNoerror }

// HedgeSummary aggregates the rounds of one hedge setting: medians of the
// percentiles (with the p99's range), totals of the counts.
type HedgeSummary struct {
	Hedge           string  `json:"hedge"`
	Rounds          int     `json:"rounds"`
	P50ms           float64 `json:"p50_ms_median"`
	P99ms           float64 `json:"p99_ms_median"`
	P99Min          float64 `json:"p99_ms_min"`
	P99Max          float64 `json:"p99_ms_max"`
	P999ms          float64 `json:"p999_ms_median"`
	SlowP50ms       float64 `json:"slow_p50_ms_median"`
	SlowP99ms       float64 `json:"slow_p99_ms_median"`
	FastP99ms       float64 `json:"fast_p99_ms_median"`
	Sent            int64   `json:"sent_total"`
	BQueries        int64   `json:"b_queries_total"`
	Hedges          int64   `json:"hedges_total"`
	WinsFirst       int64   `json:"wins_first_total"`
	WinsHedge       int64   `json:"wins_hedge_total"`
	BudgetExhausted int64   `json:"budget_exhausted_total"`
	LateDrops       int64   `json:"late_drops_total"`
	Loss            int64   `json:"lost_or_failed_total"`
	AutoDelayMs     F       `json:"auto_delay_ms_median"`
	CPUus           float64 `json:"cpu_us_per_query_median"`
}

// bShare is the share of all the queries sent that upstream B received.
func (s *HedgeSummary) bShare() float64 { return ratio(float64(s.BQueries), float64(s.Sent)) }

func summarizeHedge(runs []HedgeRun) []HedgeSummary {
	var order []string
	groups := map[string][]HedgeRun{}
	for _, r := range runs {
		if _, ok := groups[r.Hedge]; !ok {
			order = append(order, r.Hedge)
		}
		groups[r.Hedge] = append(groups[r.Hedge], r)
	}
	out := make([]HedgeSummary, 0, len(order))
	for _, h := range order {
		s := HedgeSummary{Hedge: h, Rounds: len(groups[h]), P99Min: math.Inf(1), P99Max: math.Inf(-1)}
		var p50, p99, p999, sp50, sp99, fp99, delay, cpu []float64
		for _, r := range groups[h] {
			p50, p99, p999 = append(p50, r.P50ms), append(p99, r.P99ms), append(p999, r.P999ms)
			sp50, sp99, fp99 = append(sp50, r.SlowP50ms), append(sp99, r.SlowP99ms), append(fp99, r.FastP99ms)
			cpu = append(cpu, r.CPUusPerQuery)
			if !math.IsNaN(r.AutoDelayMs) && r.AutoDelayMs >= 0 {
				delay = append(delay, r.AutoDelayMs)
			}
			s.P99Min, s.P99Max = math.Min(s.P99Min, r.P99ms), math.Max(s.P99Max, r.P99ms)
			s.Sent += r.Sent
			s.BQueries += r.BQueries
			s.Hedges += r.Hedges
			s.WinsFirst += r.WinsFirst
			s.WinsHedge += r.WinsHedge
			s.BudgetExhausted += r.BudgetExhausted
			s.LateDrops += r.LateDrops
			s.Loss += r.loss()
		}
		s.P50ms, s.P99ms, s.P999ms = median(p50), median(p99), median(p999)
		s.SlowP50ms, s.SlowP99ms, s.FastP99ms, s.CPUus = median(sp50), median(sp99), median(fp99), median(cpu)
		s.AutoDelayMs = F(math.NaN())
		if len(delay) > 0 {
			s.AutoDelayMs = F(median(delay))
		}
		out = append(out, s)
	}
	return out
}

// hedgeTarget is one of issue 16's targets for one hedge setting.
type hedgeTarget struct {
	Hedge string `json:"hedge"`
	Name  string `json:"name"`
	Value F      `json:"value"`
	Op    string `json:"op"`
	Limit F      `json:"limit"`
	Pass  bool   `json:"pass"`
}

// HedgeResults is bench/results/hedge.json.
type HedgeResults struct {
	Generated string            `json:"generated"`
	Machine   map[string]string `json:"machine"`
	Summaries []HedgeSummary    `json:"summaries"`
	Targets   []hedgeTarget     `json:"targets"`
	Runs      []HedgeRun        `json:"runs"`
}

// hedgeLimits are issue 16's targets per hedge setting: p99 (ms) and B's share.
var hedgeLimits = map[string]struct{ p99, share float64 }{
	"20ms": {50, 0.08},
	"auto": {100, 0.10},
}

func hedgeCmd(args []string) error {
	fs := flag.NewFlagSet("hedge", flag.ContinueOnError)
	in := fs.String("in", "", "hedge.jsonl written by run.sh")
	out := fs.String("out", "bench/results", "output directory")
	machine := fs.String("machine", "", "key=value lines describing the machine and the run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	res := HedgeResults{Generated: time.Now().UTC().Format(time.RFC3339)}
	var err error
	if res.Runs, err = readHedgeRuns(*in); err != nil {
		return err
	}
	if len(res.Runs) == 0 {
		return fmt.Errorf("%s: no runs", *in)
	}
	if res.Machine, err = readKV(*machine); err != nil {
		return err
	}
	res.Summaries = summarizeHedge(res.Runs)
	res.Targets = hedgeTargets(res.Summaries)
	var md strings.Builder
	writeHedge(&md, &res)
	return writeResults(*out, "hedge", res, md.String(), "hedge.svg", hedgeSVG(&res))
}

func readHedgeRuns(path string) ([]HedgeRun, error) {
	return readJSONL(path, func() HedgeRun { return HedgeRun{AutoDelayMs: math.NaN()} })
}

// hedgeTargets checks each setting with a target (hedge 20ms, hedge auto): its
// median p99 over the rounds, the share of all queries B received, and that
// nothing was lost in any round.
func hedgeTargets(ss []HedgeSummary) []hedgeTarget {
	var ts []hedgeTarget
	for _, r := range ss {
		lim, ok := hedgeLimits[r.Hedge]
		if !ok {
			continue
		}
		ts = append(ts,
			hedgeTarget{r.Hedge, "p99 ms (median of the rounds)", F(r.P99ms), "≤", F(lim.p99), r.P99ms <= lim.p99},
			hedgeTarget{r.Hedge, "share of queries at B", F(r.bShare()), "≤", F(lim.share), r.bShare() <= lim.share},
			hedgeTarget{r.Hedge, "lost or failed", F(float64(r.Loss)), "=", 0, r.Loss == 0})
	}
	return ts
}

func hedgeLabel(h string) string {
	if h == "off" {
		return "no hedging"
	}
	return "hedge " + h
}

func writeHedge(w io.Writer, r *HedgeResults) {
	m := r.Machine
	fmt.Fprintf(w, "# Hedged queries against a slow tail (issue 16)\n\n")
	fmt.Fprintf(w, "Generated %s by bench/run.sh, phase `hedge` (`make bench-hedge`). Machine: %s CPUs (%s), kernel %s, %s; %s; %s.",
		r.Generated, m["nproc"], m["cpu"], m["kernel"], m["go"], m["coredns"], m["dnsperf"])
	if m["loadavg_start"] != "" {
		fmt.Fprintf(w, " Load average (1, 5, 15 min) at the phase's start: %s; at its end: %s.", m["loadavg_start"], m["loadavg_end"])
	}
	fmt.Fprintf(w, "\n\nCoreDNS with `dotforward . A B { policy sequential; hedge … }` in front of two bench/cmd/fakedot upstreams "+
		"on 127.0.0.1: **A** answers the names starting with `s` after 300 ms (`-delay 300ms -delay-prefix s`; every 20th name of the "+
		"query file is one: 5 %% of the queries), **B** answers every name at once. Load: `dnsperf %s`, after a %s s warm-up "+
		"(not recorded; it also warms `hedge auto`'s estimate). The upstreams and CoreDNS start afresh for each run; the settings "+
		"alternate in rotated order over %d rounds. The machine is shared with other work: compare the settings within this run "+
		"(ratios), not the absolute figures.\n\n", r.Runs[0].Load, m["warmup"], r.Summaries[0].Rounds)
	fmt.Fprintf(w, "![p50, p99 and p99.9 and B's share per hedge setting](hedge.svg)\n\n")
	fmt.Fprintf(w, "| setting | p50 ms | p99 ms (range) | p99.9 ms | slow names p50 / p99 ms | fast names p99 ms | p99 vs no hedging | "+
		"queries at B | hedges sent | won by hedge / first | refused (budget) | late answers dropped | auto delay | lost+failed | CPU µs/q |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var off *HedgeSummary
	for i := range r.Summaries {
		if r.Summaries[i].Hedge == "off" {
			off = &r.Summaries[i]
		}
	}
	for _, x := range r.Summaries {
		vs := "–"
		if off != nil && x.Hedge != "off" && x.P99ms > 0 {
			vs = num(off.P99ms/x.P99ms, 1) + "× lower"
		}
		delay := "–"
		if !math.IsNaN(float64(x.AutoDelayMs)) {
			delay = num(float64(x.AutoDelayMs), 1) + " ms"
		}
		fmt.Fprintf(w, "| %s | %s | %s (%s–%s) | %s | %s / %s | %s | %s | %d (%s) | %d (%s) | %d / %d | %d | %d | %s | %d | %s |\n",
			hedgeLabel(x.Hedge), num(x.P50ms, 2), num(x.P99ms, 1), num(x.P99Min, 1), num(x.P99Max, 1), num(x.P999ms, 1),
			num(x.SlowP50ms, 1), num(x.SlowP99ms, 1), num(x.FastP99ms, 1), vs, x.BQueries, pct(x.bShare()),
			x.Hedges, pct(ratio(float64(x.Hedges), float64(x.Sent))), x.WinsHedge, x.WinsFirst, x.BudgetExhausted, x.LateDrops,
			delay, x.Loss, num(x.CPUus, 1))
	}
	fmt.Fprintf(w, "\nPercentiles are nearest-rank over the answered queries of a run (dnsperf `-v`'s line per answer), then the median "+
		"of the rounds (the p99's range across rounds in brackets); *slow names* are the names A holds back, *fast names* the others. "+
		"Counts are totals over the rounds. *queries at B* is fakedot B's own count during the runs, over the queries dnsperf sent. "+
		"*hedges sent* is `coredns_dotforward_hedges_total`, *won by* `hedge_wins_total` by winner, *refused* "+
		"`hedge_budget_exhausted_total`, *late answers dropped* `dropped_total{reason=\"late\"}` (the abandoned exchanges' "+
		"answers, whose IDs stayed reserved until then), *auto delay* A's `hedge_delay_seconds` at the end of a run. "+
		"*lost+failed*: queries unanswered beyond the kernel's UDP drops, plus answers other than NOERROR.\n\n")
	fmt.Fprintf(w, "## Targets (issue 16)\n\n| setting | target | measured | limit | result |\n|---|---|---:|---:|---|\n")
	for _, t := range r.Targets {
		res := "pass"
		if !t.Pass {
			res = "**FAIL**"
		}
		v, l := num(float64(t.Value), 1), num(float64(t.Limit), 1)
		if strings.HasPrefix(t.Name, "share") {
			v, l = pct(float64(t.Value)), pct(float64(t.Limit))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s %s | %s |\n", hedgeLabel(t.Hedge), t.Name, v, t.Op, l, res)
	}
	fmt.Fprintf(w, "\n<details><summary>Every run</summary>\n\n")
	fmt.Fprintf(w, "| round | setting | sent | p50 ms | p99 ms | p99.9 ms | slow p99 ms | fast p99 ms | at B | hedges | refused | lost+failed |\n")
	fmt.Fprintf(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, x := range r.Runs {
		fmt.Fprintf(w, "| %d | %s | %d | %s | %s | %s | %s | %s | %d | %d | %d | %d |\n", x.Round, hedgeLabel(x.Hedge), x.Sent,
			num(x.P50ms, 2), num(x.P99ms, 1), num(x.P999ms, 1), num(x.SlowP99ms, 1), num(x.FastP99ms, 1), x.BQueries, x.Hedges,
			x.BudgetExhausted, x.loss())
	}
	fmt.Fprintf(w, "\n</details>\n")
}

// hedgeSVG draws p50, p99 and p99.9 per setting (log scale) and B's share.
func hedgeSVG(r *HedgeResults) string {
	var lat, share []bar
	for _, x := range r.Summaries {
		hl := x.Hedge != "off"
		for _, p := range []struct {
			name string
			v    float64
		}{{"p50", x.P50ms}, {"p99", x.P99ms}, {"p99.9", x.P999ms}} {
			lat = append(lat, bar{label: hedgeLabel(x.Hedge) + ": " + p.name, v: p.v, lo: math.NaN(), hi: math.NaN(), highlight: hl})
		}
		share = append(share, bar{label: hedgeLabel(x.Hedge), v: 100 * x.bShare(), lo: math.NaN(), hi: math.NaN(), highlight: hl})
	}
	m := r.Machine
	var b strings.Builder
	height := svgOpen(&b, len(lat), 0, "dotforward hedge: 1 name in 20 answered after 300 ms by the first upstream (issue 16)",
		fmt.Sprintf("%s CPUs, %s, kernel %s; policy sequential; dnsperf %s; load average %s at the start", m["nproc"], m["cpu"], m["kernel"],
			r.Runs[0].Load, m["loadavg_start"]))
	barPanel(&b, chartLeftPad, "Latency percentiles, ms (log scale)", lat, " ms", 1, true)
	barPanel(&b, chartLeftPad+chartPanelW+30, "Share of the queries the second upstream got, %", share, " %", 1, false)
	svgClose(&b, height, "Medians of the rounds (settings interleaved) on a shared machine; compare the settings within the run.")
	return b.String()
}
