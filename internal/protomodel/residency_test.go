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

// residencyMix is a case's calls' kinds and idle blocks (ResidencyConfig.Kinds and Idle).
type residencyMix struct {
	name  string
	kinds []KernelKind
	idle  []int
}

// residencyKinds are the kind mixes every case of grids runs with: nil (every call SendFirst,
// as before kinds), every call EntryFirst, each call's kind at random, the slice sometimes a
// call short (that call SendFirst), and unfused pairs (every other call Local, the others
// SendFirst or EntryFirst at random); the last three again with idle blocks (residencyIdle).
// The draws are the same on every run of the tests.
func residencyKinds(grids []int, rng *rand.Rand) []residencyMix {
	entry := make([]KernelKind, len(grids))
	for k := range entry {
		entry[k] = EntryFirst
	}
	mixed := make([]KernelKind, len(grids)-rng.IntN(2))
	for k := range mixed {
		mixed[k] = KernelKind(rng.IntN(2))
	}
	pairs := make([]KernelKind, len(grids))
	for k := range pairs {
		pairs[k] = KernelKind(rng.IntN(2))
		if k%2 == 1 {
			pairs[k] = Local
		}
	}
	return []residencyMix{{"send first", nil, nil}, {"entry first", entry, nil}, {"mixed", mixed, nil},
		{"pairs", pairs, nil},
		{"entry first, idle", entry, residencyIdle(grids, entry, rng)},
		{"mixed, idle", mixed, residencyIdle(grids, mixed, rng)},
		{"pairs, idle", pairs, residencyIdle(grids, pairs, rng)}}
}

// residencyIdle draws idle blocks for calls of grids and kinds: every other EntryFirst call
// or so has 0 to all but one of its blocks idle, as a message smaller than the grid leaves
// them; SendFirst and Local calls have none.
func residencyIdle(grids []int, kinds []KernelKind, rng *rand.Rand) []int {
	idle := make([]int, len(kinds))
	for k, kind := range kinds {
		if kind == EntryFirst && rng.IntN(2) == 0 {
			idle[k] = rng.IntN(grids[k])
		}
	}
	return idle
}

// TestResidencyRule checks ptx.EarlyTriggerRoom and EarlyAfterEntry: with PDL and the early
// trigger where either rule allows it (and with the late trigger only, and without PDL), no
// schedule deadlocks, whatever the calls' kinds and idle blocks; the runs did put a rank's
// next kernel on the GPU beside its previous one, and those with early triggers beside one
// still waiting on a peer, EarlyAfterEntry's also beside EntryFirst and Local grids larger
// than the room, which the room rule alone would not let trigger early, and beside EntryFirst
// grids with idle blocks, with a lagging rank's idle block still waiting for a slot.
func TestResidencyRule(t *testing.T) {
	overlaps, earlyOverlaps, entryOverlaps, localOverlaps, idleOverlaps, idleLags := 0, 0, 0, 0, 0, 0
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range residencyCases() {
		for _, mix := range residencyKinds(c.Grids, rng) {
			c.Kinds, c.Idle = mix.kinds, mix.idle
			for _, v := range []struct {
				pdl  bool
				rule TriggerRule
			}{{true, EarlyAfterEntry}, {true, EarlyWhereRoom}, {true, LateOnly}, {false, LateOnly}} {
				c.PDL, c.Rule = v.pdl, v.rule
				for seed := range uint64(100) {
					c.Seed = seed
					st, err := Residency(c)
					require.NoError(t, err, "ranks %d slots %d grids %v kinds %v idle %v room %d PDL %v rule %v, seed %d", c.Ranks, c.Slots, c.Grids, c.Kinds, c.Idle, c.Room, c.PDL, c.Rule, seed)
					if !c.PDL {
						require.Zero(t, st.Overlaps, "without PDL a kernel starts after its predecessor exits")
						continue
					}
					if c.Rule == LateOnly {
						overlaps += st.Overlaps
					}
					if c.Rule == EarlyAfterEntry {
						idleLags += st.IdleLags
					}
					for k, n := range st.EarlyOverlaps {
						if n == 0 {
							continue
						}
						require.True(t, k > 0 && c.early(k-1), "call %d placed beside call %d still waiting on a peer, which rule %v does not let trigger early (grids %v kinds %v room %d)", k, k-1, c.Rule, c.Grids, c.Kinds, c.Room)
						earlyOverlaps += n
						if c.Rule == EarlyAfterEntry && c.kind(k-1) == EntryFirst && c.Grids[k-1] > c.Room {
							entryOverlaps += n
						}
						if c.Rule == EarlyAfterEntry && c.kind(k-1) == Local && c.Grids[k-1] > c.Room {
							localOverlaps += n
						}
						if c.Rule == EarlyAfterEntry && c.idleBlocks(k-1) > 0 {
							idleOverlaps += n
						}
					}
				}
			}
		}
	}
	assert.Positive(t, overlaps, "PDL runs placed a next kernel beside its predecessor")
	assert.Positive(t, earlyOverlaps, "runs with early triggers placed a next kernel beside a predecessor still waiting")
	assert.Positive(t, entryOverlaps, "EarlyAfterEntry runs placed a next kernel beside an EntryFirst predecessor larger than the room, still at its exit barrier")
	assert.Positive(t, localOverlaps, "EarlyAfterEntry runs placed a next kernel beside a Local predecessor larger than the room, still running")
	assert.Positive(t, idleOverlaps, "EarlyAfterEntry runs placed a next kernel beside a predecessor with idle blocks, still at its exit barrier")
	assert.Positive(t, idleLags, "EarlyAfterEntry runs placed blocks while another rank's idle block waited for a slot")
	t.Logf("early overlaps %d (after EntryFirst grids over the room %d, after Local ones %d, after grids with idle blocks %d), idle lags %d", earlyOverlaps, entryOverlaps, localOverlaps, idleOverlaps, idleLags)
}

