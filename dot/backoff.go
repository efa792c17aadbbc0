package dot

import (
	"math"
	"math/rand/v2"
	"time"
)

// Backoff defaults (gRPC's connection backoff with a lower cap: DNS wants a failed
// upstream back within seconds, not minutes).
const (
	DefaultBackoffBase       = 250 * time.Millisecond
	DefaultBackoffMax        = 30 * time.Second
	DefaultBackoffMultiplier = 1.6
	DefaultBackoffJitter     = 0.2
)

func (b Backoff) withDefaults() Backoff {
	setDefault(&b.Base, DefaultBackoffBase)
	setDefault(&b.Max, DefaultBackoffMax)
	if b.Multiplier < 1 {
		b.Multiplier = DefaultBackoffMultiplier
	}
	if b.Jitter <= 0 || b.Jitter >= 1 {
		b.Jitter = DefaultBackoffJitter
	}
	return b
}

// Delay returns the wait before the next dial after failures consecutive failures
// (failures >= 1): Base*Multiplier^(failures-1), capped at Max, then spread
// uniformly by ±Jitter so that pools that failed together do not redial together.
func (b Backoff) Delay(failures int) time.Duration {
	if failures <= 0 {
		return 0
	}
	d := float64(b.Base) * math.Pow(b.Multiplier, float64(failures-1))
	d = min(d, float64(b.Max))
	d *= 1 + b.Jitter*(2*rand.Float64()-1)
	return time.Duration(d)
}

// redial is the reconnect backoff's state: failed dials and connections in a row
// (strikes), and when the next dial may start. A connection's first answer resets
// it, a handshake alone does not.
type redial struct {
	strikes int       // failures in a row since a new connection last answered
	after   time.Time // no dial before this, but the retry
	// retry: the first strike's one dial that need not wait out its backoff
	// (see strike); taken by the next dial that starts
	retry bool
	cause error // the last failure, for ErrUnavailable's message
	// cutAt: when the last strike came of a connection the server closed
	// before its first answer (zero if it came of anything else): a restart,
	// if the server closes one that had answered within restartWindow of it
	// (see Pool.connClosed)
	cutAt time.Time
}

// strike records a failed dial or connection and arms the backoff. A failure
// while the backoff is armed is of the same episode: the connections that were
// open when the server went away, or dials started together, fail together, and
// each counting as a strike of its own pushed a pool with many connections (one
// per query, as forward opens them) to the 30 s cap when a server restarted in
// under a second (e2e, dnsdist and kresd on a loaded CI machine: no answer for
// 10 s after the restart). No dial starts while it is armed, so the next strike
// is the next dial's.
// The first strike in a row leaves one dial at once (retry): forward, whose
// dial fails only the query that made it, dials again for the next query; the
// pool, whose queries of a burst share its first dial, failed every query of
// the backoff's 250 ms when that one dial got EOF (50,000 QPS: 10,700-14,800
// failed). If the retry fails too, the failure is of the same episode: a
// server that refuses every connection gets one dial more, then the backoff.
// It reports whether the failure counted as a strike of its own.
func (r *redial) strike(err error, b Backoff) bool {
	r.cause = err
	now := time.Now()
	if now.Before(r.after) {
		return false
	}
	r.strikes++
	r.after = now.Add(b.Delay(r.strikes))
	r.retry = r.strikes == 1
	r.cutAt = time.Time{}
	return true
}

// mayDial reports whether a dial may start at now: the backoff is not armed,
// or its first strike's retry is not taken yet.
func (r *redial) mayDial(now time.Time) bool {
	return r.retry || !now.Before(r.after)
}

// forgive takes back the last strike: it came of a restart, not of a server
// that refuses connections (see Pool.connClosed).
func (r *redial) forgive(now time.Time) {
	r.strikes = max(r.strikes-1, 0)
	r.after, r.cutAt, r.retry = now, time.Time{}, false
}

// noteServerCutLocked records that the server closed a connection that had
// answered, at now. A server that restarts (or reloads) closes every
// connection at once, the new ones that have not answered yet too; taken for
// a server that accepts connections and closes them, those armed the dial
// backoff, and with every connection gone the pool failed its queries at once
// (ErrUnavailable) for the backoff's 250 ms, where forward would have dialled
// the restarted server (TestServerRestartTeachesNoLimit: 300-600 of 1,500
// queries failed across three restarts in about half the runs). Such a cut
// within restartWindow of one of a connection that had answered is a restart,
// before or after it: it arms no backoff (restartLocked), or its strike is
// taken back. Its queries are not replayed: a query that made the server
// close its connection (and others with it) must not be sent again (e2e
// TestHostileOversizedTCPQuery: BIND got the oversized query twice when they
// were). Pool.mu must be held.
func (p *Pool) noteServerCutLocked(now time.Time) {
	p.answeredCut = now
	if !p.redial.cutAt.IsZero() && now.Sub(p.redial.cutAt) < restartWindow {
		p.redial.forgive(now)
	}
}

// restartLocked reports whether the server's close, at now, of a connection
// that had not answered came within restartWindow after its close of one that
// had: a restart (see noteServerCutLocked). Pool.mu must be held.
func (p *Pool) restartLocked(now time.Time) bool {
	return now.Sub(p.answeredCut) < restartWindow
}
