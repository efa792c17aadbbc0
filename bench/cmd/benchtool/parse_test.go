package main

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// sample is dnsperf 2.10 -v output, shortened: four answers, one lost query.
const sample = `DNS Performance Testing Tool
Version 2.10.0

[Status] Command line: dnsperf -s 127.0.0.1 -p 25310 -d q.txt -c 20 -q 200 -l 3 -v
[Status] Sending queries (to 127.0.0.1:25310)
> NOERROR q000001.bench.test A 0.000400
> NOERROR q000002.bench.test A 0.000100
> SERVFAIL q000003.bench.test A 0.000300
> T q000004.bench.test A
> NOERROR q000005.bench.test A 0.000200
[Status] Testing complete (time limit)

Statistics:

  Queries sent:         5
  Queries completed:    4 (80.00%)
  Queries lost:         1 (20.00%)

  Response codes:       NOERROR 3 (75.00%), SERVFAIL 1 (25.00%)
  Average packet size:  request 36, response 52
  Run time (s):         3.000957
  Queries per second:   1.332908

  Average Latency (s):  0.000250 (min 0.000100, max 0.000400)
  Latency StdDev (s):   0.000129
`

func TestParseDnsperf(t *testing.T) {
	st, err := parseDnsperf(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	rec := st.record()
	want := map[string]float64{
		"sent": 5, "completed": 4, "lost": 1, "not_noerror": 1, "latency_samples": 4,
		"qps": 1.332908, "p50_ms": 0.2, "p99_ms": 0.4, "p999_ms": 0.4, "avg_ms": 0.25,
	}
	for k, v := range want {
		got, ok := rec[k].(float64)
		if !ok || math.Abs(got-v) > 1e-9 {
			t.Errorf("Record %s = %v, want %v", k, rec[k], v)
		}
	}
}

func TestParseDnsperfWithoutStatistics(t *testing.T) {
	_, err := parseDnsperf(strings.NewReader("> NOERROR a.bench.test A 0.001\n"))
	if !errors.Is(err, errNoStats) {
		t.Fatalf("Got %v, want errNoStats", err)
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {99, 10}, {10, 1}, {100, 10}, {0, 1}} {
		if got := percentile(v, c.p); got != c.want {
			t.Errorf("Percentile %v = %v, want %v", c.p, got, c.want)
		}
	}
	var k []float64
	for i := range 1000 {
		k = append(k, float64(i+1))
	}
	for _, c := range []struct{ p, want float64 }{{99.9, 999}, {99, 990}, {50, 500}, {99.95, 1000}} {
		if got := percentile(k, c.p); got != c.want {
			t.Errorf("Percentile %v of 1..1000 = %v, want %v", c.p, got, c.want)
		}
	}
}

func TestCPUPerQuery(t *testing.T) {
	rec := map[string]any{"cpu_ticks": 150.0, "clk_tck": 100.0, "completed": 100000.0,
		"upstream_cpu_ticks": 300.0, "run_time_s": 6.0}
	addCPU(rec)
	if got := rec["cpu_us_per_query"]; got != 15.0 {
		t.Errorf("cpu_us_per_query = %v, want 15", got)
	}
	if got := rec["upstream_cpu_util"]; got != 0.5 {
		t.Errorf("upstream_cpu_util = %v, want 0.5", got)
	}
}

func TestTargetsNeedMeasurements(t *testing.T) {
	runs := []Run{
		{Kind: "throughput", Mode: "fwd-udp", Round: 1, QPS: 1000, CPUusPerQuery: 20},
		{Kind: "throughput", Mode: "dotforward", Round: 1, QPS: 1200, CPUusPerQuery: 14, ConnsMax: 2},
	}
	ss := summarize(runs)
	ts := targets(ss, throughputRatios(ss, runs))
	byName := map[string]Target{}
	for _, tg := range ts {
		byName[tg.Name] = tg
	}
	if tg := byName["QPS dotforward / forward UDP"]; !tg.Pass || math.Abs(float64(tg.Value)-1.2) > 1e-9 {
		t.Errorf("QPS ratio target = %+v, want 1.2 and a pass", tg)
	}
	if tg := byName["CPU per query dotforward / forward UDP"]; !tg.Pass {
		t.Errorf("CPU target = %+v, want a pass (0.7 <= 0.75)", tg)
	}
	if tg := byName["QPS dotforward / Unbound"]; tg.Pass || !math.IsNaN(float64(tg.Value)) {
		t.Errorf("Unmeasured target = %+v, want NaN and no pass", tg)
	}
}

func TestUnexplainedLoss(t *testing.T) {
	for _, c := range []struct {
		s    Summary
		want int64
	}{
		{Summary{Lost: 5, UDPDrops: 3, NotNoerror: 1}, 3},
		{Summary{Lost: 2, UDPDrops: 7}, 0},
		{Summary{Lost: 0, NotNoerror: 4}, 4},
	} {
		if got := unexplainedLoss(&c.s); got != c.want {
			t.Errorf("UnexplainedLoss(%+v) = %d, want %d", c.s, got, c.want)
		}
	}
}

func TestParseDnsperfSplit(t *testing.T) {
	in := strings.Replace(sample, "q000002.bench.test", "s000002.bench.test", 1)
	st, err := parseDnsperfSplit(strings.NewReader(in), "s")
	if err != nil {
		t.Fatal(err)
	}
	rec := st.record()
	want := map[string]float64{
		"latency_samples": 4, "slow_samples": 1, "fast_samples": 3,
		"slow_p50_ms": 0.1, "slow_p99_ms": 0.1, "fast_p50_ms": 0.3, "fast_p99_ms": 0.4,
	}
	for k, v := range want {
		got, ok := rec[k].(float64)
		if !ok || math.Abs(got-v) > 1e-9 {
			t.Errorf("Record %s = %v, want %v", k, rec[k], v)
		}
	}
	if _, ok := st.record()["slow_p50_ms"]; !ok {
		t.Error("record() twice lost the split")
	}
	plain, _ := parseDnsperf(strings.NewReader(in))
	if _, ok := plain.record()["fast_samples"]; ok {
		t.Error("Without a split prefix the record has fast_samples")
	}
}

// The coalescing and base-build ratios appear only when both of their modes ran,
// and then compare dotforward with them round by round.
func TestOptionalRatios(t *testing.T) {
	runs := []Run{
		{Kind: "throughput", Mode: "fwd-udp", Round: 1, QPS: 1000, CPUusPerQuery: 20},
		{Kind: "throughput", Mode: "dotforward", Round: 1, QPS: 1200, CPUusPerQuery: 14},
		{Kind: "throughput", Mode: "dotforward", Round: 2, QPS: 1300, CPUusPerQuery: 13},
	}
	names := func(rs []Ratio) map[string]Ratio {
		m := map[string]Ratio{}
		for _, r := range rs {
			m[r.Name] = r
		}
		return m
	}
	without := names(throughputRatios(summarize(runs), runs))
	if r, ok := without["QPS dotforward / dotforward no_coalesce"]; ok {
		t.Errorf("no_coalesce ratio without its mode: %+v", r)
	}
	if _, ok := without["QPS dotforward / Unbound"]; !ok {
		t.Error("the usual ratios must stay, measured or not")
	}
	runs = append(runs,
		Run{Kind: "throughput", Mode: "dotforward-nocoalesce", Round: 1, QPS: 1000, CPUusPerQuery: 14},
		Run{Kind: "throughput", Mode: "dotforward-nocoalesce", Round: 2, QPS: 1300, CPUusPerQuery: 13})
	with := names(throughputRatios(summarize(runs), runs))
	r, ok := with["QPS dotforward / dotforward no_coalesce"]
	if !ok {
		t.Fatal("no no_coalesce ratio with both modes")
	}
	if math.Abs(float64(r.Value)-1250.0/1150) > 1e-9 || float64(r.RoundMin) != 1 || math.Abs(float64(r.RoundMax)-1.2) > 1e-9 {
		t.Errorf("no_coalesce ratio = %+v, want 1250/1150 of the medians, rounds 1–1.2", r)
	}
	if _, ok := with["QPS dotforward / dotforward base build"]; ok {
		t.Error("base ratio without the base mode")
	}
}
