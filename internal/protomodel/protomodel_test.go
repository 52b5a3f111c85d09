package protomodel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/ptx"
)

// brokenStall is the watchdog limit for runs expected to deadlock: long
// against the model's millisecond stalls, short enough to retry a few times.
const brokenStall = 250 * time.Millisecond

// attempts bounds the retries of a broken variant. Each variant is caught in
// its first attempt in practice; the retries only absorb unusual scheduling.
const attempts = 10

// nearWrap makes round counters and epochs wrap a few rounds into a run.
const nearWrap = math.MaxUint32 - 5

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// catch runs a broken variant with seeds 1, 2, .. until it fails, and returns
// the failure; a broken protocol that the model never catches fails the test.
func catch(t *testing.T, try func(seed uint64) (Stats, error)) (Stats, error) {
	t.Helper()
	for seed := uint64(1); seed <= attempts; seed++ {
		st, err := try(seed)
		if err != nil {
			t.Logf("caught in attempt %d: %v", seed, err)
			return st, err
		}
	}
	require.FailNow(t, "the model did not catch the broken protocol", "%d attempts", attempts)
	return Stats{}, nil
}

func TestSignalLayout(t *testing.T) {
	// The byte offsets of docs/kernel-abi.md, and no word used twice.
	owner := map[int]string{}
	claim := func(word, wantByte int, name string) {
		if 4*word != wantByte || word >= signalWords || owner[word] != "" {
			require.Failf(t, "bad signal layout", "%s: word %d (byte %d, want %d) of %d, used by %q", name, word, 4*word, wantByte, signalWords, owner[word])
		}
		owner[word] = name
	}
	for b := range MaxBlocks {
		for t := range MaxRanks {
			claim(selfCounterWord(b, t), 4*(16*b+t), fmt.Sprintf("self_counter[%d][%d]", b, t))
			for ph := range 2 {
				claim(peerCounterWord(ph, b, t), 4096+4*(1024*ph+16*b+t), fmt.Sprintf("peer_counter[%d][%d][%d]", ph, b, t))
			}
		}
		claim(pushEpochWord(b), 12288+4*b, fmt.Sprintf("push_epoch[%d]", b))
		for i := range 2 {
			claim(pushPendingWord(b, i), 12544+8*b+4*i, fmt.Sprintf("push_pending[%d][%d]", b, i))
		}
	}
	for i := range 4 {
		claim(callWord(i), 13056+4*i, fmt.Sprintf("call[%d]", i))
	}
}

func TestBarrier(t *testing.T) {
	var configs []BarrierConfig
	for _, v := range []BarrierVariant{TwoPhase, Counting} {
		configs = append(configs, []BarrierConfig{
			{Ranks: 2, Blocks: 1, Rounds: 2000, Start: nearWrap, Variant: v},
			{Ranks: 3, Blocks: 2, Rounds: 500, Variant: v},
			{Ranks: 4, Blocks: 3, Rounds: 300, Start: nearWrap, Variant: v},
			{Ranks: 8, Blocks: 2, Rounds: 200, Start: nearWrap, Variant: v},
			{Ranks: 16, Blocks: 2, Rounds: 100, Start: nearWrap, Variant: v},
			{Ranks: 1, Blocks: 1, Rounds: 10, Variant: v},
		}...)
	}
	for _, c := range configs {
		t.Run(fmt.Sprintf("%v_ws%d_b%d_start%#x", c.Variant, c.Ranks, c.Blocks, c.Start), func(t *testing.T) {
			c.Seed = uint64(c.Ranks)
			st, err := Barrier(testContext(t), c)
			require.NoError(t, err)
			assert.Equal(t, c.Ranks*c.Blocks*c.Rounds, st.Rounds, "every block passed every barrier")
			if c.Ranks > 1 {
				assert.Positive(t, st.Ahead, "no rank ever got a barrier ahead: the schedule did not test two phases")
			}
		})
	}
}

func TestBarrierOnePhaseDeadlocks(t *testing.T) {
	for _, ranks := range []int{2, 4} {
		t.Run(fmt.Sprint("ws", ranks), func(t *testing.T) {
			_, err := catch(t, func(seed uint64) (Stats, error) {
				return Barrier(testContext(t), BarrierConfig{Ranks: ranks, Blocks: 2, Rounds: 2000, Variant: OnePhase, Seed: seed, Stall: brokenStall})
			})
			var dl *DeadlockError
			require.ErrorAs(t, err, &dl)
			assert.ErrorIs(t, err, ErrDeadlock)
			// The cause, not just a hang: a slot holding the next round, which
			// overwrote the round its reader still waits for.
			overwritten := false
			for _, w := range dl.Waits {
				overwritten = overwritten || w.Holds == w.Want+1
			}
			assert.True(t, overwritten, "no wait shows an overwritten round: %v", dl.Waits)
		})
	}
}

