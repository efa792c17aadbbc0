package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coredns/caddy/caddyfile"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// imageRef is the image both workloads run: IMAGE_NAME:IMAGE_TAG of image.env,
// the name `make image` gives it. deploy/README.md tells how to replace it.
func imageRef(t *testing.T) string {
	t.Helper()
	r := readRecipe(t)
	return r.Value(t, "IMAGE_NAME") + ":" + r.Value(t, "IMAGE_TAG")
}

// manifests is the set of objects of one kustomization directory.
type manifests struct {
	dir             string
	serviceAccounts map[string]*corev1.ServiceAccount
	configMaps      map[string]*corev1.ConfigMap
	services        map[string]*corev1.Service
	deployments     map[string]*appsv1.Deployment
	daemonSets      map[string]*appsv1.DaemonSet
	pdbs            map[string]*policyv1.PodDisruptionBudget
	clusterRoles    map[string]*rbacv1.ClusterRole
	bindings        map[string]*rbacv1.ClusterRoleBinding
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// load decodes every resource of dir's kustomization.yaml strictly: a field the
// Kubernetes API does not know is an error, as kubectl's validation makes it.
func load(t *testing.T, dir string) *manifests {
	t.Helper()
	var kust struct {
		Resources []string `json:"resources"`
	}
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &kust); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, f := range files {
		if base := filepath.Base(f); base != "kustomization.yaml" {
			want = append(want, base)
		}
	}
	got := slices.Sorted(slices.Values(kust.Resources))
	if !slices.Equal(got, want) {
		t.Errorf("%s/kustomization.yaml lists %v, the directory holds %v", dir, got, want)
	}
	m := &manifests{
		dir:             dir,
		serviceAccounts: map[string]*corev1.ServiceAccount{},
		configMaps:      map[string]*corev1.ConfigMap{},
		services:        map[string]*corev1.Service{},
		deployments:     map[string]*appsv1.Deployment{},
		daemonSets:      map[string]*appsv1.DaemonSet{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
		clusterRoles:    map[string]*rbacv1.ClusterRole{},
		bindings:        map[string]*rbacv1.ClusterRoleBinding{},
	}
	for _, r := range kust.Resources {
		file := filepath.Join(dir, r)
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range docSeparator.Split(string(b), -1) {
			if strings.TrimSpace(doc) == "" {
				continue
			}
			if err := m.add(doc); err != nil {
				t.Errorf("%s: %v", file, err)
			}
		}
	}
	return m
}

func (m *manifests) add(doc string) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
		return err
	}
	var obj metav1.Object
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 ServiceAccount":
		o := &corev1.ServiceAccount{}
		obj, m.serviceAccounts[nameOf(doc)] = o, o
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		obj, m.configMaps[nameOf(doc)] = o, o
	case "v1 Service":
		o := &corev1.Service{}
		obj, m.services[nameOf(doc)] = o, o
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		obj, m.deployments[nameOf(doc)] = o, o
	case "apps/v1 DaemonSet":
		o := &appsv1.DaemonSet{}
		obj, m.daemonSets[nameOf(doc)] = o, o
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		obj, m.pdbs[nameOf(doc)] = o, o
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		o := &rbacv1.ClusterRole{}
		obj, m.clusterRoles[nameOf(doc)] = o, o
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		o := &rbacv1.ClusterRoleBinding{}
		obj, m.bindings[nameOf(doc)] = o, o
	default:
		return fmt.Errorf("unexpected object %s %s", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if obj.GetName() == "" {
		return fmt.Errorf("%s without a name", tm.Kind)
	}
	_, clusterScoped := obj.(*rbacv1.ClusterRole)
	if _, ok := obj.(*rbacv1.ClusterRoleBinding); ok {
		clusterScoped = true
	}
	if !clusterScoped && obj.GetNamespace() != "kube-system" {
		return fmt.Errorf("%s %s: namespace %q, want kube-system", tm.Kind, obj.GetName(), obj.GetNamespace())
	}
	return nil
}

// nameOf reads metadata.name, to key the maps before the strict decode.
func nameOf(doc string) string {
	var o struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	_ = yaml.Unmarshal([]byte(doc), &o)
	return o.Metadata.Name
}

