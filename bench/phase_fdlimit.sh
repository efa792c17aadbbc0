# shellcheck shell=bash
# The fdlimit phase (issue 21), sourced by bench/run.sh: CoreDNS short of file
# descriptors. CoreDNS runs under a real RLIMIT_NOFILE of BENCH_FDLIMIT_NOFILE
# (prlimit, which sets the limit and execs CoreDNS, so the PID is CoreDNS's) in
# front of the distant in-order upstream (the inorder-distant regime: every
# answer 30 ms after its query, one at a time per connection), offered
# BENCH_FDLIMIT_QPS for BENCH_FDLIMIT_SECONDS, forward tls:// and dotforward
# alternating, BENCH_FDLIMIT_RUNS rounds. The load needs about QPS × 30 ms
# connections, more than the process can open: forward fails the queries whose
# dial fails, dotforward must serve at least as many with the connections it could
# open, and log once that the process is out of file descriptors.
# It writes bench/results/fdlimit.md.

BENCH_FDLIMIT_NOFILE=${BENCH_FDLIMIT_NOFILE:-40}
BENCH_FDLIMIT_QPS=${BENCH_FDLIMIT_QPS:-1000}
BENCH_FDLIMIT_SECONDS=${BENCH_FDLIMIT_SECONDS:-8}
BENCH_FDLIMIT_RUNS=${BENCH_FDLIMIT_RUNS:-5}
# dotforward's log line (nofiles.go); the errors plugin's lines quote the error
# text, not this.
FDLIMIT_LINE='plugin/dotforward: The process is out of file descriptors'

# fdlimit_run MODE ROUND: one run; appends a line to $WORK/fdlimit.tsv:
# mode round sent noerror servfail lost conns_median conns_max log_lines.
fdlimit_run() {
	local mode=$1 round=$2 tag="fdlimit-$1-r$2"
	regime_upstream inorder-distant 0
	METRICS_LINE=""
	render "bench/conf/regime-$mode.Corefile" "$WORK/$tag.Corefile"
	FRONT_NAME=coredns-$tag # its output: $WORK/$FRONT_NAME.out, apart from dnsperf's $WORK/$tag.out
	start_bg "$FRONT_NAME" prlimit "--nofile=$BENCH_FDLIMIT_NOFILE:$BENCH_FDLIMIT_NOFILE" "$COREDNS" -conf "$WORK/$tag.Corefile"
	FRONT_PID=$BG_PID
	FRONT_QPORT=$FRONT_PORT
	wait_dns "$FRONT_PID" "$FRONT_NAME" "$FRONT_QPORT" || die "$mode did not answer under RLIMIT_NOFILE $BENCH_FDLIMIT_NOFILE"
	local lim
	lim=$(awk '/^Max open files/ { print $4 }' "/proc/$FRONT_PID/limits")
	[ "$lim" = "$BENCH_FDLIMIT_NOFILE" ] || die "CoreDNS (PID $FRONT_PID) runs with $lim open files, want $BENCH_FDLIMIT_NOFILE"

	dnsperf_run "$WORK/$tag.out" "$BENCH_FDLIMIT_SECONDS" -c 10 -q 1000 -Q "$BENCH_FDLIMIT_QPS"
	local samples=() i
	for ((i = 1; i < BENCH_FDLIMIT_SECONDS; i++)); do
		sleep 1
		samples+=("$(est_conns "$REG_CONN_PORT")")
	done
	dnsperf_wait || die "dnsperf failed for $tag: $(tail -3 "$WORK/$tag.out")"
	alive "$FRONT_PID" "$FRONT_NAME" || die "$mode died under RLIMIT_NOFILE $BENCH_FDLIMIT_NOFILE"
	stop_pid "$FRONT_PID"
	local p
	for p in "${REG_STOP[@]}"; do stop_pid "$p"; done

	local out=$WORK/$tag.out sent noerror servfail lost cmed cmax lines
	sent=$(awk '/Queries sent:/ { print $3 }' "$out")
	lost=$(awk '/Queries lost:/ { print $3 }' "$out")
	noerror=$(grep -o 'NOERROR [0-9]*' "$out" | awk '{ print $2 }' || true) # none: no such line
	servfail=$(grep -o 'SERVFAIL [0-9]*' "$out" | awk '{ print $2 }' || true)
	read -r cmed cmax < <(printf '%s\n' "${samples[@]}" | sort -n | awk '{ v[NR] = $1 } END {
		m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[NR] }')
	lines=$(grep -c -F "$FDLIMIT_LINE" "$WORK/$FRONT_NAME.out" || true)
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$round" "${sent:-0}" "${noerror:-0}" "${servfail:-0}" \
		"${lost:-0}" "$cmed" "$cmax" "$lines" >>"$WORK/fdlimit.tsv"
	log "$(printf '%-28s sent %s  NOERROR %s  SERVFAIL %s  lost %s  conns %s/%s  out-of-fds log lines %s' \
		"$tag" "$sent" "${noerror:-0}" "${servfail:-0}" "$lost" "$cmed" "$cmax" "$lines")"
}