// TestBarrierCountingEqualDeadlocks: counting arrivals but waiting for exactly round misses a
// peer that is already one barrier ahead.
func TestBarrierCountingEqualDeadlocks(t *testing.T) {
	_, err := catch(t, func(seed uint64) (Stats, error) {
		return Barrier(testContext(t), BarrierConfig{Ranks: 3, Blocks: 2, Rounds: 2000, Variant: CountingEqual, Seed: seed, Stall: brokenStall})
	})
	var dl *DeadlockError
	require.ErrorAs(t, err, &dl)
	ahead := false
	for _, w := range dl.Waits {
		ahead = ahead || w.Holds == w.Want+1
	}
	assert.True(t, ahead, "no wait shows a peer one barrier ahead: %v", dl.Waits)
}

func TestBarrierGreaterOrEqualPassesEarly(t *testing.T) {
	_, err := catch(t, func(seed uint64) (Stats, error) {
		return Barrier(testContext(t), BarrierConfig{Ranks: 3, Blocks: 4, Rounds: 200, Variant: GreaterOrEqual, Start: nearWrap, Seed: seed, Stall: brokenStall})
	})
	require.ErrorIs(t, err, ErrEarlyPass)

	// Without a wrap, >= is as good as != here: the failure is the wrap's.
	st, err := Barrier(testContext(t), BarrierConfig{Ranks: 3, Blocks: 2, Rounds: 200, Variant: GreaterOrEqual, Seed: 1})
	require.NoError(t, err)
	assert.Equal(t, 3*2*200, st.Rounds)
}

func TestPush(t *testing.T) {
	for _, c := range []PushConfig{
		{Ranks: 2, Blocks: 2, Threads: 4, Elems: 64, Rounds: 200, Start: 1},
		{Ranks: 3, Blocks: 3, Threads: 5, Elems: 36, Rounds: 150}, // uneven grid-stride shares
		{Ranks: 8, Blocks: 2, Threads: 4, Elems: 32, Rounds: 60, Start: 1},
		{Ranks: 16, Blocks: 1, Threads: 4, Elems: 16, Rounds: 20},
		{Ranks: 2, Blocks: 2, Threads: 4, Elems: 64, Rounds: 200, Variant: Deferred, Start: 2},
		{Ranks: 3, Blocks: 3, Threads: 5, Elems: 36, Rounds: 150, Variant: Deferred},
		{Ranks: 8, Blocks: 2, Threads: 4, Elems: 32, Rounds: 60, Variant: Deferred, Start: 1},
		{Ranks: 16, Blocks: 1, Threads: 4, Elems: 16, Rounds: 20, Variant: Deferred},
	} {
		t.Run(fmt.Sprintf("%v_ws%d_b%d_n%d", c.Variant, c.Ranks, c.Blocks, c.Elems), func(t *testing.T) {
			c.Seed = uint64(c.Ranks)
			st, err := Push(testContext(t), c)
			require.NoError(t, err)
			assert.Equal(t, c.Ranks*c.Blocks*c.Rounds, st.Rounds)
			assert.Positive(t, st.Ahead, "no rank ever got a call ahead: the schedule did not test the parts")
		})
	}
}

// TestPushPartsMatchKernels: the modelled protocols use the kernels' receive parts.
func TestPushPartsMatchKernels(t *testing.T) {
	assert.Equal(t, ptx.PushParts(ptx.DeferRearmMinRanks-1), Immediate.parts())
	assert.Equal(t, ptx.PushParts(ptx.DeferRearmMinRanks), Deferred.parts())
}

