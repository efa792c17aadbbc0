package e2e

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrape fetches the Prometheus text exposition from addr's /metrics.
func scrape(t testing.TB, addr string) string {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("Scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("Scrape %s: status %d, %v", addr, resp.StatusCode, err)
	}
	return string(body)
}

// metricSum adds up the samples of metric name whose labels include every
// `key="value"` pair in labels. found is false if no sample matched.
func metricSum(text, name string, labels ...string) (sum float64, found bool) {
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		series, value, ok := cutLast(line, " ")
		if !ok {
			continue
		}
		metric, lbls, _ := strings.Cut(series, "{")
		if metric != name || !hasLabels(lbls, labels) {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		sum += v
		found = true
	}
	return sum, found
}

func hasLabels(lbls string, want []string) bool {
	for _, l := range want {
		if !strings.Contains(lbls, l) {
			return false
		}
	}
	return true
}

func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}

// label formats one label pair as it appears in the exposition.
func label(k, v string) string { return fmt.Sprintf("%s=%q", k, v) }
