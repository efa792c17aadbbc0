package dot

import (
	"errors"
	"syscall"
	"time"
)

// A process out of file descriptors.
//
// A dial can fail before anything leaves the machine: socket(2) returns EMFILE
// when the process holds as many descriptors as RLIMIT_NOFILE allows, ENFILE when
// the whole system does. That says nothing about the upstream, so it is no
// strike: no reconnect backoff, no Observer.Failed (health). It says that the
// pool cannot have more connections than it has now: the pool takes the
// connections open at that moment as its cap (fdCap), re-tests the cap with one
// dial beyond it every fdRetest, and forgets it as soon as a dial succeeds. The
// pool then serves with the connections it could open, as forward does with its
// own, instead of failing queries on dials that cannot succeed.

// fdRetest is how often a pool capped for lack of file descriptors tries one dial
// beyond its cap: descriptors may have been freed meanwhile (the limit raised,
// other sockets closed).
const fdRetest = time.Second

// outOfFiles reports whether err is the kernel refusing a descriptor: EMFILE (the
// process's limit) or ENFILE (the system's).
func outOfFiles(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// fdCap is the cap a pool keeps on its connections after a dial failed for lack
// of file descriptors. Its zero value is no cap. The Pool's mu guards it.
type fdCap struct {
	on    bool      // a dial failed for lack of descriptors since the last one succeeded
	conns int       // the cap: connections open when that dial failed
	retry time.Time // no dial beyond the cap before this (the next re-test)
	cause error     // that dial's error (wrapping ErrNoFiles), for ErrUnavailable
}

// hit records a dial that failed for lack of descriptors while open connections
// were open: they are the most the process can hold now.
func (f *fdCap) hit(open int, err error, now time.Time) {
	*f = fdCap{on: true, conns: open, retry: now.Add(fdRetest), cause: err}
}

// grant reports whether a dial may start while n connections are open or being
// dialled. One beyond the cap is a re-test, at most one per fdRetest.
func (f *fdCap) grant(n int, now time.Time) bool {
	switch {
	case !f.on || n < f.conns:
		return true
	case now.Before(f.retry):
		return false
	}
	f.retry = now.Add(fdRetest)
	return true
}

// blocks reports whether the cap keeps a pool with no usable connection and no
// dial under way from dialing now: its callers should fail at once.
func (f *fdCap) blocks(now time.Time) bool {
	return f.on && f.conns == 0 && now.Before(f.retry)
}

// lift forgets the cap: a dial succeeded, descriptors are to be had again.
func (f *fdCap) lift() { *f = fdCap{} }
