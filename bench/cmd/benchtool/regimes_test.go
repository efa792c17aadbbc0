package main

import (
	"math"
	"strings"
	"testing"
)

func regimeRun(regime, mode string, cut int, qps, p50, p99 float64, conns int) RegimeRun {
	return RegimeRun{Regime: regime, Mode: mode, CloseAfter: cut, QPS: qps, P50ms: p50, P99ms: p99,
		ConnsMax: conns, ConnsMedian: float64(conns), Completed: int64(qps * 10), Sent: int64(qps * 10), RunTime: 10, UpstreamHS: -1}
}

func TestRegimeTargets(t *testing.T) {
	runs := []RegimeRun{
		regimeRun("coredns-erratic", "fwd-tls", 0, 2000, 0.22, 301, 52),
		regimeRun("coredns-erratic", "dotforward", 0, 76, 1505, 3000, 4),
		regimeRun("unbound", "fwd-tls", 0, 3000, 0.22, 1, 100),
		regimeRun("unbound", "dotforward", 0, 3000, 0.25, 1.1, 1),
		regimeRun("churn", "fwd-tls", 100, 30000, 5, 10, 200),
		regimeRun("churn", "fwd-tls", 0, 36000, 5, 10, 200),
		regimeRun("churn", "dotforward", 100, 40000, 3, 8, 4),
		regimeRun("churn", "dotforward", 0, 60000, 3, 8, 4),
	}
	runs[1].Lost = 30
	ss := summarizeRegimes(runs)
	if got := regimeNames(ss); strings.Join(got, " ") != "coredns-erratic unbound churn" {
		t.Fatalf("regime order %v", got)
	}
	ts := regimeTargets(ss)
	pass := map[string]map[string]bool{}
	for _, x := range ts {
		if pass[x.Regime] == nil {
			pass[x.Regime] = map[string]bool{}
		}
		pass[x.Regime][x.Name] = x.Pass
	}
	if v, failed := regimeVerdict(ts, "coredns-erratic"); v != "FAIL" || len(failed) != 4 {
		t.Errorf("coredns-erratic: %s %v, want FAIL on QPS, p50, p99 and loss", v, failed)
	}
	if v, failed := regimeVerdict(ts, "unbound"); v != "PASS" {
		t.Errorf("unbound: %s %v, want PASS", v, failed)
	}
	// Churn costs forward 1/6 of its QPS and dotforward 1/3: that target fails.
	if v, failed := regimeVerdict(ts, "churn"); v != "FAIL" || len(failed) != 1 || !strings.Contains(failed[0], "cuts every 100") {
		t.Errorf("churn: %s %v, want FAIL on the cost of the cuts only", v, failed)
	}
	for _, x := range ts {
		if x.Regime == "churn" && strings.Contains(x.Name, "cuts") {
			if math.Abs(float64(x.Value)-1.0/3) > 1e-9 || math.Abs(float64(x.Limit)-1.0/6) > 1e-9 {
				t.Errorf("churn cost %v limit %v, want 1/3 and 1/6", x.Value, x.Limit)
			}
		}
	}
	var md strings.Builder
	writeRegimes(&md, &RegimeResults{Summaries: ss, Targets: ts, Runs: runs, Machine: map[string]string{}})
	for _, want := range []string{"## coredns-erratic", "| coredns-erratic | full speed | 76 / 2000 |", "**FAIL**", "QPS vs no cuts"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if svg := regimesSVG(&RegimeResults{Summaries: ss, Machine: map[string]string{}}); !strings.Contains(svg, "unbound: dotforward") || strings.Contains(svg, "NaN") {
		t.Errorf("chart lacks a bar or draws NaN:\n%s", svg)
	}
}
