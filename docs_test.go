package dotforward

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/caddy/caddyfile"
	"github.com/coredns/coredns/core/dnsserver"

	"github.com/dotforward/dotforward/dot/dottest"
	"go.yaml.in/yaml/v3"
)

// The documentation tests keep the Corefiles shipped in the README, docs/,
// Corefile.example and the Kubernetes manifests, and the Grafana dashboard, in
// step with the code: every dotforward block must parse with the plugin's own
// parser, and the dashboard may only query metrics that metrics.go defines.
const manifestsDir = "deploy/kubernetes"

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

// TestDesignNumbers checks docs/design.md's tables of the plugin's numbers
// against the constants themselves (dot checks the pool's).
func TestDesignNumbers(t *testing.T) {
	dottest.CheckDesign(t, "docs/design.md", "The plugin", map[string]any{
		"defaultTimeout":      defaultTimeout,
		"defaultMaxFails":     defaultMaxFails,
		"defaultHealthCheck":  defaultHealthCheck,
		"maxUpstreams":        maxUpstreams,
		"defaultHedgePercent": defaultHedgePercent,
		"ewmaWeight":          ewmaWeight,
		"exploreEvery":        exploreEvery,
		"hedgeMinDelay":       hedgeMinDelay,
		"hedgeQuantile":       hedgeQuantile,
		"hedgeFactor":         hedgeFactor,
		"hedgeWindow":         hedgeWindow,
		"hedgeRecompute":      hedgeRecompute,
		"hedgeBurst":          hedgeBurst,
	})
}
