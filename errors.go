package dotforward

import "errors"

// Errors of the plugin layer; the pool's own sentinels are in dot/errors.go.
var (
	// ErrNoHealthy is returned when every upstream is down and
	// failfast_all_unhealthy_upstreams is set, or no upstream could be tried.
	ErrNoHealthy = errors.New("no healthy upstream")
	// ErrLimitExceeded is returned when max_concurrent queries are already in flight.
	ErrLimitExceeded = errors.New("max_concurrent queries exceeded")
	// ErrZoneTransfer is returned for AXFR and IXFR, which a pipelined DoT
	// connection cannot carry (their answers span several messages).
	ErrZoneTransfer = errors.New("zone transfers are not forwarded")
	// ErrNotStarted is returned for an upstream whose pool is not running: before
	// OnStartup or after OnShutdown.
	ErrNotStarted = errors.New("upstream not started")

	errNotTLS = errors.New("dotforward only forwards over TLS")
)
