# shellcheck shell=bash
# The cluster phase of bench/run.sh (issue 22): the shipped cluster DNS Corefile
# (deploy/kubernetes/configmap.yaml) on a real API server holding a few hundred
# Services, under a hybrid load: 80 % cluster names, 20 % outside names distinct
# enough to miss `cache 30`. Three fronts in one run, each the same Corefile but
# for the forwarding line: dotforward to the bench's unbound over DoT, forward to
# the same unbound over tls://, and forward over UDP. It writes
# bench/results/cluster.md and puts it into results.md as a section of its own.
#
# Knobs: BENCH_CLUSTER_SERVICES=300 BENCH_CLUSTER_ROUNDS=$BENCH_ROUNDS
#   BENCH_CLUSTER_MODES="dotforward fwd-tls fwd-udp" BENCH_CLUSTER_QUERIES=400000
# Ports: BASE+50..BASE+55 (API server, etcd client and peer, health, ready, metrics).

# cluster_init sets the phase's settings; run.sh sources this file before it
# sets BASE and BENCH_ROUNDS, so they are read when preflight asks for the ports.
cluster_init() {
	BENCH_CLUSTER_SERVICES=${BENCH_CLUSTER_SERVICES:-300}
	BENCH_CLUSTER_ROUNDS=${BENCH_CLUSTER_ROUNDS:-$BENCH_ROUNDS}
	BENCH_CLUSTER_MODES=${BENCH_CLUSTER_MODES:-dotforward fwd-tls fwd-udp}
	BENCH_CLUSTER_QUERIES=${BENCH_CLUSTER_QUERIES:-400000}
	CL_API_PORT=$((BASE + 50))
	CL_ETCD_PORT=$((BASE + 51))
	CL_ETCD_PEER_PORT=$((BASE + 52))
	CL_HEALTH_PORT=$((BASE + 53))
	CL_READY_PORT=$((BASE + 54))
	CL_METRICS_PORT=$((BASE + 55))
	CL_TOKEN=dotforward-bench-admin
}

# cluster_ports: the phase's ports, for preflight.
cluster_ports() {
	cluster_init
	echo "$CL_API_PORT $CL_ETCD_PORT $CL_ETCD_PEER_PORT $CL_HEALTH_PORT $CL_READY_PORT $CL_METRICS_PORT"
}

# cluster_control_plane starts etcd and kube-apiserver (built by
# scripts/k8s-tools.sh) on 127.0.0.1 and writes $WORK/kubeconfig.
cluster_control_plane() {
	local bin deadline
	bin=$(bash scripts/k8s-tools.sh) || die "scripts/k8s-tools.sh could not build the control plane"
	KUBECTL=$bin/kubectl
	openssl ecparam -name prime256v1 -genkey -noout -out "$WORK/sa.key" 2>>"$WORK/openssl.err"
	echo "$CL_TOKEN,admin,admin,\"system:masters\"" >"$WORK/tokens.csv"
	start_bg etcd "$bin/etcd" --data-dir "$WORK/etcd" --name default --log-level warn \
		--listen-client-urls "http://127.0.0.1:$CL_ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$CL_ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$CL_ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$CL_ETCD_PEER_PORT" \
		--initial-cluster "default=http://127.0.0.1:$CL_ETCD_PEER_PORT"
	wait_tcp "$BG_PID" etcd "$CL_ETCD_PORT" || die "etcd did not start"
	start_bg kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$CL_ETCD_PORT" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$CL_API_PORT" \
		--tls-cert-file "$WORK/leaf.pem" --tls-private-key-file "$WORK/leaf.key" --cert-dir "$WORK/apiserver-certs" \
		--token-auth-file "$WORK/tokens.csv" --authorization-mode RBAC \
		--service-account-key-file "$WORK/sa.key" --service-account-signing-key-file "$WORK/sa.key" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-cluster-ip-range 10.96.0.0/12 --endpoint-reconciler-type none --enable-priority-and-fairness=false
	CL_API_PID=$BG_PID
	cat >"$WORK/kubeconfig" <<-EOF
		apiVersion: v1
		kind: Config
		clusters: [{name: bench, cluster: {server: "https://127.0.0.1:$CL_API_PORT", certificate-authority: "$WORK/ca.pem", tls-server-name: "$SERVER_NAME"}}]
		users: [{name: admin, user: {token: $CL_TOKEN}}]
		contexts: [{name: bench, context: {cluster: bench, user: admin}}]
		current-context: bench
	EOF
	# The API server takes about 4 s idle; far longer on a loaded machine.
	deadline=$((SECONDS + 180))
	until [ "$(timeout 10 "$KUBECTL" --kubeconfig "$WORK/kubeconfig" get --raw /readyz 2>/dev/null)" = ok ]; do
		alive "$CL_API_PID" kube-apiserver || die "kube-apiserver exited"
		[ $SECONDS -lt $deadline ] || die "kube-apiserver not ready after 180 s: $(tail -3 "$WORK/kube-apiserver.out")"
		sleep 0.5
	done
	log "kube-apiserver PID $CL_API_PID ready on :$CL_API_PORT"
}

