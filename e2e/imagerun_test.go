package e2e

import (
	"crypto/tls"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"sigs.k8s.io/yaml"
)

// nodeLocalAddr is the address deploy/kubernetes/nodelocal binds.
const nodeLocalAddr = "169.254.20.10"

// imageBundle is the host's image unpacked by umoci: its root file system and
// the user its runtime configuration runs as.
type imageBundle struct {
	rootfs   string
	uid, gid int
	args     []string
}

// unpackImage copies the host's image out of the archive into an OCI layout
// (skopeo picks the host's platform from the index) and unpacks it with umoci,
// as a container runtime would. It checks the runtime configuration, the file
// capability on the unpacked binary, and the flags it was built with.
func unpackImage(t *testing.T, archive string, r imageRecipe) *imageBundle {
	t.Helper()
	dir := sharedDir(t)
	layout := filepath.Join(dir, "layout")
	tag := r.Value(t, "IMAGE_TAG")
	mustRunFor(t, tool(t, "skopeo"), "copy", "--quiet", "oci-archive:"+archive+":"+tag, "oci:"+layout+":"+tag)
	bundle := filepath.Join(dir, "bundle")
	mustRunFor(t, tool(t, "umoci"), "unpack", "--image", layout+":"+tag, bundle)
	var spec struct {
		Process struct {
			User struct {
				UID int `json:"uid"`
				GID int `json:"gid"`
			} `json:"user"`
			Args []string `json:"args"`
		} `json:"process"`
	}
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil || json.Unmarshal(b, &spec) != nil {
		t.Fatalf("umoci's config.json: %v\n%s", err, b)
	}
	ib := &imageBundle{rootfs: filepath.Join(bundle, "rootfs"), uid: spec.Process.User.UID, gid: spec.Process.User.GID, args: spec.Process.Args}
	if got := fmt.Sprintf("%d:%d", ib.uid, ib.gid); got != r.Value(t, "IMAGE_USER") || ib.uid == 0 {
		t.Errorf("runtime config: user %s, want %s (not root)", got, r.Value(t, "IMAGE_USER"))
	}
	wantArgs := append([]string{r.Value(t, "IMAGE_ENTRYPOINT")}, strings.Fields(r.Value(t, "IMAGE_CMD"))...)
	if strings.Join(ib.args, " ") != strings.Join(wantArgs, " ") {
		t.Errorf("runtime config: args %q, want %q", ib.args, wantArgs)
	}
	for _, d := range []string{bundle, ib.rootfs} {
		if err := os.Chmod(d, 0o755); err != nil { // umoci makes the bundle root's only
			t.Fatal(err)
		}
	}
	bin := filepath.Join(ib.rootfs, r.Value(t, "IMAGE_ENTRYPOINT"))
	if out := mustRunFor(t, tool(t, "getcap"), bin); !strings.Contains(out, "cap_net_bind_service=ep") {
		t.Errorf("getcap on the unpacked binary: %q, want cap_net_bind_service=ep", out)
	}
	checkBuildFlags(t, r, bin)
	return ib
}

// checkBuildFlags: the binary's build information records the recipe's flags,
// but for -ldflags, which Go leaves out with -trimpath: "-s -w" shows as a
// binary without a symbol table and without DWARF.
func checkBuildFlags(t *testing.T, r imageRecipe, bin string) {
	t.Helper()
	out := mustRunFor(t, "go", "version", "-m", bin)
	for _, want := range []string{"build\tCGO_ENABLED=0", "build\t" + r.Value(t, "IMAGE_GOFLAGS") + "=true"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("go version -m: no line %q in\n%s", want, out)
		}
	}
	if r.Value(t, "IMAGE_LDFLAGS") != "-s -w" {
		t.Fatalf("image.env: IMAGE_LDFLAGS = %s; this test checks -s -w: update it", r.Value(t, "IMAGE_LDFLAGS"))
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, sec := range f.Sections {
		if sec.Name == ".symtab" || strings.HasPrefix(sec.Name, ".debug_") || strings.HasPrefix(sec.Name, ".zdebug_") {
			t.Errorf("the binary has section %s: not built with -ldflags \"-s -w\"", sec.Name)
		}
	}
	if ph := slices.IndexFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }); ph >= 0 {
		t.Errorf("the binary has an ELF interpreter: not static (CGO_ENABLED=0)")
	}
}

// mustRunFor runs a command to completion within a minute, failing the test if
// it fails, and returns its output.
func mustRunFor(t testing.TB, bin string, args ...string) string {
	t.Helper()
	out, err := run(t, time.Minute, bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, strings.Join(args, " "), err, out)
	}
	return out
}

