package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// cacheTTL bounds how long a cached answer hides a change: the shipped Corefile
// has `cache 30` and the kubernetes plugin's `ttl 30`.
const cacheTTL = 30 * time.Second

// scaleGroup numbers the scaled services' endpoint addresses, 10.1.<group>.x.
var scaleGroup = map[string]int{"grow": 1, "shrink": 2}

// clusterCases are the objects TestClusterDNS creates, and what it reads back.
type clusterCases struct {
	web        *corev1.Service // dual-stack ClusterIP, ports http/80/TCP and dns/53/UDP
	later      string          // a ClusterIP service not queried before the API server stops
	grow       string          // headless, scaled 1 → 3 ready endpoints
	shrink     string          // headless, scaled 3 → 1 ready endpoints
	externalIP string          // a service name's target outside the cluster
}

// TestClusterDNS runs the shipped cluster DNS Corefile (deploy/kubernetes/
// configmap.yaml) against a real API server, through the shipped RBAC: the
// manifests are applied, and CoreDNS reads the API with a token of their
// ServiceAccount. The upstream is unbound over DoT. The subtests run in order;
// the last ones stop the upstream and then the API server.
func TestClusterDNS(t *testing.T) {
	cp := startControlPlane(t)
	t.Run("ManifestsDryRun", func(t *testing.T) { checkManifestsDryRun(t, cp) })
	saConf := installClusterDNS(t, cp)
	cases := createClusterCases(t, cp.client)
	c := newCerts(t)
	u := startUnbound(t, c, unboundOpts{})
	f := startClusterFront(t, clusterOpts{kubeconfig: saConf, upstream: u.addr, ca: c.CA})
	// The loop plugin's probe (HINFO, through dotforward) is the one query the
	// upstream gets at startup; counting starts after it.
	waitFor(t, "the loop plugin's probe at the upstream", startTimeout, f.p, func() error {
		if u.stats(t)["num.query.type.HINFO"] < 1 {
			return fmt.Errorf("unbound counted no HINFO query")
		}
		return nil
	})
	upstreamBefore := u.stats(t)["total.num.queries"]

	t.Run("ClusterIP", func(t *testing.T) { checkClusterIP(t, f, cases.web) })
	t.Run("Headless", func(t *testing.T) { checkHeadless(t, f) })
	t.Run("ExternalName", func(t *testing.T) {
		r := f.mustQuery(t, clusterName("ext"), dns.TypeCNAME)
		if err := checkAnswer(r, dns.TypeCNAME, aName); err != nil {
			t.Fatalf("ext CNAME: %v", err)
		}
	})
	t.Run("PTR", func(t *testing.T) { checkPTR(t, f, cases.web) })
	t.Run("PodsInsecure", func(t *testing.T) {
		r := f.mustQuery(t, "10-244-1-7."+testNS+".pod.cluster.local.", dns.TypeA)
		if err := checkAnswer(r, dns.TypeA, "10.244.1.7"); err != nil {
			t.Fatalf("pod A: %v", err)
		}
	})
	t.Run("NXDOMAIN", func(t *testing.T) {
		r := f.mustQuery(t, clusterName("missing"), dns.TypeA)
		if r.Rcode != dns.RcodeNameError {
			t.Fatalf("missing service: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
		}
	})
	t.Run("ClusterNamesStayInside", func(t *testing.T) {
		// Every query so far was a cluster name (or a service's reverse name):
		// none of them may have reached the upstream.
		if n := u.stats(t)["total.num.queries"] - upstreamBefore; n != 0 {
			t.Fatalf("The upstream got %d queries for cluster names", n)
		}
	})
	t.Run("Scaling", func(t *testing.T) { checkScaling(t, f, cp.client, cases) })
	t.Run("OutsideOverDoT", func(t *testing.T) { checkOutside(t, f, u) })
	t.Run("ReloadUnderLoad", func(t *testing.T) { checkReload(t, f, cases.web) })
	// The shipped ClusterRole is enough only if the kubernetes plugin's
	// informers never met a refusal: a missing verb does not stop CoreDNS
	// answering (client-go falls back to listing again and again, or, with
	// watch-list, needs no list at all), it shows as "is forbidden" errors in
	// its log and answers that go stale between relists.
	t.Run("RBACEnough", func(t *testing.T) {
		if f.p.logContains("is forbidden") {
			t.Errorf("CoreDNS, with the ServiceAccount's token, was refused by the API server (a verb or resource missing from deploy/kubernetes/clusterrole.yaml):\n%s", f.p.tail(8<<10))
		}
	})
	t.Run("UpstreamStopped", func(st *testing.T) { checkUpstreamStopped(st, t, f, u) })
	t.Run("APIServerStopped", func(t *testing.T) { checkAPIServerStopped(t, f, cp, cases) })
}

// checkManifestsDryRun: the API server accepts every object of both
// kustomizations (admission and validation included, nothing stored).
func checkManifestsDryRun(t *testing.T, cp *controlPlane) {
	for dir, n := range map[string]int{"../deploy/kubernetes": 7, "../deploy/kubernetes/nodelocal": 4} {
		out := cp.kubectlAdmin(t, "apply", "--dry-run=server", "-k", dir)
		if got := strings.Count(out, "(server dry run)"); got != n {
			t.Errorf("kubectl apply --dry-run=server -k %s: %d objects accepted, want %d:\n%s", dir, got, n, out)
		}
	}
}

// installClusterDNS applies deploy/kubernetes for real and returns a kubeconfig
// holding a token of its ServiceAccount (TokenRequest), which has only what the
// shipped ClusterRole grants.
func installClusterDNS(t *testing.T, cp *controlPlane) string {
	t.Helper()
	cp.kubectlAdmin(t, "apply", "-k", "../deploy/kubernetes")
	token := strings.TrimSpace(cp.kubectlAdmin(t, "-n", "kube-system", "create", "token", "coredns", "--duration", "2h"))
	conf := cp.writeKubeconfig(t, "coredns", token)
	// The token is the ServiceAccount's and nothing more: it may watch
	// EndpointSlices, and may not read Secrets.
	if out := cp.kubectlAs(t, conf, "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"); out != "system:serviceaccount:kube-system:coredns" {
		t.Fatalf("The token is %q's, want the coredns ServiceAccount's", out)
	}
	if out, _ := run(t, time.Minute, cp.kubectl, "--kubeconfig", conf, "auth", "can-i", "list", "secrets", "-A"); strings.TrimSpace(out) != "no" {
		t.Fatalf("The coredns ServiceAccount may list secrets (%q): the test would not prove the ClusterRole", out)
	}
	return conf
}

// createClusterCases creates the objects the subtests query.
func createClusterCases(t *testing.T, c *kubernetes.Clientset) *clusterCases {
	t.Helper()
	createNamespace(t, c, testNS)
	cs := &clusterCases{later: "later", grow: "grow", shrink: "shrink"}
	cs.web = createService(t, c, dualStackService("web", port("http", corev1.ProtocolTCP, 80), port("dns", corev1.ProtocolUDP, 53)))
	createService(t, c, dualStackService(cs.later, port("http", corev1.ProtocolTCP, 80)))
	pg := port("pg", corev1.ProtocolTCP, 5432)
	createService(t, c, headlessService("db", pg))
	createSlice(t, c, endpointSlice("db", pg,
		endpoint{ip: "10.1.0.1", hostname: "db-0", ready: true},
		endpoint{ip: "10.1.0.2", ready: true},
		endpoint{ip: "10.1.0.3", hostname: "db-2", ready: false}))
	for svc, n := range map[string]int{cs.grow: 1, cs.shrink: 3} {
		createService(t, c, headlessService(svc, pg))
		createSlice(t, c, endpointSlice(svc, pg, readyEndpoints(scaleGroup[svc], n)...))
	}
	createService(t, c, externalNameService("ext", strings.TrimSuffix(aName, ".")))
	return cs
}

// clusterIPs returns svc's addresses of one family, as the answer data reads.
func clusterIPs(svc *corev1.Service, v6 bool) []string {
	var out []string
	for _, ip := range svc.Spec.ClusterIPs {
		if strings.Contains(ip, ":") == v6 {
			out = append(out, ip)
		}
	}
	return out
}

func checkClusterIP(t *testing.T, f *clusterFront, web *corev1.Service) {
	v4, v6 := clusterIPs(web, false), clusterIPs(web, true)
	if len(v4) != 1 || len(v6) != 1 {
		t.Fatalf("web has cluster IPs %v, want one IPv4 and one IPv6", web.Spec.ClusterIPs)
	}
	if err := checkAnswer(f.mustQuery(t, clusterName("web"), dns.TypeA), dns.TypeA, v4...); err != nil {
		t.Errorf("web A: %v", err)
	}
	if err := checkAnswer(f.mustQuery(t, clusterName("web"), dns.TypeAAAA), dns.TypeAAAA, v6...); err != nil {
		t.Errorf("web AAAA: %v", err)
	}
	// One SRV per named port, pointing at the service itself; its weight is
	// 50, the kubernetes plugin's share for each of the two cluster IPs.
	for name, want := range map[string]string{"_http._tcp": "80", "_dns._udp": "53"} {
		r := f.mustQuery(t, name+"."+clusterName("web"), dns.TypeSRV)
		if err := checkAnswer(r, dns.TypeSRV, "0 50 "+want+" "+clusterName("web")); err != nil {
			t.Errorf("%s.web SRV: %v", name, err)
		}
	}
}

func checkHeadless(t *testing.T, f *clusterFront) {
	// One A per ready endpoint: 10.1.0.3 is not ready.
	if err := checkAnswer(f.mustQuery(t, clusterName("db"), dns.TypeA), dns.TypeA, "10.1.0.1", "10.1.0.2"); err != nil {
		t.Errorf("db A: %v", err)
	}
	// The hostname record of an endpoint with a hostname.
	if err := checkAnswer(f.mustQuery(t, "db-0."+clusterName("db"), dns.TypeA), dns.TypeA, "10.1.0.1"); err != nil {
		t.Errorf("db-0.db A: %v", err)
	}
	// SRV of the named port: one target per ready endpoint, by hostname or by
	// its dashed address.
	r := f.mustQuery(t, "_pg._tcp."+clusterName("db"), dns.TypeSRV)
	var targets []string
	for _, rr := range r.Answer {
		if srv, ok := rr.(*dns.SRV); ok && srv.Port == 5432 {
			targets = append(targets, srv.Target)
		}
	}
	slices.Sort(targets)
	want := []string{"10-1-0-2." + clusterName("db"), "db-0." + clusterName("db")}
	if !slices.Equal(targets, want) {
		t.Errorf("_pg._tcp.db SRV targets %v, want %v", targets, want)
	}
}

func checkPTR(t *testing.T, f *clusterFront, web *corev1.Service) {
	for _, ip := range web.Spec.ClusterIPs {
		rev, err := dns.ReverseAddr(ip)
		if err != nil {
			t.Fatalf("ReverseAddr(%s): %v", ip, err)
		}
		if err := checkAnswer(f.mustQuery(t, rev, dns.TypePTR), dns.TypePTR, clusterName("web")); err != nil {
			t.Errorf("PTR of %s: %v", ip, err)
		}
	}
}

// checkScaling changes two headless services' endpoints at once and waits until
// both answers follow: what was cached before the change (cache 30, ttl 30) may
// hide it for up to cacheTTL, never longer.
func checkScaling(t *testing.T, f *clusterFront, c *kubernetes.Clientset, cs *clusterCases) {
	pg := port("pg", corev1.ProtocolTCP, 5432)
	want := map[string][]endpoint{cs.grow: readyEndpoints(scaleGroup[cs.grow], 3), cs.shrink: readyEndpoints(scaleGroup[cs.shrink], 1)}
	for svc, old := range map[string]int{cs.grow: 1, cs.shrink: 3} {
		if err := checkAnswer(f.mustQuery(t, clusterName(svc), dns.TypeA), dns.TypeA, ips(readyEndpoints(scaleGroup[svc], old))...); err != nil {
			t.Fatalf("%s before scaling: %v", svc, err)
		}
	}
	for svc, eps := range want {
		updateSlice(t, c, endpointSlice(svc, pg, eps...))
	}
	waitFor(t, "both scaled services' answers", cacheTTL+15*time.Second, f.p, func() error {
		for svc, eps := range want {
			r, err := f.query(clusterName(svc), dns.TypeA)
			if err != nil {
				return err
			}
			if err := checkAnswer(r, dns.TypeA, ips(eps)...); err != nil {
				return fmt.Errorf("%s: %w", svc, err)
			}
		}
		return nil
	})
}

func ips(eps []endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.ip
	}
	return out
}

