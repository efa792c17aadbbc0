//go:build unix

package dot

import (
	"syscall"
	"time"
)

// processCPU is the user and system CPU time the process has used so far: what a
// benchmark reports per operation (cpu-ns/op) beside the wall time, which on a
// machine shared with other work measures the sharing as much as the code.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
