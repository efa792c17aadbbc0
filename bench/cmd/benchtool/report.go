package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
)

// F is a float64 that is null in JSON when it is not a number (not measured).
type F float64

// MarshalJSON writes NaN and infinities as null, which encoding/json refuses.
func (f F) MarshalJSON() ([]byte, error) {
	v := float64(f)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, v, 'g', 6, 64), nil
}

// Results is bench/results/results.json.
type Results struct {
	Generated string            `json:"generated"`
	Machine   map[string]string `json:"machine"`
	Summaries []Summary         `json:"summaries"`
	Ratios    []Ratio           `json:"ratios"`
	// MissionRatios are the mission phase's (the mission's Corefile), if it ran.
	MissionRatios []Ratio  `json:"mission_ratios"`
	Targets       []Target `json:"targets"`
	Runs          []Run    `json:"runs"`
	Micro         string   `json:"go_microbenchmarks,omitempty"`
}

func reportCmd(args []string) error {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	in := fs.String("in", "", "raw.jsonl written by run.sh")
	out := fs.String("out", "bench/results", "output directory")
	machine := fs.String("machine", "", "key=value lines describing the machine and the run")
	micro := fs.String("micro", "", "output of the Go micro-benchmarks")
	profile := fs.String("profile", "", "pprof -top of the dotforward mode")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runs, err := readRuns(*in)
	if err != nil {
		return err
	}
	res := Results{Generated: time.Now().UTC().Format(time.RFC3339), Runs: runs}
	if res.Machine, err = readKV(*machine); err != nil {
		return err
	}
	res.Micro = readOptional(*micro)
	res.Summaries = summarize(runs)
	res.Ratios = throughputRatios(res.Summaries, runs)
	res.MissionRatios = missionRatios(res.Summaries, runs)
	res.Targets = append(targets(res.Summaries, res.Ratios), floorTargets(append(res.Ratios, res.MissionRatios...))...)
	passes(res.Targets)
	var md strings.Builder
	writeMarkdown(&md, &res, readOptional(*profile))
	return writeResults(*out, "results", res, md.String(), "chart.svg", chartSVG(res.Summaries, res.Machine))
}

func readOptional(path string) string {
	if path == "" {
		return ""
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return string(b)
}

func readKV(path string) (map[string]string, error) {
	m := map[string]string{}
	if path == "" {
		return m, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = v
		}
	}
	return m, sc.Err()
}

func label(mode string) string {
	if l, ok := modeLabel[mode]; ok {
		return l
	}
	return mode
}

func num(v float64, prec int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "–"
	}
	return strconv.FormatFloat(v, 'f', prec, 64)
}

func writeMarkdown(w io.Writer, r *Results, profile string) {
	m := r.Machine
	fmt.Fprintf(w, "# dotforward benchmark results\n\n")
	fmt.Fprintf(w, "Generated %s by `make bench` (bench/run.sh). Machine: %s CPUs (%s), kernel %s, %s; %s; %s; %s.\n\n",
		r.Generated, m["nproc"], m["cpu"], m["kernel"], m["go"], m["coredns"], m["unbound"], m["dnsperf"])
	fmt.Fprintf(w, "Everything ran on this one machine over 127.0.0.1: dnsperf, the server under test and the "+
		"upstream (unbound, %s, answering every name under `%s` from local data over UDP and DoT). "+
		"Load: `dnsperf %s` over %s distinct names, %s rounds of %s s per mode, modes interleaved, "+
		"each after a %s s warm-up. Absolute figures vary from run to run and with what else the machine "+
		"does; **the claim is the ratios measured within one run**. Medians over the rounds; "+
		"QPS range is min–max.\n\n",
		m["upstream_threads"], m["zone"], m["dnsperf_args"], m["queries"], m["rounds"], m["seconds"], m["warmup"])

	writeVariants(w, r.Summaries, m)
	fmt.Fprintf(w, "![QPS and CPU per query per mode](chart.svg)\n\n")
	writeTargets(w, r.Targets)
	writeThroughput(w, r.Summaries, r.Ratios)
	writeLatency(w, r.Summaries)
	writeChurn(w, r.Summaries)
	writeMission(w, r.Summaries, r.MissionRatios)
	writeRounds(w, r.Runs)
	if r.Micro != "" {
		fmt.Fprintf(w, "## Go micro-benchmarks (`go test -run '^$' -bench . -benchmem ./dot/...`)\n\n```\n%s```\n\n", r.Micro)
	}
	if profile != "" {
		fmt.Fprintf(w, "## Where dotforward's CPU goes\n\nCPU profile of the CoreDNS process in dotforward mode under the same load "+
			"(a separate run, not one of the measured ones), from the `pprof` plugin, `go tool pprof -top`:\n\n```\n%s```\n", profile)
	}
}

