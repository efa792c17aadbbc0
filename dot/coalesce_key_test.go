package dot

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/miekg/dns"
)

// normalized returns q's upstream wire with the ID zeroed and the question name
// in lower case: what two merged queries must have in common.
func normalized(q *query) []byte {
	b := bytes.Clone(q.wire[2:])
	b[0], b[1] = 0, 0
	for i := 12; i < 12+len(q.question)-4; i++ {
		b[i] = lower(b[i])
	}
	return b
}

// forwarded returns m's EDNS options that go upstream, as text, and its DO bit.
func forwarded(m *dns.Msg) (opts []string, do bool) {
	o := m.IsEdns0()
	if o == nil {
		return nil, false
	}
	for _, e := range o.Option {
		if hopByHop(e.Option()) {
			continue
		}
		opts = append(opts, fmt.Sprintf("%d:%s", e.Option(), e.String()))
	}
	return opts, o.Do()
}

// checkKeyPair checks the key of two client queries: merged (the same key) means
// the same upstream wire but for the ID and the name's case, and so the same
// opcode, type, class, RD, CD, AD and DO bits and forwarded options; and that
// wire equality means merged.
func checkKeyPair(t *testing.T, fs *flights, a, b *dns.Msg) {
	t.Helper()
	qa, errA := prepareQuery(a, 128, true)
	qb, errB := prepareQuery(b, 128, true)
	if errA != nil || errB != nil {
		return
	}
	ha, okA := fs.key(qa)
	hb, okB := fs.key(qb)
	if !okA || !okB {
		if okA && qa.opcode != dns.OpcodeQuery {
			t.Fatalf("Opcode %d shared", qa.opcode)
		}
		return
	}
	same := sameKey(qa, qb)
	if same != sameKey(qb, qa) {
		t.Fatal("sameKey is not symmetric")
	}
	if same != bytes.Equal(normalized(qa), normalized(qb)) {
		t.Fatalf("sameKey %v for wires\n%x\n%x", same, normalized(qa), normalized(qb))
	}
	if !same {
		return
	}
	if ha != hb {
		t.Fatal("Queries with the same key hash differently")
	}
	optsA, doA := forwarded(a)
	optsB, doB := forwarded(b)
	qqa, qqb := a.Question[0], b.Question[0]
	switch {
	case a.Opcode != dns.OpcodeQuery || b.Opcode != dns.OpcodeQuery:
		t.Fatalf("Opcodes %d and %d merged", a.Opcode, b.Opcode)
	case a.RecursionDesired != b.RecursionDesired || a.CheckingDisabled != b.CheckingDisabled || a.AuthenticatedData != b.AuthenticatedData:
		t.Fatalf("RD, CD or AD differ, merged:\n%v\n%v", a, b)
	case doA != doB || strings.Join(optsA, ",") != strings.Join(optsB, ","):
		t.Fatalf("DO or forwarded options differ, merged: %v %v / %v %v", doA, optsA, doB, optsB)
	case !strings.EqualFold(qqa.Name, qqb.Name) || qqa.Qtype != qqb.Qtype || qqa.Qclass != qqb.Qclass:
		t.Fatalf("Questions %v and %v merged", qqa, qqb)
	}
}

// FuzzCoalesceKey checks checkKeyPair's properties on pairs of arbitrary queries.
func FuzzCoalesceKey(f *testing.F) {
	seeds := keySeeds()
	for i, a := range seeds {
		for _, b := range seeds[i:] {
			pa, _ := a.Pack()
			pb, _ := b.Pack()
			f.Add(pa, pb)
		}
	}
	fs := newFlights(newRespChans())
	f.Fuzz(func(t *testing.T, wa, wb []byte) {
		a, b := new(dns.Msg), new(dns.Msg)
		if a.Unpack(wa) != nil || b.Unpack(wb) != nil || len(a.Question) != 1 || len(b.Question) != 1 {
			return
		}
		checkKeyPair(t, fs, a, b)
	})
}

