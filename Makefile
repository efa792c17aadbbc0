# dotforward: build, test and benchmark a CoreDNS with the dotforward plugin.
GO      ?= go
BINARY  ?= coredns

# The container image's recipe (IMAGE_NAME, IMAGE_TAG, build flags, user, ...),
# shared with the Dockerfile's ARGs.
include image.env
IMAGE_ARCHS   ?= $(shell $(GO) env GOARCH)
IMAGE_ARCHIVE ?= _output/dotforward-image.oci.tar
export IMAGE_NAME IMAGE_TAG IMAGE_SOURCE IMAGE_GOFLAGS IMAGE_LDFLAGS IMAGE_CAPS \
	IMAGE_USER IMAGE_CA_BUNDLE IMAGE_PORTS IMAGE_ENTRYPOINT IMAGE_CMD IMAGE_ARCHS IMAGE_ARCHIVE

.PHONY: build test test-property property-wide test-deps image bench bench-blackhole bench-regimes bench-hedge bench-cluster clean

# build writes ./coredns: every standard CoreDNS plugin plus dotforward.
build:
	CGO_ENABLED=0 $(GO) build -o $(BINARY) ./cmd/coredns

# test installs what the tests need (Debian packages, Go modules), then runs the
# whole suite with the race detector. The end-to-end tests fail, never skip, when a
# server they need is missing. The property test's verdicts are judged without the
# race detector (under it, goroutines are scheduled otherwise: it is a race check
# there), so it runs once more without it: 200 seeds in about 10 s, and the 100
# of the steady family (TestPropertySteady, dot/property_steady_test.go) and of the
# mixed one (TestPropertyMixed, dot/property_mixed_test.go).
test: test-deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -count=1 -timeout 10m -run 'TestProperty$$|TestPropertySteady$$|TestPropertyMixed$$' ./dot/

# test-property runs the property test's verdicts on the pool strictly: seeded upstreams
# and loads, the pool beside a model of forward (dot/property_verdict_test.go), every
# failing seed failing, the known ones too, and issue 21's own upstreams (build tag
# property). make test runs TestProperty as a ratchet on the known failures
# (dot/testdata/property_known_failures.txt), and TestPropertySteady and
# TestPropertyMixed on their own (property_steady_known_failures.txt,
# property_mixed_known_failures.txt). PROPERTY_SEEDS sets how many seeds.
PROPERTY_SEEDS ?= 200
test-property:
	$(GO) test -tags property -count=1 -timeout 30m -run 'TestProperty' ./dot/ -property.seeds=$(PROPERTY_SEEDS) -property.strict

# property-wide runs both property families strictly past the CI range (TestProperty to
# seed 600, TestPropertySteady to 300) and prints each failing seed past it with its check
# and numbers, then a summary line per run (scripts/property-wide.sh; docs/building.md).
# PROPERTY_SEEDS, PROPERTY_STEADY_SEEDS, PROPERTY_RUNS and PROPERTY_FAMILIES set the ranges,
# the runs and the families.
property-wide:
	bash scripts/property-wide.sh

test-deps:
	bash scripts/install-deps.sh

# image builds the container image without a daemon or a registry (buildah, as
# root) and writes it as an OCI archive, IMAGE_ARCHIVE; it also loads it into
# docker or podman when one is installed (IMAGE_LOAD=no to skip). One commit
# gives the same digest. IMAGE_ARCHS="amd64 arm64" builds a multi-arch index.
# Push it with: skopeo copy --all oci-archive:$(IMAGE_ARCHIVE) docker://REGISTRY/$(IMAGE_NAME):TAG
image: test-deps
	bash scripts/image.sh

# bench builds ./coredns and compares forward (UDP and TLS), dotforward and Unbound
# with dnsperf, then forward tls:// and dotforward in front of upstreams unlike
# unbound (the regimes); results land in bench/results/.
bench: test-deps build
	bash bench/run.sh

# bench-blackhole offers 10,000 queries/s for 30 s to dotforward in front of an
# upstream that never answers; results land in bench/results/blackhole.md.
bench-blackhole: test-deps build
	BENCH_PHASES=blackhole bash bench/run.sh

# bench-regimes runs only the regimes (issues 14, 21): forward tls:// and dotforward side
# by side in front of seven kinds of upstream, each BENCH_REGIME_RUNS (5) times in a row;
# results land in bench/results/regimes.*.
# BENCH_DOTFORWARD_OPTS adds options to dotforward's block, BENCH_REGIMES_LABEL
# says what the run is.
bench-regimes: test-deps build
	BENCH_PHASES=regimes BENCH_REGIME_RUNS=$${BENCH_REGIME_RUNS:-5} bash bench/run.sh

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
	rm -rf _output
