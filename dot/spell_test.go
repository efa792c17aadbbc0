package dot

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
)

// A query the upstream took up in a slow spell that has ended is sent once
// more, on an idle connection, and answered at the pace after the spell
// (spell.go); an upstream that stays slow, the same names written at the same
// times, gets nothing sent twice. Ten queries and a slow one are written in
// a spell of answers six times as long as before it (300 ms; the slow one
// 1.5 s), then ten more, after the spell or not.
func TestSpellRescued(t *testing.T) {
	const (
		pace   = 50 * time.Millisecond
		factor = 6
		stuck  = "stuck.example."
	)
	for _, ends := range []bool{true, false} {
		t.Run(map[bool]string{true: "spell ends", false: "stays slow"}[ends], func(t *testing.T) {
			var from, until atomic.Int64 // unix ns: the spell's (0: not yet)
			opts := dottest.Options{Delay: func(q dns.Question) time.Duration {
				f, now := time.Duration(1), time.Now().UnixNano()
				if from.Load() != 0 && now >= from.Load() && (!ends || now < until.Load()) {
					f = factor
				}
				if q.Name == stuck {
					return 5 * f * pace
				}
				return f * pace
			}}
			bubble(t, opts, time.Millisecond, nil, func(t *testing.T, s *dottest.Server, p *Pool, rec *recorder) {
				for i := range 6 { // the usual pace, one query at a time
					if _, err := exchange(p, fmt.Sprintf("w%d.example.", i)); err != nil {
						t.Fatal(err)
					}
				}
				from.Store(time.Now().UnixNano())
				until.Store(time.Now().Add(2 * pace).UnixNano())
				var wg sync.WaitGroup
				ask := func(at time.Duration, name string) {
					wg.Go(func() {
						time.Sleep(at)
						if _, err := exchange(p, name); err != nil {
							t.Errorf("%s: %v", name, err)
						}
					})
				}
				for i := range 10 {
					ask(time.Duration(i)*pace/5, fmt.Sprintf("s%d.example.", i))
					ask(3*pace+time.Duration(i)*pace/5, fmt.Sprintf("l%d.example.", i))
				}
				start := time.Now()
				time.Sleep(pace / 2)
				if _, err := exchange(p, stuck); err != nil {
					t.Fatal(err)
				}
				took := time.Since(start) - pace/2
				wg.Wait()
				rescues := rec.get(func(r *recorder) int { return r.rescues })
				if ends && (took > 20*pace || rescues != 1) {
					t.Errorf("The query written in the spell took %v with %d rescues, want 1 rescue and at most %v (the spell's answer %v)",
						took, rescues, 20*pace, 5*factor*pace)
				}
				if !ends && (took < 5*factor*pace || rescues != 0) {
					t.Errorf("The slow query took %v with %d rescues, want no rescue and its own answer time %v", took, rescues, 5*factor*pace)
				}
			})
		})
	}
}
