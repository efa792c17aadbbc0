//go:build !linux

package dot

// setQuickAck is a no-op where TCP_QUICKACK does not exist.
func setQuickAck(uintptr) {}