// writeVariants says what the two other dotforward modes are, when they ran.
func writeVariants(w io.Writer, ss []Summary, m map[string]string) {
	if find(ss, "throughput", "dotforward-nocoalesce", 0) != nil {
		fmt.Fprintf(w, "*%s* is the same Corefile with `no_coalesce`: the names are distinct, so nothing merges, "+
			"and the pair measures what coalescing costs (issue 15).\n\n", label("dotforward-nocoalesce"))
	}
	if find(ss, "throughput", "dotforward-base", 0) != nil {
		fmt.Fprintf(w, "*%s* is dotforward's Corefile on another CoreDNS build, in the same run: %s.\n\n",
			label("dotforward-base"), m["base"])
	}
}

func writeTargets(w io.Writer, ts []Target) {
	fmt.Fprintf(w, "## Targets (issues 5 and 24)\n\n| target | measured | limit | result |\n|---|---:|---:|---|\n")
	for _, t := range ts {
		res := "FAIL"
		switch {
		case math.IsNaN(float64(t.Value)):
			res = "not measured"
		case t.Pass:
			res = "pass"
		}
		fmt.Fprintf(w, "| %s | %s | %s %s | %s |\n", t.Name, num(float64(t.Value), 2), t.Op, num(t.Limit, 2), res)
	}
	fmt.Fprintln(w)
}

func writeThroughput(w io.Writer, ss []Summary, rs []Ratio) {
	fmt.Fprintf(w, "## Throughput (dnsperf at full speed)\n\n")
	fmt.Fprintf(w, "CPU and RSS are the forwarding process's (CoreDNS, or the Unbound forwarder): user+system "+
		"CPU time from /proc over the run ÷ queries answered; RSS is its peak (VmHWM). Upstream conns: "+
		"established TCP connections to the DoT port half-way through the run (max of the rounds; in "+
		"brackets the most seen in three samples). Upstream share: the upstream's query counter over the "+
		"answered queries (1.00: every query was forwarded once). Lost: queries dnsperf got no answer to within 5 s; UDP drops counts "+
		"datagrams the kernel dropped machine-wide during the runs because a UDP socket's receive buffer was full "+
		"(RcvbufErrors, /proc/net/snmp): dnsperf→front and front→dnsperf, and for forward UDP also front↔upstream, so lost "+
		"queries matched by UDP drops were lost on the loopback, not by the forwarder. reads/q and writes/q: read(2) "+
		"and write(2) syscalls of the forwarding process per answered query (/proc/PID/io; the UDP front's "+
		"recvmsg/sendmsg are not counted there, so this is the upstream side: how well answers and queries are batched). Upstream CPU: the upstream unbound's "+
		"CPU time over the run's length (it has one thread: near 100 %% it is the bottleneck).\n\n")
	fmt.Fprintf(w, "| mode | QPS | QPS range | lost | UDP drops | not NOERROR | p50 ms | p99 ms | CPU µs/query | × whoami | RSS MB | upstream conns | upstream share | upstream CPU | reads/q | writes/q |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range ss {
		if s.Kind != "throughput" {
			continue
		}
		conns := "–"
		if !strings.HasPrefix(s.Mode, "whoami") && s.Mode != "fwd-udp" {
			conns = fmt.Sprintf("%d (%d)", s.ConnsMid, s.ConnsMax)
		}
		fmt.Fprintf(w, "| %s | %s | %s–%s | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			label(s.Mode), num(s.QPS, 0), num(s.QPSMin, 0), num(s.QPSMax, 0), s.Lost, s.UDPDrops, s.NotNoerror,
			num(s.P50ms, 2), num(s.P99ms, 2), num(s.CPUus, 1), num(float64(s.CPUxFloor), 2), num(s.RSSMB, 0), conns, num(float64(s.UpstreamShare), 2), pct(s.UpstreamCPU),
			num(float64(s.ReadsPerQuery), 2), num(float64(s.WritesPerQuery), 2))
	}
	fmt.Fprintln(w)
	if u := find(ss, "throughput", "unbound", 0); u != nil {
		fmt.Fprintf(w, "Unbound forwards rather than caches: its cache hits over all rounds: %d; the upstream counted %s queries per answered query.\n\n",
			u.ForwarderCacheHits, num(float64(u.UpstreamShare), 3))
	}
	writeRatios(w, rs)
}

