# bench/phase_mission.sh, sourced by bench/run.sh: the phase "mission" (issue 24).
#
# The Corefile users run, not a bare forwarder: errors, prometheus, cache 30 and
# the forwarding plugin (bench/conf/mission-*.Corefile), with whoami behind the
# same plugins as the floor. Each of BENCH_MISSION_MODES runs under the
# throughput load, BENCH_ROUNDS interleaved rounds, as kind "mission" in
# raw.jsonl; results.md gets its table (QPS, CPU per query, × whoami). The query
# names cycle through BENCH_NAMES (100,000) names, ten times the cache's 9,984
# entries, and the warm-up asks other names (wNNNNNN.bench.test), so nearly every
# query of a measured run misses the cache: the cache's own hits and misses
# during each run are recorded (cache_hits, cache_misses) to show it.

BENCH_MISSION_MODES=${BENCH_MISSION_MODES:-whoami fwd-udp fwd-tls dotforward}

phase_mission() {
	local r m
	"$COREDNS" -plugins | grep -Eq '(^|[ .])dotforward$' || die "phase mission needs a CoreDNS with dotforward ($COREDNS)"
	awk -v n="$BENCH_NAMES" -v z="$ZONE" 'BEGIN { for (i = 1; i <= n; i++) printf "w%06d.%s A\n", i, z }' >"$WORK/mission-warmup.txt"
	WARMUP_QUERIES=$WORK/mission-warmup.txt
	for ((r = 1; r <= BENCH_ROUNDS; r++)); do
		log "mission round $r/$BENCH_ROUNDS (errors, prometheus, cache, forwarder)"
		for m in $(rotated "$r" $BENCH_MISSION_MODES); do measure mission "mission-$m" "$r"; done
	done
	WARMUP_QUERIES=""
}

# measure_begin KIND MODE, called by measure just before a measured run: the
# cache's counters of a mission run, as words for measure_end.
measure_begin() {
	[ "$1" = mission ] || return 0
	echo "$(metric_sum coredns_cache_hits_total) $(metric_sum coredns_cache_misses_total)"
}

# measure_end KIND MODE [HITS0 MISSES0], called by measure just after the run:
# benchtool parse arguments with the cache's hits and misses during the run.
measure_end() {
	[ "$1" = mission ] || return 0
	echo "-kv cache_hits=$(($(metric_sum coredns_cache_hits_total) - $3))"
	echo "-kv cache_misses=$(($(metric_sum coredns_cache_misses_total) - $4))"
}
