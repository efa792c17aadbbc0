package dotforward

import (
	"sync/atomic"
	"time"
)

// health is whether an upstream is up. It is down after maxFails consecutive
// failures and back up at its next answer. Failures are failed health probes and
// the pool's own signals (dot.Observer.Failed: a failed dial or handshake, a
// connection that carried a query and died before its first answer, a stalled
// connection); a slow answer or a lost query on a live connection is not one.
//
// All fields are atomics: the hot path reads down, and the pool, the prober and
// the queries' goroutines write.
type health struct {
	addr     string
	maxFails int32 // 0: never down
	gauge    func(up bool)

	fails       atomic.Int32 // consecutive failures since the last answer
	down        atomic.Bool
	lastFail    atomic.Int64 // unix ns of the last failure
	failedDials atomic.Int64 // dials that failed, for the prober (see prober.probe)
}

func newHealth(addr string, maxFails int, gauge func(up bool)) *health {
	return &health{addr: addr, maxFails: int32(min(maxFails, 1<<30)), gauge: gauge}
}

// isDown reports whether queries should skip the upstream.
func (h *health) isDown() bool { return h.down.Load() }

// suspect reports whether a failure was seen since the last answer.
func (h *health) suspect() bool { return h.fails.Load() > 0 }

// lastFailure returns when the upstream last failed (unix ns), 0 if never.
func (h *health) lastFailure() int64 { return h.lastFail.Load() }

// failure counts one consecutive failure; at maxFails the upstream is down.
func (h *health) failure(err error) {
	h.lastFail.Store(time.Now().UnixNano())
	n := h.fails.Add(1)
	if h.maxFails > 0 && n >= h.maxFails {
		h.setDown(err)
	}
}

// setDown marks the upstream down at once: after maxFails failures, or when its
// very first probe fails.
func (h *health) setDown(err error) {
	if !h.down.Swap(true) {
		h.gauge(false)
		log.Warningf("Upstream %s is down: %s", h.addr, untagged(err))
	}
}

// answered records an answer: the upstream works.
func (h *health) answered() {
	if h.fails.Load() != 0 {
		h.fails.Store(0)
	}
	if h.down.Load() && h.down.Swap(false) {
		h.gauge(true)
		log.Infof("Upstream %s is back up", h.addr)
	}
}
