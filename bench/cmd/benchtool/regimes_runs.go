// Every run of a regime judged on its own: the regimes phase repeats each regime
// (BENCH_REGIME_RUNS), and a regime passes only if each of its runs does, since
// one bad run in five is a state the pool can fall into (issue 21), which a
// median of the runs would hide.

package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// RegimeRunVerdict is round Round of a regime: dotforward's run against forward's
// run of the same round, on issue 14's per-run targets.
type RegimeRunVerdict struct {
	Regime     string   `json:"regime"`
	Round      int      `json:"round"`
	DotQPS     float64  `json:"dotforward_qps"`
	FwdQPS     float64  `json:"forward_qps"`
	DotP50ms   float64  `json:"dotforward_p50_ms"`
	FwdP50ms   float64  `json:"forward_p50_ms"`
	DotP99ms   float64  `json:"dotforward_p99_ms"`
	FwdP99ms   float64  `json:"forward_p99_ms"`
	DotLoss    int64    `json:"dotforward_lost_or_failed"` // lost beyond kernel UDP drops, plus not NOERROR
	DotConns   int      `json:"dotforward_conns_max"`
	FwdConns   int      `json:"forward_conns_max"`
	Pass       bool     `json:"pass"`
	FailedWhat []string `json:"failed,omitempty"`
}

// runLoss is regimeLoss for one run.
func runLoss(r *RegimeRun) int64 { return max(0, r.Lost-r.UDPRcvbufErrors) + r.NotNoerror }

// regimeRunVerdicts pairs every dotforward run with forward's run of the same
// regime, churn setting (the main one, see mainCut) and round, and checks the
// targets: answers ≥ 0.98 × forward's, nothing lost, p50 ≤ forward's + 1 ms,
// p99 ≤ 1.2 × forward's + 5 ms. A round without forward's run fails.
func regimeRunVerdicts(ss []RegimeSummary, runs []RegimeRun) []RegimeRunVerdict {
	var out []RegimeRunVerdict
	for _, reg := range regimeNames(ss) {
		cut := mainCut(ss, reg)
		for i := range runs {
			d := &runs[i]
			if d.Regime != reg || d.Mode != "dotforward" || d.CloseAfter != cut {
				continue
			}
			j := slices.IndexFunc(runs, func(f RegimeRun) bool {
				return f.Regime == reg && f.Mode == "fwd-tls" && f.CloseAfter == cut && f.Round == d.Round
			})
			out = append(out, judgeRun(d, runs, j))
		}
	}
	return out
}

// judgeRun checks dotforward's run d against forward's runs[j] (j < 0: none).
func judgeRun(d *RegimeRun, runs []RegimeRun, j int) RegimeRunVerdict {
	v := RegimeRunVerdict{Regime: d.Regime, Round: d.Round, DotQPS: d.QPS, DotP50ms: d.P50ms, DotP99ms: d.P99ms,
		DotLoss: runLoss(d), DotConns: d.ConnsMax}
	if j < 0 {
		v.FailedWhat = []string{"forward tls:// did not run this round"}
		return v
	}
	f := &runs[j]
	v.FwdQPS, v.FwdP50ms, v.FwdP99ms, v.FwdConns = f.QPS, f.P50ms, f.P99ms, f.ConnsMax
	check := func(ok bool, what string) {
		if !ok {
			v.FailedWhat = append(v.FailedWhat, what)
		}
	}
	check(d.QPS >= 0.98*f.QPS, "answers < 0.98 × forward's")
	check(v.DotLoss == 0, "lost or failed queries")
	check(d.P50ms <= f.P50ms+1, "p50 > forward's + 1 ms")
	check(d.P99ms <= 1.2*f.P99ms+5, "p99 > 1.2 × forward's + 5 ms")
	v.Pass = len(v.FailedWhat) == 0
	return v
}

// runsPassed is "k of n": the runs of regime that passed, of those judged.
func runsPassed(vs []RegimeRunVerdict, regime string) (string, bool) {
	k, n := 0, 0
	for _, v := range vs {
		if v.Regime == regime {
			n++
			if v.Pass {
				k++
			}
		}
	}
	return fmt.Sprintf("%d of %d", k, n), n > 0 && k == n
}

// writeRegimeRunVerdicts is the table of every run's verdict, round by round.
func writeRegimeRunVerdicts(w io.Writer, vs []RegimeRunVerdict) {
	fmt.Fprintf(w, "## Every run against forward's run of the same round\n\n")
	fmt.Fprintf(w, "Per-run targets: answers ≥ 0.98 × forward's, nothing lost (beyond kernel UDP drops) or failed, "+
		"p50 ≤ forward's + 1 ms, p99 ≤ 1.2 × forward's + 5 ms. A regime passes only if every one of its runs does.\n\n")
	fmt.Fprintf(w, "| regime | round | QPS dotforward / forward | p50 ms dotforward / forward | p99 ms dotforward / forward | "+
		"conns max dotforward / forward | lost+failed dotforward | result | failed |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, v := range vs {
		res := "PASS"
		if !v.Pass {
			res = "**FAIL**"
		}
		fmt.Fprintf(w, "| %s | %d | %s / %s | %s / %s | %s / %s | %d / %d | %d | %s | %s |\n", v.Regime, v.Round,
			num(v.DotQPS, 0), num(v.FwdQPS, 0), num(v.DotP50ms, 2), num(v.FwdP50ms, 2), num(v.DotP99ms, 1), num(v.FwdP99ms, 1),
			v.DotConns, v.FwdConns, v.DotLoss, res, strings.Join(v.FailedWhat, "; "))
	}
	fmt.Fprintln(w)
}