# cluster_services creates namespace bench with BENCH_CLUSTER_SERVICES ClusterIP
# Services svc-0..N-1, in one kubectl call.
cluster_services() {
	awk -v n="$BENCH_CLUSTER_SERVICES" 'BEGIN {
		print "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: bench}}"
		for (i = 0; i < n; i++)
			printf "- {apiVersion: v1, kind: Service, metadata: {name: svc-%d, namespace: bench}, spec: {ports: [{name: http, port: 80}]}}\n", i
	}' >"$WORK/services.yaml"
	timeout 300 "$KUBECTL" --kubeconfig "$WORK/kubeconfig" create -f "$WORK/services.yaml" >"$WORK/services.out" 2>&1 ||
		die "creating the services failed: $(tail -3 "$WORK/services.out")"
	log "created $BENCH_CLUSTER_SERVICES services"
}

# cluster_corefile MODE OUT: the shipped Corefile with the changes a machine
# without a cluster forces (listen addresses, kubeconfig) and MODE's forwarding
# line and block in place of the shipped dotforward one.
cluster_corefile() {
	local fwd
	case $1 in
	dotforward) fwd="dotforward . tls://127.0.0.1%$SERVER_NAME:$DOT_PORT {\n       tls $WORK/ca.pem\n       max_concurrent 1000\n    }" ;;
	fwd-tls) fwd="forward . tls://127.0.0.1:$DOT_PORT {\n       tls_servername $SERVER_NAME\n       tls $WORK/ca.pem\n       max_concurrent 1000\n    }" ;;
	fwd-udp) fwd="forward . 127.0.0.1:$UDP_PORT {\n       max_concurrent 1000\n    }" ;;
	*) die "unknown cluster mode $1 (BENCH_CLUSTER_MODES)" ;;
	esac
	# The Corefile is the ConfigMap's data.Corefile block, 4 spaces in.
	awk '/^  Corefile: \|$/ { on = 1; next } on { sub(/^    /, ""); print }' deploy/kubernetes/configmap.yaml |
		awk -v fwd="$fwd" -v port="$FRONT_PORT" -v hp="$CL_HEALTH_PORT" -v rp="$CL_READY_PORT" -v mp="$CL_METRICS_PORT" -v kc="$WORK/kubeconfig" '
			/^\.:53 \{$/ { print ".:" port " {\n    bind 127.0.0.1"; n++; next }
			/^ *health \{$/ { sub(/health/, "health 127.0.0.1:" hp); print; n++; next }
			/^ *ready$/ { sub(/ready/, "ready 127.0.0.1:" rp); print; n++; next }
			/^ *prometheus :9153$/ { sub(/:9153/, "127.0.0.1:" mp); print; n++; next }
			/^ *kubernetes cluster\.local / { print; print "       kubeconfig " kc; n++; next }
			/^ *dotforward \. / { printf "    %s\n", fwd; skip = 1; n++; next }
			skip && /^ *\}$/ { skip = 0; next }
			skip { next }
			{ print }
			END { if (n != 6) { print "cluster_corefile: " n " of 6 edits applied" > "/dev/stderr"; exit 1 } }' >"$2" ||
		die "the shipped Corefile changed; bench/phase_cluster.sh cannot adapt it"
}

# cluster_queries TAG: BENCH_CLUSTER_QUERIES names, 4 in 5 a Service of
# namespace bench (cached after its first query, as in a cluster) and 1 in 5 an
# outside name x<TAG>-<i>.bench.test asked once (so it misses the cache).
cluster_queries() {
	awk -v n="$BENCH_CLUSTER_QUERIES" -v s="$BENCH_CLUSTER_SERVICES" -v tag="$1" -v z="$ZONE" 'BEGIN {
		for (i = 1; i <= n; i++)
			if (i % 5 == 0) printf "x%s-%d.%s A\n", tag, i, z
			else printf "svc-%d.bench.svc.cluster.local A\n", i % s
	}' >"$WORK/cluster-queries.txt"
}

