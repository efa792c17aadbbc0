package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
)

// kvFlags collects repeated -kv key=value flags.
type kvFlags map[string]string

func (k kvFlags) String() string { return fmt.Sprint(map[string]string(k)) }

func (k kvFlags) Set(s string) error {
	key, val, ok := strings.Cut(s, "=")
	if !ok || key == "" {
		return fmt.Errorf("-kv %q: want key=value", s)
	}
	k[key] = val
	return nil
}

// parseCmd reads one dnsperf -v output and prints one JSON record: dnsperf's
// statistics, latency percentiles from the per-query lines, and the -kv readings.
func parseCmd(args []string) error {
	fs := flag.NewFlagSet("parse", flag.ContinueOnError)
	in := fs.String("in", "", "dnsperf output (run with -v)")
	split := fs.String("split", "", "also give the percentiles of the names starting with this (slow_*) and of the others (fast_*) apart")
	kv := kvFlags{}
	fs.Var(kv, "kv", "key=value to add to the record (repeatable); numbers stay numbers")
	kvs := kvFlags{}
	fs.Var(kvs, "kvs", "key=value to add to the record as a string, even if it looks like a number (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := parseDnsperfSplit(f, *split)
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	rec := st.record()
	for k, v := range kv {
		if n, err := strconv.ParseFloat(v, 64); err == nil && !math.IsNaN(n) && !math.IsInf(n, 0) {
			rec[k] = n
		} else {
			rec[k] = v
		}
	}
	for k, v := range kvs {
		rec[k] = v
	}
	addCPU(rec)
	return json.NewEncoder(os.Stdout).Encode(rec)
}

// addCPU turns the CPU ticks the script read around the run into µs per query.
func addCPU(rec map[string]any) {
	ticks, ok1 := rec["cpu_ticks"].(float64)
	hz, ok2 := rec["clk_tck"].(float64)
	done, ok3 := rec["completed"].(float64)
	if ok1 && ok2 && ok3 && hz > 0 && done > 0 {
		rec["cpu_us_per_query"] = ticks / hz * 1e6 / done
	}
	// The upstream's CPU share of the run: 1.0 is one core busy all the time (the
	// upstream unbound has one thread, so near 1.0 it is the bottleneck).
	up, ok4 := rec["upstream_cpu_ticks"].(float64)
	secs, ok5 := rec["run_time_s"].(float64)
	if ok2 && ok4 && ok5 && hz > 0 && secs > 0 {
		rec["upstream_cpu_util"] = up / hz / secs
	}
}

// dnsperfStats is what one dnsperf run reported.
type dnsperfStats struct {
	sent, completed, lost int64
	qps, runTime, avgLat  float64
	rcodes                map[string]int64
	latencies             []float64 // seconds, one per answered query
	// With a split prefix: the latencies of the names starting with it (slow) and
	// of the others (fast).
	split      string
	slow, fast []float64
}

var errNoStats = errors.New("no dnsperf statistics found (did dnsperf run to the end?)")

func parseDnsperf(r io.Reader) (*dnsperfStats, error) { return parseDnsperfSplit(r, "") }

// parseDnsperfSplit also sorts the latencies into those of the names starting
// with split (case-insensitive) and the others, unless split is empty.
func parseDnsperfSplit(r io.Reader, split string) (*dnsperfStats, error) {
	st := &dnsperfStats{rcodes: map[string]int64{}, sent: -1, split: strings.ToLower(split)}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "> ") {
			// "> NOERROR q1.bench.test A 0.000102": rcode, name, type, latency (s).
			f := strings.Fields(line)
			if len(f) == 5 {
				if v, err := strconv.ParseFloat(f[4], 64); err == nil {
					st.latencies = append(st.latencies, v)
					switch {
					case st.split == "":
					case strings.HasPrefix(strings.ToLower(f[2]), st.split):
						st.slow = append(st.slow, v)
					default:
						st.fast = append(st.fast, v)
					}
				}
			}
			continue
		}
		key, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		val = strings.TrimSpace(val)
		first := strings.Fields(val)
		if len(first) == 0 {
			continue
		}
		switch key {
		case "Queries sent":
			st.sent, _ = strconv.ParseInt(first[0], 10, 64)
		case "Queries completed":
			st.completed, _ = strconv.ParseInt(first[0], 10, 64)
		case "Queries lost":
			st.lost, _ = strconv.ParseInt(first[0], 10, 64)
		case "Queries per second":
			st.qps, _ = strconv.ParseFloat(first[0], 64)
		case "Run time (s)":
			st.runTime, _ = strconv.ParseFloat(first[0], 64)
		case "Average Latency (s)":
			st.avgLat, _ = strconv.ParseFloat(first[0], 64)
		case "Response codes":
			// "NOERROR 1000 (100.00%), SERVFAIL 2 (0.00%)"
			for _, part := range strings.Split(val, ",") {
				p := strings.Fields(part)
				if len(p) >= 2 {
					n, _ := strconv.ParseInt(p[1], 10, 64)
					st.rcodes[p[0]] = n
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if st.sent < 0 {
		return nil, errNoStats
	}
	return st, nil
}

func (st *dnsperfStats) record() map[string]any {
	var notOK int64
	for rc, n := range st.rcodes {
		if rc != "NOERROR" {
			notOK += n
		}
	}
	rec := map[string]any{
		"sent": float64(st.sent), "completed": float64(st.completed), "lost": float64(st.lost),
		"qps": st.qps, "run_time_s": st.runTime, "avg_ms": st.avgLat * 1e3,
		"rcodes": st.rcodes, "not_noerror": float64(notOK),
		"latency_samples": float64(len(st.latencies)),
	}
	if len(st.latencies) > 0 {
		sort.Float64s(st.latencies)
		rec["p50_ms"] = percentile(st.latencies, 50) * 1e3
		rec["p99_ms"] = percentile(st.latencies, 99) * 1e3
	}
	if st.split != "" {
		for name, l := range map[string][]float64{"slow": st.slow, "fast": st.fast} {
			rec[name+"_samples"] = float64(len(l))
			if len(l) > 0 {
				sort.Float64s(l)
				rec[name+"_p50_ms"] = percentile(l, 50) * 1e3
				rec[name+"_p99_ms"] = percentile(l, 99) * 1e3
			}
		}
	}
	return rec
}

// percentile returns the nearest-rank p-th percentile of sorted values.
func percentile(sorted []float64, p float64) float64 {
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}
