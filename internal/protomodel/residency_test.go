package protomodel

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/ptx"
)

// residencyCases are GPUs shared by 2 to 8 ranks, each rank's grids capped to its share of
// the slots as collective caps them (largest is the cap: the whole share, or less, as a
// Blocks option below the share makes it), one call using the cap. Room is the rule's.
func residencyCases() []ResidencyConfig {
	var cases []ResidencyConfig
	rng := rand.New(rand.NewPCG(1, 2))
	for _, ranks := range []int{2, 3, 4, 8} {
		for _, share := range []int{1, 2, 3, 5, 8} {
			for _, largest := range []int{share, (share + 1) / 2, 1} {
				grids := []int{largest}
				for range 5 {
					grids = append(grids, 1+rng.IntN(largest))
				}
				rng.Shuffle(len(grids), func(i, j int) { grids[i], grids[j] = grids[j], grids[i] })
				slots := ranks * share
				cases = append(cases, ResidencyConfig{Ranks: ranks, Slots: slots, Grids: grids,
					Room: ptx.EarlyTriggerRoom(largest, slots, ranks)})
			}
		}
	}
	return cases
}

// TestResidencyRule checks ptx.EarlyTriggerRoom: with PDL and the early trigger where the rule
// allows it (and with the late trigger only, and without PDL), no schedule deadlocks, and the
// runs did put a rank's next kernel on the GPU beside its previous one.
func TestResidencyRule(t *testing.T) {
	overlaps, earlyOverlaps := 0, 0
	for _, c := range residencyCases() {
		for _, v := range []struct {
			pdl  bool
			rule TriggerRule
		}{{true, EarlyWhereRoom}, {true, LateOnly}, {false, LateOnly}} {
			c.PDL, c.Rule = v.pdl, v.rule
			for seed := range uint64(100) {
				c.Seed = seed
				st, err := Residency(c)
				require.NoError(t, err, "ranks %d slots %d grids %v room %d PDL %v, seed %d", c.Ranks, c.Slots, c.Grids, c.Room, c.PDL, seed)
				switch {
				case c.PDL && c.Rule == EarlyWhereRoom && c.Room >= 1:
					earlyOverlaps += st.Overlaps
				case c.PDL:
					overlaps += st.Overlaps
				default:
					require.Zero(t, st.Overlaps, "without PDL a kernel starts after its predecessor exits")
				}
			}
		}
	}
	assert.Positive(t, overlaps, "PDL runs placed a next kernel beside its predecessor")
	assert.Positive(t, earlyOverlaps, "runs with early triggers placed a next kernel beside a predecessor still waiting")
}

// TestResidencyRuleIsTight checks that the model would catch a rule one block too generous:
// some case then deadlocks (two ranks with a share of one block each, the smallest).
func TestResidencyRuleIsTight(t *testing.T) {
	for _, c := range residencyCases() {
		c.PDL, c.Rule = true, EarlyWhereRoom
		c.Room++
		for seed := range uint64(200) {
			c.Seed = seed
			if _, err := Residency(c); err != nil {
				require.ErrorIs(t, err, ErrDeadlock)
				t.Logf("caught with grids %v, room %d, seed %d: %v", c.Grids, c.Room, seed, err)
				return
			}
		}
	}
	require.FailNow(t, "the model did not catch a room one block larger than ptx.EarlyTriggerRoom's")
}

// TestResidencyEarlyAlwaysDeadlocks checks that the model catches the broken rule: every grid
// triggering early deadlocks once three or more ranks fill the GPU.
func TestResidencyEarlyAlwaysDeadlocks(t *testing.T) {
	c := ResidencyConfig{Ranks: 3, Slots: 6, Grids: []int{2, 2, 2, 2, 2, 2}, PDL: true, Rule: EarlyAlways}
	for seed := range uint64(1000) {
		c.Seed = seed
		if _, err := Residency(c); err != nil {
			require.ErrorIs(t, err, ErrDeadlock)
			t.Logf("caught with seed %d: %v", seed, err)
			return
		}
	}
	require.FailNow(t, "the model did not catch the early trigger on every grid deadlocking")
}

func TestResidencyConfigErrors(t *testing.T) {
	_, err := Residency(ResidencyConfig{Ranks: 0, Slots: 4, Grids: []int{1}})
	assert.ErrorContains(t, err, "0 ranks")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4})
	assert.ErrorContains(t, err, "no calls")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{5}})
	assert.ErrorContains(t, err, "5 blocks")
	assert.Equal(t, "early always", EarlyAlways.String())
}
