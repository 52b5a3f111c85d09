//go:build !race

package ptx

import (
	"slices"
	"testing"
)

// raceEnabled: this test binary has the race detector.
const raceEnabled = false

// testWorldSizes are the world sizes the tests that walk every kernel generate: all of them.
var testWorldSizes = []int{2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

// TestWorldSizesComplete: without the race detector the kernel walks cover every world size.
func TestWorldSizesComplete(t *testing.T) {
	var want []int
	for ws := 2; ws <= MaxRanks; ws++ {
		want = append(want, ws)
	}
	if !slices.Equal(want, testWorldSizes) {
		t.Fatalf("testWorldSizes = %v, want 2..%d", testWorldSizes, MaxRanks)
	}
}
