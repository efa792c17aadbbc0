package dotforward

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin"
)

const dashboardPath = "deploy/grafana/dotforward-dashboard.json"

// docMetricDef is a metric that metrics.go defines.
type docMetricDef struct {
	labels    []string
	histogram bool
}

// definedMetrics reads the promauto metric definitions of a Go source file.
func definedMetrics(file string) (map[string]docMetricDef, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		return nil, err
	}
	defs := map[string]docMetricDef{}
	var errs []error
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || !docIsIdent(sel.X, "promauto") || !strings.HasPrefix(sel.Sel.Name, "New") || len(call.Args) == 0 {
			return true
		}
		name, err := docOptsName(call.Args[0])
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", fset.Position(call.Pos()), err))
			return true
		}
		def := docMetricDef{histogram: strings.Contains(sel.Sel.Name, "Histogram")}
		if len(call.Args) > 1 {
			if def.labels, err = docStringSlice(call.Args[1]); err != nil {
				errs = append(errs, fmt.Errorf("%s: labels of %s: %w", fset.Position(call.Pos()), name, err))
			}
		}
		defs[name] = def
		return true
	})
	return defs, errors.Join(errs...)
}

func docIsIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// docOptsName returns the full name given by a prometheus.*Opts literal.
func docOptsName(e ast.Expr) (string, error) {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return "", errors.New("metric options are not a composite literal")
	}
	var parts [3]string // namespace, subsystem, name
	for _, el := range lit.Elts {
		kv, ok := el.(*ast.KeyValueExpr)
		if !ok {
			continue
		}
		key, _ := kv.Key.(*ast.Ident)
		if key == nil {
			continue
		}
		i := slices.Index([]string{"Namespace", "Subsystem", "Name"}, key.Name)
		if i < 0 {
			continue
		}
		v, err := docStringValue(kv.Value)
		if err != nil {
			return "", fmt.Errorf("%s: %w", key.Name, err)
		}
		parts[i] = v
	}
	if parts[2] == "" {
		return "", errors.New("metric without a Name")
	}
	return docPrometheusName(parts[0], parts[1], parts[2]), nil
}

// docPrometheusName joins the non-empty parts as prometheus.BuildFQName does.
func docPrometheusName(parts ...string) string {
	return strings.Join(slices.DeleteFunc(parts, func(s string) bool { return s == "" }), "_")
}

// docStringValue evaluates a string literal or plugin.Namespace.
func docStringValue(e ast.Expr) (string, error) {
	switch v := e.(type) {
	case *ast.BasicLit:
		if v.Kind == token.STRING {
			return strconv.Unquote(v.Value)
		}
	case *ast.SelectorExpr:
		if docIsIdent(v.X, "plugin") && v.Sel.Name == "Namespace" {
			return plugin.Namespace, nil
		}
	}
	return "", fmt.Errorf("cannot evaluate %T; use a string literal", e)
}

