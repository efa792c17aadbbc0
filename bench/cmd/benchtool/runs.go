package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
)

// Run is one measured dnsperf run, as bench/run.sh records it.
type Run struct {
	Kind       string  `json:"kind"` // throughput, latency, churn or mission
	Mode       string  `json:"mode"` // whoami, fwd-udp, fwd-tls, dotforward, unbound
	Round      int     `json:"round"`
	CloseAfter int     `json:"close_after"` // churn: the fake upstream's answers per connection, 0 = no churn
	OfferedQPS float64 `json:"offered_qps"` // latency: dnsperf -Q

	Sent       int64            `json:"sent"`
	Completed  int64            `json:"completed"`
	Lost       int64            `json:"lost"`
	NotNoerror int64            `json:"not_noerror"`
	Rcodes     map[string]int64 `json:"rcodes"`
	QPS        float64          `json:"qps"`
	P50ms      float64          `json:"p50_ms"`
	P99ms      float64          `json:"p99_ms"`
	AvgMs      float64          `json:"avg_ms"`

	CPUusPerQuery float64 `json:"cpu_us_per_query"` // the forwarding process, user+system
	RSSkB         int64   `json:"rss_kb"`           // its VmHWM at the end of the run
	ConnsMid      int     `json:"conns_mid"`        // established upstream connections half-way
	ConnsMax      int     `json:"conns_max"`        // the most seen in 3 samples

	ReadSyscalls    int64 `json:"read_syscalls"`     // read(2)-family syscalls of the forwarding process during the run
	WriteSyscalls   int64 `json:"write_syscalls"`    // write(2)-family ones (UDP sendmsg/recvmsg are not counted)
	UDPRcvbufErrors int64 `json:"udp_rcvbuf_errors"` // machine-wide kernel UDP drops (full receive buffer) during the run

	UpstreamCPUUtil    float64 `json:"upstream_cpu_util"`    // the upstream process's CPU time over the run's length (1 = one core)
	UpstreamQueries    int64   `json:"upstream_queries"`     // queries the upstream counted during the run
	ForwarderQueries   int64   `json:"forwarder_queries"`    // unbound mode: queries the forwarder counted
	ForwarderCacheHits int64   `json:"forwarder_cache_hits"` // unbound mode: its cache hits (want 0)

	Handshakes       int64 `json:"handshakes"`        // churn: TLS handshakes the fake upstream completed
	Resumed          int64 `json:"resumed"`           // churn: of which resumed
	MetricHandshakes int64 `json:"metric_handshakes"` // churn, dotforward: coredns_dotforward_handshakes_total
	MetricResumed    int64 `json:"metric_resumed"`    // churn, dotforward: of which resumed="true"
	Replays          int64 `json:"replays"`           // churn, dotforward: coredns_dotforward_replays_total

	CacheHits   int64 `json:"cache_hits"`   // mission: coredns_cache_hits_total during the run
	CacheMisses int64 `json:"cache_misses"` // mission: coredns_cache_misses_total during the run
}

func readRuns(path string) ([]Run, error) {
	return readJSONL(path, func() Run { return Run{} })
}

// readJSONL reads one T per line of path, each starting from fresh() (which sets
// the fields a line may leave out to their "absent" values).
func readJSONL[T any](path string, fresh func() T) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var runs []T
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		r := fresh()
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		runs = append(runs, r)
	}
	return runs, sc.Err()
}

// writeResults writes a phase's results into dir as name.json (v), name.md and
// the chart file svgName.
func writeResults(dir, name string, v any, md, svgName, svg string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	j, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), append(j, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".md"), []byte(md), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, svgName), []byte(svg), 0o644)
}

// medianCmd prints the median of one field over the runs of one kind and mode,
// for run.sh to derive the latency run's offered rate from the throughput runs.
func medianCmd(args []string) error {
	fs := flag.NewFlagSet("median", flag.ContinueOnError)
	in := fs.String("in", "", "raw.jsonl")
	kind := fs.String("kind", "throughput", "run kind")
	mode := fs.String("mode", "", "mode")
	field := fs.String("field", "qps", "qps or cpu_us_per_query")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runs, err := readRuns(*in)
	if err != nil {
		return err
	}
	var vals []float64
	for _, r := range runs {
		if r.Kind != *kind || r.Mode != *mode {
			continue
		}
		switch *field {
		case "qps":
			vals = append(vals, r.QPS)
		case "cpu_us_per_query":
			vals = append(vals, r.CPUusPerQuery)
		default:
			return fmt.Errorf("field %q: want qps or cpu_us_per_query", *field)
		}
	}
	if len(vals) == 0 {
		return fmt.Errorf("no %s runs of mode %q in %s", *kind, *mode, *in)
	}
	fmt.Printf("%.0f\n", median(vals))
	return nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
