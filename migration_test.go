package dotforward

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	golog "log"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	clog "github.com/coredns/coredns/plugin/pkg/log"
)

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
