#!/bin/bash
# property-wide.sh: the property tests strictly past the CI range (make property-wide).
#
# CI runs TestProperty on seeds 1-200 and TestPropertySteady on seeds 1-100, each a ratchet on its
# known-failures file. Issue 21 asks that the pool is never worse than forward on any upstream, so
# this runs both families on wider ranges, strictly (every failing seed counted), and prints each
# failing seed past the CI range with the check it failed (answered, lost, p99, connections) and
# the pool's and the model's numbers, then one summary line per run. The seeds inside the CI range
# are counted on the summary line too. Nothing is judged: it exits 0 once every run ended with the
# test's own verdict, so that runs of two builds can be compared (runs vary: compare several).
#
# Settings (environment):
#   PROPERTY_SEEDS         TestProperty draws seeds 1 to this (default 600)
#   PROPERTY_STEADY_SEEDS  TestPropertySteady draws seeds 1 to this (default 300)
#   PROPERTY_RUNS          runs of each family (default 1)
#   PROPERTY_FAMILIES      which to run: "property steady" (default), or one of them
#   PROPERTY_OUT           a directory that keeps each run's full output (default: a temporary one)
# One run of each family takes 1-3 minutes on two cores.
set -euo pipefail

seeds=${PROPERTY_SEEDS:-600}
steady=${PROPERTY_STEADY_SEEDS:-300}
runs=${PROPERTY_RUNS:-1}
families=${PROPERTY_FAMILIES:-property steady}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
out=${PROPERTY_OUT:-$work/out}
mkdir -p "$out"

# The test binary runs from a copy of dot/testdata (the known-failures files), so that a checkout
# that changes during the runs disturbs none of them.
(cd "$root" && go test -c -o "$work/dot.test" ./dot/)
mkdir -p "$work/dot"
cp -r "$root/dot/testdata" "$work/dot/"

# report FILE CI_END: the failing seeds past CI_END, in order, from the verdict lines ("Seed N:
# check...", then the upstream, load, pool and model lines).
report() {
	awk -v ci="$2" '
		/Seed [0-9]+:/ {
			line = $0; sub(/.*Seed /, "", line)
			seed = line; sub(/:.*/, "", seed)
			keep = seed + 0 > ci
			if (keep) printf "%s\t  seed %s\n", seed, line
			next
		}
		keep && /^ +(upstream|load|pool|model):/ { sub(/^ +/, ""); printf "%s\t    %s\n", seed, $0 }
		/replay:/ { keep = 0 }
	' "$1" | sort -s -n -k1,1 | cut -f2-
}

# summary FILE CI_END LABEL: the seeds that failed, past the CI range and within it.
summary() {
	local all past within
	all=$(grep -o "Seed [0-9]*:" "$1" | grep -o "[0-9]*" | sort -n | uniq | tr '\n' ' ' || true)
	past=$(for s in $all; do [ "$s" -gt "$2" ] && echo -n "$s "; done || true)
	within=$(for s in $all; do [ "$s" -le "$2" ] && echo -n "$s "; done || true)
	echo "$3: $(echo $past | wc -w) failing past seed $2: ${past:-none}; within 1-$2: ${within:-none}"
}

# run NAME TEST FLAG N CI_END: runs of one family.
run() {
	local name=$1 test=$2 flag=$3 n=$4 ci=$5 i f
	for i in $(seq "$runs"); do
		f=$out/$name-$i.txt
		(cd "$work/dot" && "$work/dot.test" -test.run "^$test\$" -test.count=1 -test.timeout 60m \
			-property.strict "$flag" "$n" >"$f" 2>&1) || true
		if ! grep -q "seeds failed\|^ok\|^PASS" "$f"; then
			echo "$test run $i ended without a verdict:" >&2
			tail -20 "$f" >&2
			exit 1
		fi
		echo "$test (seeds 1-$n), run $i of $runs:"
		report "$f" "$ci"
		summary "$f" "$ci" "$test run $i" | tee -a "$out/summary.txt"
	done
}

for family in $families; do
	case $family in
	property) run property TestProperty -property.seeds "$seeds" 200 ;;
	steady) run steady TestPropertySteady -property.steadyseeds "$steady" 100 ;;
	*) echo "unknown family $family (want property or steady)" >&2; exit 2 ;;
	esac
done
echo
cat "$out/summary.txt"
