package dotforward

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	golog "log"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"

	"go.yaml.in/yaml/v3"
)

// The documentation tests keep the Corefiles shipped in the README, docs/,
// Corefile.example and the Kubernetes manifests, and the Grafana dashboard, in
// step with the code: every dotforward block must parse with the plugin's own
// parser, and the dashboard may only query metrics that metrics.go defines.

const (
	dashboardPath = "deploy/grafana/dotforward-dashboard.json"
	manifestsDir  = "deploy/kubernetes"
)

// corefileDoc is one Corefile found in a file of the repository.
type corefileDoc struct {
	file string // path of the file it was found in
	line int    // line of that file where the Corefile's first line is
	text string
}

func (d corefileDoc) String() string { return fmt.Sprintf("%s:%d", d.file, d.line) }

// source returns the Corefile padded with empty lines, so that the line numbers
// caddy and the plugin report are those of the file it was found in.
func (d corefileDoc) source() string {
	return strings.Repeat("\n", max(d.line-1, 0)) + d.text
}

// docFenceOpen matches the opening line of a fenced Markdown block and captures
// its fence and info string.
var docFenceOpen = regexp.MustCompile("^ {0,3}(```+|~~~+)[ \t]*([^`\\s]*)")

// markdownCorefiles returns the fenced blocks of a Markdown text whose info
// string is "corefile", as CoreDNS READMEs write them (~~~ corefile).
func markdownCorefiles(file string, r io.Reader) ([]corefileDoc, error) {
	var (
		docs    []corefileDoc
		fence   string // the open fence; empty outside a block
		keep    bool   // whether the open block is a Corefile
		indent  int
		body    []string
		start   int
		lineNum int
	)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		lineNum++
		line := sc.Text()
		if fence == "" {
			m := docFenceOpen.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			fence, indent, start, body = m[1], len(line)-len(strings.TrimLeft(line, " ")), lineNum+1, nil
			keep = strings.EqualFold(m[2], "corefile")
			continue
		}
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
			if keep {
				docs = append(docs, corefileDoc{file: file, line: start, text: strings.Join(body, "\n") + "\n"})
			}
			fence = ""
			continue
		}
		body = append(body, docTrimIndent(line, indent))
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if fence != "" {
		return nil, fmt.Errorf("%s:%d: fenced block %s is never closed", file, start-1, fence)
	}
	return docs, nil
}

// docTrimIndent removes up to n leading spaces, the indentation of the fence.
func docTrimIndent(s string, n int) string {
	for i := 0; i < n && strings.HasPrefix(s, " "); i++ {
		s = s[1:]
	}
	return s
}

// manifestCorefiles returns the Corefiles in the ConfigMaps of a multi-document
// YAML file: the data keys named Corefile, and *.server keys (the convention
// of coredns-custom ConfigMaps).
func manifestCorefiles(file string, r io.Reader) ([]corefileDoc, error) {
	var docs []corefileDoc
	dec := yaml.NewDecoder(r)
	for {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		if len(doc.Content) == 0 {
			continue
		}
		root := doc.Content[0]
		if kind := docMapValue(root, "kind"); kind == nil || kind.Value != "ConfigMap" {
			continue
		}
		data := docMapValue(root, "data")
		if data == nil || data.Kind != yaml.MappingNode {
			continue
		}
		for i := 0; i+1 < len(data.Content); i += 2 {
			key, val := data.Content[i].Value, data.Content[i+1]
			if key != "Corefile" && !strings.HasSuffix(key, ".server") {
				continue
			}
			if val.Style&(yaml.LiteralStyle|yaml.FoldedStyle) == 0 {
				return nil, fmt.Errorf("%s:%d: write %s as a literal block (%s: |) so that its lines can be checked", file, val.Line, key, key)
			}
			// A block scalar's text starts on the line after its indicator.
			docs = append(docs, corefileDoc{file: file, line: val.Line + 1, text: val.Value})
		}
	}
}

