package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

// TestPluginsListed checks what `coredns -plugins` prints.
func TestPluginsListed(t *testing.T) {
	listed := strings.Split(caddy.DescribePlugins(), "\n")
	for _, want := range []string{"dotforward", "forward", "cache", "prometheus"} {
		if !slices.Contains(listed, want) {
			t.Errorf("Expected %s in the plugin list, got %v", want, listed)
		}
	}
}

func TestDirectiveOrder(t *testing.T) {
	dirs := dnsserver.Directives
	fwd := slices.Index(dirs, "forward")
	dot := slices.Index(dirs, "dotforward")
	if fwd < 0 || dot != fwd+1 {
		t.Fatalf("Expected dotforward right after forward (index %d), got index %d", fwd+1, dot)
	}
	for _, outer := range []string{"errors", "log", "prometheus", "cache", "hosts", "kubernetes", "file", "loop"} {
		if i := slices.Index(dirs, outer); i < 0 || i > dot {
			t.Errorf("Expected %s before dotforward, got index %d (dotforward at %d)", outer, i, dot)
		}
	}
	if n := len(slices.DeleteFunc(slices.Clone(dirs), func(d string) bool { return d != "dotforward" })); n != 1 {
		t.Errorf("Expected dotforward once in the directives, got %d times", n)
	}
}

func TestInsertAfter(t *testing.T) {
	tests := []struct {
		in   []string
		want []string
	}{
		{[]string{"a", "forward", "b"}, []string{"a", "forward", "dotforward", "b"}},
		{[]string{"a", "b"}, []string{"a", "b", "dotforward"}},
		{[]string{"a", "dotforward", "forward"}, []string{"a", "forward", "dotforward"}},
	}
	for i, tc := range tests {
		if got := insertAfter(tc.in, "forward", "dotforward"); !slices.Equal(got, tc.want) {
			t.Errorf("Test %d: expected %v, got %v", i, tc.want, got)
		}
	}
}
