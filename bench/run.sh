#!/usr/bin/env bash
# bench/run.sh (make bench): measures dotforward against CoreDNS forward (UDP and
# tls://) and Unbound's forward-tls-upstream, side by side in one run with dnsperf,
# all on 127.0.0.1, and writes bench/results/{results.md,results.json,chart.svg}.
#
# Phases: throughput (every mode, interleaved rounds), latency at a fixed offered
# rate, churn (an upstream closing each connection after N answers), regimes
# (forward tls:// and dotforward in front of upstreams unlike unbound), a CPU
# profile of the dotforward mode, and the Go micro-benchmarks of dot/.
#
# Knobs (environment):
#   BENCH_SECONDS=8     length of each measured dnsperf run
#   BENCH_ROUNDS=3      interleaved rounds per phase
#   BENCH_WARMUP=2      dnsperf warm-up before each measured run (not recorded)
#   BENCH_CLIENTS=20 BENCH_INFLIGHT=200   dnsperf -c and -q
#   BENCH_MODES="whoami fwd-udp fwd-tls dotforward dotforward-nocoalesce unbound"
#     (dotforward-nocoalesce: dotforward with no_coalesce, the cost of coalescing, issue 15)
#   BENCH_BASE_COREDNS=""  a second CoreDNS build with dotforward (for example an older
#     commit's make build): adds mode dotforward-base, the same Corefile on that binary,
#     so a change is measured against its base in one run; BENCH_BASE_LABEL names it
#   BENCH_PHASES="throughput latency churn mission regimes hedge fdlimit cluster profile micro"
#   BENCH_FDLIMIT_NOFILE=40 BENCH_FDLIMIT_QPS=1000 BENCH_FDLIMIT_SECONDS=8 BENCH_FDLIMIT_RUNS=5  (bench/phase_fdlimit.sh)
#   The cluster phase (issue 22, bench/phase_cluster.sh, make bench-cluster): the shipped cluster DNS Corefile on a real
#     API server under an 80/20 mix of cluster and outside names; its knobs are in that file
#   BENCH_LATENCY_QPS=""    the latency phase's offered rate; default half of forward UDP's
#     median throughput (which needs the throughput phase and mode fwd-udp)
#   BENCH_PROFILE_QPS=""    the profile phase's offered rate (default: as fast as it goes, the throughput load)
#   BENCH_CHURN_AFTER=100   answers per connection in the churn run
#   BENCH_CHURN_MODES="dotforward fwd-tls"  BENCH_PROFILE_MODES="dotforward"
#   BENCH_UNBOUND_THREADS=1 threads of the Unbound forwarder under test
#   BENCH_BLACKHOLE_QPS=10000 BENCH_BLACKHOLE_SECONDS=30   the opt-in blackhole phase
#   BENCH_REGIMES="coredns-erratic dnsdist-slow cut-slowtail unbound churn inorder-distant slow-pipelining"
#   BENCH_REGIME_RUNS=1      runs of each regime in a row (make bench-regimes: 5), each judged in regimes.md
#   BENCH_REGIME_SECONDS=10 BENCH_REGIME_WARMUP=2 BENCH_REGIME_CLIENTS=10 BENCH_REGIME_INFLIGHT=100
#   BENCH_DOTFORWARD_OPTS=""  extra lines for dotforward's block in the regimes (";" or newline between options)
#   BENCH_REGIMES_LABEL=""    a line at the top of regimes.md saying what the run is
#   BENCH_REGIME_MODES="fwd-tls dotforward"  the regimes' modes (one alone: to hunt a rare failure; regimes.md then judges nothing)
#   BENCH_KEEP_RUNS=""        non-empty: every regime run keeps its artefacts in $RESULTS/runs/ (a run that lost or failed queries always does)
#   BENCH_HEDGE_SETTINGS="off 20ms auto" BENCH_HEDGE_ROUNDS=3 BENCH_HEDGE_QPS=2000 BENCH_HEDGE_SECONDS=10
#   BENCH_HEDGE_WARMUP=3    the hedge phase's hedge settings ("_" for a space: auto_10), rounds, load, lengths
#   BENCH_PORT_BASE=25300   ports BASE+1..BASE+41 on 127.0.0.1
#   BENCH_COREDNS=./coredns BENCH_RESULTS=bench/results
# A quick smoke run: BENCH_SECONDS=3 BENCH_ROUNDS=1 BENCH_WARMUP=1 bash bench/run.sh
# The black hole (make bench-blackhole, BENCH_PHASES=blackhole): dotforward in front of
# an upstream that completes the TLS handshake and never answers, at a fixed rate;
# it writes bench/results/blackhole.md and leaves results.md alone.
# The regimes (make bench-regimes, BENCH_PHASES=regimes): forward tls:// and dotforward
# side by side in front of upstreams unlike unbound (issue 14): a slow tail behind a
# server that answers a connection's queries in order, dnsdist before a slow backend,
# an upstream cutting connections with a slow tail, unbound, and churn; it writes
# bench/results/regimes.{md,json,svg} and leaves results.md alone when run alone.
# The hedge phase (make bench-hedge, BENCH_PHASES=hedge): dotforward with policy
# sequential in front of an upstream that answers 1 name in 20 after 300 ms and one
# that answers at once, without hedging and with each hedge setting (issue 16); it
# writes bench/results/hedge.{md,json,svg}.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=bench/lib.sh
. bench/lib.sh
for phase_file in bench/phase_*.sh; do . "$phase_file"; done # phases and regimes kept in files of their own

BENCH_SECONDS=${BENCH_SECONDS:-8}
BENCH_ROUNDS=${BENCH_ROUNDS:-3}
BENCH_WARMUP=${BENCH_WARMUP:-2}
BENCH_CLIENTS=${BENCH_CLIENTS:-20}
BENCH_INFLIGHT=${BENCH_INFLIGHT:-200}
BENCH_MODES=${BENCH_MODES:-whoami fwd-udp fwd-tls dotforward dotforward-nocoalesce unbound}
BASE_COREDNS=${BENCH_BASE_COREDNS:-}
BASE_LABEL=${BENCH_BASE_LABEL:-$BASE_COREDNS}
if [ -n "$BASE_COREDNS" ] && [[ " $BENCH_MODES " != *" dotforward-base "* ]]; then
	BENCH_MODES="$BENCH_MODES dotforward-base"
