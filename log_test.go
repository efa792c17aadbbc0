package dotforward

import (
	"errors"
	"fmt"
	golog "log"
	"strings"
	"testing"

	clog "github.com/coredns/coredns/plugin/pkg/log"

	"github.com/dotforward/dotforward/dot"
	"github.com/miekg/dns"
)

func init() { clog.Discard() }

// The plugin's log lines start with "plugin/dotforward:", so the "dot: " that
// begins each error of package dot is left out of them; errors.Is still sees
// the pool's sentinels.
func TestLogLinesWithoutDotPrefix(t *testing.T) {
	logs := &lockedBuffer{}
	prev := golog.Writer()
	clog.SetOutput(logs)
	defer clog.SetOutput(prev)
	u := testUpstreams(1)[0]
	u.health.setDown(fmt.Errorf("%w: %w", dot.ErrUnavailable, fmt.Errorf("%w: connection refused", dot.ErrDial)))
	want := "plugin/dotforward: Upstream " + u.addr + " is down: upstream unavailable: dial failed: connection refused"
	if !strings.Contains(logs.String(), want) {
		t.Errorf("Expected the log line %q, got %q", want, logs.String())
	}

	// ServeDNS's errors become log lines of the errors plugin.
	cert := testCert(t)
	f := newForward(t, cert, "health_check 0", deadAddr(t, cert))
	_, rcode, err := serve(f, newMsg("example.org.", dns.TypeA))
	if rcode != dns.RcodeServerFailure || !errors.Is(err, dot.ErrUnavailable) {
		t.Fatalf("Expected SERVFAIL and dot.ErrUnavailable, got rcode %d, error %v", rcode, err)
	}
	if strings.Contains(err.Error(), "dot: ") || !strings.HasPrefix(err.Error(), "plugin/dotforward: ") {
		t.Errorf("Expected the error prefixed plugin/dotforward only, without dot: tags, got %q", err)
	}
}

func TestUntagged(t *testing.T) {
	tests := []struct{ in, want string }{
		{"dot: pool closed", "pool closed"},
		{"context canceled (last error: dot: timeout waiting for answer)", "context canceled (last error: timeout waiting for answer)"},
		{"192.0.2.1:853: dot: connection lost: dot: connection stalled", "192.0.2.1:853: connection lost: connection stalled"},
		{"name my.dot: dot: dial failed", "name my.dot: dial failed"},
		{"no tags here", "no tags here"},
	}
	for _, tc := range tests {
		if got := untagged(errors.New(tc.in)); got != tc.want {
			t.Errorf("untagged(%q): expected %q, got %q", tc.in, tc.want, got)
		}
	}
}

// A change of mode is logged once; a change of the queries per connection
// alone (an unlearned upstream timed slow gets one query per connection) sets
// conn_concurrency and is not logged, since it follows the answer times and
// may change often.
func TestModeLogLines(t *testing.T) {
	logs := &lockedBuffer{}
	prev := golog.Writer()
	clog.SetOutput(logs)
	defer clog.SetOutput(prev)
	o := newObserver("192.0.2.7:853")
	concurrency := func() float64 { return metricValue(t, connConcurrency.WithLabelValues(o.to)) }
	steps := []struct {
		mode    dot.Mode
		perConn int
		logged  string // "" for no line
	}{
		{dot.ModeUnknown, 1, "and answers slowly: one query per connection"},
		{dot.ModeUnknown, 128, ""},
		{dot.ModeUnknown, 1, ""},
		{dot.ModeInOrder, 1, "one at a time, in order"},
		{dot.ModeOutOfOrder, 128, "out of order: up to 128 queries per connection"},
		{dot.ModeUnknown, 128, "has not shown lately how it serves a connection: up to 128"},
	}
	for i, s := range steps {
		before := len(logs.String())
		o.ModeLearned(s.mode, s.perConn)
		line := logs.String()[before:]
		if s.logged == "" && line != "" || !strings.Contains(line, s.logged) {
			t.Errorf("Step %d (%v, %d): logged %q, want %q", i, s.mode, s.perConn, line, s.logged)
		}
		if c := concurrency(); c != float64(s.perConn) {
			t.Errorf("Step %d: conn_concurrency %v, want %d", i, c, s.perConn)
		}
	}
}
