// Helpers for the option table (setup.go): typed parsers of one option's
// arguments, and the suggestion for a misspelt option.

package dotforward

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
)

// optionFunc parses one option's arguments; the dispenser is on the option name.
type optionFunc func(c *caddy.Controller, o *options) error

// nearestOption returns the known option an unknown name was probably meant to be:
// the closest within two edits (case aside), else the only option that the name
// starts or is the start of (at least 4 letters in common); "" if none.
func nearestOption(name string) string {
	name = strings.ToLower(name)
	best, bestDist := "", 3
	var prefixed []string
	for _, known := range slices.Sorted(maps.Keys(optionTable)) {
		if d := editDistance(name, known); d < bestDist {
			best, bestDist = known, d
		}
		short := min(len(name), len(known))
		if short >= 4 && name[:short] == known[:short] {
			prefixed = append(prefixed, known)
		}
	}
	if best == "" && len(prefixed) == 1 {
		best = prefixed[0]
	}
	return best
}

// editDistance is the Levenshtein distance of a and b: the fewest single-byte
// insertions, deletions and substitutions that turn a into b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1) // distances from a[:i-1] to each prefix of b
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			sub := prev[j-1]
			if a[i-1] != b[j-1] {
				sub++
			}
			cur[j] = min(sub, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func flagOption(set func(*options)) optionFunc {
	return func(c *caddy.Controller, o *options) error {
		name := c.Val()
		if c.NextArg() {
			return c.Errf("%s takes no arguments, got %q", name, c.Val())
		}
		set(o)
		return nil
	}
}

func ignoredFlag(name, why string) optionFunc {
	return flagOption(func(*options) {
		log.Warningf("Ignoring %s: %s", name, why)
	})
}

func intOption(lo, hi int, set func(*options, int)) optionFunc {
	return func(c *caddy.Controller, o *options) error {
		name := c.Val()
		v, err := oneArg(c)
		if err != nil {
			return err
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return c.Errf("%s: %q is not an integer from %d to %d", name, v, lo, hi)
		}
		set(o, n)
		return nil
	}
}

func durationOption(allowZero bool, set func(*options, time.Duration)) optionFunc {
	return func(c *caddy.Controller, o *options) error {
		name := c.Val()
		v, err := oneArg(c)
		if err != nil {
			return err
		}
		d, err := parseDuration(v, allowZero)
		if err != nil {
			return c.Errf("%s: %v", name, err)
		}
		set(o, d)
		return nil
	}
}

func parseDuration(v string, allowZero bool) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q is not a duration (examples: 500ms, 10s, 1m)", v)
	case d < 0, d == 0 && !allowZero:
		return 0, fmt.Errorf("%q must be positive", v)
	}
	return d, nil
}

// oneArg returns the single argument of the current option.
func oneArg(c *caddy.Controller) (string, error) {
	args := c.RemainingArgs()
	if len(args) != 1 {
		return "", c.ArgErr()
	}
	return args[0], nil
}
