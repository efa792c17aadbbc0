package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// apiStartTimeout bounds the wait for etcd and the API server to be ready: the
// API server takes about 4 s on an idle machine, much longer on a loaded one.
const apiStartTimeout = 3 * time.Minute

// adminToken is the static token of the test's cluster administrator (group
// system:masters); the DNS under test never uses it.
const adminToken = "dotforward-e2e-admin-token"

// serviceCIDRs are kubeadm's default Service range, since deploy/kubernetes/
// service.yaml asks for kube-dns at 10.96.0.10, and an IPv6 range: dual-stack
// Services have AAAA records.
const serviceCIDRs = "10.96.0.0/12,fd00:10:96::/112"

// controlPlane is an etcd and a kube-apiserver on 127.0.0.1, started by a test
// and killed by PID when it ends. No kubelet, no controller manager: objects
// exist as they are created (a Service gets no EndpointSlices of its own).
type controlPlane struct {
	url       string // https://127.0.0.1:port
	dir       string
	certs     *certs // the API server's serving certificate and its CA
	kubectl   string // kubectl binary
	adminConf string // kubeconfig with adminToken
	etcd      *proc
	api       *proc
	start     func(t testing.TB) *proc // (re)starts the API server on the same port
	client    *kubernetes.Clientset    // admin's client
}

// k8sBinDir returns the directory scripts/k8s-tools.sh builds etcd,
// kube-apiserver and kubectl into, failing the test if they are not there.
func k8sBinDir(t testing.TB) string {
	t.Helper()
	out, err := exec.Command("bash", "../scripts/k8s-tools.sh", "dir").Output()
	if err != nil {
		t.Fatalf("scripts/k8s-tools.sh dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.Mode()&0o111 == 0 {
			t.Fatalf("%s is not built in %s: run scripts/k8s-tools.sh (make test runs it through scripts/install-deps.sh)", b, dir)
		}
	}
	return dir
}

// startControlPlane starts etcd and the API server and waits until /readyz
// answers "ok" with the admin's token.
func startControlPlane(t testing.TB) *controlPlane {
	t.Helper()
	bin := k8sBinDir(t)
	cp := &controlPlane{dir: t.TempDir(), certs: newCerts(t), kubectl: filepath.Join(bin, "kubectl")}
	var etcdURL string
	cp.etcd, etcdURL = startEtcd(t, bin, cp.dir)
	port := freePort(t)
	cp.url = fmt.Sprintf("https://127.0.0.1:%d", port)
	args := cp.apiserverArgs(t, etcdURL, port)
	cp.start = func(t testing.TB) *proc {
		return startProc(t, "kube-apiserver", nil, filepath.Join(bin, "kube-apiserver"), args...)
	}
	cp.api = cp.start(t)
	cp.waitReady(t)
	cp.adminConf = cp.writeKubeconfig(t, "admin", adminToken)
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.adminConf)
	if err != nil {
		t.Fatalf("Load the admin kubeconfig: %v", err)
	}
	if cp.client, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatalf("Admin client: %v", err)
	}
	return cp
}

// startEtcd starts a single-member etcd on 127.0.0.1 and waits until it is
// healthy; it returns the process and its client URL.
func startEtcd(t testing.TB, bin, dir string) (*proc, string) {
	t.Helper()
	client, peer := addr(freePort(t)), addr(freePort(t))
	url := "http://" + client
	p := startProc(t, "etcd", nil, filepath.Join(bin, "etcd"),
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", url, "--advertise-client-urls", url,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "default=http://"+peer, "--name", "default",
		"--log-level", "warn")
	hc := &http.Client{Timeout: 5 * time.Second}
	waitFor(t, "etcd on "+client, apiStartTimeout, p, func() error {
		resp, err := hc.Get(url + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /health: %s", resp.Status)
		}
		return nil
	})
	return p, url
}

// apiserverArgs writes the token file and the service-account key and returns
// the API server's flags. --endpoint-reconciler-type none: the default reconciler
// refuses a loopback advertise address.
func (cp *controlPlane) apiserverArgs(t testing.TB, etcd string, port int) []string {
	t.Helper()
	tokens := writeFile(t, cp.dir, "tokens.csv", adminToken+`,admin,admin,"system:masters"`+"\n")
	saKey := writeServiceAccountKey(t, cp.dir)
	return []string{
		"--etcd-servers", etcd,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(port),
		"--tls-cert-file", cp.certs.Cert, "--tls-private-key-file", cp.certs.Key,
		"--cert-dir", filepath.Join(cp.dir, "apiserver-certs"),
		"--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range", serviceCIDRs,
		"--endpoint-reconciler-type", "none",
		"--enable-priority-and-fairness=false",
		"--v", "1",
	}
}

// writeServiceAccountKey writes a fresh P-256 key that signs and verifies
// service-account tokens (the API server derives the public key from it).
func writeServiceAccountKey(t testing.TB, dir string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("Generate service-account key: %v", err)
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatalf("Marshal service-account key: %v", err)
	}
	path := filepath.Join(dir, "sa.key")
	writePEM(t, path, "EC PRIVATE KEY", der)
	return path
}

// waitReady polls /readyz with the admin's token until it answers 200.
func (cp *controlPlane) waitReady(t testing.TB) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: cp.certs.pool, ServerName: serverName},
	}}
	waitFor(t, "kube-apiserver /readyz on "+cp.url, apiStartTimeout, cp.api, func() error {
		req, _ := http.NewRequest(http.MethodGet, cp.url+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /readyz: %s", resp.Status)
		}
		return nil
	})
}

// writeKubeconfig writes a kubeconfig that reaches the API server with token as
// user and returns its path.
func (cp *controlPlane) writeKubeconfig(t testing.TB, user, token string) string {
	t.Helper()
	conf := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: %s
    certificate-authority: %s
    tls-server-name: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: e2e
  context:
    cluster: e2e
    user: %s
current-context: e2e
`, cp.url, cp.certs.CA, serverName, user, token, user)
	return writeFile(t, cp.dir, "kubeconfig-"+user, conf)
}

// kubectlAs runs kubectl with the kubeconfig conf and returns its output,
// failing the test if it fails.
func (cp *controlPlane) kubectlAs(t testing.TB, conf string, args ...string) string {
	t.Helper()
	out, err := run(t, 2*time.Minute, cp.kubectl, append([]string{"--kubeconfig", conf}, args...)...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// kubectlAdmin runs kubectl as the administrator.
func (cp *controlPlane) kubectlAdmin(t testing.TB, args ...string) string {
	t.Helper()
	return cp.kubectlAs(t, cp.adminConf, args...)
}

// stopAPIServer kills the API server by its PID (etcd keeps running).
func (cp *controlPlane) stopAPIServer() { cp.api.kill() }