// sharedDir is a temporary directory the image's non-root user can read.
func sharedDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} { // t.TempDir makes both 0700
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runImage runs the unpacked /coredns as the image's user in a private network
// namespace, with only CAP_NET_BIND_SERVICE in its bounding set and
// no-new-privileges, as Kubernetes runs it with deploy/kubernetes's
// securityContext: first a copy without the file capability, which must fail to
// bind port 53, then the image's binary, which must answer on port 53 through
// dotforward to Unbound over DoT.
func runImage(t *testing.T, ib *imageBundle) {
	ns := newNetns(t)
	ns.ipCmd(t, "-n", ns.name, "addr", "add", nodeLocalAddr+"/32", "dev", "lo")
	c := newCerts(t)
	startNetnsUnbound(t, ns, c)
	dir := sharedDir(t)
	corefile := writeShared(t, dir, "Corefile", nodeLocalCorefile(t, writeShared(t, dir, "ca.crt", string(readFileT(t, c.CA)))))
	bin := filepath.Join(ib.rootfs, ib.args[0])

	nocap := writeShared(t, dir, "coredns-nocap", string(readFileT(t, bin)))
	if err := os.Chmod(nocap, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, time.Minute, ns.ip, ns.asImageUser(t, ib, nocap, corefile)...)
	if err == nil || !regexp.MustCompile(`listen (tcp|udp) [0-9.]+:53: bind: permission denied`).MatchString(out) {
		t.Errorf("without the file capability, /coredns should fail to bind port 53 with permission denied; it ended with %v:\n%s", err, out)
	}

	args := ns.asImageUser(t, ib, bin, corefile)
	p := startProc(t, "coredns (image)", nil, ns.ip, args...)
	waitFor(t, "the image's CoreDNS on "+nodeLocalAddr+":53", startTimeout, p, func() error {
		r, err := ns.exchange("udp", nodeLocalAddr+":53", nil, newQuery(aName, dns.TypeA))
		if err != nil {
			return err
		}
		return checkAnswer(r, dns.TypeA, aAddr)
	})
	checkImageProcess(t, p.cmd.Process.Pid, ib, bin)
	checkNodeLocalAnswers(t, ns)
}

// asImageUser returns the arguments of ip that run bin with corefile in ns as
// the image's user, with only CAP_NET_BIND_SERVICE and no-new-privileges.
// setpriv keeps root's permitted set across the user change; the exec then
// gives bin only what its file capability grants within the bounding set.
func (n *netns) asImageUser(t testing.TB, ib *imageBundle, bin, corefile string) []string {
	return []string{"netns", "exec", n.name, tool(t, "setpriv"),
		"--reuid=" + strconv.Itoa(ib.uid), "--regid=" + strconv.Itoa(ib.gid), "--clear-groups",
		"--bounding-set=-all,+net_bind_service", "--inh-caps=-all", "--no-new-privs",
		bin, "-conf", corefile}
}

// checkImageProcess reads the running CoreDNS's credentials from /proc: the
// image's user, CAP_NET_BIND_SERVICE alone, no-new-privileges, the image's binary.
func checkImageProcess(t *testing.T, pid int, ib *imageBundle, bin string) {
	t.Helper()
	status := string(readFileT(t, fmt.Sprintf("/proc/%d/status", pid)))
	only := fmt.Sprintf("%016x", uint64(1)<<capNetBindService)
	want := map[string]string{
		"Uid":        strings.Repeat(strconv.Itoa(ib.uid)+"\t", 3) + strconv.Itoa(ib.uid),
		"Gid":        strings.Repeat(strconv.Itoa(ib.gid)+"\t", 3) + strconv.Itoa(ib.gid),
		"Groups":     "",
		"CapInh":     "0000000000000000",
		"CapPrm":     only,
		"CapEff":     only,
		"CapBnd":     only,
		"CapAmb":     "0000000000000000",
		"NoNewPrivs": "1",
	}
	for line := range strings.Lines(status) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("/proc/%d/status: %s %q, want %q", pid, k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("/proc/%d/status lacks %v", pid, want)
	}
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != bin {
		t.Errorf("pid %d runs %q (%v), want the image's %s", pid, exe, err, bin)
	}
}

// checkNodeLocalAnswers queries the node-local instance over UDP and TCP, on its
// DoT leg (dotforward) and its cluster leg (forward), and checks on its metrics
// that dotforward answered.
func checkNodeLocalAnswers(t *testing.T, ns *netns) {
	t.Helper()
	// The .:53 block caches: the AAAA query, not asked before, must reach
	// dotforward, after the readiness query for the A record.
	for _, q := range []struct {
		network, name string
		qtype         uint16
		want          string
	}{
		{"udp", aName, dns.TypeA, aAddr}, {"tcp", aName, dns.TypeAAAA, aaaaAddr},
		{"udp", kubernetesName, dns.TypeA, kubernetesAddr}, {"tcp", kubernetesName, dns.TypeA, kubernetesAddr},
	} {
		r, err := ns.exchange(q.network, nodeLocalAddr+":53", nil, newQuery(q.name, q.qtype))
		if err == nil {
			err = checkAnswer(r, q.qtype, q.want)
		}
		if err != nil {
			t.Errorf("%s %s %s over %s: %v", nodeLocalAddr, q.name, dns.TypeToString[q.qtype], q.network, err)
		}
	}
	resp, err := ns.httpClient().Get("http://" + nodeLocalAddr + ":9253/metrics")
	if err != nil {
		t.Fatalf("scrape the node-local metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape the node-local metrics: status %d, %v", resp.StatusCode, err)
	}
	if n, _ := metricSum(string(body), "coredns_dotforward_requests_total", label("to", "127.0.0.1:853")); n < 2 {
		t.Errorf("coredns_dotforward_requests_total to 127.0.0.1:853 is %v, want at least the 2 queries (A and AAAA) for %s", n, aName)
	}
}

// The cluster leg's name: the node-local Corefile forwards cluster.local to
// kube-dns, which the test's Unbound stands in for.
const (
	kubernetesName = "kubernetes.default.svc.cluster.local."
	kubernetesAddr = "10.96.0.1"
)

// startNetnsUnbound starts Unbound in ns with DoT on 127.0.0.1:853 and plain
// DNS on 127.0.0.1:5353 (standing in for kube-dns).
func startNetnsUnbound(t *testing.T, ns *netns, c *certs) {
	t.Helper()
	dir := t.TempDir()
	conf := render(t, "unbound.conf.tmpl", dir, "unbound.conf", map[string]any{
		"Dir": dir, "TLSPort": 853, "PlainPort": 5353, "ControlPort": 8953,
		"Cert": c.Cert, "Key": c.Key, "IdleTimeoutMS": 30000,
		"Records": append(zoneRecords(), kubernetesName+" 30 IN A "+kubernetesAddr),
	})
	p := ns.start(t, "unbound", tool(t, "unbound"), "-d", "-c", conf)
	tlsConf := &tls.Config{RootCAs: c.pool, ServerName: serverName}
	waitFor(t, "unbound in "+ns.name, startTimeout, p, func() error {
		r, err := ns.exchange("tcp-tls", "127.0.0.1:853", tlsConf, newQuery(aName, dns.TypeA))
		if err != nil {
			return err
		}
		return checkAnswer(r, dns.TypeA, aAddr)
	})
}

// nodeLocalCorefile returns deploy/kubernetes/nodelocal's Corefile with its
// upstreams replaced: dotforward's by the namespace's Unbound over DoT (verified
// with ca), kube-dns by its plain port. Everything else is as deployed.
func nodeLocalCorefile(t *testing.T, ca string) string {
	t.Helper()
	var cm struct {
		Data map[string]string `json:"data"`
	}
	b := readFileT(t, filepath.Join("..", "deploy", "kubernetes", "nodelocal", "configmap.yaml"))
	if err := yaml.Unmarshal(b, &cm); err != nil || cm.Data["Corefile"] == "" {
		t.Fatalf("deploy/kubernetes/nodelocal/configmap.yaml: no Corefile (%v)", err)
	}
	cf := cm.Data["Corefile"]
	upstreams := regexp.MustCompile(`(dotforward \. )[^{\n]*\{`)
	if n := len(upstreams.FindAllString(cf, -1)); n != 1 || !strings.Contains(cf, "forward . 10.96.0.10") {
		t.Fatalf("the node-local Corefile should have one dotforward stanza (has %d) and forward . 10.96.0.10:\n%s", n, cf)
	}
	cf = upstreams.ReplaceAllString(cf, "${1}tls://127.0.0.1%"+serverName+":853 {\n        tls "+ca)
	return strings.Replace(cf, "forward . 10.96.0.10", "forward . 127.0.0.1:5353", 1)
}

// writeShared writes a file the image's user can read.
func writeShared(t testing.TB, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFileT(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