// upstreamRequests is dotforward's requests_total for the upstream u.
func upstreamRequests(t testing.TB, f *clusterFront, u *unbound) float64 {
	t.Helper()
	v, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_requests_total", label("to", u.addr))
	return v
}

// checkOutside: a name outside the cluster goes to the upstream over DoT once;
// repeats are answered by the cache.
func checkOutside(t *testing.T, f *clusterFront, u *unbound) {
	before, upBefore := upstreamRequests(t, f, u), u.stats(t)["total.num.queries"]
	name := hostName(0)
	for i := range 3 {
		if err := checkAnswer(f.mustQuery(t, name, dns.TypeA), dns.TypeA, hostAddr(0)); err != nil {
			t.Fatalf("%s, query %d: %v", name, i+1, err)
		}
		sent, upstream := upstreamRequests(t, f, u)-before, u.stats(t)["total.num.queries"]-upBefore
		if sent != 1 || upstream < 1 {
			t.Fatalf("After %d queries for %s: dotforward sent %v to %s and unbound counted %d; want 1 sent (the rest cached) and unbound to count it",
				i+1, name, sent, u.addr, upstream)
		}
	}
	if n := u.stats(t)["num.query.tls"]; n == 0 {
		t.Fatalf("unbound counted no query over TLS")
	}
}

