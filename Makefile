# dotforward: build, test and benchmark a CoreDNS with the dotforward plugin.
GO      ?= go
BINARY  ?= coredns

.PHONY: build test test-deps bench bench-blackhole bench-regimes bench-hedge bench-cluster clean

# build writes ./coredns: every standard CoreDNS plugin plus dotforward.
build:
	CGO_ENABLED=0 $(GO) build -o $(BINARY) ./cmd/coredns

# test installs what the tests need (Debian packages, Go modules), then runs the
# whole suite with the race detector. The end-to-end tests fail, never skip, when a
# server they need is missing.
test: test-deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...

test-deps:
	bash scripts/install-deps.sh

# bench builds ./coredns and compares forward (UDP and TLS), dotforward and Unbound
# with dnsperf, then forward tls:// and dotforward in front of upstreams unlike
# unbound (the regimes); results land in bench/results/.
bench: test-deps build
	bash bench/run.sh

# bench-blackhole offers 10,000 queries/s for 30 s to dotforward in front of an
# upstream that never answers; results land in bench/results/blackhole.md.
bench-blackhole: test-deps build
	BENCH_PHASES=blackhole bash bench/run.sh

# bench-regimes runs only the regimes (issue 14): forward tls:// and dotforward side
# by side in front of five kinds of upstream; results land in bench/results/regimes.*.
# BENCH_DOTFORWARD_OPTS adds options to dotforward's block, BENCH_REGIMES_LABEL
# says what the run is.
bench-regimes: test-deps build
	BENCH_PHASES=regimes bash bench/run.sh

# bench-hedge runs only the hedge phase (issue 16): dotforward with policy sequential
# in front of an upstream answering 1 name in 20 after 300 ms and one answering at
# once, without hedging, with hedge 20ms and with hedge auto, at 2,000 QPS for 10 s;
# results land in bench/results/hedge.*. BENCH_HEDGE_SETTINGS changes the settings.
bench-hedge: test-deps build
	BENCH_PHASES=hedge bash bench/run.sh

# bench-cluster runs only the cluster phase (issue 22): the shipped cluster DNS
# Corefile on a real API server with a few hundred Services, under 80 % cluster
# names and 20 % outside names, with dotforward, forward tls:// and forward UDP;
# results land in bench/results/cluster.md and a section of results.md.
bench-cluster: test-deps build
	BENCH_PHASES=cluster bash bench/run.sh

clean:
	rm -f $(BINARY)
