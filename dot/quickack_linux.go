package dot

import (
	"syscall"
	"unsafe"
)

// setQuickAck asks the kernel to acknowledge what it receives at once instead of
// delaying the ACK (up to 40ms on Linux). Servers that leave Nagle's algorithm on
// for DoT, unbound among them, hold each answer until the previous one is
// acknowledged: with delayed ACKs the second of two answers written back to back
// waits for our ACK timer. Linux goes back to delayed ACKs when we send, so the
// flag is set again on the first read after each write (see batchConn.Read).
func setQuickAck(fd uintptr) {
	syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
}

// unreadBytes returns how many bytes the socket has received that nobody has
// read yet.
func unreadBytes(fd uintptr) int {
	var n int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCINQ, uintptr(unsafe.Pointer(&n))); errno != 0 {
		return 0
	}
	return int(n)
}