// lightResult counts a light load's queries.
type lightResult struct {
	sent, failed atomic.Int64
	mu           sync.Mutex
	firstErr     error // guarded by mu
}

func (l *lightResult) fail(err error) {
	l.failed.Add(1)
	l.mu.Lock()
	if l.firstErr == nil {
		l.firstErr = err
	}
	l.mu.Unlock()
}

// lightLoad sends queries one at a time from two workers, alternating a cluster
// name and an outside name, until stop is closed or 5,000 queries were sent.
func lightLoad(f *clusterFront, web *corev1.Service, stop <-chan struct{}) (*lightResult, func()) {
	res := &lightResult{}
	var wg sync.WaitGroup
	v4 := clusterIPs(web, false)
	for w := range 2 {
		wg.Go(func() {
			for i := 0; i < 2500; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name, qtype, want := clusterName("web"), dns.TypeA, v4
				if i%2 == 1 {
					n := (w*2500 + i) % hostCount
					name, want = hostName(n), []string{hostAddr(n)}
				}
				res.sent.Add(1)
				r, err := f.query(name, qtype)
				if err == nil {
					err = checkAnswer(r, qtype, want...)
				}
				if err != nil {
					res.fail(fmt.Errorf("%s: %w", name, err))
				}
			}
		})
	}
	return res, wg.Wait
}

