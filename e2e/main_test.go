package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// coredns is the path of the CoreDNS binary under test, built by TestMain.
var coredns string

// raceBuild, set by E2E_RACE=1, builds CoreDNS with the race detector: slower, and
// a data race it reports in any CoreDNS process fails the test that started it.
var raceBuild = os.Getenv("E2E_RACE") == "1"

// TestMain builds the custom CoreDNS (./cmd/coredns) once for the whole package
// and checks that it has the dotforward plugin.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dotforward-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		os.Exit(1)
	}
	code := 1
	if err := buildCoreDNS(dir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildCoreDNS(dir string) error {
	coredns = filepath.Join(dir, "coredns")
	args := []string{"build", "-o", coredns}
	if raceBuild {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/coredns")...)
	cmd.Dir = ".." // the module root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building ./cmd/coredns failed: %v\n%s", err, out)
	}
	out, err := exec.Command(coredns, "-plugins").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -plugins: %v\n%s", coredns, err, out)
	}
	if !listsPlugin(string(out), "dotforward") {
		return fmt.Errorf("the CoreDNS built from ./cmd/coredns has no dotforward plugin; -plugins lists:\n%s", out)
	}
	return nil
}

// corednsBinary returns the CoreDNS under test.
func corednsBinary(t testing.TB) string {
	t.Helper()
	if coredns == "" {
		t.Fatalf("CoreDNS was not built")
	}
	return coredns
}

// listsPlugin reports whether the output of `coredns -plugins` lists name, bare
// or as dns.name (the format differs between CoreDNS versions).
func listsPlugin(out, name string) bool {
	for line := range strings.Lines(out) {
		if l := strings.TrimSpace(line); l == name || l == "dns."+name {
			return true
		}
	}
	return false
}