fi
BENCH_PHASES=${BENCH_PHASES:-throughput latency churn mission regimes hedge fdlimit cluster profile micro}
BENCH_CHURN_AFTER=${BENCH_CHURN_AFTER:-100}
BENCH_CHURN_MODES=${BENCH_CHURN_MODES:-dotforward fwd-tls}
BENCH_PROFILE_MODES=${BENCH_PROFILE_MODES:-dotforward}
BENCH_BLACKHOLE_QPS=${BENCH_BLACKHOLE_QPS:-10000}
BENCH_BLACKHOLE_SECONDS=${BENCH_BLACKHOLE_SECONDS:-30}
BENCH_NAMES=${BENCH_NAMES:-100000}
BENCH_REGIMES=${BENCH_REGIMES:-coredns-erratic dnsdist-slow cut-slowtail unbound churn inorder-distant slow-pipelining}
BENCH_REGIME_SECONDS=${BENCH_REGIME_SECONDS:-10}
BENCH_REGIME_WARMUP=${BENCH_REGIME_WARMUP:-2}
BENCH_REGIME_CLIENTS=${BENCH_REGIME_CLIENTS:-10}
BENCH_REGIME_INFLIGHT=${BENCH_REGIME_INFLIGHT:-100}
BENCH_KEEP_RUNS=${BENCH_KEEP_RUNS:-}
BENCH_REGIME_MODES=${BENCH_REGIME_MODES:-fwd-tls dotforward}
BENCH_REGIMES_LABEL=${BENCH_REGIMES_LABEL:-}
BENCH_HEDGE_SETTINGS=${BENCH_HEDGE_SETTINGS:-off 20ms auto}
BENCH_HEDGE_ROUNDS=${BENCH_HEDGE_ROUNDS:-3}
BENCH_HEDGE_QPS=${BENCH_HEDGE_QPS:-2000}
BENCH_HEDGE_SECONDS=${BENCH_HEDGE_SECONDS:-10}
BENCH_HEDGE_WARMUP=${BENCH_HEDGE_WARMUP:-3}
# Options for dotforward's block in the regimes; ";" separates them like a newline.
DOTFORWARD_OPTS=$(printf '%s\n' "${BENCH_DOTFORWARD_OPTS:-}" | tr ';' '\n' | sed 's/^[[:space:]]*//; s/[[:space:]]*$//; /^$/d')
DOTFORWARD_OPTS=${DOTFORWARD_OPTS//$'\n'/$'\n\t\t'} # indented like the block's other lines
# The regimes' upstreams (issue 14's table).
ERRATIC_EVERY=20      # coredns-erratic: erratic holds back 1 query in 20 ...
ERRATIC_DELAY=300ms   # ... for 300 ms
BACKEND_DELAY=5ms     # dnsdist-slow: the backend answers every query after 5 ms
SLOW_EVERY=20         # cut-slowtail: 1 name in 20 is answered after ...
SLOW_DELAY=300ms      # ... 300 ms
SLOW_CUT=50           # ... and every connection is cut after 50 answers
UNBOUND_THREADS=${BENCH_UNBOUND_THREADS:-1}
BASE=${BENCH_PORT_BASE:-25300}
COREDNS=${BENCH_COREDNS:-$ROOT/coredns}
RESULTS=${BENCH_RESULTS:-$ROOT/bench/results}
WORK=$ROOT/bench/work

ZONE=bench.test
ANSWER=192.0.2.1
SERVER_NAME=bench.dot.test
UDP_PORT=$((BASE + 1))     # upstream, plain DNS (UDP and TCP)
DOT_PORT=$((BASE + 2))     # upstream, DoT
CTL_PORT=$((BASE + 3))     # upstream, unbound-control
FRONT_PORT=$((BASE + 10))  # CoreDNS under test
METRICS_PORT=$((BASE + 11)) # its prometheus endpoint (churn runs)
PPROF_PORT=$((BASE + 12))  # its pprof endpoint
FWD_PORT=$((BASE + 20))    # Unbound forwarder under test
FWD_CTL_PORT=$((BASE + 21))
FAKE_PORT=$((BASE + 30))   # fakedot (churn upstream)
FAKE_STATS_PORT=$((BASE + 31))
HEDGE_B_PORT=$((BASE + 32))       # the hedge phase's second upstream (fakedot, answering at once)
HEDGE_B_STATS_PORT=$((BASE + 33))
REG_DOT_PORT=$((BASE + 40))     # the regimes' DoT upstream (CoreDNS tls://, dnsdist)
REG_BACKEND_PORT=$((BASE + 41)) # dnsdist-slow's plain-DNS backend
METRICS_LINE=""
UPSTREAM_ADDR=127.0.0.1:$DOT_PORT
HEDGE_B_ADDR=127.0.0.1:$HEDGE_B_PORT
HEDGE_LINE="" # the hedge option of the hedge phase's dotforward block
CLK_TCK=$(getconf CLK_TCK)

has_phase() { [[ " $BENCH_PHASES " == *" $1 "* ]]; }
has_mode() { [[ " $BENCH_MODES " == *" $1 "* ]]; }

preflight() {
	local t missing=()
	for t in unbound unbound-control unbound-checkconf dnsperf dig openssl ss go timeout getconf awk sed flock; do
		command -v "$t" >/dev/null 2>&1 || missing+=("$t")
	done
	[ ${#missing[@]} -eq 0 ] || die "missing tools: ${missing[*]} (scripts/install-deps.sh installs them)"
	[ -x "$COREDNS" ] || die "no CoreDNS binary at $COREDNS (make build writes ./coredns)"
	if { has_mode dotforward || has_phase regimes || has_phase hedge; } && ! "$COREDNS" -plugins | grep -Eq '(^|[ .])dotforward$'; then
		die "$COREDNS has no dotforward plugin; build it with make build, or set BENCH_MODES without dotforward"
	fi
	if has_mode dotforward-base; then
		[ -x "$BASE_COREDNS" ] || die "mode dotforward-base needs BENCH_BASE_COREDNS, a CoreDNS binary with dotforward (got '$BASE_COREDNS')"
		"$BASE_COREDNS" -plugins | grep -Eq '(^|[ .])dotforward$' || die "BENCH_BASE_COREDNS=$BASE_COREDNS has no dotforward plugin"
	fi
	if has_phase regimes; then
		command -v dnsdist >/dev/null 2>&1 || die "missing tool: dnsdist (scripts/install-deps.sh installs it)"
		"$COREDNS" -plugins | grep -Eq '(^|[ .])erratic$' || die "$COREDNS has no erratic plugin (the regimes' slow upstreams)"
	fi
	local p
	for p in $UDP_PORT $DOT_PORT $CTL_PORT $FRONT_PORT $METRICS_PORT $PPROF_PORT $FWD_PORT $FWD_CTL_PORT $FAKE_PORT $FAKE_STATS_PORT \
		$HEDGE_B_PORT $HEDGE_B_STATS_PORT $REG_DOT_PORT $REG_BACKEND_PORT $(cluster_ports); do
		port_free "$p" || die "port $p on 127.0.0.1 is in use; set BENCH_PORT_BASE to a free range"
	done
}

# make_certs writes a CA and a leaf for 127.0.0.1 and $SERVER_NAME (ECDSA P-256).
make_certs() {
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
		-keyout "$WORK/ca.key" -out "$WORK/ca.pem" -subj "/CN=dotforward bench CA" \
		-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>"$WORK/openssl.err"
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
		-keyout "$WORK/leaf.key" -out "$WORK/leaf.csr" -subj "/CN=$SERVER_NAME" 2>>"$WORK/openssl.err"
	printf 'subjectAltName=DNS:%s,IP:127.0.0.1\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n' \
		"$SERVER_NAME" >"$WORK/leaf.ext"
	openssl x509 -req -in "$WORK/leaf.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" -CAcreateserial \
		-days 2 -extfile "$WORK/leaf.ext" -out "$WORK/leaf.pem" 2>>"$WORK/openssl.err"
	openssl verify -CAfile "$WORK/ca.pem" "$WORK/leaf.pem" >/dev/null || die "generated leaf does not verify against the CA"
}

# make_queries writes $BENCH_NAMES distinct names under the bench zone.
make_queries() {
	awk -v n="$BENCH_NAMES" -v z="$ZONE" 'BEGIN { for (i = 1; i <= n; i++) printf "q%06d.%s A\n", i, z }' >"$WORK/queries.txt"
}

start_upstream() {
	render bench/conf/upstream.conf.in "$WORK/upstream.conf"
	unbound-checkconf "$WORK/upstream.conf" >/dev/null || die "unbound-checkconf rejected $WORK/upstream.conf"
	start_bg upstream unbound -d -c "$WORK/upstream.conf"
	UPSTREAM_PID=$BG_PID
	wait_dns "$UPSTREAM_PID" upstream "$UDP_PORT" || die "upstream unbound did not start"
	wait_tcp "$UPSTREAM_PID" upstream "$DOT_PORT" || die "upstream unbound does not listen for DoT"
	log "upstream unbound PID $UPSTREAM_PID: UDP/TCP :$UDP_PORT, DoT :$DOT_PORT"
}

# start_fake CLOSE_AFTER: fakedot as the upstream for a churn run.
start_fake() {
	start_bg fakedot "$WORK/fakedot" -addr "127.0.0.1:$FAKE_PORT" -stats "127.0.0.1:$FAKE_STATS_PORT" \
		-cert "$WORK/leaf.pem" -key "$WORK/leaf.key" -close-after "$1" -lifetime 10m "${@:2}"
	FAKE_PID=$BG_PID
	wait_tcp "$FAKE_PID" fakedot "$FAKE_STATS_PORT" || die "fakedot did not start"
}

# fake_stat KEY [STATS_PORT]: one counter of fakedot (the one serving its counters
# on STATS_PORT, by default the churn upstream's).
fake_stat() {
	http_get "${2:-$FAKE_STATS_PORT}" /stats | awk -F= -v k="$1" '$1 == k { print $2 }'
}

# metric_sum NAME [LABEL_FILTER]: sum of a CoreDNS metric's samples (optionally only
# lines containing LABEL_FILTER).
metric_sum() {
	http_get "$METRICS_PORT" /metrics | awk -v n="$1" -v f="${2:-}" '
		index($0, n) == 1 && (substr($0, length(n) + 1, 1) == "{" || substr($0, length(n) + 1, 1) == " ") && (f == "" || index($0, f)) { s += $NF }
		END { printf "%d\n", s }'
}

# metric_float NAME [LABEL_FILTER]: as metric_sum, for gauges with fractions.
metric_float() {
	http_get "$METRICS_PORT" /metrics | awk -v n="$1" -v f="${2:-}" '
		index($0, n) == 1 && (substr($0, length(n) + 1, 1) == "{" || substr($0, length(n) + 1, 1) == " ") && (f == "" || index($0, f)) { s += $NF }
		END { printf "%.6f\n", s }'
}

# start_front MODE [metrics]: starts the forwarder under test; sets FRONT_PID,
# FRONT_NAME, FRONT_QPORT. It waits for an answer, or with "metrics" (an upstream
# that never answers) for the metrics endpoint.
start_front() {
	local mode=$1 ready=${2:-dns}
	if [ "$mode" = unbound ]; then
		render bench/conf/forwarder.conf.in "$WORK/forwarder.conf"
		unbound-checkconf "$WORK/forwarder.conf" >/dev/null || die "unbound-checkconf rejected $WORK/forwarder.conf"
		FRONT_NAME=forwarder
		start_bg "$FRONT_NAME" unbound -d -c "$WORK/forwarder.conf"
		FRONT_QPORT=$FWD_PORT
	else
		# dotforward-base is dotforward's Corefile on the base build.
		local conf=$mode bin=$COREDNS
		[ "$mode" = dotforward-base ] && conf=dotforward bin=$BASE_COREDNS
		[ "$mode" = whoami-paced ] && conf=whoami
		render "bench/conf/$conf.Corefile" "$WORK/$mode.Corefile"
		FRONT_NAME=coredns-$mode
		start_bg "$FRONT_NAME" "$bin" -conf "$WORK/$mode.Corefile"
		FRONT_QPORT=$FRONT_PORT
	fi
	FRONT_PID=$BG_PID
	if [ "$ready" = metrics ]; then
		wait_tcp "$FRONT_PID" "$FRONT_NAME" "$METRICS_PORT" || die "$mode did not start"
		return
	fi
	wait_dns "$FRONT_PID" "$FRONT_NAME" "$FRONT_QPORT" || die "$mode did not answer"
}

# dnsperf_run OUT SECONDS [dnsperf args...]: one bounded dnsperf run against the
# front; its PID is recorded so the EXIT trap can stop it.
dnsperf_run() {
	local out=$1 secs=$2
	shift 2
	timeout $((secs + 30)) dnsperf -s 127.0.0.1 -p "$FRONT_QPORT" -d "${DNSPERF_QUERIES:-$WORK/queries.txt}" \
		-c "$BENCH_CLIENTS" -q "$BENCH_INFLIGHT" -l "$secs" "$@" >"$out" 2>&1 &
	DNSPERF_PID=$!
	PIDS+=("$DNSPERF_PID")
}

dnsperf_wait() {
	local rc=0
	wait "$DNSPERF_PID" || rc=$?
	local kept=() p
	for p in "${PIDS[@]}"; do [ "$p" = "$DNSPERF_PID" ] || kept+=("$p"); done
	PIDS=("${kept[@]}")
	return $rc
}

# measure KIND MODE ROUND [dnsperf args...]: one recorded run of MODE, appended to
# raw.jsonl. The front (and, for churn, fakedot) starts fresh for every run.
measure() {
	local kind=$1 mode=$2 round=$3
	shift 3
	local conn_port=$DOT_PORT kv=() close_after=0
	if [ "$kind" = churn ]; then
		close_after=$CHURN_CLOSE_AFTER
		start_fake "$close_after"
		conn_port=$FAKE_PORT
		UPSTREAM_ADDR=127.0.0.1:$FAKE_PORT
		METRICS_LINE="prometheus 127.0.0.1:$METRICS_PORT"
	else
		UPSTREAM_ADDR=127.0.0.1:$DOT_PORT
		METRICS_LINE=""
	fi
	start_front "$mode"

	local tag="$kind-$mode-n$close_after-r$round"
	# A short query timeout for the warm-up: it should not wait 5 s for a lost query.
	DNSPERF_QUERIES=${WARMUP_QUERIES:-} dnsperf_run "$WORK/$tag.warmup" "$BENCH_WARMUP" -t 1 "$@"
	dnsperf_wait || die "warm-up dnsperf failed for $tag: $(tail -3 "$WORK/$tag.warmup")"
	alive "$FRONT_PID" "$FRONT_NAME" || die "$mode died during warm-up"

	local up0 fq0=0 fh0=0 hs0=0 res0=0 mhs0=0 mres0=0 rep0=0
	up0=$(unbound_counter "$WORK/upstream.conf" total.num.queries)
	if [ "$mode" = unbound ]; then
		fq0=$(unbound_counter "$WORK/forwarder.conf" total.num.queries)
		fh0=$(unbound_counter "$WORK/forwarder.conf" total.num.cachehits)
	fi
	if [ "$kind" = churn ]; then
		up0=$(fake_stat queries)
		hs0=$(fake_stat handshakes)
		res0=$(fake_stat resumed)
		if [ "$mode" = dotforward ]; then
			mhs0=$(metric_sum coredns_dotforward_handshakes_total)
			mres0=$(metric_sum coredns_dotforward_handshakes_total 'resumed="true"')
			rep0=$(metric_sum coredns_dotforward_replays_total)
		fi
	fi
	local c0 c1 drops0 sr0 sw0 sr1 sw1 hook0
	hook0=$(measure_begin "$kind" "$mode") # phase_mission.sh: the cache's counters
	drops0=$(udp_rcvbuf_errors)
	read -r sr0 sw0 < <(io_syscalls "$FRONT_PID")
	local upc0 upc1 uppid=$UPSTREAM_PID
	[ "$kind" = churn ] && uppid=$FAKE_PID
	upc0=$(cpu_ticks "$uppid")
	c0=$(cpu_ticks "$FRONT_PID")

	dnsperf_run "$WORK/$tag.out" "$BENCH_SECONDS" -v "$@"
	local mid most
	read -r mid most < <(sample_conns "$conn_port" "$BENCH_SECONDS")
	dnsperf_wait || die "dnsperf failed for $tag: $(tail -3 "$WORK/$tag.out")"
	c1=$(cpu_ticks "$FRONT_PID")
	upc1=$(cpu_ticks "$uppid")
	read -r sr1 sw1 < <(io_syscalls "$FRONT_PID")
	alive "$FRONT_PID" "$FRONT_NAME" || die "$mode died during the run"
	# shellcheck disable=SC2046,SC2086 # words: -kv name=value pairs
	kv+=($(measure_end "$kind" "$mode" $hook0))

	local up1 upq fq=0 fh=0
	up1=$(unbound_counter "$WORK/upstream.conf" total.num.queries)
	if [ "$mode" = unbound ]; then
		fq=$(($(unbound_counter "$WORK/forwarder.conf" total.num.queries) - fq0))
		fh=$(($(unbound_counter "$WORK/forwarder.conf" total.num.cachehits) - fh0))
	fi
	if [ "$kind" = churn ]; then
		up1=$(fake_stat queries)
		kv+=(-kv "handshakes=$(($(fake_stat handshakes) - hs0))" -kv "resumed=$(($(fake_stat resumed) - res0))")
		if [ "$mode" = dotforward ]; then
			kv+=(-kv "metric_handshakes=$(($(metric_sum coredns_dotforward_handshakes_total) - mhs0))")
			kv+=(-kv "metric_resumed=$(($(metric_sum coredns_dotforward_handshakes_total 'resumed="true"') - mres0))")
			kv+=(-kv "replays=$(($(metric_sum coredns_dotforward_replays_total) - rep0))")
		fi
	fi
	upq=$((up1 - up0))
	[[ "$mode" = whoami* ]] && upq=0

	"$WORK/benchtool" parse -in "$WORK/$tag.out" -kv "kind=$kind" -kv "mode=$mode" -kv "round=$round" \
		-kv "close_after=$close_after" -kv "offered_qps=${OFFERED_QPS:-0}" \
		-kv "cpu_ticks=$((c1 - c0))" -kv "clk_tck=$CLK_TCK" -kv "rss_kb=$(rss_peak_kb "$FRONT_PID")" \
		-kv "conns_mid=$mid" -kv "conns_max=$most" -kv "upstream_queries=$upq" \
		-kv "udp_rcvbuf_errors=$(($(udp_rcvbuf_errors) - drops0))" \
		-kv "read_syscalls=$((sr1 - sr0))" -kv "write_syscalls=$((sw1 - sw0))" \
		-kv "upstream_cpu_ticks=$((upc1 - upc0))" \
		-kv "forwarder_queries=$fq" -kv "forwarder_cache_hits=$fh" "${kv[@]}" >>"$WORK/raw.jsonl" ||
		die "could not parse $WORK/$tag.out"
	# Keep dnsperf's summary only: the per-query lines run to megabytes per run.
	grep -v '^> ' "$WORK/$tag.out" >"$WORK/$tag.summary" || true
	rm -f "$WORK/$tag.out"
	# The front's own counters at the end of the run (closes by reason, mode
	# changes, rescues...): what explains a run that missed its targets.
	http_get "$METRICS_PORT" /metrics | grep -E '^coredns_(dotforward|proxy|forward)_' >"$WORK/$tag.metrics" || true
	stop_pid "$FRONT_PID"
	if [ "$kind" = churn ]; then stop_pid "$FAKE_PID"; fi
	local q c l
	read -r q c l < <(last_fields "$WORK/raw.jsonl" qps cpu_us_per_query lost)
	log "$(printf '%-34s %8.0f qps  lost %s  cpu %.1f us/q' "$tag" "$q" "$l" "$c")"
}

# rotated ROUND WORDS...: WORDS rotated left by ROUND-1, so that no mode always
# runs first (or right after a given other one) in every round.
rotated() {
	local r=$1
	shift
	local a=("$@") n=$# i
	for ((i = 0; i < n; i++)); do printf '%s ' "${a[(i + r - 1) % n]}"; done
}

phase_throughput() {
	local r m q
	for ((r = 1; r <= BENCH_ROUNDS; r++)); do
		log "throughput round $r/$BENCH_ROUNDS"
		for m in $(rotated "$r" $BENCH_MODES); do
			measure throughput "$m" "$r"
			if [ "$m" = dotforward ] && has_mode whoami; then
				# The floor at dotforward's own rate, right after it (issue 24):
				# CPU per query depends on the rate, and at full speed whoami
				# answers two or three times as many queries a second.
				read -r q < <(last_fields "$WORK/raw.jsonl" qps)
				OFFERED_QPS=${q%.*} measure throughput whoami-paced "$r" -Q "${q%.*}"
			fi
		done
	done
}

phase_latency() {
	local r m half
	if [ -n "${BENCH_LATENCY_QPS:-}" ]; then
		OFFERED_QPS=$BENCH_LATENCY_QPS
	else
		has_mode fwd-udp || { log "latency phase needs mode fwd-udp for its rate (or BENCH_LATENCY_QPS); skipped"; return; }
		half=$("$WORK/benchtool" median -in "$WORK/raw.jsonl" -kind throughput -mode fwd-udp -field qps)
		OFFERED_QPS=$((half / 2))
	fi
	for ((r = 1; r <= BENCH_ROUNDS; r++)); do
		log "latency round $r/$BENCH_ROUNDS at $OFFERED_QPS qps offered"
		for m in $(rotated "$r" $BENCH_MODES); do
			measure latency "$m" "$r" -Q "$OFFERED_QPS"
		done
	done
	OFFERED_QPS=0
}

phase_churn() {
	local r m n
	for ((r = 1; r <= BENCH_ROUNDS; r++)); do
		log "churn round $r/$BENCH_ROUNDS (fakedot closing after $BENCH_CHURN_AFTER answers, and not at all)"
		for m in $(rotated "$r" $BENCH_CHURN_MODES); do
			has_mode "$m" || continue
			for n in "$BENCH_CHURN_AFTER" 0; do
				CHURN_CLOSE_AFTER=$n
				measure churn "$m" "$r"
			done
		done
	done
}

# phase_profile takes a CPU profile of CoreDNS in each of $BENCH_PROFILE_MODES
# under the throughput load, or at BENCH_PROFILE_QPS (separate runs, not measured
# ones), and keeps pprof's top functions in bench/results/profile-MODE.txt.
phase_profile() {
	local m secs=$((BENCH_SECONDS > 4 ? BENCH_SECONDS - 2 : 2))
	UPSTREAM_ADDR=127.0.0.1:$DOT_PORT
	METRICS_LINE=""
	for m in $BENCH_PROFILE_MODES; do
		[ "$m" = unbound ] && continue
		has_mode "$m" || continue
		start_front "$m"
		log "profiling $m for $secs s"
		dnsperf_run "$WORK/profile-$m.dnsperf" $((secs + 3)) ${BENCH_PROFILE_QPS:+-Q "$BENCH_PROFILE_QPS"}
		sleep 1
		PPROF_TMPDIR=$WORK timeout $((secs + 30)) go tool pprof -seconds "$secs" -proto -output "$WORK/$m.pprof" \
			"http://127.0.0.1:$PPROF_PORT/debug/pprof/profile" >"$WORK/pprof.err" 2>&1 || true
		dnsperf_wait || true
		stop_pid "$FRONT_PID"
		if timeout 60 go tool pprof -top -nodecount=30 "$COREDNS" "$WORK/$m.pprof" >"$WORK/profile-$m.txt" 2>>"$WORK/pprof.err" &&
			{ echo; echo "Cumulative:"; timeout 60 go tool pprof -top -cum -nodecount=40 "$COREDNS" "$WORK/$m.pprof" 2>>"$WORK/pprof.err" | sed '1,/flat%/d'; } >>"$WORK/profile-$m.txt"; then
			cp "$WORK/$m.pprof" "$RESULTS/$m.cpu.pprof"
			cp "$WORK/profile-$m.txt" "$RESULTS/profile-$m.txt"
		else
			log "no CPU profile of $m: $(tail -2 "$WORK/pprof.err")"
		fi
	done
	if [ -s "$WORK/profile-dotforward.txt" ]; then cp "$WORK/profile-dotforward.txt" "$WORK/profile.txt"; fi
}

# phase_blackhole offers BENCH_BLACKHOLE_QPS to dotforward for BENCH_BLACKHOLE_SECONDS
# with an upstream that never answers (fakedot -drop). dnsperf may keep 60000 queries
# outstanding and waits 10 s for each, so that CoreDNS's SERVFAILs (after its 5 s
# timeout, or at once when the pool's waiting room is full) are counted, not lost.
phase_blackhole() {
	local secs=$BENCH_BLACKHOLE_SECONDS qps=$BENCH_BLACKHOLE_QPS
	start_fake 0 -drop
	UPSTREAM_ADDR=127.0.0.1:$FAKE_PORT
	METRICS_LINE="prometheus 127.0.0.1:$METRICS_PORT"
	start_front dotforward metrics

	log "black hole: $qps qps offered for $secs s"
	local c0 c1 drops i g goroutines=0
	drops=$(udp_rcvbuf_errors)
	c0=$(cpu_ticks "$FRONT_PID")
	# dnsperf takes the last of repeated options: these -q and -t win over dnsperf_run's.
	dnsperf_run "$WORK/blackhole.out" "$secs" -q 60000 -Q "$qps" -t 10
	for i in 1 2 3 4 5; do
		sleep "$(awk -v s="$secs" 'BEGIN { printf "%.3f", s / 5 }')"
		g=$(metric_sum go_goroutines)
		[ "$g" -gt "$goroutines" ] && goroutines=$g
	done
	dnsperf_wait || die "dnsperf failed in the black hole: $(tail -3 "$WORK/blackhole.out")"
	c1=$(cpu_ticks "$FRONT_PID")
	alive "$FRONT_PID" "$FRONT_NAME" || die "dotforward died in the black hole"
	drops=$(($(udp_rcvbuf_errors) - drops))
	local rss timeouts replays
	rss=$(rss_peak_kb "$FRONT_PID")
	timeouts=$(metric_sum coredns_dotforward_timeouts_total)
	replays=$(metric_sum coredns_dotforward_replays_total)
	stop_pid "$FRONT_PID"
	stop_pid "$FAKE_PID"
	write_blackhole "$qps" "$secs" "$((c1 - c0))" "$rss" "$goroutines" "$drops" "$timeouts" "$replays"
}

# write_blackhole QPS SECONDS CPU_TICKS RSS_KB GOROUTINES UDP_DROPS TIMEOUTS REPLAYS
# turns dnsperf's summary of the black-hole run into bench/results/blackhole.md.
write_blackhole() {
	local out=$WORK/blackhole.out
	local sent completed lost servfail latency
	sent=$(awk '/Queries sent:/ { print $3 }' "$out")
	completed=$(awk '/Queries completed:/ { print $3 }' "$out")
	lost=$(awk '/Queries lost:/ { print $3 }' "$out")
	servfail=$(grep -o 'SERVFAIL [0-9]*' "$out" | awk '{ print $2 }')
	latency=$(awk '/Average Latency/ { print }' "$out" | sed 's/^ *//')
	{
		echo "# dotforward in front of a black hole"
		echo
		echo "Generated $(date -u +%Y-%m-%dT%H:%M:%SZ) by \`make bench-blackhole\` (bench/run.sh, phase blackhole) on $(nproc) CPUs."
		echo "The upstream (bench/cmd/fakedot -drop) completes every TLS handshake and never answers."
		echo "dnsperf offered $1 queries/s for $2 s (\`-Q $1 -q 60000 -t 10\`) to CoreDNS with *dotforward* (defaults:"
		echo "\`timeout\` 5s, \`read_timeout\` 2s, 4 connections of 128 queries) and *prometheus*."
		echo
		echo "| offered qps | sent | answered | SERVFAIL | lost | UDP drops | CPU µs/query | peak RSS MB | most goroutines | read timeouts | replays |"
		echo "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
		awk -v q="$1" -v s="$sent" -v c="$completed" -v f="${servfail:-0}" -v l="$lost" -v d="$6" \
			-v t="$3" -v k="$CLK_TCK" -v r="$4" -v g="$5" -v to="$7" -v rp="$8" \
			'BEGIN { printf "| %d | %d | %d | %d | %d | %d | %.1f | %.0f | %d | %d | %d |\n", q, s, c, f, l, d, (c > 0 ? t * 1e6 / k / c : 0), r / 1024, g, to, rp }'
		echo
		echo "dnsperf: $latency"
		echo
		echo "Lost: no answer within dnsperf's 10 s. UDP drops: datagrams the kernel dropped machine-wide"
		echo "(RcvbufErrors) during the run, which a lost query may be."
	} >"$RESULTS/blackhole.md"
	log "black hole results in $RESULTS/blackhole.md"
}

# make_slow_queries writes the query file of cut-slowtail: the names of queries.txt
# with every SLOW_EVERY-th one renamed sNNNNNN, the names fakedot holds back.
make_slow_queries() {
	awk -v n="$BENCH_NAMES" -v z="$ZONE" -v e="$SLOW_EVERY" \
		'BEGIN { for (i = 1; i <= n; i++) printf "%s%06d.%s A\n", (i % e == 0 ? "s" : "q"), i, z }' >"$WORK/queries-slow.txt"
}

# regime_upstream REGIME CUT: starts REGIME's upstream afresh (CUT: the churn
# regime's answers per connection) and sets UPSTREAM_ADDR, REG_CONN_PORT (the DoT
# port whose connections are counted), REG_STOP (PIDs to stop after the run, in
# order), REG_FAKE (1: fakedot, which counts handshakes) and REG_SETUP (the
# upstream in words, for regimes.md).
regime_upstream() {
	local reg=$1 cut=$2 dig_tls=(+tls "+tls-ca=$WORK/ca.pem" "+tls-hostname=$SERVER_NAME")
	REG_STOP=()
	REG_FAKE=0
	UPSTREAM_ADDR=127.0.0.1:$REG_DOT_PORT
	REG_CONN_PORT=$REG_DOT_PORT
	case $reg in
	coredns-erratic)
		render bench/conf/regime-erratic.Corefile "$WORK/regime-erratic.Corefile"
		start_bg regime-erratic "$COREDNS" -conf "$WORK/regime-erratic.Corefile"
		REG_STOP=("$BG_PID")
		wait_dns "$BG_PID" regime-erratic "$REG_DOT_PORT" "${dig_tls[@]}" || die "CoreDNS with erratic did not answer over DoT"
		REG_SETUP="CoreDNS $COREDNS_VERSION's own \`tls://\` server block (bench/conf/regime-erratic.Corefile), which"\
" like every miekg/dns server answers a connection's queries one at a time, in order, answering every A query itself"\
" with \`erratic { delay $ERRATIC_EVERY $ERRATIC_DELAY }\`: erratic counts the queries of the whole server and holds back"\
" queries number 1, $((ERRATIC_EVERY + 1)), $((2 * ERRATIC_EVERY + 1))… for $ERRATIC_DELAY (1 query in $ERRATIC_EVERY,"\
" whichever connection and name), so the later queries of that connection wait behind it."
		;;
	dnsdist-slow)
		render bench/conf/regime-backend.Corefile "$WORK/regime-backend.Corefile"
		start_bg regime-backend "$COREDNS" -conf "$WORK/regime-backend.Corefile"
		REG_STOP=("$BG_PID")
		wait_dns "$BG_PID" regime-backend "$REG_BACKEND_PORT" || die "the slow backend did not answer"
		render bench/conf/dnsdist.conf.in "$WORK/dnsdist.conf"
		start_bg dnsdist dnsdist --supervised --disable-syslog -C "$WORK/dnsdist.conf"
		REG_STOP=("$BG_PID" "${REG_STOP[@]}")
		wait_dns "$BG_PID" dnsdist "$REG_DOT_PORT" "${dig_tls[@]}" || die "dnsdist did not answer over DoT"
		REG_SETUP="$DNSDIST_VERSION's DoT frontend with its defaults (bench/conf/dnsdist.conf.in: \`addTLSLocal\`"\
" without \`maxInFlight\`, so it handles one query of a client connection at a time) in front of a plain-DNS"\
" backend, a CoreDNS answering every query after $BACKEND_DELAY (\`erratic { delay 1 $BACKEND_DELAY }\`,"\
" bench/conf/regime-backend.Corefile); dnsdist sends queries that came over TLS to the backend over TCP."
		;;
	cut-slowtail)
		regime_fake "$SLOW_CUT" -delay "$SLOW_DELAY" -delay-prefix s
		REG_SETUP="bench/cmd/fakedot (dot/dottest as a process: it answers a connection's queries concurrently) cutting"\
" every connection after $SLOW_CUT answers (\`-close-after $SLOW_CUT\`: it serves the first $SLOW_CUT queries of a"\
" connection, closes it right after the ${SLOW_CUT}th answer and never answers the queries after them, which the"\
" client must send again elsewhere), and answering the names that start with \`s\` after $SLOW_DELAY"\
" (\`-delay $SLOW_DELAY -delay-prefix s\`): every ${SLOW_EVERY}th name of the query file is one (1 name in $SLOW_EVERY)."\
" *fast names* are the others."
		;;
	unbound)
		UPSTREAM_ADDR=127.0.0.1:$DOT_PORT
		REG_CONN_PORT=$DOT_PORT
		REG_SETUP="The bench's upstream unbound (bench/conf/upstream.conf.in: 1 thread, local data), which answers a"\
