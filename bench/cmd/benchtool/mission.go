package main

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// The floor is CoreDNS's own cost of receiving, routing and answering a query:
// whoami, in the same Corefile and the same run as the modes it is the floor of
// (issue 24). The mission's modes (kind "mission", bench/phase_mission.sh) run
// behind errors, prometheus and cache, and their floor is whoami behind the same.

// missionPrefix starts the name of every mission mode (bench/conf/mission-*.Corefile).
const missionPrefix = "mission-"

// floorMode is the mode whose CPU per query is mode's floor.
func floorMode(mode string) string {
	if strings.HasPrefix(mode, missionPrefix) {
		return missionPrefix + "whoami"
	}
	return "whoami"
}

// addFloor sets every summary's CPU per query × its floor's, where the floor ran
// in the same kind of run (the latency phase runs whoami at the same offered
// rate: the floor at equal load); NaN where it did not.
func addFloor(ss []Summary) {
	for i := range ss {
		s := &ss[i]
		s.CPUxFloor = F(math.NaN())
		if f := find(ss, s.Kind, floorMode(s.Mode), s.CloseAfter); f != nil {
			s.CPUxFloor = F(ratio(s.CPUus, f.CPUus))
		}
	}
}

// missionRatios compares dotforward with forward in the mission's Corefile, as
// throughputRatios does for the bare one, round by round.
func missionRatios(ss []Summary, runs []Run) []Ratio {
	defs := []ratioDef{
		{"mission: QPS dotforward / forward UDP", "mission-dotforward", "mission-fwd-udp", false, false},
		{"mission: QPS dotforward / forward tls://", "mission-dotforward", "mission-fwd-tls", false, false},
		{"mission: CPU per query dotforward / forward UDP", "mission-dotforward", "mission-fwd-udp", true, false},
		{"mission: CPU per query dotforward / forward tls://", "mission-dotforward", "mission-fwd-tls", true, false},
		{"mission: CPU per query dotforward / whoami", "mission-dotforward", "mission-whoami", true, false},
		{"mission: CPU per query forward UDP / whoami", "mission-fwd-udp", "mission-whoami", true, false},
	}
	if find(ss, "mission", "mission-dotforward", 0) == nil {
		return nil
	}
	return ratiosOf("mission", defs, ss, runs)
}

// floorTargets are issue 24's: dotforward's CPU per query within 1.3× whoami's
// in the bare Corefile, and in the mission's at least 1.1× forward UDP's QPS at
// no more than 0.75× its CPU per query. Unmeasured (NaN) when a mode did not run.
func floorTargets(rs []Ratio) []Target {
	byName := map[string]F{}
	for _, r := range rs {
		byName[r.Name] = r.Value
	}
	value := func(name string) F {
		if v, ok := byName[name]; ok {
			return v
		}
		return F(math.NaN())
	}
	return []Target{
		{Name: "CPU per query dotforward / whoami", Value: value("CPU per query dotforward / whoami"), Op: "<=", Limit: 1.3},
		{Name: "mission: QPS dotforward / forward UDP", Value: value("mission: QPS dotforward / forward UDP"), Op: ">=", Limit: 1.1},
		{Name: "mission: CPU per query dotforward / forward UDP", Value: value("mission: CPU per query dotforward / forward UDP"), Op: "<=", Limit: 0.75},
	}
}

// writeMission is results.md's table of the mission's Corefile.
func writeMission(w io.Writer, ss []Summary, rs []Ratio) {
	rows := ofKind(ss, "mission")
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "## The mission's Corefile (errors, prometheus, cache 30, the forwarder)\n\n")
	fmt.Fprintf(w, "The Corefile users run (kubeadm's, without what only Kubernetes needs; bench/conf/mission-*.Corefile), "+
		"under the throughput load. The names cycle through ten times more names than the cache holds, so nearly "+
		"every query misses it: cache hits is the cache's hits over its lookups during the runs. × whoami: CPU per "+
		"query over that of whoami behind the same plugins, the floor of this Corefile.\n\n")
	fmt.Fprintf(w, "| mode | QPS | QPS range | lost | not NOERROR | p50 ms | p99 ms | CPU µs/query | × whoami | cache hits | upstream share |\n")
	fmt.Fprintf(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range rows {
		fmt.Fprintf(w, "| %s | %s | %s–%s | %d | %d | %s | %s | %s | %s | %s | %s |\n",
			label(s.Mode), num(s.QPS, 0), num(s.QPSMin, 0), num(s.QPSMax, 0), s.Lost, s.NotNoerror,
			num(s.P50ms, 2), num(s.P99ms, 2), num(s.CPUus, 1), num(float64(s.CPUxFloor), 2),
			pct(float64(s.CacheHitShare)), num(float64(s.UpstreamShare), 2))
	}
	fmt.Fprintln(w)
	writeRatios(w, rs)
}