// workload is what the checks need of a Deployment or a DaemonSet.
type workload struct {
	kind     string
	name     string
	selector *metav1.LabelSelector
	pod      corev1.PodTemplateSpec
}

func (m *manifests) workloads() []workload {
	var ws []workload
	for n, d := range m.deployments {
		ws = append(ws, workload{"Deployment", n, d.Spec.Selector, d.Spec.Template})
	}
	for n, d := range m.daemonSets {
		ws = append(ws, workload{"DaemonSet", n, d.Spec.Selector, d.Spec.Template})
	}
	return ws
}

func TestClusterDNSManifests(t *testing.T) {
	m := load(t, "kubernetes")
	for _, kind := range []struct {
		name string
		n    int
	}{
		{"ServiceAccount", len(m.serviceAccounts)}, {"ClusterRole", len(m.clusterRoles)},
		{"ClusterRoleBinding", len(m.bindings)}, {"ConfigMap", len(m.configMaps)},
		{"Deployment", len(m.deployments)}, {"Service", len(m.services)},
		{"PodDisruptionBudget", len(m.pdbs)},
	} {
		if kind.n != 1 {
			t.Errorf("Expected one %s, found %d", kind.name, kind.n)
		}
	}
	d := m.deployments["coredns"]
	if d == nil {
		t.Fatal("Expected the Deployment coredns")
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("Expected 2 replicas, got %v", d.Spec.Replicas)
	}
	if a := d.Spec.Template.Spec.Affinity; a == nil || a.PodAntiAffinity == nil {
		t.Error("Expected pod anti-affinity to spread the replicas")
	}
	if d.Spec.Template.Spec.DNSPolicy != corev1.DNSDefault {
		t.Errorf("Expected dnsPolicy Default (CoreDNS must not resolve through itself), got %q", d.Spec.Template.Spec.DNSPolicy)
	}
	svc := m.services["kube-dns"]
	if svc == nil {
		t.Fatal("Expected the Service kube-dns")
	}
	if net.ParseIP(svc.Spec.ClusterIP) == nil {
		t.Errorf("Expected an IP address as the kube-dns clusterIP, got %q", svc.Spec.ClusterIP)
	}
	for _, b := range m.bindings {
		if m.clusterRoles[b.RoleRef.Name] == nil || b.RoleRef.Kind != "ClusterRole" {
			t.Errorf("ClusterRoleBinding %s refers to a missing %s %s", b.Name, b.RoleRef.Kind, b.RoleRef.Name)
		}
		for _, s := range b.Subjects {
			if s.Kind != "ServiceAccount" || m.serviceAccounts[s.Name] == nil || s.Namespace != "kube-system" {
				t.Errorf("ClusterRoleBinding %s binds a missing %s %s/%s", b.Name, s.Kind, s.Namespace, s.Name)
			}
		}
	}
	pdb := m.pdbs["coredns"]
	if pdb == nil {
		t.Fatal("Expected the PodDisruptionBudget coredns")
	}
	if !selects(t, pdb.Spec.Selector, d.Spec.Template.Labels) {
		t.Error("The PodDisruptionBudget does not select the Deployment's pods")
	}
	m.checkCommon(t)
}

func TestNodeLocalManifests(t *testing.T) {
	m := load(t, filepath.Join("kubernetes", "nodelocal"))
	ds := m.daemonSets["dotforward-node-local"]
	if ds == nil {
		t.Fatal("Expected the DaemonSet dotforward-node-local")
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork {
		t.Error("Expected hostNetwork: the instance answers on the node's link-local address")
	}
	if len(m.clusterRoles)+len(m.bindings) != 0 {
		t.Error("Expected no RBAC: the node-local instance does not watch the API")
	}
	m.checkCommon(t)

	blocks := corefile(t, m, spec)
	const linkLocal = "169.254.20.10"
	for _, sb := range blocks {
		binds := directiveArgs(sb, "bind")
		if len(binds) != 1 || !slices.Equal(binds[0], []string{linkLocal}) {
			t.Errorf("Server block %v: expected `bind %s`, got %v", sb.Keys, linkLocal, binds)
		}
	}
	c := coreDNSContainer(t, spec)
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Host != linkLocal {
			t.Errorf("Expected the probes to reach %s (the only address the pod listens on)", linkLocal)
		}
	}
	if len(spec.InitContainers) != 1 || !strings.Contains(strings.Join(spec.InitContainers[0].Command, " "), linkLocal+"/32") {
		t.Errorf("Expected an init container that assigns %s/32", linkLocal)
	}
	if !slices.ContainsFunc(blocks, func(sb caddyfile.ServerBlock) bool {
		return slices.Contains(sb.Keys, "cluster.local:53") && len(sb.Tokens["forward"]) > 0
	}) {
		t.Error("Expected cluster.local to be forwarded to kube-dns with forward")
	}
}