" connection's queries as they come, out of order, fast: the upstream dotforward's pool was built for."
		;;
	churn)
		regime_fake "$cut"
		REG_SETUP="bench/cmd/fakedot cutting every connection after $BENCH_CHURN_AFTER answers (\`-close-after"\
" $BENCH_CHURN_AFTER\`), and the same server without cuts as the baseline, at full speed: the churn phase of"\
" \`make bench\` with both modes. The target is that the cuts cost dotforward no larger share of its QPS than"\
" they cost forward."
		;;
	*) regime_upstream_more "$reg" || die "unknown regime $reg (BENCH_REGIMES)" ;;
	esac
}

# regime_fake CLOSE_AFTER [FAKEDOT ARGS]: a regime's upstream is fakedot, started
# with these arguments (see start_fake), stopped after the regime.
regime_fake() {
	start_fake "$@"
	REG_STOP=("$FAKE_PID")
	REG_FAKE=1
	UPSTREAM_ADDR=127.0.0.1:$FAKE_PORT
	REG_CONN_PORT=$FAKE_PORT
}

# regime_run REGIME MODE CUT QPS [ROUND]: one measured run of MODE (fwd-tls or dotforward)
# in front of REGIME's upstream, offered QPS queries/s (0: full speed), appended to
# regimes.jsonl. The upstream and the front start afresh for every run.
regime_run() {
	local reg=$1 mode=$2 cut=$3 qps=$4 round=${5:-1}
	regime_upstream "$reg" "$cut"
	METRICS_LINE=""
	start_front "regime-$mode"

	local qfile=$WORK/queries.txt split=() args load
	if [ "$reg" = cut-slowtail ]; then
		qfile=$WORK/queries-slow.txt
		split=(-split s)
	fi
	# dnsperf takes the last of repeated options: these -d, -c and -q win over dnsperf_run's.
	if [ "$qps" -gt 0 ]; then
		args=(-d "$qfile" -c "$BENCH_REGIME_CLIENTS" -q "$BENCH_REGIME_INFLIGHT" -Q "$qps")
		load="-c $BENCH_REGIME_CLIENTS -q $BENCH_REGIME_INFLIGHT -Q $qps -l $BENCH_REGIME_SECONDS"
	else
		args=(-d "$qfile")
		load="-c $BENCH_CLIENTS -q $BENCH_INFLIGHT -l $BENCH_REGIME_SECONDS"
	fi
	local tag="regime-$reg-$mode-n$cut-r$round"
	dnsperf_run "$WORK/$tag.warmup" "$BENCH_REGIME_WARMUP" -t 1 "${args[@]}"
	dnsperf_wait || die "warm-up dnsperf failed for $tag: $(tail -3 "$WORK/$tag.warmup")"
	alive "$FRONT_PID" "$FRONT_NAME" || die "$mode died during the warm-up of $reg"

	local dialm=coredns_proxy_conn_cache_misses_total d0 rep0=0 to0=0 hs0=0 drops0 c0 c1
	[ "$mode" = dotforward ] && dialm=coredns_dotforward_dials_total
	d0=$(metric_sum "$dialm")
	if [ "$mode" = dotforward ]; then
		rep0=$(metric_sum coredns_dotforward_replays_total)
		to0=$(metric_sum coredns_dotforward_timeouts_total)
	fi
	local uq0=0 ua0=0
	if [ "$REG_FAKE" = 1 ]; then
		hs0=$(fake_stat handshakes)
		uq0=$(fake_stat queries)
		ua0=$(fake_stat answers)
	fi
	drops0=$(udp_rcvbuf_errors)
	local net0 net1
	read -ra net0 < <(net_drops)
	c0=$(cpu_ticks "$FRONT_PID")

	dnsperf_run "$WORK/$tag.out" "$BENCH_REGIME_SECONDS" -v "${args[@]}"
	# Count the upstream connections once a second while the load runs.
	local samples=() i
	for ((i = 1; i < BENCH_REGIME_SECONDS; i++)); do
		sleep 1
		samples+=("$(est_conns "$REG_CONN_PORT")")
	done
	[ ${#samples[@]} -gt 0 ] || samples=("$(est_conns "$REG_CONN_PORT")")
	dnsperf_wait || die "dnsperf failed for $tag: $(tail -3 "$WORK/$tag.out")"
	c1=$(cpu_ticks "$FRONT_PID")
	read -ra net1 < <(net_drops)
	alive "$FRONT_PID" "$FRONT_NAME" || die "$mode died during $reg"

	local dials rep=0 to=0 hs=-1 uq=-1 ua=-1 cmed cmax
	dials=$(($(metric_sum "$dialm") - d0))
	if [ "$mode" = dotforward ]; then
		rep=$(($(metric_sum coredns_dotforward_replays_total) - rep0))
		to=$(($(metric_sum coredns_dotforward_timeouts_total) - to0))
	fi
	if [ "$REG_FAKE" = 1 ]; then
		hs=$(($(fake_stat handshakes) - hs0))
		uq=$(($(fake_stat queries) - uq0))
		ua=$(($(fake_stat answers) - ua0))
	fi
	read -r cmed cmax < <(printf '%s\n' "${samples[@]}" | sort -n | awk '{ v[NR] = $1 } END {
		m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[NR] }')

	"$WORK/benchtool" parse -in "$WORK/$tag.out" "${split[@]}" -kv kind=regime -kvs "regime=$reg" -kvs "mode=$mode" \
		-kv "round=$round" -kv "close_after=$cut" -kv "offered_qps=$qps" -kvs "setup=$REG_SETUP" -kvs "load=$load" \
		-kv "cpu_ticks=$((c1 - c0))" -kv "clk_tck=$CLK_TCK" -kv "rss_kb=$(rss_peak_kb "$FRONT_PID")" \
		-kv "conns_median=$cmed" -kv "conns_max=$cmax" -kvs "conn_samples=${samples[*]}" \
		-kv "dials=$dials" -kv "upstream_handshakes=$hs" -kv "replays=$rep" -kv "timeouts=$to" \
		-kv "upstream_queries=$uq" -kv "upstream_answers=$ua" \
		-kv "udp_in_errors=$((net1[0] - net0[0]))" -kv "udp_sndbuf_errors=$((net1[1] - net0[1]))" \
		-kv "udp_noports=$((net1[2] - net0[2]))" -kv "backlog_drops=$((net1[3] - net0[3]))" \
		-kv "udp_rcvbuf_errors=$(($(udp_rcvbuf_errors) - drops0))" >>"$WORK/regimes.jsonl" ||
		die "could not parse $WORK/$tag.out"
	grep -v '^> ' "$WORK/$tag.out" >"$WORK/$tag.summary" || true
	# The front's own counters at the end of the run (closes by reason, mode
	# changes, rescues...): what explains a run that missed its targets.
	http_get "$METRICS_PORT" /metrics | grep -E '^coredns_(dotforward|proxy|forward)_' >"$WORK/$tag.metrics" || true
	# The same a second later: a query the front answers after dnsperf gave up on it
	# moves its counters in between.
	sleep 1
	http_get "$METRICS_PORT" /metrics | grep -E '^coredns_(dotforward|proxy|forward)_' >"$WORK/$tag.metrics-1s" || true
	stop_pid "$FRONT_PID"
	local p
	for p in "${REG_STOP[@]}"; do stop_pid "$p"; done
	local q p5 p9 l nn
	read -r q p5 p9 l nn < <(last_fields "$WORK/regimes.jsonl" qps p50_ms p99_ms lost not_noerror)
	if [ -n "$BENCH_KEEP_RUNS" ] || [ "$l" != 0 ] || [ "$nn" != 0 ]; then keep_run "$tag"; fi
	rm -f "$WORK/$tag.out"
	log "$(printf '%-40s %7.0f qps  p50 %.2f ms  p99 %.1f ms  lost %s  conns %s  dials %s' "$tag" "$q" "$p5" "$p9" "$l" "$cmed/$cmax" "$dials")"
}

# keep_run TAG: copies a regime run's artefacts to $RESULTS/runs/: dnsperf's
# output with a line per answer (TAG.out.gz: which queries went unanswered), the
# front's metrics at the end of the run and a second later, and the front's and
# the upstream's logs (errors, fakedot's counters).
keep_run() {
	local tag=$1 dir=$RESULTS/runs f
	mkdir -p "$dir"
	gzip -c "$WORK/$tag.out" >"$dir/$tag.out.gz"
	for f in "$tag.summary" "$tag.metrics" "$tag.metrics-1s" "$FRONT_NAME.out"; do
		[ -f "$WORK/$f" ] && cp "$WORK/$f" "$dir/${f/#$FRONT_NAME/$tag.front}"
	done
	[ "$REG_FAKE" = 1 ] && [ -f "$WORK/fakedot.out" ] && cp "$WORK/fakedot.out" "$dir/$tag.upstream.out"
	return 0
}

# phase_regimes runs forward tls:// and dotforward side by side in each of
# BENCH_REGIMES (issue 14) and writes bench/results/regimes.{md,json,svg}.
phase_regimes() {
	local t0=$SECONDS i=0 reg m n r load0
	load0=$(cut -d' ' -f1-3 /proc/loadavg)
	: >"$WORK/regimes.jsonl"
	make_slow_queries
	for reg in $BENCH_REGIMES; do
		i=$((i + 1))
		for ((r = 1; r <= BENCH_REGIME_RUNS; r++)); do # the runs of a regime in a row, modes alternating
			log "regime $reg, run $r of $BENCH_REGIME_RUNS"
			for m in $(rotated "$((i + r))" $BENCH_REGIME_MODES); do
				case $reg in
				churn) for n in "$BENCH_CHURN_AFTER" 0; do regime_run churn "$m" "$n" 0 "$r"; done ;;
				*) regime_run "$reg" "$m" 0 "$(regime_offered "$reg")" "$r" ;;
				esac
			done
		done
	done
	local took=$((SECONDS - t0))
	{
		cat "$WORK/machine.env"
		echo "dnsdist=$DNSDIST_VERSION"
		echo "regime_seconds=$BENCH_REGIME_SECONDS"
		echo "regime_runs=$BENCH_REGIME_RUNS"
		echo "dotforward_opts=$(printf '%s' "$DOTFORWARD_OPTS" | tr -s '\n\t' ';' | sed 's/;/; /g')"
		echo "regimes_seconds_total=$took"
		echo "loadavg_start=$load0"
		echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
	} >"$WORK/regimes.env"
	"$WORK/benchtool" regimes -in "$WORK/regimes.jsonl" -out "$RESULTS" -machine "$WORK/regimes.env" \
		-label "$BENCH_REGIMES_LABEL" || die "benchtool regimes failed"
	cp "$WORK/regimes.jsonl" "$RESULTS/regimes.jsonl"
	log "regimes took $took s; results in $RESULTS/regimes.md"
}

