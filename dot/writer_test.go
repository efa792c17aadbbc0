package dot

import (
	"fmt"
	"testing"
	"testing/synctest"

	"github.com/dotforward/dotforward/dot/dottest"
)

// Queries queued while a write is in progress go out together in one write. The
// first such burst runs the record trial; later ones are framed by its verdict:
// shared records for a server that reads them, one record per query for one that
// reads only the first query of a record until more bytes come (dnsdist 1.7).
func TestWritesCoalesce(t *testing.T) {
	const n = 50
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("LazyRecords=%v", lazy), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := startPipe(t, dottest.Options{LazyRecords: lazy})
				g := newPipeGate(s)
				p, rec := newTestPool(t, s, func(c *Config) { c.Dial = g.Dial; c.MaxConns = 1 })
				if _, err := exchange(p, "warm.example."); err != nil {
					t.Fatal(err)
				}
				// The trial: after the blocked write, one write with the first two
				// queries in one record, then the rest once the verdict is in.
				if w := gatedBurst(t, p, g, n); w != 3 {
					t.Errorf("Socket writes for the first burst of %d queries = %d, want 3 (the blocked one, the trial record, the rest)", n, w)
				}
				if v := verdicts(rec); len(v) != 1 || v[0] == lazy {
					t.Fatalf("Verdicts = %v, want [%v]", v, !lazy)
				}
				if w := gatedBurst(t, p, g, n); w != 2 {
					t.Errorf("Socket writes for %d queries = %d, want 2 (the blocked one, then one batch)", n, w)
				}
				g.mu.Lock()
				records := tlsRecords(g.last)
				g.mu.Unlock()
				switch {
				case lazy && records != n-1:
					t.Errorf("The batch write holds %d TLS records for %d queries, want one each", records, n-1)
				case !lazy && records != 2:
					t.Errorf("The batch write holds %d TLS records for %d queries, want 2 (the last query has its own)", records, n-1)
				}
				if to, re := rec.get(func(r *recorder) int { return r.timeouts }), rec.get(func(r *recorder) int { return r.replays }); to+re != 0 {
					t.Errorf("%d timeouts and %d replays, want none", to, re)
				}
				// Once the verdict expires, the next burst tries again.
				p.learned.records.until.Store(0)
				if w := gatedBurst(t, p, g, n); w != 3 {
					t.Errorf("Socket writes for a burst after the verdict expired = %d, want 3 (a new trial)", w)
				}
			})
		})
	}
}