// TestResidencyEntryFirstEarlyAlways checks the claim behind EarlyAfterEntry at its limit:
// when every call is EntryFirst, every grid may trigger early, even in the case where
// EarlyAlways deadlocks SendFirst calls (TestResidencyEarlyAlwaysDeadlocks's) and in every
// shape of residencyCases, whatever the room, with idle blocks or without; and the tight case
// did place a next kernel beside a predecessor still at its exit barrier, with idle blocks
// also beside one that has idle blocks, while a lagging rank's idle block waited for a slot.
func TestResidencyEntryFirstEarlyAlways(t *testing.T) {
	run := func(c ResidencyConfig, seeds uint64) (earlyOverlaps, idleOverlaps, idleLags int) {
		c.PDL, c.Rule = true, EarlyAlways
		c.Kinds = make([]KernelKind, len(c.Grids))
		for k := range c.Kinds {
			c.Kinds[k] = EntryFirst
		}
		for seed := range seeds {
			c.Seed = seed
			st, err := Residency(c)
			require.NoError(t, err, "ranks %d slots %d grids %v idle %v, every call EntryFirst and early, seed %d", c.Ranks, c.Slots, c.Grids, c.Idle, seed)
			for k, n := range st.EarlyOverlaps {
				earlyOverlaps += n
				if k > 0 && c.idleBlocks(k-1) > 0 {
					idleOverlaps += n
				}
			}
			idleLags += st.IdleLags
		}
		return earlyOverlaps, idleOverlaps, idleLags
	}
	tight := ResidencyConfig{Ranks: 3, Slots: 6, Grids: []int{2, 2, 2, 2, 2, 2}}
	early, _, _ := run(tight, 2000)
	assert.Positive(t, early, "the tight case placed a next kernel beside a predecessor at its exit barrier")
	tight.Idle = []int{1, 0, 1, 1, 0, 1}
	early, idle, lags := run(tight, 2000)
	assert.Positive(t, early, "the tight case with idle blocks placed a next kernel beside a predecessor at its exit barrier")
	assert.Positive(t, idle, "the tight case placed a next kernel beside a predecessor with idle blocks")
	assert.Positive(t, lags, "the tight case placed blocks while another rank's idle block waited for a slot")
	rng := rand.New(rand.NewPCG(7, 8))
	for _, c := range residencyCases() {
		run(c, 150)
		c.Idle = make([]int, len(c.Grids))
		for k := range c.Idle {
			c.Idle[k] = rng.IntN(c.Grids[k])
		}
		run(c, 150)
	}
}

// TestResidencyIdleBlocks checks what idle blocks do: they wait for no peer (two ranks whose
// grids of two blocks cannot all be resident at once finish when one block of each is idle,
// and not otherwise), and they let the next kernel launch only by exiting, whatever the rule.
func TestResidencyIdleBlocks(t *testing.T) {
	c := ResidencyConfig{Ranks: 2, Slots: 2, Grids: []int{2, 2}, Kinds: []KernelKind{EntryFirst, EntryFirst}, Idle: []int{1, 1}}
	for seed := range uint64(200) {
		c.Seed = seed
		_, err := Residency(c)
		require.NoError(t, err, "seed %d", seed)
	}
	c.Idle = nil
	_, err := Residency(c)
	require.ErrorIs(t, err, ErrDeadlock, "four blocks that wait on each other in two slots")

	for _, rule := range []TriggerRule{EarlyAlways, EarlyAfterEntry, LateOnly} {
		m := &residency{cfg: ResidencyConfig{Ranks: 1, Slots: 2, Grids: []int{2, 1}, Kinds: []KernelKind{EntryFirst}, Idle: []int{1}, PDL: true, Rule: rule}}
		m.stage = [][][]uint8{{{stagePastPeer, stagePastPeer}, {stagePending}}}
		assert.False(t, m.triggered(0, 0), "rule %v: an idle block past its wait has not triggered", rule)
		assert.False(t, m.waiting(0, 0), "rule %v: no block waits on a peer", rule)
		m.stage[0][0][1] = stageDone
		assert.True(t, m.triggered(0, 0), "rule %v: an idle block triggers by exiting", rule)
		m.stage[0][0] = []uint8{stageEntered, stageDone}
		assert.Equal(t, rule != LateOnly, m.triggered(0, 0), "rule %v: block 0 at its exit barrier", rule)
		assert.True(t, m.waiting(0, 0), "rule %v: block 0 at its exit barrier waits on a peer", rule)
	}
}