# hedge_counters: the hedge phase's readings, as "a b hedges wins_first wins_hedge
# budget_exhausted late_drops": the two upstreams' query counts and dotforward's
# hedge metrics (late drops: the abandoned exchanges' answers).
hedge_counters() {
	echo "$(fake_stat queries) $(fake_stat queries "$HEDGE_B_STATS_PORT")" \
		"$(metric_sum coredns_dotforward_hedges_total)" \
		"$(metric_sum coredns_dotforward_hedge_wins_total 'winner="first"')" \
		"$(metric_sum coredns_dotforward_hedge_wins_total 'winner="hedge"')" \
		"$(metric_sum coredns_dotforward_hedge_budget_exhausted_total)" \
		"$(metric_sum coredns_dotforward_dropped_total 'reason="late"')"
}

# hedge_run SETTING ROUND: one measured run of dotforward in front of A (1 name in 20
# after 300 ms) and B (at once) with `hedge SETTING` ("off": no hedge line; "_"
# stands for a space), appended to hedge.jsonl. Everything starts afresh.
hedge_run() {
	local h=$1 round=$2 a_pid b_pid
	start_fake 0 -delay "$SLOW_DELAY" -delay-prefix s
	a_pid=$FAKE_PID
	start_bg fakedot-b "$WORK/fakedot" -addr "127.0.0.1:$HEDGE_B_PORT" -stats "127.0.0.1:$HEDGE_B_STATS_PORT" \
		-cert "$WORK/leaf.pem" -key "$WORK/leaf.key" -lifetime 10m
	b_pid=$BG_PID
	wait_tcp "$b_pid" fakedot-b "$HEDGE_B_STATS_PORT" || die "the second fakedot did not start"
	UPSTREAM_ADDR=127.0.0.1:$FAKE_PORT
	METRICS_LINE=""
	HEDGE_LINE=""
	[ "$h" = off ] || HEDGE_LINE="hedge ${h//_/ }"
	start_front hedge-dotforward

	local args=(-d "$WORK/queries-slow.txt" -c "$BENCH_REGIME_CLIENTS" -q "$BENCH_REGIME_INFLIGHT" -Q "$BENCH_HEDGE_QPS")
	local tag=hedge-$h-r$round
	dnsperf_run "$WORK/$tag.warmup" "$BENCH_HEDGE_WARMUP" -t 1 "${args[@]}"
	dnsperf_wait || die "warm-up dnsperf failed for $tag: $(tail -3 "$WORK/$tag.warmup")"
	alive "$FRONT_PID" "$FRONT_NAME" || die "dotforward died during the warm-up of $tag"
	# Let the warm-up's slow answers (and their late drops) land before the readings.
	sleep 1
	local before after drops0 c0 c1
	read -ra before < <(hedge_counters)
	drops0=$(udp_rcvbuf_errors)
	c0=$(cpu_ticks "$FRONT_PID")
	dnsperf_run "$WORK/$tag.out" "$BENCH_HEDGE_SECONDS" -v "${args[@]}"
	dnsperf_wait || die "dnsperf failed for $tag: $(tail -3 "$WORK/$tag.out")"
	c1=$(cpu_ticks "$FRONT_PID")
	alive "$FRONT_PID" "$FRONT_NAME" || die "dotforward died during $tag"
	sleep 1 # the last abandoned exchanges' late answers
	read -ra after < <(hedge_counters)
	local delay=-1
	[[ "$h" == auto* ]] && delay=$(metric_float coredns_dotforward_hedge_delay_seconds "to=\"127.0.0.1:$FAKE_PORT\"" | awk '{ print $1 * 1000 }')

	"$WORK/benchtool" parse -in "$WORK/$tag.out" -split s -kvs "hedge=$h" -kv "round=$round" -kv "offered_qps=$BENCH_HEDGE_QPS" \
		-kvs "load=-c $BENCH_REGIME_CLIENTS -q $BENCH_REGIME_INFLIGHT -Q $BENCH_HEDGE_QPS -l $BENCH_HEDGE_SECONDS" \
		-kv "a_queries=$((after[0] - before[0]))" -kv "b_queries=$((after[1] - before[1]))" \
		-kv "hedges=$((after[2] - before[2]))" -kv "wins_first=$((after[3] - before[3]))" -kv "wins_hedge=$((after[4] - before[4]))" \
		-kv "budget_exhausted=$((after[5] - before[5]))" -kv "late_drops=$((after[6] - before[6]))" -kv "auto_delay_ms=$delay" \
		-kv "cpu_ticks=$((c1 - c0))" -kv "clk_tck=$CLK_TCK" -kv "udp_rcvbuf_errors=$(($(udp_rcvbuf_errors) - drops0))" \
		>>"$WORK/hedge.jsonl" || die "could not parse $WORK/$tag.out"
	grep -v '^> ' "$WORK/$tag.out" >"$WORK/$tag.summary" || true
	rm -f "$WORK/$tag.out"
	# The front's own counters at the end of the run (closes by reason, mode
	# changes, rescues...): what explains a run that missed its targets.
	http_get "$METRICS_PORT" /metrics | grep -E '^coredns_(dotforward|proxy|forward)_' >"$WORK/$tag.metrics" || true
	stop_pid "$FRONT_PID"
	stop_pid "$b_pid"
	stop_pid "$a_pid"
	local p5 p9 p99 b n l
	read -r p5 p9 p99 b n l < <(last_fields "$WORK/hedge.jsonl" p50_ms p99_ms p999_ms b_queries sent lost)
	log "$(printf '%-20s p50 %.2f ms  p99 %.1f ms  p99.9 %.1f ms  B %d of %d sent  lost %s' "$tag" "$p5" "$p9" "$p99" "$b" "$n" "$l")"
}

