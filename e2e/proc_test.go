package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// proc is a server process started by a test. Its stdout and stderr go to a log
// file that is printed when the test fails. The test kills it by its PID.
type proc struct {
	name string
	log  string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

// startProc starts bin with args and registers its kill in t.Cleanup. env entries
// are added to the test's environment.
func startProc(t testing.TB, name string, env []string, bin string, args ...string) *proc {
	t.Helper()
	logFile, err := os.CreateTemp(t.TempDir(), name+"-*.log")
	if err != nil {
		t.Fatalf("Create log for %s: %v", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		logFile.Close()
		t.Fatalf("Start %s (%s): %v", name, bin, err)
	}
	p := &proc{name: name, log: logFile.Name(), cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		for _, bad := range badLogLines {
			if p.logContains(bad) {
				t.Errorf("%s logged %q", name, bad)
			}
		}
		if t.Failed() {
			t.Logf("--- log of %s (pid %d, %s):\n%s", name, cmd.Process.Pid, bin, p.tail(64<<10))
		}
	})
	return p
}

// badLogLines fail the test when any process it started logs them: a data race
// (E2E_RACE=1), a Go panic, or a panic CoreDNS recovered from while serving.
var badLogLines = []string{"WARNING: DATA RACE", "panic: ", "Recovered from panic"}

// kill stops the process by its PID with SIGKILL and waits until it is gone.
func (p *proc) kill() {
	if p.exited() {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail returns the last n bytes of the process's log.
func (p *proc) tail(n int) string {
	data, err := os.ReadFile(p.log)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(data)
}

// logContains reports whether the process's log contains s.
func (p *proc) logContains(s string) bool {
	data, _ := os.ReadFile(p.log)
	return bytes.Contains(data, []byte(s))
}

// pollInterval paces every readiness and condition poll.
const pollInterval = 20 * time.Millisecond

// waitFor polls cond until it returns nil or the deadline passes; it fails the
// test with cond's last error. If p is not nil and exits, it fails at once.
// Every wait of the end-to-end tests is on the wall clock, and must be: they
// await real processes (unbound, dnsdist, CoreDNS...) over real sockets, which
// no testing/synctest bubble can hold. Timer-driven logic is tested in bubbles
// in the root package and in dot/.
func waitFor(t testing.TB, what string, timeout time.Duration, p *proc, cond func() error) {
	t.Helper()
	if err := poll(timeout, p, cond); err != nil {
		t.Fatalf("Waiting for %s: %v", what, err)
	}
}

// poll is waitFor without the test: it returns cond's last error on timeout.
func poll(timeout time.Duration, p *proc, cond func() error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if p != nil && p.exited() {
			return fmt.Errorf("%s exited (%v) before it was ready; last error: %v\n%s", p.name, p.err, err, p.tail(8<<10))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %v: %w", timeout, err)
		}
		<-tick.C
	}
}

// installHint is how to get a missing tool.
const installHint = "run scripts/install-deps.sh (or `make test`, which runs it) to install the servers and clients the end-to-end tests need"

// tool returns the path of an external program the test needs, failing the test
// (never skipping it) if it is not installed.
func tool(t testing.TB, name string) string {
	t.Helper()
	path, err := lookTool(name)
	if err != nil {
		t.Fatalf("%s is not installed (%v): %s", name, err, installHint)
	}
	return path
}

// lookTool finds name in PATH or in the sbin directories where Debian puts the
// daemons (they are not in an ordinary user's PATH).
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", errors.New("not found in PATH, /usr/sbin or /sbin")
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatalf("Write %s: %v", path, err)
	}
	return path
}

// run runs a client program to completion with a time bound and returns its
// combined output.
func run(t testing.TB, timeout time.Duration, bin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-done:
		return out.String(), err
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("%s %s: killed after %v", bin, strings.Join(args, " "), timeout)
	}
}

// fatalRecorder is a testing.TB whose Fatalf only records the message.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
}

// TestMissingToolFails proves that a missing server or client fails a test with a
// pointer to the installer, rather than skipping it.
func TestMissingToolFails(t *testing.T) {
	r := &fatalRecorder{TB: t}
	tool(r, "dotforward-e2e-no-such-tool")
	if !strings.Contains(r.msg, "scripts/install-deps.sh") || !strings.Contains(r.msg, "dotforward-e2e-no-such-tool") {
		t.Fatalf("A missing tool gave %q, want a failure naming it and scripts/install-deps.sh", r.msg)
	}
	if p := tool(t, "unbound"); !strings.HasSuffix(p, "/unbound") {
		t.Fatalf("tool(unbound) = %q", p)
	}
}