// TestPushBrokenCaught: one part for every call, and the deferred re-arm with two parts (a peer
// writes the part the deferred re-arm zeroes in the very next call), must both be caught.
func TestPushBrokenCaught(t *testing.T) {
	for _, v := range []PushVariant{OneHalf, DeferredTwoParts} {
		for _, ranks := range []int{2, 3} {
			t.Run(fmt.Sprintf("%v_ws%d", v, ranks), func(t *testing.T) {
				_, err := catch(t, func(seed uint64) (Stats, error) {
					return Push(testContext(t), PushConfig{Ranks: ranks, Blocks: 2, Threads: 4, Elems: 64, Rounds: 300, Variant: v, Seed: seed, Stall: brokenStall})
				})
				assert.True(t, errors.Is(err, ErrWrongSum) || errors.Is(err, ErrDeadlock), "caught by something else: %v", err)
			})
		}
	}
}

func TestOneShotExitBarrier(t *testing.T) {
	st, err := OneShot(testContext(t), OneShotConfig{Ranks: 4, Blocks: 2, Threads: 4, Elems: 64, Rounds: 150, ExitBarrier: true, Seed: 1})
	require.NoError(t, err)
	assert.Equal(t, 4*2*150, st.Rounds)
	assert.Zero(t, st.Ahead, "with the exit barrier no copy may start while a peer still reads")

	st, err = catch(t, func(seed uint64) (Stats, error) {
		return OneShot(testContext(t), OneShotConfig{Ranks: 4, Blocks: 2, Threads: 4, Elems: 64, Rounds: 150, Seed: seed, Stall: brokenStall})
	})
	require.ErrorIs(t, err, ErrStaleRead)
	assert.Positive(t, st.Ahead)
}

// TestOneShotSplitExit runs the exit barrier in two halves, as the fused one-shot's row-cache
// build does (a block arrives after its reads and waits after work of its own), over both
// barriers, with the input copied before the kernel or staged by it: no call may write its
// input while a peer still reads the previous one. Arriving before the last reads must be
// caught reading another call's data.
func TestOneShotSplitExit(t *testing.T) {
	for _, v := range []BarrierVariant{TwoPhase, Counting} {
		for _, stage := range []StageVariant{HostCopy, KernelStaged} {
			t.Run(fmt.Sprintf("%v_%v", v, stage), func(t *testing.T) {
				c := OneShotConfig{Ranks: 4, Blocks: 2, Threads: 6, Elems: 64, Rounds: 150, ExitBarrier: true, SplitExit: true,
					Stage: stage, Barrier: v, Seed: 7}
				st, err := OneShot(testContext(t), c)
				require.NoError(t, err)
				assert.Equal(t, c.Ranks*c.Blocks*c.Rounds, st.Rounds)
				assert.Zero(t, st.Ahead, "with the exit barrier's arrivals after the reads no call may write while a peer still reads")
			})
			t.Run(fmt.Sprintf("%v_%v_early", v, stage), func(t *testing.T) {
				st, err := catch(t, func(seed uint64) (Stats, error) {
					return OneShot(testContext(t), OneShotConfig{Ranks: 4, Blocks: 2, Threads: 6, Elems: 64, Rounds: 150,
						ExitBarrier: true, SplitExit: true, SplitEarly: true, Stage: stage, Barrier: v, Seed: seed, Stall: brokenStall})
				})
				require.ErrorIs(t, err, ErrStaleRead)
				assert.Positive(t, st.Ahead)
			})
		}
	}
}

// TestOneShotStaging runs the one-shot kernel that stages its own input (ptx.FlagStageInput)
// over both barriers: its copies, weak stores that land late, are released by the lanes'
// fences after the copy's bar.sync and acquired by the peers' polls, so no block ever reads
// another call's data, and with the exit barrier no call stages while a peer still reads the
// previous one. Without the exit barrier the next call's copies overwrite what a slow peer
// still reads.
func TestOneShotStaging(t *testing.T) {
	for _, v := range []BarrierVariant{TwoPhase, Counting} {
		for _, c := range []OneShotConfig{
			{Ranks: 4, Blocks: 2, Threads: 6, Elems: 64, Rounds: 120},
			{Ranks: 3, Blocks: 3, Threads: 5, Elems: 37, Rounds: 120}, // uneven grid-stride shares
			{Ranks: 8, Blocks: 2, Threads: 9, Elems: 40, Rounds: 40},
		} {
			t.Run(fmt.Sprintf("%v_ws%d_b%d", v, c.Ranks, c.Blocks), func(t *testing.T) {
				c.Barrier, c.Stage, c.ExitBarrier, c.Seed = v, KernelStaged, true, uint64(c.Ranks)
				st, err := OneShot(testContext(t), c)
				require.NoError(t, err)
				assert.Equal(t, c.Ranks*c.Blocks*c.Rounds, st.Rounds)
				assert.Zero(t, st.Ahead, "with the exit barrier no call may stage while a peer still reads")
				assert.Positive(t, st.Released, "no fence found a copy still pending: the schedule did not test the release")
			})
		}
		t.Run(fmt.Sprintf("%v_no_exit_barrier", v), func(t *testing.T) {
			st, err := catch(t, func(seed uint64) (Stats, error) {
				return OneShot(testContext(t), OneShotConfig{Ranks: 4, Blocks: 2, Threads: 4, Elems: 64, Rounds: 150,
					Stage: KernelStaged, Barrier: v, Seed: seed, Stall: brokenStall})
			})
			require.ErrorIs(t, err, ErrStaleRead)
			assert.Positive(t, st.Ahead)
		})
	}
}

