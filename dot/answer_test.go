package dot

import (
	"testing"

	"github.com/miekg/dns"
)

func TestAnswersMatchesQuestionOnTheWire(t *testing.T) {
	q, err := prepareQuery(newQuery("MiXed.Example.", dns.TypeAAAA), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	reply := func(name string, qtype uint16, qr bool) []byte {
		r := newQuery(name, qtype)
		r.Response = qr
		b, err := r.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name string
		resp []byte
		want bool
	}{
		{"same", reply("MiXed.Example.", dns.TypeAAAA, true), true},
		{"other case", reply("mixed.EXAMPLE.", dns.TypeAAAA, true), true},
		{"other name", reply("mixes.example.", dns.TypeAAAA, true), false},
		{"other type", reply("mixed.example.", dns.TypeA, true), false},
		{"not a response", reply("mixed.example.", dns.TypeAAAA, false), false},
		{"truncated", reply("mixed.example.", dns.TypeAAAA, true)[:15], false},
		{"longer name", reply("mixed.example.org.", dns.TypeAAAA, true), false},
	}
	for _, tc := range tests {
		if got := answers(tc.resp, q.question); got != tc.want {
			t.Errorf("%s: answers = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The answer goes back without hop-by-hop options, and without an OPT at all if
// the client sent none.
func TestFinishAnswerStripsHopByHop(t *testing.T) {
	for _, clientEDNS := range []bool{true, false} {
		m := newQuery("a.example.", dns.TypeA)
		if clientEDNS {
			m.SetEdns0(1232, false)
		}
		q, err := prepareQuery(m, 128, true)
		if err != nil {
			t.Fatal(err)
		}
		r := new(dns.Msg)
		r.SetReply(m)
		r.SetEdns0(1232, false)
		r.IsEdns0().Option = append(r.IsEdns0().Option,
			&dns.EDNS0_TCP_KEEPALIVE{Code: dns.EDNS0TCPKEEPALIVE, Timeout: 50},
			&dns.EDNS0_PADDING{Padding: make([]byte, 20)},
			&dns.EDNS0_EDE{InfoCode: dns.ExtendedErrorCodeOther},
		)
		wire, _ := r.Pack()
		got, keepalive, err := finishAnswer(q, wire)
		if err != nil {
			t.Fatal(err)
		}
		if keepalive != 50 {
			t.Errorf("Keepalive = %d, want 50", keepalive)
		}
		opt := got.IsEdns0()
		switch {
		case !clientEDNS && opt != nil:
			t.Errorf("Client without EDNS got an OPT: %v", opt)
		case clientEDNS && (opt == nil || len(opt.Option) != 1):
			t.Errorf("Client with EDNS got OPT %v, want only the EDE option", opt)
		}
	}
}
