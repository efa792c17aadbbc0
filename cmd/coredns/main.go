// Command coredns is CoreDNS with every standard plugin plus dotforward, placed
// in the directive order right after forward: inside errors, log, prometheus and
// cache (so they see and cache its answers), after hosts, file, kubernetes and
// loop (so local data wins and loop's self-probe runs first).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/core/plugin" // every standard plugin
	"github.com/coredns/coredns/coremain"

	_ "github.com/dotforward/dotforward"
)

func init() {
	dnsserver.Directives = insertAfter(dnsserver.Directives, "forward", "dotforward")
}

// insertAfter returns dirs with name inserted right after anchor, or appended if
// anchor is missing. name is not added twice.
func insertAfter(dirs []string, anchor, name string) []string {
	out := make([]string, 0, len(dirs)+1)
	inserted := false
	for _, d := range dirs {
		if d == name {
			continue
		}
		out = append(out, d)
		if d == anchor {
			out = append(out, name)
			inserted = true
		}
	}
	if !inserted {
		out = append(out, name)
	}
	return out
}

func main() {
	coremain.Run()
}
