package dottest

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// DesignRow is one row of a table in docs/design.md: a Go constant, named in
// backquotes in the first column, and the value the document gives it in the
// second.
type DesignRow struct {
	Line        int
	Name, Value string
}

// DesignRows returns the constant rows of the tables in the part of the
// Markdown file path under the level-2 heading ("## heading"), up to the next
// level-2 heading.
func DesignRows(path, heading string) ([]DesignRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []DesignRow
	in, found := false, false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.TrimSpace(line[3:]) == heading
			found = found || in
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 2 {
			return nil, fmt.Errorf("%s:%d: a constant's row needs its value in the second column", path, n)
		}
		rows = append(rows, DesignRow{Line: n, Name: strings.Trim(strings.TrimSpace(cells[0]), "`"), Value: strings.TrimSpace(cells[1])})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%s: no section ## %s", path, heading)
	}
	return rows, nil
}

// CheckDesign checks the tables under heading in the design document at path
// against consts, the package's constants by name: every row names one of them
// and gives its value, and every one of them has a row. A time.Duration's value
// is written as Go writes durations (250ms, 30s, 10m); any other number as a
// decimal.
func CheckDesign(t testing.TB, path, heading string, consts map[string]any) {
	t.Helper()
	rows, err := DesignRows(path, heading)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		c, ok := consts[r.Name]
		if !ok {
			t.Errorf("%s:%d: %s is not a constant the test knows: add it to the test's map, or fix the name", path, r.Line, r.Name)
			continue
		}
		seen[r.Name] = true
		if err := designValueIs(r.Value, c); err != nil {
			t.Errorf("%s:%d: %s: %v", path, r.Line, r.Name, err)
		}
	}
	for name := range consts {
		if !seen[name] {
			t.Errorf("%s: ## %s has no row for %s", path, heading, name)
		}
	}
}

// designValueIs reports how the document's text differs from the constant c.
func designValueIs(text string, c any) error {
	if d, ok := c.(time.Duration); ok {
		got, err := time.ParseDuration(text)
		if err != nil || got != d {
			return fmt.Errorf("the document says %q, the code %v", text, d)
		}
		return nil
	}
	var want float64
	switch v := c.(type) {
	case int:
		want = float64(v)
	case int32:
		want = float64(v)
	case int64:
		want = float64(v)
	case float64:
		want = v
	default:
		return fmt.Errorf("constant of type %T: only durations and numbers are checked", c)
	}
	got, err := strconv.ParseFloat(strings.ReplaceAll(text, ",", ""), 64)
	if err != nil || got != want {
		return fmt.Errorf("the document says %q, the code %v", text, want)
	}
	return nil
}