# phase_hedge measures issue 16's tail-latency regime for each of
# BENCH_HEDGE_SETTINGS, BENCH_HEDGE_ROUNDS times in rotated order, and writes
# bench/results/hedge.{md,json,svg}.
phase_hedge() {
	local t0=$SECONDS load0 h r
	load0=$(cut -d' ' -f1-3 /proc/loadavg)
	: >"$WORK/hedge.jsonl"
	make_slow_queries
	for ((r = 1; r <= BENCH_HEDGE_ROUNDS; r++)); do
		log "hedge round $r/$BENCH_HEDGE_ROUNDS"
		for h in $(rotated "$r" $BENCH_HEDGE_SETTINGS); do hedge_run "$h" "$r"; done
	done
	{
		cat "$WORK/machine.env"
		echo "warmup=$BENCH_HEDGE_WARMUP"
		echo "hedge_seconds_total=$((SECONDS - t0))"
		echo "loadavg_start=$load0"
		echo "loadavg_end=$(cut -d' ' -f1-3 /proc/loadavg)"
	} >"$WORK/hedge.env"
	"$WORK/benchtool" hedge -in "$WORK/hedge.jsonl" -out "$RESULTS" -machine "$WORK/hedge.env" || die "benchtool hedge failed"
	cp "$WORK/hedge.jsonl" "$RESULTS/hedge.jsonl"
	log "hedge took $((SECONDS - t0)) s; results in $RESULTS/hedge.md"
}

