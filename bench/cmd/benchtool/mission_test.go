package main

import (
	"math"
	"strings"
	"testing"
)

// floorRuns: one run of the bare Corefile and one of the mission's per mode, and a
// latency run (which has no whoami). The mission's whoami costs more than the
// bare one, so a mode divided by the wrong floor shows.
func floorRuns() []Run {
	return []Run{
		{Kind: "throughput", Mode: "whoami", Round: 1, QPS: 3000, CPUusPerQuery: 20},
		{Kind: "throughput", Mode: "fwd-udp", Round: 1, QPS: 1000, CPUusPerQuery: 40},
		{Kind: "throughput", Mode: "dotforward", Round: 1, QPS: 1200, CPUusPerQuery: 25},
		{Kind: "latency", Mode: "dotforward", Round: 1, QPS: 500, CPUusPerQuery: 30},
		{Kind: "mission", Mode: "mission-whoami", Round: 1, QPS: 2000, CPUusPerQuery: 32, CacheHits: 0, CacheMisses: 100},
		{Kind: "mission", Mode: "mission-fwd-udp", Round: 1, QPS: 800, CPUusPerQuery: 64, CacheHits: 1, CacheMisses: 99},
		{Kind: "mission", Mode: "mission-dotforward", Round: 1, QPS: 1000, CPUusPerQuery: 40, CacheHits: 3, CacheMisses: 97},
	}
}

func near(got F, want float64) bool { return math.Abs(float64(got)-want) < 1e-9 }

// Every mode's CPU per query is divided by the whoami of its own kind of run.
func TestFloorColumn(t *testing.T) {
	ss := summarize(floorRuns())
	for _, c := range []struct {
		kind, mode string
		want       float64
	}{
		{"throughput", "whoami", 1},
		{"throughput", "dotforward", 1.25},
		{"throughput", "fwd-udp", 2},
		{"mission", "mission-dotforward", 1.25},
		{"mission", "mission-fwd-udp", 2},
	} {
		s := find(ss, c.kind, c.mode, 0)
		if s == nil || !near(s.CPUxFloor, c.want) {
			t.Errorf("%s %s: × whoami = %v, want %v", c.kind, c.mode, s, c.want)
		}
	}
	if s := find(ss, "latency", "dotforward", 0); s == nil || !math.IsNaN(float64(s.CPUxFloor)) {
		t.Errorf("latency dotforward: × whoami = %+v, want NaN (no whoami in that kind)", s)
	}
	if s := find(ss, "mission", "mission-dotforward", 0); !near(s.CacheHitShare, 0.03) {
		t.Errorf("cache hit share = %v, want 0.03", s.CacheHitShare)
	}
}

// The mission's ratios and issue 24's targets come from the mission's runs,
// not the bare Corefile's.
func TestMissionRatiosAndTargets(t *testing.T) {
	runs := floorRuns()
	ss := summarize(runs)
	rs := missionRatios(ss, runs)
	byName := map[string]Ratio{}
	for _, r := range rs {
		byName[r.Name] = r
	}
	if r := byName["mission: QPS dotforward / forward UDP"]; !near(r.Value, 1.25) || !near(r.RoundMin, 1.25) {
		t.Errorf("mission QPS ratio = %+v, want 1.25", r)
	}
	if r := byName["mission: CPU per query dotforward / forward UDP"]; !near(r.Value, 0.625) {
		t.Errorf("mission CPU ratio = %+v, want 0.625", r)
	}
	ts := floorTargets(append(throughputRatios(ss, runs), rs...))
	passes(ts)
	want := map[string]struct {
		v    float64
		pass bool
	}{
		"CPU per query dotforward / whoami":               {1.25, true},
		"mission: QPS dotforward / forward UDP":           {1.25, true},
		"mission: CPU per query dotforward / forward UDP": {0.625, true},
	}
	for _, tg := range ts {
		w, ok := want[tg.Name]
		if !ok || !near(tg.Value, w.v) || tg.Pass != w.pass {
			t.Errorf("target %+v, want %+v", tg, w)
		}
	}
	if got := missionRatios(summarize(runs[:3]), runs[:3]); got != nil {
		t.Errorf("mission ratios without mission runs: %+v", got)
	}
	bare := floorTargets(nil)
	passes(bare)
	for _, tg := range bare {
		if tg.Pass || !math.IsNaN(float64(tg.Value)) {
			t.Errorf("unmeasured target %+v, want NaN and no pass", tg)
		}
	}
}

func TestWriteMission(t *testing.T) {
	runs := floorRuns()
	ss := summarize(runs)
	var b strings.Builder
	writeMission(&b, ss, missionRatios(ss, runs))
	out := b.String()
	for _, want := range []string{
		"| dotforward behind errors, prometheus, cache | 1000 | 1000–1000 | 0 | 0 | 0.00 | 0.00 | 40.0 | 1.25 | 3.0 % | – |",
		"| mission: QPS dotforward / forward UDP | 1.25 | 1.25–1.25 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("mission table lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	writeThroughput(&b, ss, throughputRatios(ss, runs))
	if want := "| 25.0 | 1.25 |"; !strings.Contains(b.String(), want) {
		t.Errorf("throughput table lacks the × whoami column (%q):\n%s", want, b.String())
	}
}

// The latency phase runs whoami at the same offered rate as the forwarders: its
// table divides each mode's CPU per query by that whoami's, the floor at equal
// load, and by no other kind's.
func TestLatencyFloorColumn(t *testing.T) {
	runs := append(floorRuns(), Run{Kind: "latency", Mode: "whoami", Round: 1, QPS: 500, CPUusPerQuery: 40, OfferedQPS: 500})
	ss := summarize(runs)
	if s := find(ss, "latency", "dotforward", 0); s == nil || !near(s.CPUxFloor, 0.75) {
		t.Fatalf("latency dotforward: × whoami = %+v, want 0.75 (30 over the latency whoami's 40)", s)
	}
	var b strings.Builder
	writeLatency(&b, ss)
	if want := "| 30.0 | 0.75 |"; !strings.Contains(b.String(), want) {
		t.Errorf("latency table lacks the × whoami column (%q):\n%s", want, b.String())
	}
}

// whoami offered dotforward's own QPS in each round (whoami-paced) is the floor
// at dotforward's rate: the ratio pairs the runs of each round, and is left out
// of a run without it.
func TestPacedFloorRatio(t *testing.T) {
	runs := append(floorRuns(),
		Run{Kind: "throughput", Mode: "whoami-paced", Round: 1, QPS: 1200, CPUusPerQuery: 25 / 1.1, OfferedQPS: 1200},
		Run{Kind: "throughput", Mode: "dotforward", Round: 2, QPS: 1300, CPUusPerQuery: 26},
		Run{Kind: "throughput", Mode: "whoami-paced", Round: 2, QPS: 1300, CPUusPerQuery: 20, OfferedQPS: 1300})
	const name = "CPU per query dotforward / whoami at dotforward's QPS"
	var got *Ratio
	rs := throughputRatios(summarize(runs), runs)
	for i := range rs {
		if rs[i].Name == name {
			got = &rs[i]
		}
	}
	if got == nil || !near(got.RoundMin, 1.1) || !near(got.RoundMax, 1.3) {
		t.Fatalf("%s = %+v, want rounds 1.1 and 1.3", name, got)
	}
	for _, r := range throughputRatios(summarize(floorRuns()), floorRuns()) {
		if r.Name == name {
			t.Errorf("%s without whoami-paced runs: %+v, want it left out", name, r)
		}
	}
}