// docMapValue returns the value of key in a YAML mapping node, or nil.
func docMapValue(m *yaml.Node, key string) *yaml.Node {
	if m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// directives is what a Corefile in this repository may use: CoreDNS's own
// directives and dotforward, as in the custom build.
func docDirectives() []string {
	ds := slices.Clone(dnsserver.Directives)
	if !slices.Contains(ds, "dotforward") {
		ds = append(ds, "dotforward")
	}
	return ds
}

// docServerBlocks parses a Corefile with caddy's parser. A text that starts with a
// directive rather than a server address is a fragment of a server block, as
// documentation often shows; it is parsed inside a root zone block.
func docServerBlocks(d corefileDoc) ([]caddyfile.ServerBlock, error) {
	src := d.source()
	if first := strings.Fields(d.text); len(first) > 0 && slices.Contains(docDirectives(), first[0]) {
		if d.line < 2 {
			return nil, fmt.Errorf("%s: a server block fragment needs a line before it", d)
		}
		src = strings.Repeat("\n", d.line-2) + ". {\n" + d.text + "\n}\n"
	}
	return caddyfile.Parse(d.file, strings.NewReader(src), docDirectives())
}

// checkDotforward parses every dotforward directive of a Corefile with the
// plugin's parser and returns how many stanzas it read.
func checkDotforward(d corefileDoc) (int, error) {
	blocks, err := docServerBlocks(d)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, sb := range blocks {
		toks := sb.Tokens["dotforward"]
		if len(toks) == 0 {
			continue
		}
		c := caddy.NewTestController("dns", "")
		c.Dispenser = caddyfile.NewDispenserTokens(d.file, toks)
		c.ServerBlockKeys = sb.Keys
		fs, err := parse(c)
		if err != nil {
			return n, err
		}
		n += len(fs)
	}
	return n, nil
}

// repoCorefiles collects the Corefiles of the README, docs/*.md, deploy/*.md,
// Corefile.example and the Kubernetes manifests. Each of these is expected to
// hold at least one dotforward stanza, except the other Markdown files, which
// may hold none.
func repoCorefiles(t *testing.T) (docs []corefileDoc, mustHave []string) {
	t.Helper()
	add := func(file string, extract func(string, io.Reader) ([]corefileDoc, error)) []corefileDoc {
		f, err := os.Open(file)
		if err != nil {
			t.Fatalf("Cannot read %s: %v", file, err)
		}
		defer f.Close()
		ds, err := extract(file, f)
		if err != nil {
			t.Fatalf("Cannot extract the Corefiles of %s: %v", file, err)
		}
		docs = append(docs, ds...)
		return ds
	}
	add("README.md", markdownCorefiles)
	mustHave = append(mustHave, "README.md")
	var mds []string
	for _, pattern := range []string{"docs/*.md", "deploy/*.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		mds = append(mds, m...)
	}
	for _, md := range mds {
		add(md, markdownCorefiles)
	}
	add("Corefile.example", func(file string, r io.Reader) ([]corefileDoc, error) {
		b, err := io.ReadAll(r)
		return []corefileDoc{{file: file, line: 1, text: string(b)}}, err
	})
	mustHave = append(mustHave, "Corefile.example")
	err := filepath.WalkDir(manifestsDir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return err
		}
		if ds := add(path, manifestCorefiles); len(ds) > 0 {
			mustHave = append(mustHave, path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Cannot walk %s: %v", manifestsDir, err)
	}
	return docs, mustHave
}

func TestDocsCorefilesParse(t *testing.T) {
	docs, mustHave := repoCorefiles(t)
	stanzas := map[string]int{}
	failed := map[string]bool{}
	for _, d := range docs {
		n, err := checkDotforward(d)
		if err != nil {
			t.Errorf("Corefile at %s does not parse: %v", d, err)
			failed[d.file] = true
			continue
		}
		stanzas[d.file] += n
	}
	for _, f := range mustHave {
		if stanzas[f] == 0 && !failed[f] {
			t.Errorf("Expected at least one dotforward stanza in %s, found none", f)
		}
	}
	if !slices.Contains(mustHave, filepath.Join(manifestsDir, "configmap.yaml")) {
		t.Errorf("Expected the cluster DNS Corefile in %s/configmap.yaml", manifestsDir)
	}
}

// TestDocsCorefileLines checks that the extracted Corefiles keep their lines: the
// line each dotforward token reports must hold "dotforward" in the file itself,
// or the errors of the other test would point at the wrong place.
func TestDocsCorefileLines(t *testing.T) {
	docs, _ := repoCorefiles(t)
	lines := map[string][]string{}
	for _, d := range docs {
		if lines[d.file] == nil {
			b, err := os.ReadFile(d.file)
			if err != nil {
				t.Fatal(err)
			}
			lines[d.file] = strings.Split(string(b), "\n")
		}
		blocks, err := docServerBlocks(d)
		if err != nil {
			continue // reported by TestDocsCorefilesParse
		}
		for _, sb := range blocks {
			for _, tok := range sb.Tokens["dotforward"] {
				if tok.Text != "dotforward" {
					continue
				}
				fl := lines[d.file]
				if tok.Line < 1 || tok.Line > len(fl) || !strings.Contains(fl[tok.Line-1], "dotforward") {
					t.Errorf("Corefile at %s: dotforward token reported on line %d, which does not contain it", d, tok.Line)
				}
			}
		}
	}
}

func TestMarkdownCorefiles(t *testing.T) {
	md := strings.Join([]string{
		"# Title",                        // 1
		"~~~ txt",                        // 2
		"dotforward FROM TO...",          // 3
		"~~~",                            // 4
		"~~~ corefile",                   // 5
		". {",                            // 6
		"    dotforward . tls://1.1.1.1", // 7
		"}",                              // 8
		"~~~",                            // 9
		"  ```Corefile",                  // 10
		"  dotforward . tls://9.9.9.9",   // 11
		"  ```",                          // 12
		"```corefile",                    // 13
		"~~~",                            // 14: not the closing fence
		"````",                           // 15: closes, longer fences of the same kind do
		"```go",                          // 16
		"x := 1",                         // 17
		"```",                            // 18
	}, "\n")
	docs, err := markdownCorefiles("x.md", strings.NewReader(md))
	if err != nil {
		t.Fatal(err)
	}
	want := []corefileDoc{
		{file: "x.md", line: 6, text: ". {\n    dotforward . tls://1.1.1.1\n}\n"},
		{file: "x.md", line: 11, text: "dotforward . tls://9.9.9.9\n"},
		{file: "x.md", line: 14, text: "~~~\n"},
	}
	if !slices.Equal(docs, want) {
		t.Errorf("Expected %q, got %q", want, docs)
	}
	if _, err := markdownCorefiles("y.md", strings.NewReader("~~~ corefile\n. {\n}\n")); err == nil {
		t.Error("Expected an error for an unclosed fence")
	}
}

func TestManifestCorefiles(t *testing.T) {
	y := strings.Join([]string{
		"apiVersion: v1",     // 1
		"kind: Service",      // 2
		"metadata:",          // 3
		"  name: x",          // 4
		"---",                // 5
		"apiVersion: v1",     // 6
		"kind: ConfigMap",    // 7
		"data:",              // 8
		"  other: |",         // 9
		"    not a corefile", // 10
		"  Corefile: |",      // 11
		"    .:53 {",         // 12
		"        dotforward . tls://1.1.1.1%one.one.one.one", // 13
		"    }",             // 14
		"  extra.server: |", // 15
		"    example.org {", // 16
		"    }",             // 17
	}, "\n") + "\n"
	docs, err := manifestCorefiles("m.yaml", strings.NewReader(y))
	if err != nil {
		t.Fatal(err)
	}
	want := []corefileDoc{
		{file: "m.yaml", line: 12, text: ".:53 {\n    dotforward . tls://1.1.1.1%one.one.one.one\n}\n"},
		{file: "m.yaml", line: 16, text: "example.org {\n}\n"},
	}
	if !slices.Equal(docs, want) {
		t.Errorf("Expected %q, got %q", want, docs)
	}
	_, err = manifestCorefiles("q.yaml", strings.NewReader("kind: ConfigMap\ndata:\n  Corefile: \". {\\n}\"\n"))
	if err == nil {
		t.Error("Expected an error for a Corefile that is not a literal block")
	}
	if _, err := manifestCorefiles("bad.yaml", strings.NewReader("kind: [\n")); err == nil {
		t.Error("Expected an error for malformed YAML")
	}
}

func TestCheckDotforward(t *testing.T) {
	tests := []struct {
		name    string
		doc     corefileDoc
		stanzas int
		errLine string // "" for success; else the file:line the error must name
	}{
		{"server block", corefileDoc{"a.md", 3, ". {\n  cache\n  dotforward . tls://1.1.1.1%one.one.one.one\n}\n"}, 1, ""},
		{"two blocks", corefileDoc{"a.md", 3, "a.org {\n dotforward . tls://1.1.1.1%x.org\n}\nb.org {\n dotforward . tls://1.1.1.1%x.org {\n  max_fails 3\n }\n}\n"}, 2, ""},
		{"fragment", corefileDoc{"a.md", 10, "dotforward . tls://9.9.9.9%dns.quad9.net {\n  policy sequential\n}\n"}, 1, ""},
		{"no dotforward", corefileDoc{"a.md", 3, ". {\n  whoami\n}\n"}, 0, ""},
		{"plain upstream", corefileDoc{"a.md", 20, ". {\n  dotforward . 8.8.8.8\n}\n"}, 0, "a.md:21"},
		{"bad option in fragment", corefileDoc{"b.md", 7, "dotforward . tls://1.1.1.1%x.org {\n  no_such_option\n}\n"}, 0, "b.md:8"},
		{"unknown directive", corefileDoc{"c.md", 2, ". {\n  dotfoward . tls://1.1.1.1%x.org\n}\n"}, 0, "c.md:3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, err := checkDotforward(tc.doc)
			if tc.errLine == "" {
				if err != nil {
					t.Fatalf("Expected no error, got %v", err)
				}
				if n != tc.stanzas {
					t.Errorf("Expected %d stanzas, got %d", tc.stanzas, n)
				}
				return
			}
			if err == nil {
				t.Fatalf("Expected an error naming %s, got none", tc.errLine)
			}
			if !strings.Contains(err.Error(), tc.errLine+" ") {
				t.Errorf("Expected the error to name %s, got %v", tc.errLine, err)
			}
		})
	}
}

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

const migrationPath = "docs/migration.md"

// forwardOptions are the options of CoreDNS's forward plugin (its README and
// setup.go), each of which the migration guide must place.
var forwardOptions = []string{
	"except", "force_tcp", "prefer_udp", "expire", "max_age", "max_idle_conns", "max_fails",
	"max_connect_attempts", "tls", "tls_servername", "policy", "health_check", "max_concurrent",
	"next", "next_on_nodata", "failfast_all_unhealthy_upstreams", "failover", "source_address",
	"resolver", "read_timeout", "doh_method",
}

// optionSamples are valid arguments of each option, to try the guide's verdict
// on the parser. An option the guide lists without a sample fails the test.
var optionSamples = map[string]string{
	"except": "example.org", "force_tcp": "", "prefer_udp": "", "expire": "10s", "max_age": "30s",
	"max_idle_conns": "5", "max_fails": "3", "max_connect_attempts": "3", "tls": "",
	"tls_servername": "dns.example", "policy": "sequential", "health_check": "1s no_rec domain example.org",
	"max_concurrent": "100", "next": "NXDOMAIN", "next_on_nodata": "", "failfast_all_unhealthy_upstreams": "",
	"failover": "SERVFAIL", "source_address": "127.0.0.1", "resolver": "127.0.0.1", "read_timeout": "2s",
	"doh_method": "POST", "tls_pin": strings.Repeat("A", 43) + "=", "max_conns": "8", "max_inflight": "64",
	"dial_timeout": "2s", "stall_timeout": "1s", "timeout": "4s", "no_padding": "", "no_keepalive": "", "no_coalesce": "",
	"hedge": "20ms",
}

// migrationRow is an option row of the guide: the option and what the guide
// says dotforward does with it.
type migrationRow struct {
	option  string
	verdict string // "same", "ignored" or "refused"
	line    int
}

var firstCode = regexp.MustCompile("`([^`]*)`")

// migrationRows reads the guide's two option tables: forward's options (header
// "| `forward` | `dotforward` | Notes |") and dotforward's own ("| Option |
// Default | Meaning |"). Rows of forward's table that are not options (FROM,
// TO) are skipped.
func migrationRows(r io.Reader) (fwd, own []migrationRow, err error) {
	var table string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			table = ""
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case slices.Equal(cells, []string{"`forward`", "`dotforward`", "Notes"}):
			table = "forward"
			continue
		case slices.Equal(cells, []string{"Option", "Default", "Meaning"}):
			table = "own"
			continue
		case table == "" || strings.HasPrefix(cells[0], "---"):
			continue
		}
		m := firstCode.FindStringSubmatch(cells[0])
		if m == nil || len(cells) < 2 {
			return nil, nil, fmt.Errorf("line %d: expected an option in backquotes in the first cell", n)
		}
		name := strings.Fields(m[1] + " ")[0]
		if table == "own" {
			own = append(own, migrationRow{option: name, verdict: "same", line: n})
			continue
		}
		if name == "FROM" || strings.HasPrefix(name, "TO") {
			continue
		}
		v := strings.ToLower(cells[1])
		switch {
		case strings.HasPrefix(v, "same"):
			v = "same"
		case strings.HasPrefix(v, "accepted and ignored"):
			v = "ignored"
		case strings.HasPrefix(v, "refused"):
			v = "refused"
		default:
			return nil, nil, fmt.Errorf("line %d: %s: verdict %q is none of same, accepted and ignored, refused", n, name, cells[1])
		}
		fwd = append(fwd, migrationRow{option: name, verdict: v, line: n})
	}
	return fwd, own, sc.Err()
}

