package collective

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/gputest"
	"github.com/goccl/goccl/ptx"
)

// requireGPUHere is the external tests' requireGPU for the internal ones.
func requireGPUHere(tb testing.TB) { gputest.Require(tb) }

// BenchmarkAllReduceLaunchOnly is the baseline of BenchmarkAllReduceHost (in the external
// tests): the same kernel, launched with the same arguments on the same two virtual ranks'
// streams, through driver.Launch alone. The difference between the two is what AllReduce
// itself costs above the driver launch (lock, checks, argument packing).
func BenchmarkAllReduceLaunchOnly(b *testing.B) {
	requireGPUHere(b)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms, err := NewGroup(ctx, []int{0, 0}, Options{Algorithm: Push})
	if err != nil {
		b.Fatal(err)
	}
	const count = 8 << 10 // 16 KiB of bf16, as BenchmarkAllReduceHost
	streams := make([]*driver.Stream, len(comms))
	bufs := make([]driver.DevicePtr, len(comms))
	for r, c := range comms {
		if streams[r], err = c.Context().NewStream(); err != nil {
			b.Fatal(err)
		}
		if bufs[r], err = c.Context().Alloc(2 * count); err != nil {
			b.Fatal(err)
		}
	}
	// wait bounds every wait for the GPU: a stuck kernel fails the benchmark, never hangs it.
	wait := func() {
		wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, s := range streams {
			if err := s.Wait(wctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	defer func() {
		wait()
		for r, c := range comms {
			streams[r].Close()
			c.Context().Free(bufs[r])
			c.Close()
		}
	}()
	// One real call per rank packs the arguments; the loop relaunches them as they are.
	for r, c := range comms {
		if err := c.AllReduce(streams[r], bufs[r], bufs[r], count, dtype.BFloat16); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		for r, c := range comms {
			if err := driver.Launch(streams[r], c.kernels.fn[c.scope][Push][dtype.BFloat16], &c.cfg, &c.args); err != nil {
				b.Fatal(err)
			}
		}
		if i%64 == 63 {
			b.StopTimer()
			wait()
			b.StartTimer()
		}
	}
	b.StopTimer()
	wait()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/call")
	for _, c := range comms {
		if err := c.Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBarrierScope checks which kernels a communicator launches: ranks that all run on one
// GPU get GPU-scope barriers unless Options.SystemScope asks otherwise; system-scope barriers
// count arrivals there (one GPU has native atomics on its own memory) unless
// Options.FlagBarriers asks for round-number flags.
func TestBarrierScope(t *testing.T) {
	requireGPUHere(t)
	for _, o := range []struct {
		opts Options
		want ptx.Scope
	}{
		{Options{}, ptx.ScopeGPU},
		{Options{SystemScope: true}, ptx.ScopeSystemCounted},
		{Options{SystemScope: true, FlagBarriers: true}, ptx.ScopeSystem},
		{Options{FlagBarriers: true}, ptx.ScopeGPU},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		comms, err := NewGroup(ctx, []int{0, 0, 0}, o.opts)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("SystemScope=%v FlagBarriers=%v", o.opts.SystemScope, o.opts.FlagBarriers)
		for _, c := range comms {
			if c.scope != o.want {
				t.Errorf("%s: rank %d uses %v barriers, want %v", name, c.rank, c.scope, o.want)
			}
			// PDL is safe with every rank on one GPU, whatever the scope (FlagEarlyTrigger)
			if wantPDL := c.major >= 9 && driver.Has(driver.FeatureLaunchEx); c.pdl != wantPDL {
				t.Errorf("%s: rank %d on sm_%d0: PDL %v, want %v", name, c.rank, c.major, c.pdl, wantPDL)
			}
			// ranks sharing the GPU: the pull kernels trigger early at their whole grid, push
			// within the room (ptx.EarlyTriggerAnyGrid, ptx.EarlyTriggerRoom)
			if !c.earlyTrigger(ptx.OneShot, c.blocks) || !c.earlyTrigger(ptx.TwoShot, c.blocks) {
				t.Errorf("%s: rank %d: the pull kernels' grid of %d blocks does not trigger early", name, c.rank, c.blocks)
			}
			if got, want := c.earlyTrigger(ptx.Push, c.pushBlocks), c.pushBlocks <= c.earlyRoom; got != want {
				t.Errorf("%s: rank %d: push's %d blocks trigger early: %v, want %v (room %d)", name, c.rank, c.pushBlocks, got, want, c.earlyRoom)
			}
			// the pull kernels' early trigger comes right after their entry barrier where few
			// enough ranks share the GPU
			if want := c.ranksOnGPU <= entryTriggerMaxRanksOnGPU; c.ranksOnGPU != 3 || c.entryTrigger != want {
				t.Errorf("%s: rank %d: %d ranks on the GPU, entry trigger %v: want 3 ranks and %v", name, c.rank, c.ranksOnGPU, c.entryTrigger, want)
			}
			// the barrier kernels follow the scope; push has no barrier and one kernel for all
			for algo, scope := range map[ptx.Algorithm]ptx.Scope{ptx.OneShot: o.want, ptx.TwoShot: o.want, ptx.Push: ptx.ScopeSystem} {
				spec := ptx.Spec{Algo: algo, DType: dtype.BFloat16, WorldSize: 3, Scope: scope}
				if got := c.kernels.fn[c.scope][algo][dtype.BFloat16].Name(); got != spec.EntryName() {
					t.Errorf("%s: rank %d launches %s for %v, want %s", name, c.rank, got, algo, spec.EntryName())
				}
			}
			if err := c.Close(); err != nil {
				t.Error(err)
			}
		}
	}
}

// TestEarlyTrigger: which launches carry ptx.FlagEarlyTrigger where ranks share a GPU: the
// kernels that trigger after their entry barrier at any grid, push within the room alone; with
// the room rule alone (as benchmarks set it), every kernel within the room.
func TestEarlyTrigger(t *testing.T) {
	c := &Comm{earlyRoom: 16, earlyAnyGrid: true}
	for _, k := range []ptx.Algorithm{ptx.OneShot, ptx.TwoShot, ptx.Columns} {
		assert.True(t, c.earlyTrigger(k, ptx.MaxBlocks), k.String())
		assert.True(t, c.earlyTrigger(k, 1), k.String())
	}
	assert.True(t, c.earlyTrigger(ptx.Push, 16))
	assert.False(t, c.earlyTrigger(ptx.Push, 17))
	c.earlyAnyGrid = false
	assert.True(t, c.earlyTrigger(ptx.OneShot, 16))
	assert.False(t, c.earlyTrigger(ptx.OneShot, 17))
	c.earlyRoom = 0
	assert.False(t, c.earlyTrigger(ptx.TwoShot, 1))
}

// TestTriggerFlags: the PDL bits of p_flags. FlagEntryTrigger comes only with
// FlagEarlyTrigger, only where the communicator chose it, and never on push, which has no
// entry barrier.
func TestTriggerFlags(t *testing.T) {
	c := &Comm{earlyRoom: 16, earlyAnyGrid: true, entryTrigger: true}
	both := uint32(ptx.FlagEarlyTrigger | ptx.FlagEntryTrigger)
	for _, k := range []ptx.Algorithm{ptx.OneShot, ptx.TwoShot, ptx.Columns} {
		assert.Equal(t, both, c.triggerFlags(k, ptx.MaxBlocks), k.String())
	}
	assert.Equal(t, uint32(ptx.FlagEarlyTrigger), c.triggerFlags(ptx.Push, 16))
	assert.Zero(t, c.triggerFlags(ptx.Push, 17))
	c.entryTrigger = false
	assert.Equal(t, uint32(ptx.FlagEarlyTrigger), c.triggerFlags(ptx.OneShot, ptx.MaxBlocks))
	c.entryTrigger, c.earlyAnyGrid, c.earlyRoom = true, false, 0
	assert.Zero(t, c.triggerFlags(ptx.TwoShot, 1), "no early trigger, no entry trigger")
}

// TestBarrierScopeChoice: the scope the ranks' facts and options give, without a GPU.
func TestBarrierScopeChoice(t *testing.T) {
	for _, c := range []struct {
		oneGPU, atomics bool
		opts            Options
		want            ptx.Scope
	}{
		{true, true, Options{}, ptx.ScopeGPU},
		{true, true, Options{FlagBarriers: true}, ptx.ScopeGPU},
		{true, true, Options{SystemScope: true}, ptx.ScopeSystemCounted},
		{true, true, Options{SystemScope: true, FlagBarriers: true}, ptx.ScopeSystem},
		{false, true, Options{}, ptx.ScopeSystemCounted},
		{false, true, Options{FlagBarriers: true}, ptx.ScopeSystem},
		{false, false, Options{}, ptx.ScopeSystem},
		{false, false, Options{SystemScope: true}, ptx.ScopeSystem},
	} {
		assert.Equal(t, c.want, barrierScope(c.oneGPU, c.atomics, c.opts), "%+v", c)
	}
}

// TestPeerAtomics: every ordered pair of distinct GPUs must have native atomics; a question
// the driver cannot answer counts as no.
func TestPeerAtomics(t *testing.T) {
	nvlink := func(from, to int) (bool, error) { return true, nil }
	assert.True(t, peerAtomics([]int{0, 1, 2, 3}, nvlink))
	assert.True(t, peerAtomics([]int{2, 2, 2}, func(int, int) (bool, error) { return false, errors.New("not asked") }), "one GPU: nothing to ask")
	oneWay := func(from, to int) (bool, error) { return from < to, nil }
	assert.False(t, peerAtomics([]int{0, 1}, oneWay))
	var asked [][2]int
	failing := func(from, to int) (bool, error) {
		asked = append(asked, [2]int{from, to})
		return true, errors.New("driver refused")
	}
	assert.False(t, peerAtomics([]int{0, 0, 1}, failing))
	assert.Equal(t, [][2]int{{0, 1}}, asked, "the first failure decides")
}

// TestTopologyVerdictReachesEveryRank: in New across processes, rank 0 checks every rank's
// GPU and every rank ends as it does: eligible (with rank 0's answer about atomics), not
// eligible (ErrNotEligible everywhere, so that every rank may hand the work to NCCL), or a
// check that failed (an error everywhere, never taken for ErrNotEligible by the peers while
// rank 0 fails New).
func TestTopologyVerdictReachesEveryRank(t *testing.T) {
	for _, tc := range []struct {
		name        string
		atomics     bool
		verdict     error
		notEligible bool
		want        string
	}{
		{"eligible", true, nil, false, ""},
		{"not eligible", false, fmt.Errorf("%w: GPU 0 and GPU 1 have no NVLink", ErrNotEligible), true, "no NVLink"},
		{"check failed", false, errors.New("discover the GPUs' links: NVML refused"), false, "NVML refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size = 3
			boots, err := bootstrap.NewInProcess(size)
			require.NoError(t, err)
			infos := make([]rankInfo, size)
			for r := range infos {
				infos[r].Process = uint64(100 + r) // a process and a GPU each
				infos[r].UUID[0] = byte(r + 1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			atomics := make([]bool, size)
			errs := make([]error, size)
			done := make(chan struct{})
			for r := range size {
				go func() {
					defer func() { done <- struct{}{} }()
					defer boots[r].Close()
					c := &Comm{rank: r, size: size, boot: boots[r]}
					c.judgeOverride = func(context.Context, []rankInfo) (bool, error) {
						assert.Zero(t, r, "only rank 0 judges")
						return tc.atomics, tc.verdict
					}
					atomics[r], errs[r] = c.checkPeerTopology(ctx, infos)
				}()
			}
			for range size {
				<-done
			}
			for r := range size {
				assert.Equal(t, tc.atomics, atomics[r], "rank %d", r)
				if tc.want == "" {
					assert.NoError(t, errs[r], "rank %d", r)
					continue
				}
				require.Error(t, errs[r], "rank %d", r)
				assert.ErrorContains(t, errs[r], tc.want, "rank %d", r)
				assert.Equal(t, tc.notEligible, errors.Is(errs[r], ErrNotEligible), "rank %d: %v", r, errs[r])
			}
		})
	}
}

// spinPTX holds a kernel that runs for p_ns nanoseconds of %globaltimer: another part of the
// program keeping the GPU busy.
const spinPTX = `
.version 7.8
.target sm_80
.address_size 64
.visible .entry spin(.param .u64 p_ns)
{
	.reg .b64 %start, %now, %ns;
	.reg .pred %p;
	ld.param.u64 %ns, [p_ns];
	mov.u64 %start, %globaltimer;
LOOP:
	mov.u64 %now, %globaltimer;
	sub.u64 %now, %now, %start;
	setp.lt.u64 %p, %now, %ns;
	@%p bra LOOP;
	ret;
}
`

// TestDrainWaitsForOwnWorkOnly: Close waits for this communicator's queued work, not for
// the rest of the context's: a service's long kernel on the same GPU does not hold it up.
func TestDrainWaitsForOwnWorkOnly(t *testing.T) {
	requireGPUHere(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms, err := NewGroup(ctx, []int{0, 0}, Options{Timeout: 5 * time.Second})
	require.NoError(t, err)
	// The test's own reference to the context: the communicators release theirs in Close.
	dev, err := driver.PrimaryContext(comms[0].Device())
	require.NoError(t, err)
	defer dev.Close()
	mod, err := dev.LoadModule("spin", []byte(spinPTX))
	require.NoError(t, err)
	defer mod.Close()
	spin, err := mod.Function("spin")
	require.NoError(t, err)
	other, err := dev.NewStream()
	require.NoError(t, err)
	defer other.Close()
	const busy = 3 * time.Second
	var args driver.Args
	args.U64(uint64(busy))
	require.NoError(t, driver.Launch(other, spin, &driver.LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{32, 1, 1}}, &args))

	streams := make([]*driver.Stream, len(comms))
	bufs := make([]driver.DevicePtr, len(comms))
	for r, c := range comms {
		streams[r], err = dev.NewStream()
		require.NoError(t, err)
		defer streams[r].Close()
		bufs[r], err = dev.Alloc(1 << 16)
		require.NoError(t, err)
		defer dev.Free(bufs[r])
		require.NoError(t, c.AllReduce(streams[r], bufs[r], bufs[r], 1<<15, BFloat16))
	}
	start := time.Now()
	for r, c := range comms {
		c.mu.Lock()
		err := c.drain()
		c.mu.Unlock()
		require.NoError(t, err, "rank %d", r)
	}
	assert.Less(t, time.Since(start), busy/2, "drain waited for another part of the program's kernel")
	for _, c := range comms {
		require.NoError(t, c.Err())
		require.NoError(t, c.Close())
	}
	require.NoError(t, other.Synchronize())
}

// TestCloseAfterFailedDrain: a Close whose drain times out frees nothing and says so; a second
// Close says so again rather than nil; once the work has finished, Close frees everything.
func TestCloseAfterFailedDrain(t *testing.T) {
	requireGPUHere(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms, err := NewGroup(ctx, []int{0, 0}, Options{Timeout: -1, Algorithm: OneShot})
	require.NoError(t, err)
	dev, err := driver.PrimaryContext(comms[0].Device())
	require.NoError(t, err)
	defer dev.Close()
	streams := make([]*driver.Stream, len(comms))
	bufs := make([]driver.DevicePtr, len(comms))
	for r := range comms {
		streams[r], err = dev.NewStream()
		require.NoError(t, err)
		defer streams[r].Close()
		bufs[r], err = dev.Alloc(1 << 16)
		require.NoError(t, err)
		defer dev.Free(bufs[r])
	}
	// Rank 0 waits for rank 1, with no timeout.
	require.NoError(t, comms[0].AllReduce(streams[0], bufs[0], bufs[0], 1<<15, BFloat16))
	comms[0].drainOverride = 300 * time.Millisecond
	for range 2 {
		err := comms[0].Close()
		require.Error(t, err)
		assert.ErrorContains(t, err, "still running")
		assert.False(t, comms[0].released)
	}
	assert.ErrorIs(t, comms[0].AllReduce(streams[0], bufs[0], bufs[0], 8, BFloat16), ErrClosed, "closed for new work all the same")
	// Rank 1 arrives: rank 0's kernel completes and Close frees everything.
	require.NoError(t, comms[1].AllReduce(streams[1], bufs[1], bufs[1], 1<<15, BFloat16))
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	for _, s := range streams {
		require.NoError(t, s.Wait(wctx))
	}
	require.NoError(t, comms[0].Close())
	assert.True(t, comms[0].released)
	require.NoError(t, comms[0].Close())
	require.NoError(t, comms[1].Close())
}