// checkCommon checks what the cluster DNS and node-local directories share:
// references between objects, the CoreDNS container and its Corefile.
func (m *manifests) checkCommon(t *testing.T) {
	t.Helper()
	ws := m.workloads()
	if len(ws) != 1 {
		t.Fatalf("Expected one workload in %s, found %d", m.dir, len(ws))
	}
	w := ws[0]
	spec := w.pod.Spec
	if !selects(t, w.selector, w.pod.Labels) {
		t.Errorf("%s %s: the selector does not match the pod template's labels", w.kind, w.name)
	}
	if m.serviceAccounts[spec.ServiceAccountName] == nil {
		t.Errorf("%s %s: service account %q is not defined", w.kind, w.name, spec.ServiceAccountName)
	}
	for _, s := range m.services {
		if !selects(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, w.pod.Labels) {
			t.Errorf("Service %s does not select the %s's pods", s.Name, w.kind)
		}
	}
	c := coreDNSContainer(t, spec)
	if image := imageRef(t); c.Image != image {
		t.Errorf("Expected image %s (image.env's IMAGE_NAME:IMAGE_TAG, as make image tags it), got %s", image, c.Image)
	}
	if !slices.Equal(c.Args, []string{"-conf", "/etc/coredns/Corefile"}) {
		t.Errorf("Expected args -conf /etc/coredns/Corefile, got %v", c.Args)
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Error("Expected memory requests and limits")
	}
	checkSecurity(t, spec, c)

	blocks := corefile(t, m, spec)
	checkPorts(t, blocks, c)
	checkProbe(t, blocks, c.LivenessProbe, "health", "/health", 8080)
	checkProbe(t, blocks, c.ReadinessProbe, "ready", "/ready", 8181)
	if !slices.ContainsFunc(blocks, func(sb caddyfile.ServerBlock) bool { return len(sb.Tokens["dotforward"]) > 0 }) {
		t.Error("Expected a dotforward stanza in the Corefile")
	}
}

func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("Invalid selector %v: %v", sel, err)
		return false
	}
	return s.Matches(labels.Set(l))
}

func coreDNSContainer(t *testing.T, spec corev1.PodSpec) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == "coredns" {
			return &spec.Containers[i]
		}
	}
	t.Fatal("Expected a container named coredns")
	return nil
}

// checkSecurity checks that CoreDNS runs as non-root with NET_BIND_SERVICE as
// its only capability, which the image's file capability needs to bind port 53.
func checkSecurity(t *testing.T, spec corev1.PodSpec, c *corev1.Container) {
	t.Helper()
	nonRoot := false
	if psc := spec.SecurityContext; psc != nil && psc.RunAsNonRoot != nil {
		nonRoot = *psc.RunAsNonRoot
	}
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("Expected a container securityContext")
	}
	if sc.RunAsNonRoot != nil {
		nonRoot = *sc.RunAsNonRoot
	}
	if !nonRoot {
		t.Error("Expected runAsNonRoot")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("Expected allowPrivilegeEscalation: false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("Expected readOnlyRootFilesystem: true")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"NET_BIND_SERVICE"}) ||
		!slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("Expected capabilities add [NET_BIND_SERVICE] drop [ALL], got %+v", sc.Capabilities)
	}
}

