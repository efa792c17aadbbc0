package main

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestCheckLoopback(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:8853": true,
		"127.0.0.2:0":    true,
		"0.0.0.0:8853":   false,
		"192.0.2.1:853":  false,
		"[::1]:853":      false,
		"localhost:853":  false,
		"127.0.0.1":      false,
	} {
		if err := checkLoopback(addr); (err == nil) != ok {
			t.Errorf("CheckLoopback(%q) = %v, want ok=%v", addr, err, ok)
		}
	}
}

func TestDelayFunc(t *testing.T) {
	slow := delayFunc(300*time.Millisecond, "s")
	for name, want := range map[string]time.Duration{
		"s000020.bench.test.": 300 * time.Millisecond,
		"S000020.bench.test.": 300 * time.Millisecond,
		"q000001.bench.test.": 0,
	} {
		if got := slow(dns.Question{Name: name, Qtype: dns.TypeA}); got != want {
			t.Errorf("delay(%q) = %v, want %v", name, got, want)
		}
	}
	if got := delayFunc(5*time.Millisecond, "")(dns.Question{Name: "a.test."}); got != 5*time.Millisecond {
		t.Errorf("empty prefix: delay = %v, want 5ms for every name", got)
	}
}
