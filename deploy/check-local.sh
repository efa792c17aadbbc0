#!/usr/bin/env bash
# check-local.sh runs the deployment files as far as one machine without a
# container engine or a cluster allows, in a private network namespace (all
# traffic stays on its loopback interface):
#
#  - kubectl kustomize builds both Kubernetes directories;
#  - the binary is built with the Dockerfile's command and given the file
#    capability the image sets; as user 65532 with no-new-privileges and only
#    NET_BIND_SERVICE permitted (what the manifests' securityContext gives), it
#    binds port 53, and without the file capability it cannot;
#  - the node-local Corefile runs with its own addresses and ports after the
#    init container's script (the upstream addresses alone are replaced by a
#    local Unbound serving DoT with a certificate made here), and answers over
#    UDP and TCP with /health and /ready at 200;
#  - promtool parses every query of the Grafana dashboard, and a Prometheus
#    scraping the node-local instance under a bounded dnsperf load returns data
#    for each, except those on events a healthy run may not have (dropped
#    messages, closed connections);
#  - the cluster Corefile runs the same way, on its own ports, without the
#    kubernetes plugin (it needs an API server).
#
# Needs root (unshare), and: go, kubectl, unbound, openssl, dig, curl, dnsperf,
# capsh and setcap (libcap2-bin), python3 with yaml, promtool and prometheus
# (Debian package prometheus). Usage: sudo deploy/check-local.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

