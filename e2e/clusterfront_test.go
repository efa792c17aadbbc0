package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// shippedConfigMap is the cluster DNS ConfigMap users apply.
const shippedConfigMap = "../deploy/kubernetes/configmap.yaml"

// clusterFront is CoreDNS running the shipped cluster DNS Corefile.
type clusterFront struct {
	addr    string // DNS, UDP and TCP
	metrics string // prometheus
	ready   string // the ready plugin
	conf    string // the Corefile's path, rewritten by reload
	p       *proc
}

// clusterOpts are what a machine without a cluster forces on the Corefile.
type clusterOpts struct {
	kubeconfig string
	upstream   string // DoT "127.0.0.1:port" serving a certificate from ca
	ca         string
}

// shippedCorefile returns the Corefile of deploy/kubernetes/configmap.yaml.
func shippedCorefile(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(shippedConfigMap)
	if err != nil {
		t.Fatalf("Read %s: %v", shippedConfigMap, err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatalf("Decode %s: %v", shippedConfigMap, err)
	}
	cf, ok := cm.Data["Corefile"]
	if !ok {
		t.Fatalf("%s has no data.Corefile", shippedConfigMap)
	}
	return cf
}

// localCorefile is the shipped Corefile with only these changes: the server
// block, health, ready and prometheus listen on 127.0.0.1 at free ports; the
// kubernetes block reads kubeconfig; dotforward's upstreams are one local DoT
// server, trusted through its CA. Each change must apply exactly once, so a
// change to the shipped file that this test does not know fails it.
func localCorefile(t testing.TB, o clusterOpts, ports [4]int) string {
	t.Helper()
	host, port, _ := strings.Cut(o.upstream, ":")
	edits := []struct{ re, repl string }{
		{`(?m)^\.:53 \{$`, fmt.Sprintf(".:%d {\n    bind 127.0.0.1", ports[0])},
		{`(?m)^(\s*)health \{$`, fmt.Sprintf("${1}health 127.0.0.1:%d {", ports[1])},
		{`(?m)^(\s*)ready$`, fmt.Sprintf("${1}ready 127.0.0.1:%d", ports[2])},
		{`(?m)^(\s*)prometheus :9153$`, fmt.Sprintf("${1}prometheus 127.0.0.1:%d", ports[3])},
		{`(?m)^(\s*)(kubernetes cluster\.local in-addr\.arpa ip6\.arpa \{)$`, "${1}${2}\n${1}   kubeconfig " + o.kubeconfig},
		{`(?m)^(\s*)dotforward \. tls://[^{\n]*\{$`,
			fmt.Sprintf("${1}dotforward . tls://%s%%%s:%s {\n${1}   tls %s", host, serverName, port, o.ca)},
	}
	cf := shippedCorefile(t)
	for _, e := range edits {
		re := regexp.MustCompile(e.re)
		if n := len(re.FindAllStringIndex(cf, -1)); n != 1 {
			t.Fatalf("%s: %q matches %d lines of the Corefile, want 1:\n%s", shippedConfigMap, e.re, n, cf)
		}
		cf = re.ReplaceAllString(cf, e.repl)
	}
	return cf
}

// startClusterFront starts CoreDNS on the local form of the shipped Corefile and
// waits until the ready plugin reports ready (the kubernetes plugin has synced)
// and kubernetes.default answers.
func startClusterFront(t testing.TB, o clusterOpts) *clusterFront {
	t.Helper()
	ports := [4]int{freePort(t), freePort(t), freePort(t), freePort(t)}
	f := &clusterFront{addr: addr(ports[0]), ready: addr(ports[2]), metrics: addr(ports[3])}
	f.conf = writeFile(t, t.TempDir(), "Corefile", localCorefile(t, o, ports))
	t.Cleanup(func() {
		if data, err := os.ReadFile(f.conf); err == nil && t.Failed() {
			t.Logf("--- cluster Corefile:\n%s", data)
		}
	})
	f.p = startProc(t, "coredns-cluster", nil, corednsBinary(t), "-conf", f.conf)
	hc := &http.Client{Timeout: 5 * time.Second}
	waitFor(t, "cluster CoreDNS ready on "+f.ready, 3*startTimeout, f.p, func() error {
		resp, err := hc.Get("http://" + f.ready + "/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /ready: %s", resp.Status)
		}
		return nil
	})
	return f
}

// query sends name/qtype over UDP to the front.
func (f *clusterFront) query(name string, qtype uint16) (*dns.Msg, error) {
	return exchange("udp", f.addr, nil, newQuery(name, qtype))
}

// mustQuery is query failing the test on a transport error.
func (f *clusterFront) mustQuery(t testing.TB, name string, qtype uint16) *dns.Msg {
	t.Helper()
	r, err := f.query(name, qtype)
	if err != nil {
		t.Fatalf("%s %s: %v", name, dns.TypeToString[qtype], err)
	}
	return r
}

// reload writes a new Corefile and signals CoreDNS to load it, as the reload
// plugin does when it sees the file change (SIGUSR1 takes the same path
// without the plugin's 30 s poll).
func (f *clusterFront) reload(t testing.TB, edit func(string) string) {
	t.Helper()
	old, err := os.ReadFile(f.conf)
	if err != nil {
		t.Fatalf("Read %s: %v", f.conf, err)
	}
	next := edit(string(old))
	if next == string(old) {
		t.Fatalf("The reload's edit changed nothing in %s", filepath.Base(f.conf))
	}
	writeFile(t, filepath.Dir(f.conf), filepath.Base(f.conf), next)
	if err := f.p.cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatalf("Signal CoreDNS to reload: %v", err)
	}
}
