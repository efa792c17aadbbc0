package dotforward

import (
	"errors"
	"strings"

	"github.com/dotforward/dotforward/dot"
)

// Errors of the plugin layer; the pool's own sentinels are in dot/errors.go.
var (
	// ErrNoHealthy is returned when every upstream is down and
	// failfast_all_unhealthy_upstreams is set, or no upstream could be tried.
	ErrNoHealthy = errors.New("no healthy upstream")
	// ErrLimitExceeded is returned when max_concurrent queries are already being served.
	ErrLimitExceeded = errors.New("max_concurrent queries exceeded")
	// ErrZoneTransfer is returned for AXFR and IXFR, which a pipelined DoT
	// connection cannot carry (their answers span several messages). It is the
	// pool's, and wraps dot.ErrBadQuery: errorRcode checks it first.
	ErrZoneTransfer = dot.ErrZoneTransfer
	// ErrNotStarted is returned for an upstream whose pool is not running: before
	// OnStartup or after OnShutdown.
	ErrNotStarted = errors.New("upstream not started")

	errNotTLS = errors.New("dotforward only forwards over TLS")
)

// untaggedError presents an error without the "dot: " tags of package dot's
// errors (see untagged); errors.Is and errors.As see the error unchanged.
type untaggedError struct{ err error }

func (e untaggedError) Error() string { return untagged(e.err) }
func (e untaggedError) Unwrap() error { return e.err }

// dotTag begins every error text of package dot.
const dotTag = "dot: "

// untagged returns err's text without the tags of package dot's errors, which
// would repeat what the "plugin/dotforward: " before every log line and error of
// the plugin says: "dot: upstream unavailable: dot: dial failed" becomes
// "upstream unavailable: dial failed". A tag is one that begins the text or
// follows a space or a parenthesis, so a name ending in "dot" keeps its letters.
func untagged(err error) string {
	s := err.Error()
	var b strings.Builder
	for {
		i := strings.Index(s, dotTag)
		if i < 0 {
			break
		}
		b.WriteString(s[:i])
		if i > 0 && s[i-1] != ' ' && s[i-1] != '(' {
			b.WriteString(dotTag)
		}
		s = s[i+len(dotTag):]
	}
	b.WriteString(s)
	return b.String()
}