// corefile returns the server blocks of the Corefile the pod mounts at
// /etc/coredns/Corefile, following its volume to the ConfigMap.
func corefile(t *testing.T, m *manifests, spec corev1.PodSpec) []caddyfile.ServerBlock {
	t.Helper()
	c := coreDNSContainer(t, spec)
	var mount *corev1.VolumeMount
	for i := range c.VolumeMounts {
		if c.VolumeMounts[i].MountPath == "/etc/coredns" {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatal("Expected a volume mounted at /etc/coredns")
	}
	var cm *corev1.ConfigMapVolumeSource
	for _, v := range spec.Volumes {
		if v.Name == mount.Name {
			cm = v.ConfigMap
		}
	}
	if cm == nil {
		t.Fatalf("Expected volume %s to be a ConfigMap", mount.Name)
	}
	data := m.configMaps[cm.Name]
	if data == nil {
		t.Fatalf("ConfigMap %s is not defined in %s", cm.Name, m.dir)
	}
	key := "Corefile"
	for _, it := range cm.Items {
		if it.Path == "Corefile" {
			key = it.Key
		}
	}
	text, ok := data.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", cm.Name, key)
	}
	blocks, err := caddyfile.Parse(cm.Name, strings.NewReader(text), nil)
	if err != nil {
		t.Fatalf("ConfigMap %s: %v", cm.Name, err)
	}
	return blocks
}

// directiveArgs returns the arguments of each occurrence of a directive in a
// server block: the tokens on the directive's own line, without a block.
func directiveArgs(sb caddyfile.ServerBlock, name string) [][]string {
	var out [][]string
	toks := sb.Tokens[name]
	for i := 0; i < len(toks); i++ {
		if toks[i].Text != name || (i > 0 && toks[i].Line == toks[i-1].Line) {
			continue
		}
		args := []string{}
		for j := i + 1; j < len(toks) && toks[j].Line == toks[i].Line && toks[j].Text != "{"; j++ {
			args = append(args, toks[j].Text)
		}
		out = append(out, args)
	}
	return out
}

// port returns the port of a Corefile address ("host:port", ":port", "zone:port"),
// or def when it has none.
func port(t *testing.T, addr string, def int) int {
	t.Helper()
	addr = strings.TrimPrefix(addr, "dns://")
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return def
	}
	p, err := strconv.Atoi(addr[i+1:])
	if err != nil {
		t.Errorf("Bad port in %q", addr)
	}
	return p
}

// checkPorts checks that the container declares the DNS port of every server
// block over UDP and TCP, and the prometheus port.
func checkPorts(t *testing.T, blocks []caddyfile.ServerBlock, c *corev1.Container) {
	t.Helper()
	declared := map[string]bool{}
	for _, p := range c.Ports {
		declared[fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol)] = true
	}
	metrics := false
	for _, sb := range blocks {
		for _, k := range sb.Keys {
			p := port(t, k, 53)
			for _, proto := range []string{"UDP", "TCP"} {
				if !declared[fmt.Sprintf("%d/%s", p, proto)] {
					t.Errorf("Server block %s listens on %d/%s, which the container does not declare", k, p, proto)
				}
			}
		}
		for _, args := range directiveArgs(sb, "prometheus") {
			addr := ""
			if len(args) > 0 {
				addr = args[0]
			}
			p := port(t, addr, 9153)
			if !declared[fmt.Sprintf("%d/TCP", p)] {
				t.Errorf("prometheus listens on %d, which the container does not declare", p)
			}
			metrics = true
		}
	}
	if !metrics {
		t.Error("Expected the prometheus plugin in the Corefile")
	}
}

// checkProbe checks that a probe asks the plugin that serves it: the directive
// must be in the Corefile, on the probe's port and host.
func checkProbe(t *testing.T, blocks []caddyfile.ServerBlock, p *corev1.Probe, directive, path string, def int) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("Expected an HTTP probe for %s", directive)
		return
	}
	var found [][]string
	for _, sb := range blocks {
		found = append(found, directiveArgs(sb, directive)...)
	}
	if len(found) != 1 {
		t.Errorf("Expected the %s plugin once in the Corefile, found it %d times", directive, len(found))
		return
	}
	addr := ""
	if len(found[0]) > 0 {
		addr = found[0][0]
	}
	if p.HTTPGet.Path != path || p.HTTPGet.Port.IntValue() != port(t, addr, def) {
		t.Errorf("Probe GET %s:%s does not reach %s %q (%s on port %d)", p.HTTPGet.Path, p.HTTPGet.Port.String(), directive, addr, path, port(t, addr, def))
	}
	if host, _, _ := strings.Cut(addr, ":"); host != p.HTTPGet.Host {
		t.Errorf("Probe host %q does not match the %s address %q", p.HTTPGet.Host, directive, addr)
	}
}