// TestOneShotRegions runs the one-shot without an exit barrier over regions per block in two
// halves that the parity of the block's entry round picks (BlockParity), with a fixed grid
// and with grids that change from call to call: no block ever reads another call's data,
// although calls stage while a slow peer still reads the one before. One half per block, or
// halves indexed by element where grids change, must be caught reading another call's data;
// with a fixed grid every block's round has the same parity, so halves by element hold.
func TestOneShotRegions(t *testing.T) {
	for _, v := range []BarrierVariant{TwoPhase, Counting} {
		for _, c := range []OneShotConfig{
			{Ranks: 4, Blocks: 3, Threads: 4, Elems: 64, Rounds: 150, VaryGrid: true},
			{Ranks: 3, Blocks: 4, Threads: 5, Elems: 37, Rounds: 150, VaryGrid: true}, // uneven shares
			{Ranks: 4, Blocks: 2, Threads: 4, Elems: 64, Rounds: 150},
			{Ranks: 8, Blocks: 2, Threads: 3, Elems: 40, Rounds: 60, VaryGrid: true},
		} {
			t.Run(fmt.Sprintf("%v_ws%d_b%d_vary%v", v, c.Ranks, c.Blocks, c.VaryGrid), func(t *testing.T) {
				c.Barrier, c.Stage, c.Regions, c.Seed = v, KernelStaged, BlockParity, uint64(c.Ranks)
				st, err := OneShot(testContext(t), c)
				require.NoError(t, err)
				assert.Positive(t, st.Ahead, "no call staged while a peer still read the one before: the schedule did not test the halves")
				assert.Positive(t, st.Released, "no fence found a copy still pending: the schedule did not test the release")
			})
		}
		t.Run(fmt.Sprintf("%v_elem_parity_fixed_grid", v), func(t *testing.T) {
			_, err := OneShot(testContext(t), OneShotConfig{Ranks: 4, Blocks: 3, Threads: 4, Elems: 64, Rounds: 150,
				Stage: KernelStaged, Regions: ElemParity, Barrier: v, Seed: 5})
			require.NoError(t, err)
		})
		for _, broken := range []struct {
			regions RegionLayout
			vary    bool
		}{{BlockRegionsOnly, false}, {ElemParity, true}} {
			t.Run(fmt.Sprintf("%v_%v", v, broken.regions), func(t *testing.T) {
				st, err := catch(t, func(seed uint64) (Stats, error) {
					return OneShot(testContext(t), OneShotConfig{Ranks: 4, Blocks: 3, Threads: 4, Elems: 64, Rounds: 150,
						Stage: KernelStaged, Regions: broken.regions, VaryGrid: broken.vary, Barrier: v, Seed: seed, Stall: brokenStall})
				})
				require.ErrorIs(t, err, ErrStaleRead)
				assert.Positive(t, st.Ahead)
			})
		}
	}
}

// TestOneShotStagingBrokenCaught: the staging without the fence before the flags, with fences
// but without the bar.sync that makes them release the whole block's copies, with polls that
// do not acquire, with the copy after the barrier, or with a block copying another block's
// elements, must each be caught reading another call's data.
func TestOneShotStagingBrokenCaught(t *testing.T) {
	for _, stage := range []StageVariant{StagedNoRelease, StagedNoBarSync, StagedNoAcquire, StagedAfterBarrier, StagedOtherBlock} {
		for _, v := range []BarrierVariant{TwoPhase, Counting} {
			t.Run(fmt.Sprintf("%v_%v", stage, v), func(t *testing.T) {
				_, err := catch(t, func(seed uint64) (Stats, error) {
					// more threads than ranks: lanes are only some of the block's threads
					return OneShot(testContext(t), OneShotConfig{Ranks: 3, Blocks: 2, Threads: 6, Elems: 48, Rounds: 200,
						ExitBarrier: true, Stage: stage, Barrier: v, Seed: seed, Stall: brokenStall})
				})
				require.ErrorIs(t, err, ErrStaleRead)
				assert.Contains(t, err.Error(), stage.String())
			})
		}
	}
}

