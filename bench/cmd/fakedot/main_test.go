package main

import "testing"

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
