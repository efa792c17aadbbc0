// Package dottest provides a scriptable DNS-over-TLS server and certificates for
// tests: real TLS on 127.0.0.1 with faults that real servers cannot be made to
// produce on demand (out-of-order or missing answers, wrong IDs, cut connections,
// silence).
package dottest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"time"
)

// ServerName is the DNS name in the default test certificate.
const ServerName = "dot.test"

// Cert is a test CA and a leaf certificate it signed.
type Cert struct {
	CA      *x509.Certificate
	Leaf    tls.Certificate
	CAPEM   []byte // the CA certificate, PEM
	CertPEM []byte // the leaf certificate, PEM
	KeyPEM  []byte // the leaf key, PEM (PKCS#8)
}

// CertOptions shape a generated certificate.
type CertOptions struct {
	Hosts     []string  // IP addresses and DNS names for the leaf; default 127.0.0.1 and ServerName
	NotBefore time.Time // default an hour ago
	NotAfter  time.Time // default in a day; set in the past for an expired leaf
}

// NewCert generates a CA and a leaf valid for hosts (IPs or names).
func NewCert(hosts ...string) (*Cert, error) {
	return NewCertWith(CertOptions{Hosts: hosts})
}

// NewCertWith generates a CA and a leaf as described by o.
func NewCertWith(o CertOptions) (*Cert, error) {
	if len(o.Hosts) == 0 {
		o.Hosts = []string{"127.0.0.1", ServerName}
	}
	now := time.Now()
	if o.NotBefore.IsZero() {
		o.NotBefore = now.Add(-time.Hour)
	}
	if o.NotAfter.IsZero() {
		o.NotAfter = now.Add(24 * time.Hour)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dottest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: o.Hosts[0]},
		NotBefore:    o.NotBefore,
		NotAfter:     o.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	c := &Cert{
		CA:      ca,
		CAPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	if c.Leaf, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		return nil, fmt.Errorf("dottest: %w", err)
	}
	return c, nil
}

// ServerTLS returns a server configuration presenting the leaf.
func (c *Cert) ServerTLS() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{c.Leaf}, MinVersion: tls.VersionTLS12}
}

// ClientTLS returns a client configuration trusting only the CA, for serverName.
func (c *Cert) ClientTLS(serverName string) *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(c.CA)
	return &tls.Config{RootCAs: pool, ServerName: serverName}
}

// SPKIPin returns the SHA-256 digest of the leaf's SubjectPublicKeyInfo (RFC 7469).
func (c *Cert) SPKIPin() []byte {
	sum := sha256.Sum256(c.Leaf.Leaf.RawSubjectPublicKeyInfo)
	return sum[:]
}
