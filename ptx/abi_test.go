package ptx

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEarlyTriggerRoom(t *testing.T) {
	assert.Equal(t, MaxBlocks, EarlyTriggerRoom(36, 132, 1), "one rank per GPU: every grid")
	// H200, 2 virtual ranks, 3 blocks per SM: a share of 198 blocks, 162 of them beside a grid of 36
	assert.Equal(t, 162, EarlyTriggerRoom(36, 3*132, 2))
	// 8 virtual ranks, 1 block per SM: the share is 16 blocks, which a 16-block grid fills
	assert.Equal(t, 0, EarlyTriggerRoom(16, 132, 8))
	assert.Less(t, EarlyTriggerRoom(33, 4*132, 16), 1, "16 ranks at 33 blocks: none")
	// the invariant: a flagged grid beside the rank's largest fits in the rank's share
	for _, ranks := range []int{2, 3, 4, 8, 16} {
		for _, slots := range []int{132, 2 * 132, 3 * 132, 4 * 132} {
			share := slots / ranks
			for maxBlocks := 1; maxBlocks <= min(share, MaxBlocks); maxBlocks++ {
				for blocks := 1; blocks <= EarlyTriggerRoom(maxBlocks, slots, ranks); blocks++ {
					assert.LessOrEqual(t, blocks+maxBlocks, share)
				}
			}
		}
	}
}
