// Upstream addresses: tls://IP[%NAME][:PORT], parsed and checked, with errors that
// show the form to write.

package dotforward

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/coredns/caddy"
	"github.com/miekg/dns"
)

// maxUpstreams caps the TO list, as forward does.
const maxUpstreams = 15

// target is one parsed TO: the upstream address and its optional TLS server name.
type target struct {
	raw        string
	addr       string // "IP:port", IPv6 in brackets
	serverName string // from tls://IP%NAME, empty if not given
}

func parseTargets(c *caddy.Controller, to []string) ([]target, error) {
	if len(to) == 0 {
		return nil, c.ArgErr()
	}
	if len(to) > maxUpstreams {
		return nil, c.Errf("%d upstreams given, at most %d are allowed", len(to), maxUpstreams)
	}
	seen := make(map[string]bool, len(to))
	ts := make([]target, 0, len(to))
	for _, s := range to {
		t, err := parseTarget(s)
		if err != nil {
			return nil, c.Errf("upstream %q: %v", s, err)
		}
		if seen[t.addr] {
			return nil, c.Errf("upstream %q: %s is listed twice", s, t.addr)
		}
		seen[t.addr] = true
		ts = append(ts, t)
	}
	return ts, nil
}

// parseTarget parses tls://IP[%NAME][:PORT]; IPv6 addresses are written in
// brackets when a port follows: tls://[::1]:853, tls://[::1%NAME]:853 or
// tls://[::1]%NAME:853.
func parseTarget(s string) (target, error) {
	rest, ok := strings.CutPrefix(s, "tls://")
	if !ok {
		return target{}, notTLS(s)
	}
	host, name, port, err := splitTarget(rest)
	if err != nil {
		return target{}, err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil || ip.Zone() != "" {
		return target{}, notAnIP(host, name, port)
	}
	if !strings.HasPrefix(rest, "[") {
		if err := checkUnbracketed(host, name); err != nil {
			return target{}, err
		}
	}
	if port == "" {
		port = "853"
	}
	if err := checkPort(port); err != nil {
		return target{}, err
	}
	if name != "" {
		if _, ok := dns.IsDomainName(name); !ok || strings.ContainsAny(name, "[]:/% ") {
			return target{}, fmt.Errorf("invalid TLS server name %q", name)
		}
	}
	return target{raw: s, addr: net.JoinHostPort(ip.String(), port), serverName: name}, nil
}

// splitTarget splits "host[%name][:port]" into its parts without validating them.
func splitTarget(s string) (host, name, port string, err error) {
	if s == "" {
		return "", "", "", fmt.Errorf("no address after tls://")
	}
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return "", "", "", fmt.Errorf("missing ']' in IPv6 address")
		}
		host, name, _ = strings.Cut(s[1:end], "%")
		after := s[end+1:]
		if rest, ok := strings.CutPrefix(after, "%"); ok {
			if name != "" {
				return "", "", "", fmt.Errorf("two TLS server names")
			}
			var hasPort bool
			name, port, hasPort = strings.Cut(rest, ":")
			if hasPort && port == "" {
				return "", "", "", fmt.Errorf("empty port")
			}
		} else if after != "" {
			p, ok := strings.CutPrefix(after, ":")
			if !ok || p == "" {
				return "", "", "", fmt.Errorf("unexpected %q after IPv6 address", after)
			}
			port = p
		}
		return host, name, port, checkName(s, name)
	}
	host, name, hasName := strings.Cut(s, "%")
	switch {
	case hasName:
		if i := strings.LastIndexByte(name, ':'); i >= 0 {
			name, port = name[:i], name[i+1:]
			if port == "" {
				return "", "", "", fmt.Errorf("empty port")
			}
		}
	case strings.Count(host, ":") == 1:
		host, port, _ = strings.Cut(host, ":")
		if port == "" {
			return "", "", "", fmt.Errorf("empty port")
		}
	}
	return host, name, port, checkName(s, name)
}

// notTLS refuses an upstream that is not tls://, showing the tls:// form of its
// address when it has one (dns://9.9.9.9, 9.9.9.9:53).
func notTLS(s string) error {
	ip := "IP"
	if a, ok := plainAddr(strings.TrimPrefix(s, "dns://")); ok {
		ip = a.String()
		if a.Is6() {
			ip = "[" + ip + "]"
		}
	}
	return fmt.Errorf("%w: write the upstream as tls://%s%%NAME (NAME: the name its certificate is for) or pin its key with tls_pin", errNotTLS, ip)
}

// plainAddr parses "IP" or "IP:port" (IPv6 in brackets with a port).
func plainAddr(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), true
	}
	a, err := netip.ParseAddr(s)
	return a, err == nil && a.Zone() == ""
}

// notAnIP refuses a host that is not an IP address; for a host name it shows the
// form that names the server by its IP address and verifies the host name.
func notAnIP(host, name, port string) error {
	if !isHostName(host) {
		return fmt.Errorf("%q is not an IP address (dotforward does not resolve host names)", host)
	}
	if name == "" {
		name = host
	}
	if port != "" {
		name += ":" + port
	}
	return fmt.Errorf("%q is not an IP address, and dotforward does not resolve host names: write the server's IP address with the name its certificate is for after %%, as tls://IP%%%s", host, name)
}

// isHostName reports whether s looks like a host name: labels of letters, digits
// and hyphens, at least one letter.
func isHostName(s string) bool {
	if _, ok := dns.IsDomainName(s); !ok || strings.Trim(s, ".") == "" {
		return false
	}
	letter := false
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
			letter = true
		case c >= '0' && c <= '9', c == '-', c == '.':
		default:
			return false
		}
	}
	return letter
}

// checkUnbracketed refuses an IPv6 address written without brackets whose last
// group could be a port: ::1:853 is the address ::1:853, or port 853 of ::1.
func checkUnbracketed(host, name string) error {
	i := strings.LastIndexByte(host, ':')
	if i < 0 || checkPort(host[i+1:]) != nil {
		return nil
	}
	if a, err := netip.ParseAddr(host[:i]); err != nil || !a.Is6() {
		return nil
	}
	if name != "" {
		name = "%" + name
	}
	return fmt.Errorf("%q is ambiguous: write IPv6 addresses in brackets, tls://[%s]%s:%s for port %s of %s, or tls://[%s]%s for the address %s",
		host, host[:i], name, host[i+1:], host[i+1:], host[:i], host, name, host)
}

// checkPort accepts a port in plain decimal from 1 to 65535, without sign or
// leading zero, so that a Corefile value means one thing to every reader.
func checkPort(port string) error {
	ok := port != "" && len(port) <= 5 && port[0] != '0'
	for i := 0; ok && i < len(port); i++ {
		ok = port[i] >= '0' && port[i] <= '9'
	}
	if ok {
		if n, _ := strconv.Atoi(port); n <= 65535 {
			return nil
		}
	}
	return fmt.Errorf("invalid port %q: write it in plain decimal from 1 to 65535, such as 853", port)
}

func checkName(s, name string) error {
	if strings.Contains(s, "%") && name == "" {
		return fmt.Errorf("empty TLS server name after '%%'")
	}
	return nil
}
