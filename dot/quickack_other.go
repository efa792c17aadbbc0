//go:build !linux

package dot

// setQuickAck is a no-op where TCP_QUICKACK does not exist.
func setQuickAck(uintptr) {}

// unreadBytes is 0 where the pool does not ask the kernel.
func unreadBytes(uintptr) int { return 0 }
