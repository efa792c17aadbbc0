package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

var (
	// coredns is the path of the CoreDNS binary under test, built by TestMain.
	coredns string
	// directive is the forwarding plugin under test.
	directive = "dotforward"
)

// TestMain builds the custom CoreDNS (./cmd/coredns) once for the whole package
// and checks that it has the dotforward plugin. E2E_COREDNS names a prebuilt
// binary to use instead.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dotforward-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		os.Exit(1)
	}
	code := 1
	if err := setupCoreDNS(dir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func setupCoreDNS(dir string) error {
	if d := os.Getenv("E2E_DIRECTIVE"); d != "" {
		directive = d
	}
	coredns = os.Getenv("E2E_COREDNS")
	if coredns == "" {
		coredns = filepath.Join(dir, "coredns")
		cmd := exec.Command("go", "build", "-o", coredns, "./cmd/coredns")
		cmd.Dir = ".." // the module root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building ./cmd/coredns failed: %v\n%s", err, out)
		}
	}
	out, err := exec.Command(coredns, "-plugins").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -plugins: %v\n%s", coredns, err, out)
	}
	if !listsPlugin(string(out), directive) {
		return fmt.Errorf("%s has no %s plugin; `%s -plugins` lists:\n%s", coredns, directive, coredns, out)
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
