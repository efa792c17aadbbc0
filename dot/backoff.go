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
