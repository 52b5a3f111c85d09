package ptx

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/dtype"
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

// TestEarlyTriggerAnyGrid checks what EarlyTriggerAnyGrid rests on, in the text of every
// kernel for sm_90: the kernels it names trigger only after their entry barrier (every block
// of every rank's same call is then resident), and push's FlagEarlyTrigger comes before it
// waits on any peer (it has no barrier), which is why it keeps EarlyTriggerRoom's limit; its
// unflagged trigger comes after a thread's first vector has arrived from every rank.
func TestEarlyTriggerAnyGrid(t *testing.T) {
	for _, a := range []Algorithm{OneShot, TwoShot, Columns} {
		assert.True(t, EarlyTriggerAnyGrid(a), a.String())
	}
	assert.False(t, EarlyTriggerAnyGrid(Push))
	type kernel struct {
		name  string
		algo  Algorithm
		src   []byte
		fused bool
	}
	var kernels []kernel
	for _, s := range allSpecs() {
		if s.Target == SM90 {
			kernels = append(kernels, kernel{variantName(s), s.Algo, generate(t, s), false})
		}
	}
	for _, s := range allFusedSpecs() {
		if s.Target == SM90 {
			kernels = append(kernels, kernel{s.EntryName(), s.Algo, mustGenerate(t, s.Generate), true})
		}
	}
	for _, k := range kernels {
		// entry: the entry barrier's last step, the bar.red that releases the block once every
		// lane has seen its peer (step 6); a trigger before it would come before block b of
		// every rank is known to be resident
		entry, trigger, arrived, received := -1, -1, -1, -1
		inEntry := false
		for i, line := range strings.Split(string(k.src), "\n") {
			instr, _, _ := strings.Cut(line, "//")
			if entry < 0 && strings.Contains(line, "==== entry barrier") {
				inEntry = true
			}
			if inEntry && strings.Contains(instr, "bar.red.or.pred") {
				entry, inEntry = i, false
			}
			if trigger < 0 && strings.Contains(instr, "griddepcontrol.launch_dependents;") {
				trigger = i
			}
			if arrived < 0 && strings.HasPrefix(instr, "ARRIVED:") {
				arrived = i
			}
			if strings.Contains(instr, "@%untriggered griddepcontrol.launch_dependents;") {
				received = i
			}
		}
		require.GreaterOrEqual(t, trigger, 0, "%s: no PDL trigger", k.name)
		if k.algo == Push {
			assert.Less(t, entry, 0, "%s: push has no entry barrier", k.name)
			if !k.fused {
				require.GreaterOrEqual(t, arrived, 0, "%s: no receive", k.name)
				assert.Greater(t, received, arrived, "%s: push's receive trigger (line %d) must follow its first receive's wait (line %d)", k.name, received+1, arrived+1)
			}
			continue
		}
		require.GreaterOrEqual(t, entry, 0, "%s: no entry barrier", k.name)
		assert.Greater(t, trigger, entry, "%s: the first PDL trigger (line %d) must follow the entry barrier's release of the block (line %d)", k.name, trigger+1, entry+1)
	}
}

// TestNormTriggersAtStart checks where the single-rank norm kernel lets the next kernel of its
// stream launch: once, right after its griddepcontrol.wait and before it reads any data. It
// waits on no peer, so its blocks finish whatever the next kernel's blocks hold
// (internal/protomodel's Local kernels).
func TestNormTriggersAtStart(t *testing.T) {
	for _, dt := range dtype.All {
		s := NormSpec{DType: dt, Target: SM90}
		src, err := s.Generate()
		require.NoError(t, err)
		wait, trigger, triggers, load := -1, -1, 0, -1
		for i, line := range strings.Split(string(src), "\n") {
			instr, _, _ := strings.Cut(line, "//")
			switch {
			case strings.Contains(instr, "griddepcontrol.wait;"):
				wait = i
			case strings.Contains(instr, "griddepcontrol.launch_dependents;"):
				triggers++
				trigger = i
			case load < 0 && strings.Contains(instr, "ld.global"):
				load = i
			}
		}
		require.GreaterOrEqual(t, wait, 0, "%s: no griddepcontrol.wait", s.EntryName())
		require.GreaterOrEqual(t, load, 0, "%s: no global load", s.EntryName())
		assert.Equal(t, 1, triggers, "%s: one trigger", s.EntryName())
		assert.Greater(t, trigger, wait, "%s: the trigger (line %d) follows griddepcontrol.wait (line %d)", s.EntryName(), trigger+1, wait+1)
		assert.Less(t, trigger, load, "%s: the trigger (line %d) comes before the first load (line %d)", s.EntryName(), trigger+1, load+1)
	}
}