// TestWatchdogReportsWaits stops a run whose peer never arrives: ws 2, but
// only rank 0 takes part, as when a peer never launches.
func TestWatchdogReportsWaits(t *testing.T) {
	r := newRun(50 * time.Millisecond)
	m := &barrier{sig: newSignals(2), variant: TwoPhase, run: r}
	end := r.watch(context.Background())
	start := time.Now()
	_, ok := m.wait(0, 3, newJitter(1, 0, 3))
	end()
	assert.False(t, ok)
	assert.Less(t, time.Since(start), 2*time.Second)
	_, err := r.result()
	var dl *DeadlockError
	require.ErrorAs(t, err, &dl)
	require.Equal(t, []Wait{{Rank: 0, Block: 3, Peer: 1, Slot: "peer_counter[1][3][1]", Want: 1, Holds: 0}}, dl.Waits)
	assert.Contains(t, err.Error(), "rank 0 block 3 waits for rank 1: peer_counter[1][3][1] holds 0x0, wants 0x1")
}

func TestContextEndsRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	// A deadlocking variant with a watchdog too slow to notice: only the
	// context can end it.
	_, err := Barrier(ctx, BarrierConfig{Ranks: 2, Blocks: 1, Rounds: 1 << 20, Variant: OnePhase, Stall: time.Hour})
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestConfigErrors(t *testing.T) {
	ctx := testContext(t)
	_, err := Barrier(ctx, BarrierConfig{Ranks: 17, Blocks: 1})
	assert.ErrorContains(t, err, "17 ranks")
	_, err = Barrier(ctx, BarrierConfig{Ranks: 2, Blocks: 65})
	assert.ErrorContains(t, err, "65 blocks")
	_, err = Barrier(ctx, BarrierConfig{Ranks: 2, Blocks: 1, Rounds: -1})
	assert.ErrorContains(t, err, "-1 rounds")
	_, err = Push(ctx, PushConfig{Ranks: 2, Blocks: 1, Threads: 1, Elems: 4, Rounds: 1, Start: 2})
	assert.ErrorContains(t, err, "start part 2")
	_, err = Push(ctx, PushConfig{Ranks: 2, Blocks: 1, Threads: 1, Rounds: 1})
	assert.ErrorContains(t, err, "0 elements")
	_, err = Push(ctx, PushConfig{Ranks: 2, Blocks: 1, Elems: 4})
	assert.ErrorContains(t, err, "0 threads")
	_, err = OneShot(ctx, OneShotConfig{Ranks: 0, Blocks: 1, Threads: 1})
	assert.ErrorContains(t, err, "0 ranks")
	_, err = OneShot(ctx, OneShotConfig{Ranks: 2, Blocks: 1, Threads: 1, Stage: StagedOtherBlock + 1})
	assert.ErrorContains(t, err, "unknown stage variant")
	_, err = OneShot(ctx, OneShotConfig{Ranks: 2, Blocks: 1, Threads: 1, Barrier: OnePhase})
	assert.ErrorContains(t, err, "one-phase")
	_, err = OneShot(ctx, OneShotConfig{Ranks: 2, Blocks: 1, Threads: 1, Regions: BlockParity})
	assert.ErrorContains(t, err, "the kernel's own staging")
	_, err = OneShot(ctx, OneShotConfig{Ranks: 2, Blocks: 1, Threads: 1, Stage: KernelStaged, Regions: ElemParity + 1})
	assert.ErrorContains(t, err, "unknown region layout")
	_, err = OneShot(ctx, OneShotConfig{Ranks: 2, Blocks: 1, Threads: 1, SplitExit: true})
	assert.ErrorContains(t, err, "SplitExit splits the exit barrier")
	_, err = OneShot(ctx, OneShotConfig{Ranks: 2, Blocks: 1, Threads: 1, ExitBarrier: true, SplitEarly: true})
	assert.ErrorContains(t, err, "SplitEarly is a SplitExit")
	assert.Equal(t, []string{"host-copy", "kernel-staged", "staged-no-release", "staged-no-bar-sync", "staged-no-acquire", "staged-after-barrier", "staged-other-block", "StageVariant(9)"},
		[]string{HostCopy.String(), KernelStaged.String(), StagedNoRelease.String(), StagedNoBarSync.String(), StagedNoAcquire.String(), StagedAfterBarrier.String(), StagedOtherBlock.String(), StageVariant(9).String()})
	assert.Equal(t, []string{"shared-buffer", "block-parity", "block-regions-only", "elem-parity", "RegionLayout(4)"},
		[]string{SharedBuffer.String(), BlockParity.String(), BlockRegionsOnly.String(), ElemParity.String(), RegionLayout(4).String()})
	assert.Equal(t, []string{"none", "checked", "untagged", "late", "halves", "one-set", "CallVariant(6)"},
		[]string{NoCallCheck.String(), CallChecked.String(), CallUntagged.String(), CallLate.String(), CallHalves.String(), CallOneSet.String(), CallVariant(6).String()})
}

