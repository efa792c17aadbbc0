package dot

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"time"
)

// Config describes one DoT upstream and how the pool talks to it. The zero value of
// every field but Addr and TLS means "use the default" given in its comment.
type Config struct {
	// Addr is the upstream's "IP:port". Required.
	Addr string
	// TLS is the base client configuration: RootCAs (nil means the system roots),
	// ServerName (required unless Pins is set), client certificates. The pool clones
	// it and enforces TLS 1.2 as a minimum, ALPN "dot" and a session ticket cache.
	// InsecureSkipVerify is refused: authentication is never optional.
	TLS *tls.Config
	// Pins are SHA-256 digests of acceptable SubjectPublicKeyInfos (RFC 7469 pin
	// format, raw 32 bytes each). With Pins and no ServerName, a certificate is
	// accepted if any certificate in the presented chain matches a pin (RFC 7858
	// out-of-band key-pinned profile). With both, both checks must pass. Pins are
	// checked on every handshake, resumed ones included.
	Pins [][]byte

	// MaxConns caps the connections to the upstream that take new queries (not
	// draining, not blocked behind a slow answer). Default 0, auto: the pool
	// sizes itself to how the upstream serves a connection (see Mode), with at
	// most AutoMaxConnsOutOfOrder (4) connections if it answers out of order
	// or is not known to answer in order, and at most AutoMaxConnsInOrder (1024)
	// if it answers a connection's queries one at a time, in order.
	MaxConns int
	// MaxInflight caps queries outstanding on one connection, tombstones included.
	// Default 128.
	MaxInflight int
	// DialTimeout bounds a TCP connect plus TLS handshake. Default 3s.
	DialTimeout time.Duration
	// ReadTimeout bounds one attempt: from the query being queued until its answer.
	// Default 2s.
	ReadTimeout time.Duration
	// WriteTimeout bounds each write to the socket: one to a peer that does not
	// read fails after half of it to all of it (see batchConn.armLocked). Default 2s.
	WriteTimeout time.Duration
	// StallTimeout declares a connection dead when it has read nothing for this long
	// while its oldest outstanding query was written at least this long ago.
	// Default 2s.
	StallTimeout time.Duration
	// IdleTimeout closes a connection with no outstanding query after this long.
	// Default 8s: below the ~10s after which public resolvers drop idle DoT
	// connections, so that the pool closes first and never writes into a closing
	// connection. A server's RFC 7828 keepalive timeout lowers it per connection.
	IdleTimeout time.Duration
	// MaxAge stops sending new queries on a connection this old; it closes once its
	// answers are in. Default 0: no maximum.
	MaxAge time.Duration
	// TombstoneTTL keeps the ID of a query that timed out reserved on its connection
	// until its late answer arrives or this long has passed. Default 10s.
	TombstoneTTL time.Duration
	// PadBlock pads queries to a multiple of this many octets (RFC 7830, RFC 8467).
	// Default 128; a negative value disables padding.
	PadBlock int
	// NoKeepalive disables sending the RFC 7828 edns-tcp-keepalive option.
	NoKeepalive bool
	// NoCoalesce sends every query upstream. By default a query identical to one
	// whose flight is open (the same upstream wire but for the ID and the
	// question name's case) waits for that answer instead, and gets it with its
	// own ID and question.
	NoCoalesce bool
	// Backoff paces reconnects after dial failures. Zero fields take defaults.
	Backoff Backoff

	// Dial opens the TCP connection. Default: a net.Dialer. The pool performs the
	// TLS handshake on top of it.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Observer receives the pool's events, for metrics. Default: none.
	Observer Observer
}

// Backoff is an exponential reconnect backoff with jitter, after gRPC's connection
// backoff: delay(n) = min(Base * Multiplier^n, Max), spread by ±Jitter.
type Backoff struct {
	// Base is the first delay. Default 250ms.
	Base time.Duration
	// Max caps the delay. Default 30s: low enough for DNS failover.
	Max time.Duration
	// Multiplier grows the delay per consecutive failure. Default 1.6.
	Multiplier float64
	// Jitter is the relative random spread. Default 0.2.
	Jitter float64
}

// Defaults, exported for documentation and for the plugin's Corefile parser.
const (
	DefaultMaxInflight  = 128
	DefaultDialTimeout  = 3 * time.Second
	DefaultReadTimeout  = 2 * time.Second
	DefaultWriteTimeout = 2 * time.Second
	DefaultStallTimeout = 2 * time.Second
	DefaultIdleTimeout  = 8 * time.Second
	DefaultTombstoneTTL = 10 * time.Second
	DefaultPadBlock     = 128
)

// Limits of the fields that have one.
const (
	// MaxMaxConns caps MaxConns.
	MaxMaxConns = 1024
	// MaxMaxInflight caps MaxInflight: with at most half the 16-bit ID space taken by
	// live calls and tombstones, a free ID is always found within a few steps.
	MaxMaxInflight = 65535 / 2
)

// WithDefaults returns c with every zero field that has a default set to it: the
// configuration a pool made from c runs with. It does not validate c; New does.
func (c Config) WithDefaults() Config {
	if c.TLS == nil {
		c.TLS = &tls.Config{}
	}
	setDefault(&c.MaxInflight, DefaultMaxInflight)
	setDefault(&c.DialTimeout, DefaultDialTimeout)
	setDefault(&c.ReadTimeout, DefaultReadTimeout)
	setDefault(&c.WriteTimeout, DefaultWriteTimeout)
	setDefault(&c.StallTimeout, DefaultStallTimeout)
	setDefault(&c.IdleTimeout, DefaultIdleTimeout)
	setDefault(&c.TombstoneTTL, DefaultTombstoneTTL)
	setDefault(&c.PadBlock, DefaultPadBlock)
	if c.PadBlock < 0 {
		c.PadBlock = 0
	}
	c.Backoff = c.Backoff.withDefaults()
	if c.Dial == nil {
		d := &net.Dialer{}
		c.Dial = d.DialContext
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	return c
}

// withDefaults returns c with its defaults, or an error naming the first invalid
// field.
func (c Config) withDefaults() (Config, error) {
	if c.Addr == "" {
		return c, errors.New("dot: Addr is required")
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return c, fmt.Errorf("dot: Addr %q: %w", c.Addr, err)
	}
	c = c.WithDefaults()
	if c.TLS.InsecureSkipVerify {
		return c, errors.New("dot: InsecureSkipVerify is not allowed; use Pins for self-signed servers")
	}
	if c.TLS.ServerName == "" && len(c.Pins) == 0 {
		return c, errors.New("dot: a TLS server name or an SPKI pin is required")
	}
	for i, p := range c.Pins {
		if len(p) != 32 {
			return c, fmt.Errorf("dot: pin %d is %d bytes, want a 32-byte SHA-256 digest", i, len(p))
		}
	}
	if c.MaxConns < 0 {
		return c, fmt.Errorf("dot: MaxConns %d is negative", c.MaxConns)
	}
	if c.MaxConns > MaxMaxConns {
		return c, fmt.Errorf("dot: MaxConns %d too large, at most %d", c.MaxConns, MaxMaxConns)
	}
	if c.MaxInflight > MaxMaxInflight {
		return c, fmt.Errorf("dot: MaxInflight %d too large, at most %d", c.MaxInflight, MaxMaxInflight)
	}
	return c, nil
}

func setDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}