func docStringSlice(e ast.Expr) ([]string, error) {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, fmt.Errorf("not a []string literal")
	}
	var out []string
	for _, el := range lit.Elts {
		s, err := docStringValue(el)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// Labels a query may use besides a metric's own: the ones Prometheus adds to
// every scraped series, and le on histogram buckets.
var docTargetLabels = []string{"instance", "job"}

var (
	docMetricRef   = regexp.MustCompile(`\bcoredns_dotforward_[a-zA-Z0-9_]+`)
	docMatcher     = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"`)
	docGrouping    = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	docLabelValues = regexp.MustCompile(`label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)`)
)

// docCheckPromQL checks that a PromQL query uses only metrics and labels that defs
// define. It is a lexical check, enough for the dashboard's queries: every
// coredns_dotforward_* name must be defined, with _bucket, _sum and _count
// only on histograms; the label matchers after a name must be its labels; the
// labels of by/without and label_values must belong to a metric of the query.
func docCheckPromQL(q string, defs map[string]docMetricDef) []error {
	var errs []error
	all := slices.Clone(docTargetLabels)
	for _, loc := range docMetricRef.FindAllStringIndex(q, -1) {
		name := q[loc[0]:loc[1]]
		def, base, ok := docLookupMetric(name, defs)
		if !ok {
			errs = append(errs, fmt.Errorf("metric %s is not defined in metrics.go", name))
			continue
		}
		labels := append(slices.Clone(def.labels), docTargetLabels...)
		if base != name && strings.HasSuffix(name, "_bucket") {
			labels = append(labels, "le")
		}
		all = append(all, labels...)
		rest := q[loc[1]:]
		if !strings.HasPrefix(strings.TrimLeft(rest, " "), "{") {
			continue
		}
		end := strings.IndexByte(rest, '}')
		if end < 0 {
			errs = append(errs, fmt.Errorf("unclosed label docMatcher after %s", name))
			continue
		}
		for _, m := range docMatcher.FindAllStringSubmatch(rest[:end], -1) {
			if !slices.Contains(labels, m[1]) {
				errs = append(errs, fmt.Errorf("metric %s has no label %q", name, m[1]))
			}
		}
	}
	var grouped []string
	for _, m := range docGrouping.FindAllStringSubmatch(q, -1) {
		grouped = append(grouped, strings.Split(m[1], ",")...)
	}
	if m := docLabelValues.FindStringSubmatch(q); m != nil {
		grouped = append(grouped, m[2])
	}
	for _, l := range grouped {
		if l = strings.TrimSpace(l); l != "" && !slices.Contains(all, l) {
			errs = append(errs, fmt.Errorf("label %q is not a label of the metrics in %q", l, q))
		}
	}
	return errs
}

// docLookupMetric finds a series name's metric: itself, or the histogram it is a
// _bucket, _sum or _count series of.
func docLookupMetric(name string, defs map[string]docMetricDef) (docMetricDef, string, bool) {
	if d, ok := defs[name]; ok && !d.histogram {
		return d, name, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if d, found := defs[base]; ok && found && d.histogram {
			return d, base, true
		}
	}
	return docMetricDef{}, "", false
}

// dashboardQueries returns the PromQL of every panel target and query variable.
func dashboardQueries(dash map[string]any) []string {
	var qs []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				walk(v[k], k)
			}
		case []any:
			for _, e := range v {
				walk(e, key)
			}
		case string:
			if key == "expr" || key == "query" || key == "definition" {
				qs = append(qs, v)
			}
		}
	}
	walk(dash, "")
	return qs
}

// docRequiredMetrics are the metrics issue 8 asks the dashboard to show.
var docRequiredMetrics = []string{
	"coredns_dotforward_requests_total",
	"coredns_dotforward_request_duration_seconds_bucket",
	"coredns_dotforward_inflight",
	"coredns_dotforward_conns_open",
	"coredns_dotforward_handshakes_total",
	"coredns_dotforward_conn_closes_total",
	"coredns_dotforward_replays_total",
	"coredns_dotforward_upstream_healthy",
	"coredns_dotforward_hedges_total",
	"coredns_dotforward_hedge_wins_total",
	"coredns_dotforward_hedge_delay_seconds",
	// and issue 14: the learned mode, connections wanted against those taking
	// queries, rescued queries.
	"coredns_dotforward_upstream_mode",
	"coredns_dotforward_conns_wanted",
	"coredns_dotforward_conns_taking",
	"coredns_dotforward_rescues_total",
}