# cluster_measure MODE ROUND: one run of MODE, appended to cluster.jsonl.
cluster_measure() {
	local mode=$1 round=$2 tag="cluster-$1-r$2"
	cluster_corefile "$mode" "$WORK/$tag.Corefile"
	start_bg "coredns-$tag" "$COREDNS" -conf "$WORK/$tag.Corefile"
	FRONT_PID=$BG_PID FRONT_NAME=coredns-$tag FRONT_QPORT=$FRONT_PORT
	local deadline=$((SECONDS + 60))
	until [ "$(http_get "$CL_READY_PORT" /ready 2>/dev/null)" = OK ]; do
		alive "$FRONT_PID" "$FRONT_NAME" || die "$mode did not start"
		[ $SECONDS -lt $deadline ] || die "$mode not ready after 60 s"
		sleep 0.2
	done
	cluster_queries "w$round$mode"
	dnsperf_run "$WORK/$tag.warmup" "$BENCH_WARMUP" -t 1 -d "$WORK/cluster-queries.txt"
	dnsperf_wait || die "warm-up dnsperf failed for $tag: $(tail -3 "$WORK/$tag.warmup")"
	cluster_queries "m$round$mode"
	local up0 c0 c1 drops0 most mid
	up0=$(unbound_counter "$WORK/upstream.conf" total.num.queries)
	drops0=$(udp_rcvbuf_errors)
	c0=$(cpu_ticks "$FRONT_PID")
	local port=$DOT_PORT
	[ "$mode" = fwd-udp ] && port=$UDP_PORT
	dnsperf_run "$WORK/$tag.out" "$BENCH_SECONDS" -v -d "$WORK/cluster-queries.txt"
	read -r mid most < <(sample_conns "$port" "$BENCH_SECONDS")
	dnsperf_wait || die "dnsperf failed for $tag: $(tail -3 "$WORK/$tag.out")"
	c1=$(cpu_ticks "$FRONT_PID")
	alive "$FRONT_PID" "$FRONT_NAME" || die "$mode died during the run"
	"$WORK/benchtool" parse -in "$WORK/$tag.out" -split x -kv "kind=cluster" -kv "mode=$mode" -kv "round=$round" \
		-kv "cpu_ticks=$((c1 - c0))" -kv "clk_tck=$CLK_TCK" -kv "conns_mid=$mid" -kv "conns_max=$most" \
		-kv "upstream_queries=$(($(unbound_counter "$WORK/upstream.conf" total.num.queries) - up0))" \
		-kv "udp_rcvbuf_errors=$(($(udp_rcvbuf_errors) - drops0))" >>"$WORK/cluster.jsonl" ||
		die "could not parse $WORK/$tag.out"
	grep -v '^> ' "$WORK/$tag.out" >"$WORK/$tag.summary" || true
	rm -f "$WORK/$tag.out"
	stop_pid "$FRONT_PID"
	local qps cpu lost
	read -r qps cpu lost < <(last_fields "$WORK/cluster.jsonl" qps cpu_us_per_query lost)
	log "$(printf '%-34s %8.0f qps  lost %s  cpu %.1f us/q' "$tag" "$qps" "$lost" "$cpu")"
}

phase_cluster() {
	local t0=$SECONDS r m
	cluster_init
	: >"$WORK/cluster.jsonl"
	cluster_control_plane
	cluster_services
	for ((r = 1; r <= BENCH_CLUSTER_ROUNDS; r++)); do
		log "cluster round $r/$BENCH_CLUSTER_ROUNDS"
		for m in $(rotated "$r" $BENCH_CLUSTER_MODES); do cluster_measure "$m" "$r"; done
	done
	stop_pid "$CL_API_PID"
	cluster_report >"$RESULTS/cluster.md"
	cp "$WORK/cluster.jsonl" "$RESULTS/cluster.jsonl"
	log "cluster took $((SECONDS - t0)) s; results in $RESULTS/cluster.md"
}

# cluster_median MODE FIELD: the median over the rounds of FIELD of MODE's runs.
cluster_median() {
	grep "\"mode\":\"$1\"" "$WORK/cluster.jsonl" | while read -r line; do
		printf '%s\n' "$line" | sed -n "s/.*\"$2\":\\([0-9.e+-]*\\).*/\\1/p"
	done | sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

cluster_label() {
	case $1 in
	dotforward) echo "dotforward → unbound, DoT" ;;
	fwd-tls) echo "forward → unbound, tls://" ;;
	fwd-udp) echo "forward → unbound, UDP" ;;
	esac
}