// writeRatios is a table of ratios of medians, with their per-round ranges.
func writeRatios(w io.Writer, rs []Ratio) {
	fmt.Fprintf(w, "| ratio | of the medians | range of the per-round ratios |\n|---|---:|---:|\n")
	for _, r := range rs {
		rng := "–"
		if !math.IsNaN(float64(r.RoundMin)) {
			rng = num(float64(r.RoundMin), 2) + "–" + num(float64(r.RoundMax), 2)
		}
		fmt.Fprintf(w, "| %s | %s | %s |\n", r.Name, num(float64(r.Value), 2), rng)
	}
	fmt.Fprintln(w)
}

// ofKind returns the summaries of one kind of run (latency, churn, mission...).
func ofKind(ss []Summary, kind string) []Summary {
	var rows []Summary
	for _, s := range ss {
		if s.Kind == kind {
			rows = append(rows, s)
		}
	}
	return rows
}

func writeLatency(w io.Writer, ss []Summary) {
	rows := ofKind(ss, "latency")
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## Latency at a fixed offered rate (`dnsperf -Q %s`, half of forward UDP's median QPS)\n\n", num(rows[0].OfferedQPS, 0))
	fmt.Fprintf(w, "× whoami: CPU per query over whoami's at the same offered rate, the floor where every mode "+
		"answers as many queries a second. At full speed (the throughput table) whoami answers two or three times "+
		"as many as a forwarder, and what the runtime costs per second (its monitor thread, idle processors "+
		"woken by each packet) is spread over more queries.\n\n")
	fmt.Fprintf(w, "| mode | QPS | lost | UDP drops | not NOERROR | p50 ms | p99 ms | CPU µs/query | × whoami |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rows {
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %s | %s | %s | %s |\n", label(s.Mode), num(s.QPS, 0), s.Lost, s.UDPDrops, s.NotNoerror,
			num(s.P50ms, 3), num(s.P99ms, 3), num(s.CPUus, 1), num(float64(s.CPUxFloor), 2))
	}
	fmt.Fprintln(w)
}

func writeChurn(w io.Writer, ss []Summary) {
	rows := ofKind(ss, "churn")
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## Churn (upstream closes each connection after N answers)\n\n")
	fmt.Fprintf(w, "The upstream here is bench/cmd/fakedot (dot/dottest as a process), since no real server "+
		"can be told to close every connection after N answers; N = 0 is the same server without churn. "+
		"Handshakes and resumptions are the fake server's counters over the measured run (after warm-up, "+
		"so every one is a reconnect); dotforward's own `coredns_dotforward_handshakes_total` agrees "+
		"where shown.\n\n")
	fmt.Fprintf(w, "| mode | N | QPS | QPS vs no churn | lost | UDP drops | not NOERROR | p99 ms | CPU µs/query | handshakes / 1k queries | resumed | resumed (metrics) | replays |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rows {
		vs := "–"
		if s.CloseAfter > 0 {
			if base := find(ss, "churn", s.Mode, 0); base != nil {
				vs = num(100*(s.QPS/base.QPS-1), 1) + " %"
			}
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %d | %d | %d | %s | %s | %s | %s | %s | %d |\n", label(s.Mode), s.CloseAfter,
			num(s.QPS, 0), vs, s.Lost, s.UDPDrops, s.NotNoerror, num(s.P99ms, 2), num(s.CPUus, 1),
			num(float64(s.HandshakesPer1k), 2), pct(float64(s.ResumedShare)), pct(float64(s.MetricResumedShare)), s.Replays)
	}
	fmt.Fprintln(w)
}

func pct(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return num(100*v, 1) + " %"
}

func writeRounds(w io.Writer, runs []Run) {
	fmt.Fprintf(w, "<details><summary>Every run</summary>\n\n")
	fmt.Fprintf(w, "| kind | mode | N | round | QPS | sent | completed | lost | UDP drops | not NOERROR | p50 ms | p99 ms | CPU µs/q | RSS MB | conns mid/max | upstream q | handshakes | resumed |\n")
	fmt.Fprintf(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		fmt.Fprintf(w, "| %s | %s | %d | %d | %s | %d | %d | %d | %d | %d | %s | %s | %s | %s | %d/%d | %d | %d | %d |\n",
			r.Kind, r.Mode, r.CloseAfter, r.Round, num(r.QPS, 0), r.Sent, r.Completed, r.Lost, r.UDPRcvbufErrors, r.NotNoerror,
			num(r.P50ms, 3), num(r.P99ms, 3), num(r.CPUusPerQuery, 1), num(float64(r.RSSkB)/1024, 0),
			r.ConnsMid, r.ConnsMax, r.UpstreamQueries, r.Handshakes, r.Resumed)
	}
	fmt.Fprintf(w, "\n</details>\n\n")
}