func TestDashboardMetrics(t *testing.T) {
	defs, err := definedMetrics("metrics.go")
	if err != nil {
		t.Fatalf("Cannot read the metric definitions: %v", err)
	}
	if len(defs) == 0 {
		t.Fatal("Expected metric definitions in metrics.go, found none")
	}
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	if v, err := dash["schemaVersion"].(json.Number).Int64(); err != nil || v < 36 {
		t.Errorf("Expected schemaVersion 36 or later, got %v", dash["schemaVersion"])
	}
	vars := map[string]bool{}
	if tl, ok := dash["templating"].(map[string]any); ok {
		list, _ := tl["list"].([]any)
		for _, v := range list {
			if m, ok := v.(map[string]any); ok {
				vars[fmt.Sprint(m["name"])] = true
			}
		}
	}
	for _, v := range []string{"DS_PROMETHEUS", "to"} {
		if !vars[v] {
			t.Errorf("Expected the template variable %q", v)
		}
	}
	qs := dashboardQueries(dash)
	if len(qs) == 0 {
		t.Fatal("Expected queries in the dashboard, found none")
	}
	used := map[string]bool{}
	for _, q := range qs {
		for _, err := range docCheckPromQL(q, defs) {
			t.Errorf("Dashboard query %q: %v", q, err)
		}
		for _, name := range docMetricRef.FindAllString(q, -1) {
			used[name] = true
		}
	}
	for _, name := range docRequiredMetrics {
		if !used[name] {
			t.Errorf("Expected the dashboard to show %s", name)
		}
	}
	if strings.Contains(string(b), `"uid": "prometheus"`) {
		t.Error("Expected every panel to use ${DS_PROMETHEUS}, found a fixed data source uid")
	}
}

func TestDocCheckPromQL(t *testing.T) {
	defs := map[string]docMetricDef{
		"coredns_dotforward_requests_total":           {labels: []string{"to"}},
		"coredns_dotforward_request_duration_seconds": {labels: []string{"to"}, histogram: true},
		"coredns_dotforward_conn_closes_total":        {labels: []string{"to", "reason"}},
	}
	good := []string{
		`sum by (to) (rate(coredns_dotforward_requests_total{instance=~"$instance",to=~"$to"}[5m]))`,
		`histogram_quantile(0.99, sum by (to, le) (rate(coredns_dotforward_request_duration_seconds_bucket{to=~"$to"}[5m])))`,
		`sum by (reason) (rate(coredns_dotforward_conn_closes_total[5m]))`,
		`label_values(coredns_dotforward_requests_total{instance=~"$instance"}, to)`,
	}
	for _, q := range good {
		if errs := docCheckPromQL(q, defs); len(errs) > 0 {
			t.Errorf("Expected %q to pass, got %v", q, errs)
		}
	}
	bad := []string{
		`rate(coredns_dotforward_request_total[5m])`,                          // misspelt metric
		`rate(coredns_dotforward_requests_total_bucket[5m])`,                  // bucket of a counter
		`rate(coredns_dotforward_requests_total{rcode="NOERROR"}[5m])`,        // label of another metric
		`sum by (reason) (rate(coredns_dotforward_requests_total[5m]))`,       // docGrouping by a missing label
		`label_values(coredns_dotforward_requests_total, upstream)`,           // variable on a missing label
		`sum by (le) (rate(coredns_dotforward_request_duration_seconds[5m]))`, // le on the base name
	}
	for _, q := range bad {
		if errs := docCheckPromQL(q, defs); len(errs) == 0 {
			t.Errorf("Expected %q to fail", q)
		}
	}
}

func TestDefinedMetrics(t *testing.T) {
	src := `package x
var (
	a = promauto.NewCounterVec(prometheus.CounterOpts{Namespace: plugin.Namespace, Subsystem: "dotforward", Name: "a_total"}, []string{"to", "rcode"})
	b = promauto.NewHistogram(prometheus.HistogramOpts{Namespace: plugin.Namespace, Subsystem: "dotforward", Name: "b_seconds"})
)
`
	dir := t.TempDir()
	file := filepath.Join(dir, "m.go")
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	defs, err := definedMetrics(file)
	if err != nil {
		t.Fatal(err)
	}
	a, b := defs["coredns_dotforward_a_total"], defs["coredns_dotforward_b_seconds"]
	if len(defs) != 2 || !slices.Equal(a.labels, []string{"to", "rcode"}) || a.histogram || !b.histogram || b.labels != nil {
		t.Errorf("Unexpected definitions %+v", defs)
	}
	bad := strings.Replace(src, `Subsystem: "dotforward"`, "Subsystem: sub", 1)
	if err := os.WriteFile(file, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := definedMetrics(file); err == nil {
		t.Error("Expected an error for a subsystem that is not a literal")
	}
}
