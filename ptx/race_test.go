//go:build race

package ptx

// raceEnabled: this test binary has the race detector.
const raceEnabled = true

// testWorldSizes are the world sizes the tests that walk every kernel generate. Under the
// race detector text/template runs many times slower and the generator has no goroutines of
// its own to check: the smallest, the largest, a power of two and an odd size between stand
// for the rest, which the build without -race covers.
var testWorldSizes = []int{2, 3, 8, 16}