// lockedBuffer collects log output, which other goroutines may write too.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// tryOption parses a stanza with the option and its sample arguments and
// reports what the parser did with it.
func tryOption(name, args string) (verdict string, err error) {
	base := "tls_servername dns.example\n"
	if name == "tls_servername" {
		base = ""
	}
	input := fmt.Sprintf("dotforward . tls://192.0.2.1 {\n%s%s %s\n}\n", base, name, args)
	logs := &lockedBuffer{}
	prev := golog.Writer()
	clog.SetOutput(logs)
	defer clog.SetOutput(prev)
	_, err = parse(caddy.NewTestController("dns", input))
	switch {
	case err != nil:
		return "refused", err
	case strings.Contains(logs.String(), "Ignoring "+name):
		return "ignored", nil
	}
	return "same", nil
}

// TestMigrationGuide keeps docs/migration.md in step with setup.go: every
// forward option and every option the parser knows is in the guide, and the
// guide's verdict on each (same, accepted and ignored, refused) is what the
// parser does with it.
func TestMigrationGuide(t *testing.T) {
	f, err := os.Open(migrationPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fwd, own, err := migrationRows(f)
	if err != nil {
		t.Fatalf("%s: %v", migrationPath, err)
	}
	documented := map[string]bool{}
	for _, r := range append(slices.Clone(fwd), own...) {
		documented[r.option] = true
		args, ok := optionSamples[r.option]
		if !ok {
			t.Errorf("%s:%d: no sample arguments for option %q in optionSamples", migrationPath, r.line, r.option)
			continue
		}
		got, err := tryOption(r.option, args)
		if got != r.verdict {
			t.Errorf("%s:%d: the guide says %s for %q, the parser: %s (%v)", migrationPath, r.line, r.verdict, r.option, got, err)
		}
	}
	for _, o := range forwardOptions {
		if !slices.ContainsFunc(fwd, func(r migrationRow) bool { return r.option == o }) {
			t.Errorf("Expected forward's option %q in the first table of %s", o, migrationPath)
		}
	}
	known, err := parserOptions("setup.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range known {
		if !documented[o] {
			t.Errorf("Option %q of setup.go is missing from %s", o, migrationPath)
		}
	}
}

// parserOptions reads the option names of setup.go: the keys of its
// optionTable and unsupportedOptions maps.
func parserOptions(file string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		return nil, err
	}
	var names []string
	found := 0
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.VAR {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if (id.Name != "optionTable" && id.Name != "unsupportedOptions") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.CompositeLit)
				if !ok {
					return nil, fmt.Errorf("%s: %s is not a map literal", file, id.Name)
				}
				found++
				for _, el := range lit.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					k, err := docStringValue(kv.Key)
					if err != nil {
						return nil, fmt.Errorf("%s: key of %s: %w", file, id.Name, err)
					}
					names = append(names, k)
				}
			}
		}
	}
	if found != 2 {
		return nil, fmt.Errorf("%s: expected the optionTable and unsupportedOptions maps, found %d of them", file, found)
	}
	return names, nil
}

