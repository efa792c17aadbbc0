package dot

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
)

// clientTLS builds the pool's TLS configuration from cfg (already defaulted):
// TLS 1.2 at least, ALPN "dot" (RFC 7858 §3.1 via the IANA registry), a session
// ticket cache so reconnects resume, and SPKI pins checked in VerifyConnection,
// which crypto/tls runs on every handshake, resumed ones included (unlike
// VerifyPeerCertificate, golang/go#77377).
func clientTLS(cfg Config) *tls.Config {
	t := cfg.TLS.Clone()
	if t.MinVersion < tls.VersionTLS12 {
		t.MinVersion = tls.VersionTLS12
	}
	t.NextProtos = []string{"dot"}
	// Full-size records from the start: a burst of queries in shared records is
	// then one record for the server to decrypt, not a dozen small ones (dynamic
	// sizing helps HTTP show a page early; DNS has nothing to show early).
	t.DynamicRecordSizingDisabled = true
	if t.ClientSessionCache == nil {
		t.ClientSessionCache = tls.NewLRUClientSessionCache(32)
	}
	if len(cfg.Pins) == 0 {
		return t
	}
	if t.ServerName == "" {
		// Out-of-band key-pinned profile (RFC 7858 §4.2): there is no name to verify
		// and the CA chain does not matter; the pin check below is the authentication.
		t.InsecureSkipVerify = true
	}
	pins, next := cfg.Pins, t.VerifyConnection
	t.VerifyConnection = func(cs tls.ConnectionState) error {
		if err := checkPins(cs, pins); err != nil {
			return err
		}
		if next != nil {
			return next(cs)
		}
		return nil
	}
	return t
}

// checkPins accepts the connection if any certificate the server presented has a
// SubjectPublicKeyInfo whose SHA-256 digest is one of pins.
func checkPins(cs tls.ConnectionState, pins [][]byte) error {
	for _, cert := range cs.PeerCertificates {
		sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
		for _, pin := range pins {
			if bytes.Equal(sum[:], pin) {
				return nil
			}
		}
	}
	return fmt.Errorf("%w (%d certificates presented)", ErrPinMismatch, len(cs.PeerCertificates))
}