// TestCallCheck runs the kernels' call check over both barriers, and the check a one-shot
// without an exit barrier would need (CallHalves: every barrier a call's entry, the words in
// the set the round's parity picks): ranks that make the same call are never reported, and
// every rank pair whose calls differ is reported by both ranks in block 0 (and in no other
// block), also when the round numbers wrap; and the schedule really made checks meet a peer's
// call before it was visible.
func TestCallCheck(t *testing.T) {
	for _, calls := range []CallVariant{CallChecked, CallHalves} {
		for _, v := range []BarrierVariant{TwoPhase, Counting} {
			for _, c := range []BarrierConfig{
				{Ranks: 2, Blocks: 2, Rounds: 400, Mismatches: []int{3, 50, 51, 150}},
				{Ranks: 3, Blocks: 2, Rounds: 300, Start: nearWrap, Mismatches: []int{0, 1, 2, 40}},
				{Ranks: 4, Blocks: 2, Rounds: 200, Start: 0x1FFF0},
				{Ranks: 8, Blocks: 1, Rounds: 120, Start: nearWrap, Mismatches: []int{7, 8, 9}},
			} {
				t.Run(fmt.Sprintf("%v_%v_ws%d_b%d_start%#x", calls, v, c.Ranks, c.Blocks, c.Start), func(t *testing.T) {
					c.Variant, c.Calls, c.Seed = v, calls, uint64(c.Ranks)
					st, err := Barrier(testContext(t), c)
					require.NoError(t, err)
					assert.Equal(t, c.Ranks*c.Blocks*c.Rounds, st.Rounds)
					assert.Positive(t, st.Unpublished, "no check met a call that was not visible yet: the schedule did not test the reload")
					assert.Positive(t, st.Ahead)
				})
			}
		}
	}
}

// TestCallCheckBrokenCaught: words without the round's tag make a peer's previous call count
// as its call (a false mismatch); a check after the lane's next arrival may meet the peer's
// next call and never find this round's (a deadlock); without an exit barrier, one set of
// words lets a peer's next call land over the one a lane has not loaded yet (a deadlock, or a
// report of the wrong call).
func TestCallCheckBrokenCaught(t *testing.T) {
	for _, v := range []BarrierVariant{TwoPhase, Counting} {
		t.Run(fmt.Sprintf("one_set_%v", v), func(t *testing.T) {
			_, err := catch(t, func(seed uint64) (Stats, error) {
				return Barrier(testContext(t), BarrierConfig{Ranks: 3, Blocks: 2, Rounds: 600, Variant: v, Calls: CallOneSet,
					Mismatches: []int{5, 6, 100}, Seed: seed, Stall: brokenStall})
			})
			var dl *DeadlockError
			if !errors.As(err, &dl) {
				require.ErrorIs(t, err, ErrFalseMismatch)
			}
		})
		t.Run(fmt.Sprintf("untagged_%v", v), func(t *testing.T) {
			_, err := catch(t, func(seed uint64) (Stats, error) {
				// from a history of calls (Start): the stale words are a previous call's
				return Barrier(testContext(t), BarrierConfig{Ranks: 3, Blocks: 2, Rounds: 300, Start: 0x100, Variant: v, Calls: CallUntagged, Seed: seed, Stall: brokenStall})
			})
			require.ErrorIs(t, err, ErrFalseMismatch)
		})
		t.Run(fmt.Sprintf("late_%v", v), func(t *testing.T) {
			_, err := catch(t, func(seed uint64) (Stats, error) {
				return Barrier(testContext(t), BarrierConfig{Ranks: 3, Blocks: 2, Rounds: 600, Variant: v, Calls: CallLate, Seed: seed, Stall: brokenStall})
			})
			var dl *DeadlockError
			require.ErrorAs(t, err, &dl)
			stuck := false
			for _, w := range dl.Waits {
				stuck = stuck || strings.HasPrefix(w.Slot, "call of rank")
			}
			assert.True(t, stuck, "no call check among the waits: %v", dl.Waits)
		})
	}
}

