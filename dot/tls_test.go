package dot

import (
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
)

// No DNS message is ever written on a connection whose authentication failed.
func TestAuthenticationFailuresSendNothing(t *testing.T) {
	other, err := dottest.NewCert()
	if err != nil {
		t.Fatal(err)
	}
	expired, err := dottest.NewCertWith(dottest.CertOptions{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	wrongPin := sha256.Sum256([]byte("not the key"))
	tests := []struct {
		name   string
		server *dottest.Cert // nil: the default certificate
		client func(s *dottest.Server) Config
	}{
		{"unknown CA", nil, func(s *dottest.Server) Config {
			return Config{TLS: other.ClientTLS(dottest.ServerName)}
		}},
		{"wrong name", nil, func(s *dottest.Server) Config {
			return Config{TLS: s.Cert.ClientTLS("wrong.test")}
		}},
		{"expired certificate", expired, func(s *dottest.Server) Config {
			return Config{TLS: s.ClientTLS()}
		}},
		{"wrong pin alone", nil, func(s *dottest.Server) Config {
			return Config{Pins: [][]byte{wrongPin[:]}}
		}},
		{"valid CA and name but wrong pin", nil, func(s *dottest.Server) Config {
			return Config{TLS: s.ClientTLS(), Pins: [][]byte{wrongPin[:]}}
		}},
		{"right pin but wrong name", nil, func(s *dottest.Server) Config {
			return Config{TLS: s.Cert.ClientTLS("wrong.test"), Pins: [][]byte{s.Cert.SPKIPin()}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := dottest.Start(t, dottest.Options{Cert: tc.server})
			cfg := tc.client(s)
			cfg.Addr = s.Addr
			p, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if _, err := exchange(p, "secret.example."); !errors.Is(err, ErrDial) {
				t.Errorf("Exchange error = %v, want ErrDial", err)
			}
			if q := s.Queries(); q != 0 {
				t.Errorf("The server received %d DNS messages over an unauthenticated connection", q)
			}
		})
	}
}

func TestPinnedSelfSignedServerIsAccepted(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	backup := sha256.Sum256([]byte("backup key"))
	// Pins alone: no CA, no name (RFC 7858 out-of-band key-pinned profile), with a
	// backup pin listed first.
	p, err := New(Config{Addr: s.Addr, Pins: [][]byte{backup[:], s.Cert.SPKIPin()}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := exchange(p, "a.example."); err != nil {
		t.Fatalf("Pinned exchange: %v", err)
	}
	// CA, name and pin together.
	p2, err := New(Config{Addr: s.Addr, TLS: s.ClientTLS(), Pins: [][]byte{s.Cert.SPKIPin()}})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	if _, err := exchange(p2, "b.example."); err != nil {
		t.Fatalf("CA+pin exchange: %v", err)
	}
}

// A resumed TLS session does not skip the pin check (golang/go#77377 is about
// VerifyPeerCertificate, which resumption skips; VerifyConnection runs).
func TestResumedSessionStillChecksPins(t *testing.T) {
	s := dottest.Start(t, dottest.Options{})
	cache := &countingCache{ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	cfg := s.ClientTLS()
	cfg.ClientSessionCache = cache
	good, err := New(Config{Addr: s.Addr, TLS: cfg, Pins: [][]byte{s.Cert.SPKIPin()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exchange(good, "a.example."); err != nil {
		t.Fatal(err)
	}
	good.Close() // the session ticket stays in the shared cache
	before := s.Queries()

	wrong := sha256.Sum256([]byte("rotated away"))
	cfg2 := s.ClientTLS()
	cfg2.ClientSessionCache = cache
	bad, err := New(Config{Addr: s.Addr, TLS: cfg2, Pins: [][]byte{wrong[:]}})
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	if _, err := exchange(bad, "b.example."); !errors.Is(err, ErrDial) || !errors.Is(err, ErrPinMismatch) {
		t.Errorf("Exchange error = %v, want ErrDial wrapping ErrPinMismatch", err)
	}
	if cache.hits.Load() == 0 {
		t.Error("The second handshake did not try to resume: the test tests nothing")
	}
	if q := s.Queries(); q != before {
		t.Errorf("The server received %d DNS messages on the rejected resumed session", q-before)
	}
}

// countingCache counts session cache hits: handshakes that offered resumption.
type countingCache struct {
	tls.ClientSessionCache
	hits atomic.Int64
}

func (c *countingCache) Get(key string) (*tls.ClientSessionState, bool) {
	s, ok := c.ClientSessionCache.Get(key)
	if ok {
		c.hits.Add(1)
	}
	return s, ok
}

func TestInsecureSkipVerifyIsRefused(t *testing.T) {
	_, err := New(Config{Addr: "127.0.0.1:853", TLS: &tls.Config{InsecureSkipVerify: true, ServerName: "x"}})
	if err == nil {
		t.Error("New accepted InsecureSkipVerify")
	}
	if _, err := New(Config{Addr: "127.0.0.1:853"}); err == nil {
		t.Error("New accepted a config with neither a server name nor a pin")
	}
}

func TestALPNIsDot(t *testing.T) {
	var proto string
	s := dottest.Start(t, dottest.Options{TLS: func(c *tls.Config) {
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			proto = cs.NegotiatedProtocol
			return nil
		}
	}})
	p, _ := newTestPool(t, s, nil)
	if _, err := exchange(p, "a.example."); err != nil {
		t.Fatal(err)
	}
	if proto != "dot" {
		t.Errorf("Negotiated ALPN %q, want dot", proto)
	}
	if v := p.tls.MinVersion; v < tls.VersionTLS12 {
		t.Errorf("MinVersion %x, want at least TLS 1.2", v)
	}
}
