// The regimes phase's report: regimes.md, one section per regime, and its chart.

package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

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
	fmt.Fprintf(w, "The figures are the medians of the runs (losses their sum); a regime passes only if its medians "+
		"and every one of its runs pass (*runs passed*, each run below).\n\n")
	fmt.Fprintf(w, "| regime | offered | QPS dotforward / forward | p50 ms dotforward / forward | p99 ms dotforward / forward | conns dotforward / forward | lost+failed dotforward | runs passed | verdict | failed targets |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, reg := range regimeNames(r.Summaries) {
		cut := mainCut(r.Summaries, reg)
		d, f := findRegime(r.Summaries, reg, "dotforward", cut), findRegime(r.Summaries, reg, "fwd-tls", cut)
		v, failed := regimeVerdict(r.Targets, reg)
		passed, all := runsPassed(r.Verdicts, reg)
		if !all {
			v, failed = "FAIL", append(failed, "runs passed "+passed)
		}
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
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", reg, offered,
			pair(func(s *RegimeSummary) float64 { return s.QPS }, 0),
			pair(func(s *RegimeSummary) float64 { return s.P50ms }, 2),
			pair(func(s *RegimeSummary) float64 { return s.P99ms }, 1),
			pair(func(s *RegimeSummary) float64 { return float64(s.ConnsMax) }, 0),
			lost, passed, v, strings.Join(failed, "; "))
	}
	fmt.Fprintln(w)
	writeRegimeRunVerdicts(w, r.Verdicts)

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
	subtitles := []string{fmt.Sprintf("%s CPUs, %s, kernel %s; medians of the runs of each regime and mode, %s s each", m["nproc"], m["cpu"], m["kernel"], m["regime_seconds"])}
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