// checkReload changes the Corefile under light load (ttl 30 → 7 in the
// kubernetes block, and failfast_all_unhealthy_upstreams in dotforward's, which
// the next subtest needs) and checks that the new one is in use and no query
// was lost.
func checkReload(t *testing.T, f *clusterFront, web *corev1.Service) {
	stop := make(chan struct{})
	res, wait := lightLoad(f, web, stop)
	defer func() { close(stop); wait() }()
	waitFor(t, "the light load to start", startTimeout, f.p, func() error {
		if res.sent.Load() < 50 {
			return fmt.Errorf("%d queries sent", res.sent.Load())
		}
		return nil
	})
	f.reload(t, func(cf string) string {
		cf = strings.Replace(cf, "ttl 30", "ttl 7", 1)
		return strings.Replace(cf, "max_concurrent 1000", "max_concurrent 1000\n       failfast_all_unhealthy_upstreams", 1)
	})
	atReload := res.sent.Load()
	// The reload recreates the cache, so a name's first answer after it carries
	// the new ttl.
	waitFor(t, "an answer with the reloaded ttl 7", startTimeout, f.p, func() error {
		r, err := f.query("_dns._udp."+clusterName("web"), dns.TypeSRV)
		if err != nil {
			return err
		}
		if len(r.Answer) == 0 || r.Answer[0].Header().Ttl != 7 {
			return fmt.Errorf("answer %v", r.Answer)
		}
		return nil
	})
	afterReload := res.sent.Load()
	waitFor(t, "more load after the reload", startTimeout, f.p, func() error {
		if res.sent.Load() < afterReload+200 {
			return fmt.Errorf("%d queries sent", res.sent.Load())
		}
		return nil
	})
	close(stop)
	wait()
	stop = make(chan struct{}) // for the deferred close
	t.Logf("light load: %d queries, %d before the reload was signalled, %d until it was seen", res.sent.Load(), atReload, afterReload-atReload)
	if res.failed.Load() != 0 {
		t.Fatalf("%d of %d queries failed across the reload; first: %v", res.failed.Load(), res.sent.Load(), res.firstErr)
	}
}

