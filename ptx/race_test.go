//go:build race

package ptx

// raceEnabled: this test binary has the race detector.
const raceEnabled = true