// keySeeds are queries that differ in one thing each from a base query.
func keySeeds() []*dns.Msg {
	base := func() *dns.Msg {
		m := newQuery("Key.Example.", dns.TypeA)
		m.SetEdns0(1232, false)
		return m
	}
	out := []*dns.Msg{base(), newQuery("key.example.", dns.TypeA)}
	for _, mod := range []func(*dns.Msg){
		func(m *dns.Msg) { m.Question[0].Name = "KEY.EXAMPLE." },
		func(m *dns.Msg) { m.IsEdns0().SetDo() },
		func(m *dns.Msg) { m.CheckingDisabled = true },
		func(m *dns.Msg) { m.RecursionDesired = false },
		func(m *dns.Msg) { m.Opcode = dns.OpcodeNotify },
		func(m *dns.Msg) { m.IsEdns0().SetUDPSize(4096) },
		withOption(ecs("192.0.2.0")),
		withOption(cookie("0102030405060708")),
		withOption(&dns.EDNS0_PADDING{Padding: make([]byte, 8)}),
	} {
		m := base()
		mod(m)
		out = append(out, m)
	}
	return out
}

// A random walk over the properties fuzzing checks, so that plain `go test` runs
// them on many pairs: random queries, and the same with the name's case changed
// or one field flipped.
func TestCoalesceKeyProperties(t *testing.T) {
	fs := newFlights(newRespChans())
	rng := rand.New(rand.NewPCG(1, 2))
	flips := []func(*dns.Msg){
		func(m *dns.Msg) { m.Question[0].Name = mixedCase(strings.ToLower(m.Question[0].Name), rng.IntN(1<<16)) },
		func(m *dns.Msg) { m.RecursionDesired = !m.RecursionDesired },
		func(m *dns.Msg) { m.CheckingDisabled = !m.CheckingDisabled },
		func(m *dns.Msg) { m.AuthenticatedData = !m.AuthenticatedData },
		func(m *dns.Msg) {
			if o := m.IsEdns0(); o != nil {
				o.SetDo(!o.Do())
			}
		},
		func(m *dns.Msg) {
			if o := m.IsEdns0(); o != nil {
				o.Option = append(o.Option, ecs(fmt.Sprintf("192.0.%d.0", rng.IntN(3))))
			}
		},
		func(m *dns.Msg) {
			if o := m.IsEdns0(); o != nil {
				o.Option = append(o.Option, cookie(fmt.Sprintf("%016x", rng.Uint64()%4)))
			}
		},
		func(m *dns.Msg) { m.Question[0].Qtype = []uint16{dns.TypeA, dns.TypeAAAA}[rng.IntN(2)] },
		func(m *dns.Msg) { m.Opcode = []int{dns.OpcodeQuery, dns.OpcodeNotify}[rng.IntN(2)] },
	}
	merged := 0
	for range 20000 {
		a := newQuery(mixedCase([]string{"a.example.", "b.example.", "ab.example."}[rng.IntN(3)], rng.IntN(1<<16)), dns.TypeA)
		if rng.IntN(2) == 0 {
			a.SetEdns0([]uint16{1232, 4096}[rng.IntN(2)], rng.IntN(2) == 0)
		}
		b := a.Copy()
		for range rng.IntN(3) {
			flips[rng.IntN(len(flips))](b)
		}
		checkKeyPair(t, fs, a, b)
		qa, _ := prepareQuery(a, 128, true)
		qb, _ := prepareQuery(b, 128, true)
		if _, ok := fs.key(qa); ok && sameKey(qa, qb) {
			merged++
		}
	}
	if merged == 0 {
		t.Error("No pair merged: the walk tests nothing")
	}
}

// BenchmarkCoalesceLead is what coalescing adds to a query nobody joins: the key,
// leading a flight and ending it, in parallel on distinct names.
func BenchmarkCoalesceLead(b *testing.B) {
	fs := newFlights(newRespChans())
	qs := make([]*query, 1024)
	for i := range qs {
		m := newQuery(fmt.Sprintf("q%d.example.", i), dns.TypeA)
		m.SetEdns0(1232, true)
		q, err := prepareQuery(m, 128, true)
		if err != nil {
			b.Fatal(err)
		}
		qs[i] = q
	}
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			q := qs[n.Add(1)%int64(len(qs))]
			q.fl = flight{}
			if fs.join(q) != nil {
				continue // another goroutine leads this name right now
			}
			fs.end(q)
		}
	})
}