phase_micro() {
	log "Go micro-benchmarks of dot/"
	if ! timeout 600 go test -run '^$' -bench . -benchmem -timeout 8m ./dot/... >"$WORK/micro.txt" 2>&1; then
		log "micro-benchmarks failed: $(tail -5 "$WORK/micro.txt")"
		echo "(go test -bench failed; see the output above)" >>"$WORK/micro.txt"
	fi
}

write_machine() {
	{
		echo "nproc=$(nproc)"
		echo "cpu=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
		echo "kernel=$(uname -r)"
		echo "go=$(go version | awk '{ print $3 }')"
		echo "coredns=$("$COREDNS" -version 2>/dev/null | head -1)"
		echo "unbound=unbound $(unbound -V | awk '/^Version/ { print $2 }')"
		echo "dnsperf=dnsperf $(dnsperf -h 2>&1 | awk '/^Version/ { print $2 }')"
		echo "dnsperf_args=-c $BENCH_CLIENTS -q $BENCH_INFLIGHT -l $BENCH_SECONDS"
		echo "queries=$BENCH_NAMES"
		echo "rounds=$BENCH_ROUNDS"
		echo "seconds=$BENCH_SECONDS"
		echo "warmup=$BENCH_WARMUP"
		echo "zone=$ZONE"
		echo "upstream_threads=1 thread"
		echo "unbound_forwarder_threads=$UNBOUND_THREADS"
		echo "modes=$BENCH_MODES"
		if [ -n "$BASE_COREDNS" ]; then echo "base=$BASE_LABEL ($("$BASE_COREDNS" -version 2>/dev/null | head -1))"; fi
	} >"$WORK/machine.env"
	COREDNS_VERSION=$("$COREDNS" -version 2>/dev/null | awk 'NR == 1 { sub(/^CoreDNS-/, ""); print }')
	DNSDIST_VERSION=$(dnsdist --version 2>/dev/null | awk 'NR == 1 { print $1, $2 }')
}