func TestMigrationRows(t *testing.T) {
	md := strings.Join([]string{
		"| `forward` | `dotforward` | Notes |",     // 1
		"|---|---|---|",                            // 2
		"| `FROM` | same | |",                      // 3
		"| `TO...` plain | refused | |",            // 4
		"| `expire` | same | x |",                  // 5
		"| `force_tcp` | accepted and ignored | |", // 6
		"| `resolver` | refused | |",               // 7
		"",                                         // 8
		"| Option | Default | Meaning |",           // 9
		"|---|---|---|",                            // 10
		"| `max_conns N` | 4 | x |",                // 11
		"",                                         // 12
		"| `forward` | `dotforward` |",             // 13: another table
		"| `coredns_x` | `coredns_y` |",            // 14
	}, "\n")
	fwd, own, err := migrationRows(strings.NewReader(md))
	if err != nil {
		t.Fatal(err)
	}
	wantFwd := []migrationRow{{"expire", "same", 5}, {"force_tcp", "ignored", 6}, {"resolver", "refused", 7}}
	if !slices.Equal(fwd, wantFwd) || !slices.Equal(own, []migrationRow{{"max_conns", "same", 11}}) {
		t.Errorf("Unexpected rows %v and %v", fwd, own)
	}
	bad := "| `forward` | `dotforward` | Notes |\n|---|---|---|\n| `expire` | maybe | |\n"
	if _, _, err := migrationRows(strings.NewReader(bad)); err == nil {
		t.Error("Expected an error for an unknown verdict")
	}
}