# phase_fdlimit runs the rounds and writes bench/results/fdlimit.md.
phase_fdlimit() {
	command -v prlimit >/dev/null || die "prlimit (util-linux) is missing"
	local r m t0=$SECONDS
	: >"$WORK/fdlimit.tsv"
	for ((r = 1; r <= BENCH_FDLIMIT_RUNS; r++)); do
		for m in $(rotated "$r" fwd-tls dotforward); do fdlimit_run "$m" "$r"; done
	done
	write_fdlimit $((SECONDS - t0)) >"$RESULTS/fdlimit.md"
	log "fdlimit took $((SECONDS - t0)) s; results in $RESULTS/fdlimit.md"
}

# write_fdlimit SECONDS: fdlimit.md from $WORK/fdlimit.tsv. A round passes when
# dotforward's NOERROR answers are at least forward's and its log has the line
# exactly once.
write_fdlimit() {
	echo "# Short of file descriptors (issue 21)"
	echo
	echo "Generated $(date -u +%Y-%m-%dT%H:%M:%SZ) by bench/run.sh, phase \`fdlimit\` ($1 s), on $(nproc) CPUs (load average $(cut -d' ' -f1-3 /proc/loadavg))."
	echo "CoreDNS $COREDNS_VERSION runs under \`prlimit --nofile=$BENCH_FDLIMIT_NOFILE:$BENCH_FDLIMIT_NOFILE\` (checked in /proc/PID/limits)"
	echo "with *forward* \`tls://\` or *dotforward* (bench/conf/regime-*.Corefile, defaults) in front of a distant in-order"
	echo "upstream: CoreDNS's own \`tls://\` block answering every query after $INORDER_DELAY, one at a time per connection."
	echo "Load: \`dnsperf -c 10 -q 1000 -Q $BENCH_FDLIMIT_QPS -l $BENCH_FDLIMIT_SECONDS\`, no warm-up; the modes alternate, each"
	echo "started afresh. *conns*: established connections to the upstream, sampled once a second, median (max)."
	echo "*log lines*: lines \`$FDLIMIT_LINE…\` in CoreDNS's output (dotforward's; forward has none)."
	echo "A round passes when dotforward's NOERROR answers are ≥ forward's and its log has the line exactly once."
	echo
	echo "| round | mode | sent | NOERROR | SERVFAIL | lost | conns | log lines | round result |"
	echo "|---:|---|---:|---:|---:|---:|---:|---:|---|"
	awk -F'\t' '
		{ row[$2, $1] = $0; good[$2, $1] = $4; lines[$2, $1] = $9; if ($2 > n) n = $2 }
		END {
			for (r = 1; r <= n; r++) {
				ok = ((r, "dotforward") in good) && ((r, "fwd-tls") in good) && good[r, "dotforward"] >= good[r, "fwd-tls"] && lines[r, "dotforward"] == 1
				passed += ok
				for (i = 1; i <= 2; i++) {
					m = (i == 1) ? "fwd-tls" : "dotforward"
					if (!((r, m) in row)) continue
					split(row[r, m], f, "\t")
					res = (m == "dotforward") ? (ok ? "PASS" : "**FAIL**") : ""
					printf "| %d | %s | %d | %d | %d | %d | %s (%s) | %d | %s |\n", r, (m == "fwd-tls" ? "forward tls://" : m), f[3], f[4], f[5], f[6], f[7], f[8], f[9], res
				}
			}
			printf "\n**%d of %d rounds passed.**\n", passed, n
		}' "$WORK/fdlimit.tsv"
}
