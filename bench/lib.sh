# shellcheck shell=bash
# Helpers for bench/run.sh: logging, processes started and stopped by PID only,
# readiness polls with deadlines, and readings from /proc and ss.

log() { printf '%s bench: %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }

# PIDS holds every background process this script started; cleanup stops them.
PIDS=()

# start_bg NAME CMD...: runs CMD in the background with output in $WORK/NAME.out,
# records its PID in PIDS and $WORK/NAME.pid, and sets BG_PID.
start_bg() {
	local name=$1
	shift
	"$@" >"$WORK/$name.out" 2>&1 &
	BG_PID=$!
	PIDS+=("$BG_PID")
	echo "$BG_PID" >"$WORK/$name.pid"
}

# stop_pid PID: SIGTERM, wait up to 5 s, then SIGKILL. Only PIDs this script
# started are ever passed here.
stop_pid() {
	local pid=$1 i
	[ -n "$pid" ] || return 0
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for i in $(seq 1 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "$pid" 2>/dev/null; then
			log "PID $pid ignored SIGTERM for 5 s; sending SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	fi
	wait "$pid" 2>/dev/null || true
	local kept=() p
	for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || kept+=("$p"); done
	PIDS=("${kept[@]}")
}

# cleanup stops everything still running, newest first. Installed as the EXIT trap.
cleanup() {
	local i
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_pid "${PIDS[i]}"; done
}

# alive PID NAME: fails with the process's output when it has exited.
alive() {
	kill -0 "$1" 2>/dev/null && return 0
	log "$2 (PID $1) exited; its output:"
	tail -n 20 "$WORK/$2.out" >&2 || true
	return 1
}

# port_free PORT: no TCP or UDP socket is bound to 127.0.0.1:PORT.
port_free() {
	[ -z "$(ss -Htuln "( sport = :$1 )" 2>/dev/null)" ]
}

# wait_dns PID NAME PORT [dig options...]: polls a query for a bench name until it
# is answered, for at most 15 s, failing early when the process dies.
wait_dns() {
	local pid=$1 name=$2 port=$3
	shift 3
	local deadline=$((SECONDS + 15))
	while [ $SECONDS -lt $deadline ]; do
		alive "$pid" "$name" || return 1
		if dig +time=1 +tries=1 -p "$port" "$@" @127.0.0.1 "ready.$ZONE" A 2>/dev/null | grep -q 'status: NOERROR'; then
			return 0
		fi
		sleep 0.2
	done
	log "$name did not answer on port $port within 15 s; its output:"
	tail -n 20 "$WORK/$name.out" >&2 || true
	return 1
}

# wait_tcp PID NAME PORT: polls until 127.0.0.1:PORT accepts TCP, for at most 15 s.
wait_tcp() {
	local pid=$1 name=$2 port=$3
	local deadline=$((SECONDS + 15))
	while [ $SECONDS -lt $deadline ]; do
		alive "$pid" "$name" || return 1
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
		sleep 0.2
	done
	log "$name did not listen on TCP port $port within 15 s"
	return 1
}

# http_get PORT PATH: body of GET http://127.0.0.1:PORT/PATH (bash's /dev/tcp, so
# no curl needed), bounded to 30 s.
http_get() {
	timeout 30 bash -c '
		exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
		printf "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n" "$2" >&3
		# Drop the status line and headers, keep the body as is (it may be binary).
		sed -u "1,/^\r\{0,1\}$/d" <&3
	' _ "$1" "$2"
}

# cpu_ticks PID: user+system CPU time of PID in clock ticks (fields 14 and 15 of
# /proc/PID/stat, counted after the command name, which may contain spaces).
cpu_ticks() {
	sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

# io_syscalls PID: "reads writes" — read(2)/write(2)-family syscalls of PID so far
# (syscr/syscw of /proc/PID/io; socket sendmsg/recvmsg are not counted there).
io_syscalls() {
	awk '$1 == "syscr:" { r = $2 } $1 == "syscw:" { w = $2 } END { print r + 0, w + 0 }' "/proc/$1/io"
}

# rss_peak_kb PID: the process's peak resident set size (VmHWM) in kB.
rss_peak_kb() {
	awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"
}

# est_conns PORT: established TCP connections towards 127.0.0.1:PORT (client side).
est_conns() {
	ss -Htn state established "( dport = :$1 )" 2>/dev/null | wc -l
}

# sample_conns PORT SECONDS: samples est_conns PORT at 1/4, 1/2 and 3/4 of a run
# of SECONDS that has just started, and prints the middle sample and the most.
sample_conns() {
	local q=$(($2 * 250)) i n mid=0 most=0
	for i in 1 2 3; do
		sleep "$(awk -v ms="$q" 'BEGIN { printf "%.3f", ms / 1000 }')"
		n=$(est_conns "$1")
		[ "$i" = 2 ] && mid=$n
		[ "$n" -gt "$most" ] && most=$n
	done
	echo "$mid $most"
}

# udp_rcvbuf_errors: datagrams the kernel dropped because a UDP socket's receive
# buffer was full, machine-wide (Udp RcvbufErrors in /proc/net/snmp).
udp_rcvbuf_errors() {
	awk '$1 == "Udp:" { if (!h) { for (i = 2; i <= NF; i++) if ($i == "RcvbufErrors") c = i; h = 1 } else print $c }' /proc/net/snmp
}

# net_drops: counters of datagrams the kernel dropped or could not deliver,
# machine-wide, besides udp_rcvbuf_errors: Udp InErrors (every UDP receive
# error), SndbufErrors (a send that found its socket's buffer full), NoPorts (a
# datagram to a port nobody listens on: an answer after its client closed its
# socket) and the packets dropped off a CPU's backlog before any protocol saw
# them (the second column of /proc/net/softnet_stat, summed), as
# "inerrors sndbuf noports backlog". A lost query that moved none of them was
# not lost in the kernel.
net_drops() {
	local udp backlog=0 dropped
	udp=$(awk '$1 == "Udp:" { if (!h) { for (i = 2; i <= NF; i++) k[$i] = i; h = 1 } else print $k["InErrors"], $k["SndbufErrors"], $k["NoPorts"] }' /proc/net/snmp)
	while read -r _ dropped _; do backlog=$((backlog + 16#$dropped)); done </proc/net/softnet_stat
	echo "$udp $backlog"
}

# unbound_counter CONF NAME: a counter from `unbound-control stats_noreset`; dies
# when it cannot be read (the checks of who forwarded what depend on it).
unbound_counter() {
	local v
	v=$(timeout 10 unbound-control -c "$1" stats_noreset 2>/dev/null | awk -F= -v k="$2" '$1 == k { print $2 }')
	[ -n "$v" ] || die "cannot read $2 with unbound-control -c $1"
	echo "$v"
}

# render TEMPLATE OUT: copies TEMPLATE to OUT replacing every @NAME@ with $NAME
# (values may hold several lines, and any of \ # &).
render() {
	local tpl=$1 out=$2 sedargs=() v val
	for v in WORK ZONE ANSWER SERVER_NAME UDP_PORT DOT_PORT CTL_PORT FRONT_PORT FWD_PORT \
		FWD_CTL_PORT FAKE_PORT METRICS_LINE PPROF_PORT UPSTREAM_ADDR UNBOUND_THREADS \
		METRICS_PORT REG_DOT_PORT REG_BACKEND_PORT ERRATIC_EVERY ERRATIC_DELAY BACKEND_DELAY DOTFORWARD_OPTS \
		HEDGE_B_ADDR HEDGE_LINE; do
		val=${!v-}
		val=${val//\\/\\\\}
		val=${val//#/\\#}
		val=${val//&/\\&}
		val=${val//$'\n'/\\n}
		sedargs+=(-e "s#@$v@#$val#g")
	done
	sed "${sedargs[@]}" "$tpl" >"$out"
	if grep -q '@[A-Z_]*@' "$out"; then die "unfilled placeholder in $out: $(grep -o '@[A-Z_]*@' "$out" | head -1)"; fi
}

# last_fields FILE FIELD...: the numeric FIELDs of FILE's last JSON line, in
# order, space-separated ("?" for a missing one): for the progress log lines.
last_fields() {
	local f=$1
	shift
	tail -n 1 "$f" | awk -v names="$*" '{
		n = split(names, k, " ")
		for (i = 1; i <= n; i++) {
			v = "?"
			if (match($0, "\"" k[i] "\":[0-9.e+-]+")) v = substr($0, RSTART + length(k[i]) + 3, RLENGTH - length(k[i]) - 3)
			printf "%s%s", v, (i < n ? " " : "\n")
		}
	}'
}
