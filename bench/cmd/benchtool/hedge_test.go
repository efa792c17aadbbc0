package main

import (
	"strings"
	"testing"
)

func TestHedgeTargets(t *testing.T) {
	runs := []HedgeRun{
		{Hedge: "off", Sent: 20000, P99ms: 301, BQueries: 0},
		{Hedge: "20ms", Sent: 20000, P99ms: 22, BQueries: 1000},                               // 5 %: passes
		{Hedge: "auto", Sent: 20000, P99ms: 120, BQueries: 2400, Lost: 3, UDPRcvbufErrors: 1}, // p99, share and loss fail
	}
	ss := summarizeHedge(runs)
	ts := hedgeTargets(ss)
	if len(ts) != 6 {
		t.Fatalf("Expected 3 targets for each of 20ms and auto, got %d", len(ts))
	}
	for _, tc := range []struct {
		hedge, name string
		pass        bool
	}{
		{"20ms", "p99 ms (median of the rounds)", true}, {"20ms", "share of queries at B", true}, {"20ms", "lost or failed", true},
		{"auto", "p99 ms (median of the rounds)", false}, {"auto", "share of queries at B", false}, {"auto", "lost or failed", false},
	} {
		found := false
		for _, x := range ts {
			if x.Hedge == tc.hedge && x.Name == tc.name {
				found = true
				if x.Pass != tc.pass {
					t.Errorf("%s %s: pass %v, want %v (value %v)", tc.hedge, tc.name, x.Pass, tc.pass, x.Value)
				}
			}
		}
		if !found {
			t.Errorf("No target %s %s", tc.hedge, tc.name)
		}
	}
	res := &HedgeResults{Machine: map[string]string{}, Runs: runs, Summaries: ss, Targets: ts}
	var md strings.Builder
	writeHedge(&md, res)
	for _, want := range []string{"| no hedging |", "| hedge 20ms |", "13.7× lower", "1000 (5.0 %)", "**FAIL**"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("Expected %q in hedge.md, got\n%s", want, md.String())
		}
	}
	if svg := hedgeSVG(res); !strings.Contains(svg, "hedge auto: p99.9") {
		t.Error("Expected a p99.9 bar per setting in hedge.svg")
	}
}

func TestSummarizeHedgeRounds(t *testing.T) {
	runs := []HedgeRun{
		{Hedge: "off", Round: 1, Sent: 100, P99ms: 300},
		{Hedge: "20ms", Round: 1, Sent: 100, P99ms: 22, BQueries: 5, AutoDelayMs: -1},
		{Hedge: "20ms", Round: 2, Sent: 100, P99ms: 80, BQueries: 6, Lost: 1},
		{Hedge: "20ms", Round: 3, Sent: 100, P99ms: 30, BQueries: 4},
	}
	ss := summarizeHedge(runs)
	if len(ss) != 2 || ss[0].Hedge != "off" || ss[1].Hedge != "20ms" {
		t.Fatalf("Expected off then 20ms, got %+v", ss)
	}
	s := ss[1]
	if s.Rounds != 3 || s.P99ms != 30 || s.P99Min != 22 || s.P99Max != 80 || s.BQueries != 15 || s.Sent != 300 || s.Loss != 1 {
		t.Errorf("Expected 3 rounds, p99 median 30 (22–80), 15 of 300 at B, 1 lost; got %+v", s)
	}
	if s.bShare() != 0.05 {
		t.Errorf("Expected B's share 5 %%, got %v", s.bShare())
	}
}
