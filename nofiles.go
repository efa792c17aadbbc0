package dotforward

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dotforward/dotforward/dot"
)

// A process out of file descriptors (dot.ErrNoFiles) cannot open connections to
// any upstream. It is no failure of the upstream (health and the latency
// estimate leave it alone), and the pool serves with the connections it has; but
// the operator must hear of it, once, with the fix, rather than find SERVFAILs.

// noFilesLogEvery is how often at most the process logs that it is out of file
// descriptors: once per spell in practice, and again if it lasts.
const noFilesLogEvery = 10 * time.Minute

// noFilesLogged is when the process last logged it (unix ns; 0: never).
var noFilesLogged atomic.Int64

// isNoFiles reports whether err is a dial that failed for lack of descriptors.
func isNoFiles(err error) bool { return errors.Is(err, dot.ErrNoFiles) }

// logNoFiles logs, at most once per noFilesLogEvery for the whole process, that a
// dial to addr failed for lack of file descriptors, and how to fix it.
func logNoFiles(addr string, err error) {
	now := time.Now().UnixNano()
	last := noFilesLogged.Load()
	if last != 0 && now-last < int64(noFilesLogEvery) || !noFilesLogged.CompareAndSwap(last, now) {
		return
	}
	log.Errorf("The process is out of file descriptors%s: a connection to %s could not be opened (%s). "+
		"dotforward serves with the connections it has and does not count this against the upstream. "+
		"Fix: raise the limit (ulimit -n in the shell that starts CoreDNS, LimitNOFILE= in its systemd unit, "+
		"the container's nofile ulimit) or lower max_conns. Logged at most once per %v.",
		nofileLimit(), addr, untagged(err), noFilesLogEvery)
}

// nofileLimit is " (RLIMIT_NOFILE N)", the soft limit in force, or "" when it
// cannot be read.
func nofileLimit() string {
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) != nil {
		return ""
	}
	return fmt.Sprintf(" (RLIMIT_NOFILE %d)", r.Cur)
}
