package dotforward

import (
	"errors"
	"testing"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

// The plugin refuses what the pool would refuse, with the pool's own check, before
// choosing an upstream: FORMERR for a malformed query, NOTIMP for a zone transfer.
func TestCheckQueryIsThePools(t *testing.T) {
	nilRR := new(dns.Msg)
	nilRR.SetQuestion("a.example.", dns.TypeA)
	nilRR.Extra = []dns.RR{nil}
	twoOPTs := new(dns.Msg)
	twoOPTs.SetQuestion("a.example.", dns.TypeA)
	twoOPTs.SetEdns0(1232, false)
	twoOPTs.Extra = append(twoOPTs.Extra, twoOPTs.Extra[0])
	axfr := new(dns.Msg)
	axfr.SetQuestion("example.", dns.TypeAXFR)
	tests := []struct {
		name  string
		m     *dns.Msg
		want  error
		rcode int
	}{
		{"nil record", nilRR, dot.ErrBadQuery, dns.RcodeFormatError},
		{"two OPTs", twoOPTs, dot.ErrBadQuery, dns.RcodeFormatError},
		{"AXFR", axfr, dot.ErrZoneTransfer, dns.RcodeNotImplemented},
	}
	for _, tc := range tests {
		err := checkQuery(tc.m)
		if !errors.Is(err, tc.want) || errorRcode(err) != tc.rcode {
			t.Errorf("%s: checkQuery = %v (rcode %d), want %v (rcode %d)", tc.name, err, errorRcode(err), tc.want, tc.rcode)
		}
	}
}