// TestResidencyEarlyAfterEntryIsTight checks that EarlyAfterEntry still needs the room for
// SendFirst calls: one block more deadlocks some case, with every call SendFirst and with
// SendFirst calls among EntryFirst ones.
func TestResidencyEarlyAfterEntryIsTight(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, name := range []string{"send first", "mixed"} {
		t.Run(name, func(t *testing.T) {
			for _, c := range residencyCases() {
				c.PDL, c.Rule = true, EarlyAfterEntry
				c.Room++
				c.Kinds = make([]KernelKind, len(c.Grids))
				if name == "mixed" {
					for k := range c.Kinds {
						c.Kinds[k] = KernelKind(rng.IntN(2))
					}
				}
				for seed := range uint64(200) {
					c.Seed = seed
					if _, err := Residency(c); err != nil {
						require.ErrorIs(t, err, ErrDeadlock)
						t.Logf("caught with grids %v, kinds %v, room %d, seed %d: %v", c.Grids, c.Kinds, c.Room, seed, err)
						return
					}
				}
			}
			require.FailNow(t, "the model did not catch SendFirst calls one block over ptx.EarlyTriggerRoom's room deadlocking under EarlyAfterEntry")
		})
	}
}

// TestResidencyNilKindsAreSendFirst checks that a config without kinds runs as one whose
// every call is SendFirst: the same schedule and stats for the same seed.
func TestResidencyNilKindsAreSendFirst(t *testing.T) {
	for _, c := range residencyCases()[:15] {
		c.PDL, c.Rule = true, EarlyWhereRoom
		for seed := range uint64(5) {
			c.Seed = seed
			c.Kinds = nil
			want, err := Residency(c)
			require.NoError(t, err)
			c.Kinds = make([]KernelKind, len(c.Grids)-1)
			got, err := Residency(c)
			require.NoError(t, err)
			require.Equal(t, want, got, "grids %v seed %d", c.Grids, seed)
		}
	}
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
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{1}, Kinds: []KernelKind{EntryFirst, SendFirst}})
	assert.ErrorContains(t, err, "2 kinds for 1 calls")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{1, 1}, Kinds: []KernelKind{EntryFirst, 3}})
	assert.ErrorContains(t, err, "call 1 has kind KernelKind(3)")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{1}, Kinds: []KernelKind{-1}})
	assert.ErrorContains(t, err, "call 0 has kind KernelKind(-1)")
	entry := []KernelKind{EntryFirst, EntryFirst}
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{2}, Kinds: entry[:1], Idle: []int{1, 0}})
	assert.ErrorContains(t, err, "idle blocks for 2 calls, 1 calls")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{2, 2}, Kinds: entry, Idle: []int{0, 2}})
	assert.ErrorContains(t, err, "call 1 has 2 idle blocks of 2: want 0 to 1")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{2, 2}, Kinds: entry, Idle: []int{-1}})
	assert.ErrorContains(t, err, "call 0 has -1 idle blocks of 2")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{1}, Kinds: entry[:1], Idle: []int{1}})
	assert.ErrorContains(t, err, "call 0 has 1 idle blocks of 1: want 0 to 0")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{2, 2}, Kinds: []KernelKind{EntryFirst, SendFirst}, Idle: []int{1, 1}})
	assert.ErrorContains(t, err, "call 1 has 1 idle blocks but is send first")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{2, 2}, Kinds: entry[:1], Idle: []int{0, 1}})
	assert.ErrorContains(t, err, "call 1 has 1 idle blocks but is send first", "a call past Kinds is SendFirst")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{2, 2}, Kinds: []KernelKind{EntryFirst, Local}, Idle: []int{0, 1}})
	assert.ErrorContains(t, err, "call 1 has 1 idle blocks but is local")
	_, err = Residency(ResidencyConfig{Ranks: 2, Slots: 4, Grids: []int{2, 2}, Idle: []int{0, 0}})
	assert.NoError(t, err, "SendFirst calls with no idle blocks")
	assert.Equal(t, "early always", EarlyAlways.String())
	assert.Equal(t, "early after entry", EarlyAfterEntry.String())
	assert.Equal(t, "send first", SendFirst.String())
	assert.Equal(t, "entry first", EntryFirst.String())
}
