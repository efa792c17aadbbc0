package dotforward

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// Through the whole plugin: an upstream that fails authentication gets no DNS
// message, and the client gets SERVFAIL. A pinned self-signed upstream answers.
func TestAuthenticationThroughThePlugin(t *testing.T) {
	good, err := dottest.NewCert()
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := dottest.NewCert()
	if err != nil {
		t.Fatal(err)
	}
	expired, err := dottest.NewCertWith(dottest.CertOptions{NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	wrongPin := sha256.Sum256([]byte("some other key"))
	pin := func(c *dottest.Cert) string { return base64.StdEncoding.EncodeToString(c.SPKIPin()) }

	tests := []struct {
		name   string
		server *dottest.Cert
		block  func(addr string, dir string) string // the dotforward line for addr
		ok     bool
	}{
		{"unknown CA", good, func(addr, dir string) string {
			return fmt.Sprintf("dotforward . tls://%s {\ntls %s\n}", withName(addr, dottest.ServerName), writeFile(t, dir, "ca.pem", stranger.CAPEM))
		}, false},
		{"wrong name", good, func(addr, dir string) string {
			return fmt.Sprintf("dotforward . tls://%s {\ntls %s\n}", withName(addr, "wrong.test"), writeFile(t, dir, "ca.pem", good.CAPEM))
		}, false},
		{"expired certificate", expired, func(addr, dir string) string {
			return fmt.Sprintf("dotforward . tls://%s {\ntls %s\n}", withName(addr, dottest.ServerName), writeFile(t, dir, "ca.pem", expired.CAPEM))
		}, false},
		{"wrong pin", good, func(addr, dir string) string {
			return fmt.Sprintf("dotforward . tls://%s {\ntls_pin %s\n}", addr, base64.StdEncoding.EncodeToString(wrongPin[:]))
		}, false},
		{"right pin, self-signed, no CA", good, func(addr, dir string) string {
			return fmt.Sprintf("dotforward . tls://%s {\ntls_pin %s\n}", addr, pin(good))
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, tc.server, dottest.Options{})
			input := tc.block(s.Addr, t.TempDir())
			input = strings.Replace(input, "\n}", "\nhealth_check 0\n}", 1)
			fs, err := parse(caddy.NewTestController("dns", input))
			if err != nil {
				t.Fatalf("Parsing %q: %v", input, err)
			}
			f := fs[0]
			if err := f.OnStartup(); err != nil {
				t.Fatal(err)
			}
			defer f.OnShutdown()
			rec, rcode, _ := serve(f, newMsg("secret.example.org.", dns.TypeA))
			if tc.ok {
				if rcode != dns.RcodeSuccess || rec.Msg == nil || len(rec.Msg.Answer) != 1 {
					t.Errorf("Expected an answer from the pinned upstream, got rcode %d", rcode)
				}
				return
			}
			if rcode != dns.RcodeServerFailure {
				t.Errorf("Expected SERVFAIL, got rcode %d", rcode)
			}
			if q := s.Queries(); q != 0 {
				t.Errorf("Expected no DNS message to reach an unauthenticated upstream, it got %d", q)
			}
		})
	}
}

func withName(addr, name string) string { return strings.Replace(addr, ":", "%"+name+":", 1) }