if [[ ${1:-} != --inside ]]; then
	for tool in go kubectl unbound openssl dig curl dnsperf capsh setcap python3 promtool prometheus unshare; do
		command -v "$tool" >/dev/null || { echo "check-local: $tool is missing" >&2; exit 1; }
	done
	python3 -c 'import yaml' || { echo "check-local: python3 yaml is missing" >&2; exit 1; }
	kubectl kustomize "$root/deploy/kubernetes" >/dev/null
	kubectl kustomize "$root/deploy/kubernetes/nodelocal" >/dev/null
	echo "ok   kustomize builds deploy/kubernetes and deploy/kubernetes/nodelocal"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	chmod 755 "$work"
	(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/coredns" ./cmd/coredns)
	cp "$work/coredns" "$work/coredns-nocap"
	setcap cap_net_bind_service=+ep "$work/coredns"
	echo "ok   built with the Dockerfile's command; $(getcap "$work/coredns")"
	WORK=$work unshare -n "$0" --inside
	exit
fi

# Inside the network namespace from here on.
cd "$WORK"
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
}
trap cleanup EXIT
fail() {
	echo "FAIL $*" >&2
	tail -n 5 ./*.log >&2 || true
	exit 1
}
ip link set lo up

# waitfor URL: polls until the URL answers 200, for at most 10s.
waitfor() {
	for _ in $(seq 1 100); do
		[[ $(curl -s -o /dev/null -w '%{http_code}' "$1") == 200 ]] && return 0
		sleep 0.1
	done
	fail "$1 did not answer 200"
}

# Capabilities: bind 127.0.0.1:53 as user 65532, no-new-privileges,
# NET_BIND_SERVICE permitted.
printf '.:53 {\n    bind 127.0.0.1\n    whoami\n}\n' >Corefile.bind
nonroot() { timeout 10 capsh --keep=1 --gid=65532 --uid=65532 --caps=cap_net_bind_service+p --no-new-privs --shell="$WORK/$1" -- -conf Corefile.bind; }
nonroot coredns >bind.log 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do dig +short +time=1 +tries=1 @127.0.0.1 whoami.example >/dev/null 2>&1 && break; sleep 0.1; done
dig +time=1 +tries=1 @127.0.0.1 whoami.example | grep -q 'status: NOERROR' || fail "non-root CoreDNS with the file capability did not answer on port 53: $(cat bind.log)"
kill "${pids[-1]}"; wait "${pids[-1]}" 2>/dev/null || true
if nonroot coredns-nocap >nocap.log 2>&1; then fail "CoreDNS without the file capability bound port 53"; fi
grep -q 'permission denied' nocap.log || fail "expected 'permission denied' without the file capability: $(cat nocap.log)"
echo "ok   as user 65532 with no-new-privileges: binds port 53 with the file capability, 'permission denied' without"

# A DoT upstream with a certificate made here; it also stands in for kube-dns.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out ca.pem -days 1 \
	-subj /CN=check-local-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout srv.key -out srv.csr -subj /CN=dot.test 2>/dev/null
printf 'subjectAltName=DNS:dot.test\nextendedKeyUsage=serverAuth\n' >ext.cnf
openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 1 -extfile ext.cnf 2>/dev/null
cat >unbound.conf <<EOF
server:
  interface: 127.0.0.1@853
  interface: 127.0.0.1@5353
  tls-port: 853
  tls-service-key: "$WORK/srv.key"
  tls-service-pem: "$WORK/srv.pem"
  do-daemonize: no
  username: ""
  chroot: ""
  directory: "$WORK"
  pidfile: ""
  use-syslog: no
  access-control: 127.0.0.0/8 allow
  module-config: "iterator"
  local-zone: "." static
  local-data: "example.org. 300 IN A 192.0.2.1"
  local-data: "kubernetes.default.svc.cluster.local. 30 IN A 10.96.0.1"
EOF
unbound -d -c unbound.conf >unbound.log 2>&1 &
pids+=($!)

# corefile MANIFEST MODE: the manifest's Corefile with local upstreams.
corefile() {
	python3 - "$1" "$2" "$WORK/ca.pem" <<'EOF'
import re, sys, yaml
path, mode, ca = sys.argv[1:]
cf = [d for d in yaml.safe_load_all(open(path)) if d and d.get("kind") == "ConfigMap"][0]["data"]["Corefile"]
cf = re.sub(r"(dotforward \. )[^{]*\{", r"\g<1>tls://127.0.0.1%dot.test {\n           tls " + ca, cf)
cf = cf.replace("forward . 10.96.0.10", "forward . 127.0.0.1:5353")
if mode == "cluster":
    cf = re.sub(r"    kubernetes [^{]*\{[^}]*\}\n", "", cf)
print(cf)
EOF
}

# Node-local: the init container's script, twice (it must be idempotent). This
# kernel may lack the dummy driver; the address then goes on lo first, which
# takes the script's "address already there" branch.
script=$(python3 -c 'import sys, yaml; print([d for d in yaml.safe_load_all(open(sys.argv[1])) if d][0]["spec"]["template"]["spec"]["initContainers"][0]["command"][2])' "$root/deploy/kubernetes/nodelocal/daemonset.yaml")
if ! ip link add name probe0 type dummy 2>/dev/null; then
	ip addr add 169.254.20.10/32 dev lo
	echo "note the kernel has no dummy driver: 169.254.20.10 put on lo before the init script"
else
	ip link del probe0
fi
sh -ec "$script" && sh -ec "$script" || fail "init container script"
ip -o addr show | grep -q 'inet 169.254.20.10/' || fail "169.254.20.10 is not assigned after the init script"
echo "ok   init container script (twice): 169.254.20.10 assigned"

corefile "$root/deploy/kubernetes/nodelocal/configmap.yaml" nodelocal >Corefile.nodelocal
./coredns -conf Corefile.nodelocal >nodelocal.log 2>&1 &
nodelocal=$!
pids+=($nodelocal)
waitfor http://169.254.20.10:8181/ready
waitfor http://169.254.20.10:8080/health
[[ $(dig +short +time=2 +tries=1 @169.254.20.10 example.org) == 192.0.2.1 ]] || fail "node-local: no answer over UDP"
[[ $(dig +tcp +short +time=2 +tries=1 @169.254.20.10 example.org) == 192.0.2.1 ]] || fail "node-local: no answer over TCP"
[[ $(dig +short +time=2 +tries=1 @169.254.20.10 kubernetes.default.svc.cluster.local) == 10.96.0.1 ]] || fail "node-local: cluster.local not forwarded"
echo "ok   node-local Corefile: answers on 169.254.20.10 over UDP and TCP (DoT and cluster.local legs), /health and /ready 200"

# Grafana: parse every query, then evaluate each against the two instances.
python3 - "$root/deploy/grafana/dotforward-dashboard.json" <<'EOF'
import json, sys, yaml
exprs = []
def walk(v):
    if isinstance(v, dict):
        for k, x in v.items():
            exprs.append(x) if k == "expr" else walk(x)
    elif isinstance(v, list):
        for x in v: walk(x)
walk(json.load(open(sys.argv[1])))
sub = lambda e: e.replace("$__rate_interval", "30s").replace("$instance", ".*").replace("$to", ".*")
json.dump([sub(e) for e in exprs], open("exprs.json", "w"))
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [{"record": "dashboard:q%d" % i, "expr": sub(e)} for i, e in enumerate(exprs)]}]}, open("rules.yaml", "w"))
EOF
promtool check rules rules.yaml >/dev/null || fail "promtool rejects a dashboard query"
echo "ok   promtool parses the $(python3 -c 'import json; print(len(json.load(open("exprs.json"))))') dashboard queries"
printf 'global:\n  scrape_interval: 1s\nscrape_configs:\n- job_name: dotforward\n  static_configs:\n  - targets: [127.0.0.1:9253]\n' >prometheus.yml
prometheus --config.file=prometheus.yml --storage.tsdb.path=tsdb --web.listen-address=127.0.0.1:9090 >prometheus.log 2>&1 &
pids+=($!)
waitfor http://127.0.0.1:9090/-/ready
for i in $(seq 1 50); do echo "n$i.example.org A"; echo "example.org A"; done >queries.txt
timeout 30 dnsperf -s 169.254.20.10 -d queries.txt -l 10 -Q 200 >dnsperf.log 2>&1 || fail "dnsperf"
python3 - "$root/deploy/grafana/dotforward-dashboard.json" <<'EOF'
import json, sys, urllib.parse, urllib.request
empty = []
for e in json.load(open("exprs.json")):
    r = json.load(urllib.request.urlopen("http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": e})))
    if r["status"] != "success":
        sys.exit("FAIL query %s: %s" % (e, r))
    if not r["data"]["result"]:
        empty.append(e)
# Two series exist only after their event: dropped_total once a message was
# dropped, conn_closes_total once a connection closed (with probing on, a healthy
# upstream's only connection stays open).
events = ("dropped_total", "conn_closes_total")
unexpected = [e for e in empty if not any(ev in e for ev in events)]
if unexpected:
    metrics = urllib.request.urlopen("http://127.0.0.1:9253/metrics").read().decode()
    sys.exit("FAIL queries without data: %s\n%s" % (unexpected, "\n".join(l for l in metrics.splitlines() if l.startswith("coredns_dotforward_") and "_bucket" not in l)))
# The template variables: label_values(SELECTOR, LABEL) as Grafana asks it.
dash = json.load(open(sys.argv[1]))
for v in dash["templating"]["list"]:
    q = v.get("query")
    if v.get("type") != "query":
        continue
    sel, label = q[len("label_values("):-1].rsplit(",", 1)
    sel = sel.replace("$instance", ".*")
    url = "http://127.0.0.1:9090/api/v1/label/%s/values?" % label.strip() + urllib.parse.urlencode({"match[]": sel})
    values = json.load(urllib.request.urlopen(url))["data"]
    if not values:
        sys.exit("FAIL variable %s: %s returns no values" % (v["name"], q))
print("ok   template variables return values: %s" % ", ".join(v["name"] for v in dash["templating"]["list"] if v.get("type") == "query"))
print("ok   Prometheus returns data for every dashboard query (%d without data, on events that did not happen: %s)" % (len(empty), ", ".join(ev for ev in events if any(ev in e for e in empty)) or "none"))
EOF

# The cluster Corefile: its health and ready listen on all addresses, so the
# node-local instance, on the same ports, stops first.
kill "$nodelocal"
wait "$nodelocal" 2>/dev/null || true
corefile "$root/deploy/kubernetes/configmap.yaml" cluster | sed 's/^\.:53 {/.:53 {\n    bind 127.0.0.1/' >Corefile.cluster
./coredns -conf Corefile.cluster >cluster.log 2>&1 &
pids+=($!)
waitfor http://127.0.0.1:8181/ready
waitfor http://127.0.0.1:8080/health
[[ $(dig +short +time=2 +tries=1 @127.0.0.1 example.org) == 192.0.2.1 ]] || fail "cluster: no answer over UDP"
[[ $(dig +tcp +short +time=2 +tries=1 @127.0.0.1 example.org) == 192.0.2.1 ]] || fail "cluster: no answer over TCP"
echo "ok   cluster Corefile (without kubernetes): answers over UDP and TCP, /health and /ready 200"
