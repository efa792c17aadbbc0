//go:build race

package main

// raceEnabled: this test binary has the race detector, whose frames are larger
// than a production build's (see runStackChild).
const raceEnabled = true
