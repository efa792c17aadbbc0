//go:build race

package dot

// raceEnabled: this test binary has the race detector, which makes the pool
// several times slower: TestProperty then runs its seeds one at a time (see
// property_verdict_test.go).
const raceEnabled = true