main() {
	# One run at a time: a second one would wipe the first one's bench/work.
	LOCK=${TMPDIR:-/tmp}/dotforward-bench-$(id -u).lock
	exec 9>"$LOCK"
	flock -n 9 || die "another bench/run.sh holds $LOCK; wait for it to finish"
	preflight
	rm -rf "$WORK"
	mkdir -p "$WORK" "$RESULTS"
	trap cleanup EXIT
	trap 'exit 130' INT TERM
	log "building bench tools"
	go build -o "$WORK/benchtool" ./bench/cmd/benchtool
	go build -o "$WORK/fakedot" ./bench/cmd/fakedot
	make_certs
	make_queries
	: >"$WORK/raw.jsonl"
	start_upstream
	write_machine

	has_phase throughput && phase_throughput
	has_phase latency && phase_latency
	has_phase churn && phase_churn
	has_phase mission && phase_mission
	has_phase regimes && phase_regimes
	has_phase hedge && phase_hedge
	has_phase cluster && phase_cluster
	: >"$WORK/profile.txt"
	has_phase profile && phase_profile
	: >>"$WORK/micro.txt"
	has_phase micro && phase_micro
	has_phase blackhole && phase_blackhole
	has_phase fdlimit && phase_fdlimit

	local hits
	hits=$(unbound_counter "$WORK/upstream.conf" total.num.queries)
	log "upstream answered $hits queries in all"
	# A run of the black hole, the regimes or the hedge phase alone measured nothing for results.md: keep the last one.
	[ -s "$WORK/raw.jsonl" ] || { cluster_results; return 0; }
	"$WORK/benchtool" report -in "$WORK/raw.jsonl" -out "$RESULTS" -machine "$WORK/machine.env" \
		-micro "$WORK/micro.txt" -profile "$WORK/profile.txt"
	cp "$WORK/raw.jsonl" "$RESULTS/raw.jsonl"
	cluster_results
	log "results in $RESULTS/results.md"
}

main "$@"