// TestPushCallHeaders: the push call headers (block 0's), re-armed in the call that read
// them also where the data's re-arm is deferred, never report equal calls and report every
// differing pair once; never re-armed, a part's next use finds an earlier call's header.
func TestPushCallHeaders(t *testing.T) {
	for _, v := range []PushVariant{Immediate, Deferred} {
		for _, ranks := range []int{2, 3, 8} {
			t.Run(fmt.Sprintf("%v_ws%d", v, ranks), func(t *testing.T) {
				c := PushConfig{Ranks: ranks, Blocks: 2, Threads: 4, Elems: 32, Rounds: 120, Variant: v, Seed: uint64(ranks), Mismatches: []int{0, 5, 6, 50}}
				st, err := Push(testContext(t), c)
				require.NoError(t, err)
				assert.Equal(t, c.Ranks*c.Blocks*c.Rounds, st.Rounds)
				assert.Positive(t, st.Ahead)
			})
		}
		t.Run(fmt.Sprintf("%v_not_rearmed", v), func(t *testing.T) {
			_, err := Push(testContext(t), PushConfig{Ranks: 3, Blocks: 2, Threads: 4, Elems: 32, Rounds: 20, Variant: v, Headers: HeadersNotRearmed, Seed: 1, Stall: brokenStall})
			require.ErrorIs(t, err, ErrFalseMismatch)
		})
	}
}

// TestPushFused interleaves plain and fused push calls on one set of receive buffers, parts
// and call headers: the fused calls receive row by row (rows spread over several blocks where
// they are few), a mapping other than their send's, never defer their re-arm, and do the
// re-arm a plain call before them deferred. No sum may be wrong and nothing may hang.
func TestPushFused(t *testing.T) {
	for _, v := range []PushVariant{Immediate, Deferred} {
		for _, c := range []PushConfig{
			{Ranks: 2, Blocks: 4, Threads: 4, Elems: 48, Rounds: 200, Start: 1},
			{Ranks: 3, Blocks: 5, Threads: 3, Elems: 40, Rounds: 150},
			{Ranks: 8, Blocks: 4, Threads: 4, Elems: 32, Rounds: 60, Start: 1},
		} {
			t.Run(fmt.Sprintf("%v_ws%d_b%d", v, c.Ranks, c.Blocks), func(t *testing.T) {
				c.Variant, c.Fused, c.Seed = v, true, uint64(c.Ranks)
				st, err := Push(testContext(t), c)
				require.NoError(t, err)
				assert.Equal(t, c.Ranks*c.Blocks*c.Rounds, st.Rounds)
				assert.Positive(t, st.Ahead)
			})
		}
	}
}

// TestFusedElemsCover: a fused push call's receive mapping takes every element of every row
// exactly once, with rows spread over pieces blocks and with one block taking several rows.
func TestFusedElemsCover(t *testing.T) {
	for _, c := range []struct {
		blocks int
		call   pushCall
	}{
		{4, pushCall{elems: 2 * 10, threads: 3, hvec: 10, pieces: 2}},
		{3, pushCall{elems: 7 * 5, threads: 2, hvec: 5, pieces: 1}},
		{8, pushCall{elems: 1 * 33, threads: 4, hvec: 33, pieces: 8}},
	} {
		seen := make([]int, c.call.elems)
		for b := range c.blocks {
			for th := range c.call.threads {
				for _, i := range fusedElems(b, th, c.blocks, c.call) {
					seen[i]++
				}
			}
		}
		for i, n := range seen {
			assert.Equal(t, 1, n, "%+v: element %d", c, i)
		}
	}
}
