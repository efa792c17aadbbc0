package dotforward

import (
	"testing"

	"github.com/dotforward/dotforward/dot/dottest"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMetrics(t *testing.T) {
	cert := testCert(t)
	s := startServer(t, cert, dottest.Options{})
	f := newForward(t, cert, "", s.Addr)
	to := s.Addr
	// Counters are global and keyed by address, which an earlier test (or an
	// earlier -count round) may have used: compare increments.
	counters := map[string]prometheus.Metric{
		"requests_total":                 requestsTotal.WithLabelValues(to),
		"responses_total NOERROR":        responsesTotal.WithLabelValues(to, "NOERROR"),
		"dials_total ok":                 dialsTotal.WithLabelValues(to, "ok"),
		"handshakes_total resumed=false": handshakesTotal.WithLabelValues(to, "false"),
		"conn_closes_total shutdown":     connClosesTotal.WithLabelValues(to, "shutdown"),
	}
	before := map[string]float64{}
	for name, c := range counters {
		before[name] = metricValue(t, c)
	}
	samplesBefore := histogramCount(t, to)
	for range 3 {
		if _, rcode, err := serve(f, newMsg("example.org.", dns.TypeA)); rcode != dns.RcodeSuccess {
			t.Fatalf("Expected an answer, got rcode %d, error %v", rcode, err)
		}
	}
	checks := []struct {
		name string
		c    prometheus.Metric
		want float64
	}{
		{"requests_total", counters["requests_total"], 3},
		{"responses_total NOERROR", counters["responses_total NOERROR"], 3},
		{"inflight", inflight.WithLabelValues(to), 0},
		{"conns_open", connsOpen.WithLabelValues(to), 1},
		{"dials_total ok", counters["dials_total ok"], 1},
		{"handshakes_total resumed=false", counters["handshakes_total resumed=false"], 1},
		{"upstream_healthy", upstreamHealthy.WithLabelValues(to), 1},
	}
	for _, c := range checks {
		if got := metricValue(t, c.c) - before[c.name]; got != c.want {
			t.Errorf("Expected %s %v, got %v", c.name, c.want, got)
		}
	}
	if n := histogramCount(t, to) - samplesBefore; n != 3 {
		t.Errorf("Expected 3 request_duration_seconds samples, got %d", n)
	}
	if err := f.OnShutdown(); err != nil {
		t.Fatalf("Shutting down: %v", err)
	}
	if got := metricValue(t, connsOpen.WithLabelValues(to)); got != 0 {
		t.Errorf("Expected conns_open 0 after shutdown, got %v", got)
	}
	if got := metricValue(t, counters["conn_closes_total shutdown"]) - before["conn_closes_total shutdown"]; got != 1 {
		t.Errorf("Expected one close for shutdown, got %v", got)
	}
	// Every metric the README lists is registered under coredns_dotforward_.
	families, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		t.Fatalf("Gathering metrics: %v", err)
	}
	have := map[string]bool{}
	for _, mf := range families {
		have[mf.GetName()] = true
	}
	for _, name := range []string{"requests_total", "responses_total", "request_duration_seconds", "inflight",
		"conns_open", "dials_total", "handshakes_total", "conn_closes_total", "upstream_healthy",
		"healthcheck_broken_total", "max_concurrent_rejects_total"} {
		if !have["coredns_dotforward_"+name] {
			t.Errorf("Expected coredns_dotforward_%s registered", name)
		}
	}
}

// metricValue reads a counter or gauge.
func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatalf("Reading a metric: %v", err)
	}
	if m.Counter != nil {
		return m.GetCounter().GetValue()
	}
	return m.GetGauge().GetValue()
}

func histogramCount(t *testing.T, to string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := requestDuration.WithLabelValues(to).(prometheus.Metric).Write(&m); err != nil {
		t.Fatalf("Reading the histogram: %v", err)
	}
	return m.GetHistogram().GetSampleCount()
}
