#!/usr/bin/env bash
# Installs what the tests and benchmarks need on a fresh Debian machine: the DoT
# servers and DNS clients they drive, and the Go modules. Idempotent: installs only
# what is missing.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have unbound  || need+=(unbound)
have dnsdist  || need+=(dnsdist)
have kresd    || need+=(knot-resolver)
have named    || need+=(bind9)
have kdig     || need+=(knot-dnsutils)
have dig      || need+=(dnsutils)
have dnsperf  || need+=(dnsperf)
have openssl  || need+=(openssl)
have ss       || need+=(iproute2)
have prlimit  || need+=(util-linux)
# The container image (make image, e2e/image_test.go): built with buildah and
# skopeo, unpacked with umoci, its file capability set and read with setcap and
# getcap (in sbin, outside an ordinary user's PATH), run with setpriv in a
# network namespace (ip netns), with the host's CA bundle in it.
have buildah  || need+=(buildah)
have skopeo   || need+=(skopeo)
have umoci    || need+=(umoci)
have setpriv  || need+=(util-linux)
[ -x /usr/sbin/setcap ] && [ -x /usr/sbin/getcap ] || have getcap || need+=(libcap2-bin)
[ -r /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)

if [ ${#need[@]} -gt 0 ]; then
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	echo "install-deps: installing ${need[*]}"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The packaged daemons (unbound, dnsdist, kresd, named) may have been started by
# their postinst scripts; the tests never touch them: they start their own
# instances on 127.0.0.1, on free ports, with their own configuration and files.
go mod download

# The cluster e2e tests' control plane (etcd, kube-apiserver, kubectl), built from
# the Go module proxy into a cache keyed by its pins: minutes cold, nothing warm.
bash "$(dirname "$0")/k8s-tools.sh" >/dev/null
