package dottest

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// WaitFor polls cond until it holds, failing the test after 10s: tests await
// conditions instead of sleeping for a guessed time.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("Timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// CheckNoPoolGoroutines fails the test if a goroutine of a dot.Pool (a
// connection's reader or writer, a dial, the sweeper) is still running, after
// giving exiting goroutines a few seconds to finish.
func CheckNoPoolGoroutines(t testing.TB) {
	t.Helper()
	var stacks string
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "dot.(*conn)") && !strings.Contains(stacks, "dot.(*Pool)") {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Errorf("Pool goroutines left running:\n%s", stacks)
}
