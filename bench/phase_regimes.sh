# shellcheck shell=bash
# The regimes phase's additions of issue 21, sourced by bench/run.sh: two more
# regimes and the repetition of every regime (BENCH_REGIME_RUNS rounds in a row,
# each reported and judged on its own in regimes.md).
#
#   inorder-distant  CoreDNS's own tls:// server block (miekg/dns answers a
#                    connection's queries one at a time, in order) answering every
#                    query after INORDER_DELAY (erratic "delay 1 D" sleeps in
#                    ServeDNS, on the connection's only serving goroutine), at
#                    INORDER_QPS: about QPS × delay = 60 connections' worth of load.
#   slow-pipelining  bench/cmd/fakedot answering every query after SLOWPIPE_DELAY,
#                    out of order (each query in its own goroutine), at SLOWPIPE_QPS:
#                    a recursive resolver on a burst of uncached names.

BENCH_REGIME_RUNS=${BENCH_REGIME_RUNS:-1}
INORDER_DELAY=30ms
INORDER_QPS=2000
SLOWPIPE_DELAY=300ms
SLOWPIPE_QPS=250 # × 300 ms = 75 queries in flight, under dnsperf's -q (BENCH_REGIME_INFLIGHT, 100)

# regime_offered REGIME: the offered rate of a paced regime (0: full speed).
regime_offered() {
	case $1 in
	coredns-erratic | dnsdist-slow) echo 2000 ;;
	cut-slowtail | unbound) echo 3000 ;;
	inorder-distant) echo "$INORDER_QPS" ;;
	slow-pipelining) echo "$SLOWPIPE_QPS" ;;
	*) die "unknown regime $1 (BENCH_REGIMES)" ;;
	esac
}

# regime_upstream_more REGIME: regime_upstream for the regimes of this file (the
# same variables set); fails for a regime it does not know.
regime_upstream_more() {
	case $1 in
	inorder-distant)
		# regime-erratic.Corefile with every query held back: erratic "delay 1 D".
		local ERRATIC_EVERY=1 ERRATIC_DELAY=$INORDER_DELAY
		render bench/conf/regime-erratic.Corefile "$WORK/regime-inorder.Corefile"
		start_bg regime-inorder "$COREDNS" -conf "$WORK/regime-inorder.Corefile"
		REG_STOP=("$BG_PID")
		wait_dns "$BG_PID" regime-inorder "$REG_DOT_PORT" +tls "+tls-ca=$WORK/ca.pem" "+tls-hostname=$SERVER_NAME" ||
			die "CoreDNS in order did not answer over DoT"
		REG_SETUP="CoreDNS $COREDNS_VERSION's own \`tls://\` server block (bench/conf/regime-erratic.Corefile with"\
" \`erratic { delay 1 $INORDER_DELAY }\`), which like every miekg/dns server answers a connection's queries one at a"\
" time, in order, and answers every query after $INORDER_DELAY: a distant in-order upstream. At $INORDER_QPS QPS the"\
" load needs about $((INORDER_QPS * ${INORDER_DELAY%ms} / 1000)) connections."
		;;
	slow-pipelining)
		regime_fake 0 -delay "$SLOWPIPE_DELAY"
		REG_SETUP="bench/cmd/fakedot (dot/dottest as a process: it answers a connection's queries concurrently, out of"\
" order) answering every query after $SLOWPIPE_DELAY (\`-delay $SLOWPIPE_DELAY\`, every name): a pipelining upstream"\
" whose answers are all slow, as a recursive resolver on a burst of uncached names. Nothing is blocked: more"\
" connections or rescues cannot help."
		;;
	*) return 1 ;;
	esac
}
