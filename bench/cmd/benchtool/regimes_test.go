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

// Every run of a repeated regime is judged against forward's run of the same
// round, and one failing run fails the regime even when the medians pass (issue
// 21: one run in three fell into a state far worse than forward).
func TestRegimeRunVerdicts(t *testing.T) {
	var runs []RegimeRun
	for round := 1; round <= 3; round++ {
		f := regimeRun("inorder-distant", "fwd-tls", 0, 1993, 30.5, 33, 60)
		d := regimeRun("inorder-distant", "dotforward", 0, 1990, 30.9, 36, 58)
		f.Round, d.Round = round, round
		if round == 2 {
			d.QPS, d.P99ms = 145, 4200
		}
		runs = append(runs, f, d)
	}
	lone := regimeRun("slow-pipelining", "dotforward", 0, 250, 300.4, 302, 2)
	lone.Round = 1
	runs = append(runs, lone)

	ss := summarizeRegimes(runs)
	vs := regimeRunVerdicts(ss, runs)
	if len(vs) != 4 {
		t.Fatalf("%d verdicts, want one per dotforward run (4): %+v", len(vs), vs)
	}
	for _, v := range vs[:3] {
		if want := v.Round != 2; v.Pass != want {
			t.Errorf("inorder-distant round %d: pass %v (%v), want %v", v.Round, v.Pass, v.FailedWhat, want)
		}
	}
	if got := strings.Join(vs[1].FailedWhat, "; "); got != "answers < 0.98 × forward's; p99 > 1.2 × forward's + 5 ms" {
		t.Errorf("round 2 failed %q, want answers and p99", got)
	}
	// Losses count beyond the kernel's UDP drops of the run.
	d := runs[1]
	d.Lost, d.UDPRcvbufErrors = 5, 5
	if v := judgeRun(&d, runs, 0); !v.Pass {
		t.Errorf("5 lost with 5 kernel drops: %v, want a pass", v.FailedWhat)
	}
	d.Lost = 6
	if v := judgeRun(&d, runs, 0); v.Pass || v.FailedWhat[0] != "lost or failed queries" {
		t.Errorf("6 lost with 5 kernel drops: %v, want a failure for the loss", v.FailedWhat)
	}
	if vs[3].Pass || !strings.Contains(vs[3].FailedWhat[0], "did not run") {
		t.Errorf("a round without forward's run: %+v, want a failure saying so", vs[3])
	}
	if p, all := runsPassed(vs, "inorder-distant"); p != "2 of 3" || all {
		t.Errorf("runsPassed = %q, %v, want 2 of 3, false", p, all)
	}
	ts := regimeTargets(ss)
	if v, _ := regimeVerdict(ts, "inorder-distant"); v != "PASS" {
		t.Fatalf("medians' verdict %s, want PASS: the test needs the medians to hide the bad run", v)
	}
	var md strings.Builder
	writeRegimes(&md, &RegimeResults{Summaries: ss, Targets: ts, Verdicts: vs, Runs: runs, Machine: map[string]string{}})
	for _, want := range []string{
		"## Every run against forward's run of the same round",
		"| inorder-distant | 1 | 1990 / 1993 | 30.90 / 30.50 | 36.0 / 33.0 | 58 / 60 | 0 | PASS |",
		"| inorder-distant | 2 | 145 / 1993 |",
		"| 2 of 3 | **FAIL** | runs passed 2 of 3 |",
		"| inorder-distant | 3 | 1990 / 1993 |",
	} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, md.String())
		}
	}
}