# cluster_report writes the section's Markdown from cluster.jsonl.
cluster_report() {
	local m
	echo "## Cluster DNS, hybrid load (issue 22)"
	echo
	echo "Generated $(date -u +%Y-%m-%dT%H:%M:%SZ) by \`make bench\` (phase cluster, bench/phase_cluster.sh) on $(nproc) CPUs, all on 127.0.0.1."
	echo "The shipped Corefile of deploy/kubernetes/configmap.yaml (\`kubernetes\` with \`pods insecure\`, \`cache 30\`, \`loop\`, \`reload\`, \`loadbalance\`),"
	echo "changed only in its listen addresses, a \`kubeconfig\` for the \`kubernetes\` block and the forwarding line, against a real"
	echo "kube-apiserver (etcd, $("$KUBECTL" version --client 2>/dev/null | awk '/Client Version/ { print $3 }')) holding $BENCH_CLUSTER_SERVICES ClusterIP Services."
	echo "Load: \`dnsperf -c $BENCH_CLIENTS -q $BENCH_INFLIGHT -l $BENCH_SECONDS\`, 4 names in 5 one of the Services (answered by \`kubernetes\`, then by \`cache\`),"
	echo "1 in 5 an outside name asked once (forwarded to the bench's unbound every time); $BENCH_CLUSTER_ROUNDS round(s) per mode, modes interleaved,"
	echo "medians. CPU is the CoreDNS process's per answered query; upstream conns: established connections to unbound half-way (most of three samples)."
	echo
	echo "| mode | QPS | lost | not NOERROR | p50 ms | p99 ms | cluster names p99 ms | outside names p99 ms | CPU µs/query | upstream conns | upstream queries / outside name |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
	for m in $BENCH_CLUSTER_MODES; do
		awk -v l="$(cluster_label "$m")" -v q="$(cluster_median "$m" qps)" -v lo="$(cluster_median "$m" lost)" \
			-v ne="$(cluster_median "$m" not_noerror)" -v p50="$(cluster_median "$m" p50_ms)" -v p99="$(cluster_median "$m" p99_ms)" \
			-v fp="$(cluster_median "$m" fast_p99_ms)" -v sp="$(cluster_median "$m" slow_p99_ms)" \
			-v cpu="$(cluster_median "$m" cpu_us_per_query)" -v cm="$(cluster_median "$m" conns_mid)" -v cx="$(cluster_median "$m" conns_max)" \
			-v uq="$(cluster_median "$m" upstream_queries)" -v ss="$(cluster_median "$m" slow_samples)" -v udp="$([ "$m" = fwd-udp ] && echo 1)" \
			'BEGIN { printf "| %s | %.0f | %d | %d | %.2f | %.2f | %.2f | %.2f | %.1f | %s | %.2f |\n", l, q, lo, ne, p50, p99, fp, sp, cpu, (udp ? "– (UDP)" : sprintf("%d (%d)", cm, cx)), (ss > 0 ? uq / ss : 0) }'
	done
	echo
	echo "Ratios of the medians: QPS dotforward / forward tls:// $(awk -v a="$(cluster_median dotforward qps)" -v b="$(cluster_median fwd-tls qps)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'),"
	echo "QPS dotforward / forward UDP $(awk -v a="$(cluster_median dotforward qps)" -v b="$(cluster_median fwd-udp qps)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }');"
	echo "p99 dotforward / forward tls:// $(awk -v a="$(cluster_median dotforward p99_ms)" -v b="$(cluster_median fwd-tls p99_ms)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')."
	echo
	echo "The FreeIPA seed measured this hybrid mix (cluster names local, the rest over DoT) at 17–19k QPS with CoreDNS \`forward\`"
	echo "in a real cluster, and found CoreDNS the limit. Here dnsperf, the API server, the upstream and CoreDNS share $(nproc) CPUs, so the"
	echo "absolute figures do not compare with the seed's; the ratios do: with the forwarding leg over DoT, dotforward serves"
	echo "$(awk -v a="$(cluster_median dotforward qps)" -v b="$(cluster_median fwd-tls qps)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') times what \`forward\` tls:// serves and $(awk -v a="$(cluster_median dotforward qps)" -v b="$(cluster_median fwd-udp qps)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }') times \`forward\` over UDP on the same CPU."
}

# cluster_results puts bench/results/cluster.md into results.md as its last
# section, replacing an earlier one: results.md is rewritten by `benchtool report`
# on every full run, and the cluster section must survive a run without it.
cluster_results() {
	local md=$RESULTS/results.md
	[ -s "$RESULTS/cluster.md" ] && [ -f "$md" ] || return 0
	awk '/^<!-- cluster phase begin -->$/ { skip = 1 } !skip { print } /^<!-- cluster phase end -->$/ { skip = 0 }' "$md" >"$WORK/results.tmp"
	{ echo "<!-- cluster phase begin -->"; cat "$RESULTS/cluster.md"; echo "<!-- cluster phase end -->"; } >>"$WORK/results.tmp"
	mv "$WORK/results.tmp" "$md"
}