// checkUpstreamStopped: with the upstream gone, outside names fail at once
// (SERVFAIL without trying it, failfast_all_unhealthy_upstreams) and cluster
// names are answered as before; then the upstream comes back.
// parent owns the restarted upstream: it must outlive this subtest.
func checkUpstreamStopped(t *testing.T, parent testing.TB, f *clusterFront, u *unbound) {
	u.kill()
	// Fresh outside names: never asked, so never in the cache, SERVFAIL included.
	next := 0
	fresh := func(prefix string) string {
		next++
		return fmt.Sprintf("%s%d.%s", prefix, next, zone)
	}
	waitFor(t, "dotforward to mark the upstream down", startTimeout, f.p, func() error {
		r, err := f.query(fresh("down"), dns.TypeA)
		if err != nil {
			return err
		}
		healthy, found := metricSum(scrape(t, f.metrics), "coredns_dotforward_upstream_healthy", label("to", u.addr))
		if r.Rcode != dns.RcodeServerFailure || !found || healthy != 0 {
			return fmt.Errorf("rcode %s, upstream_healthy %v (found %v)", dns.RcodeToString[r.Rcode], healthy, found)
		}
		return nil
	})
	sent := upstreamRequests(t, f, u)
	broken, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_healthcheck_broken_total")
	const n = 20
	for range n {
		name := fresh("down")
		if r := f.mustQuery(t, name, dns.TypeA); r.Rcode != dns.RcodeServerFailure {
			t.Fatalf("%s with the upstream down: rcode %s, want SERVFAIL", name, dns.RcodeToString[r.Rcode])
		}
	}
	// Fast means without trying the upstream: nothing was sent, and each query
	// was counted as finding every upstream down.
	if d := upstreamRequests(t, f, u) - sent; d != 0 {
		t.Errorf("%v queries were sent to the down upstream; with failfast_all_unhealthy_upstreams, none", d)
	}
	if b, _ := metricSum(scrape(t, f.metrics), "coredns_dotforward_healthcheck_broken_total"); b-broken < n {
		t.Errorf("healthcheck_broken_total moved by %v for %d queries", b-broken, n)
	}
	if err := checkAnswer(f.mustQuery(t, "_http._tcp."+clusterName("web"), dns.TypeSRV), dns.TypeSRV, "0 50 80 "+clusterName("web")); err != nil {
		t.Errorf("A cluster name with the upstream down: %v", err)
	}
	if err := checkAnswer(f.mustQuery(t, "db-0."+clusterName("db"), dns.TypeA), dns.TypeA, "10.1.0.1"); err != nil {
		t.Errorf("A cluster name with the upstream down: %v", err)
	}
	u.restart(parent)
	// unbound answers NXDOMAIN for names of e2e.test it does not hold: an
	// answer from it, not from dotforward.
	waitFor(t, "outside names after the upstream's return", startTimeout, f.p, func() error {
		r, err := f.query(fresh("back"), dns.TypeA)
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeNameError {
			return fmt.Errorf("rcode %s, want unbound's NXDOMAIN", dns.RcodeToString[r.Rcode])
		}
		return nil
	})
}

// checkAPIServerStopped: with the API server gone, the kubernetes plugin keeps
// answering from what it last saw, names that were never asked (so not in the
// cache plugin) included; outside names are not affected.
func checkAPIServerStopped(t *testing.T, f *clusterFront, cp *controlPlane, cs *clusterCases) {
	later, err := cp.client.CoreV1().Services(testNS).Get(t.Context(), cs.later, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Get service %s: %v", cs.later, err)
	}
	cp.stopAPIServer()
	if err := checkAnswer(f.mustQuery(t, clusterName(cs.later), dns.TypeA), dns.TypeA, clusterIPs(later, false)...); err != nil {
		t.Errorf("%s A with the API server stopped: %v", cs.later, err)
	}
	if err := checkAnswer(f.mustQuery(t, clusterName(cs.later), dns.TypeAAAA), dns.TypeAAAA, clusterIPs(later, true)...); err != nil {
		t.Errorf("%s AAAA with the API server stopped: %v", cs.later, err)
	}
	if r := f.mustQuery(t, clusterName("gone"), dns.TypeA); r.Rcode != dns.RcodeNameError {
		t.Errorf("A missing service with the API server stopped: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	// An outside name no earlier subtest asked, so not in the cache.
	if err := checkAnswer(f.mustQuery(t, txtName, dns.TypeTXT), dns.TypeTXT, `"`+txtText+`"`); err != nil {
		t.Errorf("An outside name with the API server stopped: %v", err)
	}
}
