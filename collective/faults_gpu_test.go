package collective_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
)

// TestRefuseForeignPointers: memory that is not device memory of the rank's device is refused
// before anything is launched (a kernel reading it would fault and leave the whole process's
// CUDA context unusable), in eager calls and in Register; the communicator stays usable.
func TestRefuseForeignPointers(t *testing.T) {
	requireGPU(t)
	g := newGroup(t, virtualRanks(2), collective.Options{Timeout: 5 * time.Second}, 1<<20)
	rb := g.ranks[0]
	ctx := rb.comm.Context()
	const count = 4096

	goMemory := make([]byte, 2*count+16)
	hostPtr := driver.DevicePtr((uintptr(unsafe.Pointer(&goMemory[0])) + 15) &^ 15)
	pinned, err := ctx.AllocHost(2 * count)
	require.NoError(t, err)
	defer pinned.Close()
	short, err := ctx.Alloc(count) // half of what the calls below reduce
	require.NoError(t, err)
	defer ctx.Free(short)
	// Freed last, so that no allocation of this test takes its place.
	freed, err := ctx.Alloc(2 * count)
	require.NoError(t, err)
	require.NoError(t, ctx.Free(freed))

	for _, tc := range []struct {
		name string
		ptr  driver.DevicePtr
		want string
	}{
		{"pageable Go memory", hostPtr, "not memory CUDA knows"},
		{"freed allocation", freed, "not memory CUDA knows"},
		{"pinned host memory", pinned.DevicePtr(), "memory: pass device memory"},
		{"past the allocation's end", short, "runs past the end of its allocation"},
	} {
		err := rb.comm.AllReduce(rb.stream, rb.out, tc.ptr, count, dtype.BFloat16)
		require.ErrorIs(t, err, collective.ErrInvalidArgument, "src: %s", tc.name)
		assert.ErrorContains(t, err, tc.want, "src: %s", tc.name)
		err = rb.comm.AllReduce(rb.stream, tc.ptr, rb.in, count, dtype.BFloat16)
		require.ErrorIs(t, err, collective.ErrInvalidArgument, "dst: %s", tc.name)
	}

	// Register refuses them too, on the rank that passes one, and the others hear of it.
	for _, tc := range []struct {
		name string
		ptr  driver.DevicePtr
	}{{"pageable Go memory", hostPtr}, {"freed allocation", freed}} {
		errs := registerAll(g, func(r int) (driver.DevicePtr, uint64) {
			if r == 0 {
				return tc.ptr, 2 * count
			}
			return g.ranks[r].in, 2 * count
		})
		require.ErrorIs(t, errs[0], collective.ErrInvalidArgument, tc.name)
		var refused *collective.RefusedError
		require.ErrorAs(t, errs[1], &refused, tc.name)
		assert.Contains(t, refused.Reasons, 0)
	}

	// Still usable: a correct all-reduce afterwards.
	rng := rand.New(rand.NewPCG(7, 8))
	inputs := g.fill(rng, dtype.BFloat16, 2*count, false)
	want, err := reference(rb.comm.Selected(2*count, false), dtype.BFloat16, inputs)
	require.NoError(t, err)
	for _, r := range g.ranks {
		require.NoError(t, r.comm.AllReduce(r.stream, r.out, r.in, count, dtype.BFloat16))
	}
	g.syncAll(30 * time.Second)
	g.check(dtype.BFloat16, want, false, "after the refusals")
}

// registerAll calls Register on every rank at once with the buffer buf(rank) and returns each
// rank's error; registrations that succeed are released.
func registerAll(g *group, buf func(r int) (driver.DevicePtr, uint64)) []error {
	errs := make([]error, len(g.ranks))
	regs := make([]*collective.Registration, len(g.ranks))
	var wg sync.WaitGroup
	for r, rb := range g.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ptr, n := buf(r)
			regs[r], errs[r] = rb.comm.Register(ctx, ptr, n)
		}()
	}
	wg.Wait()
	for _, reg := range regs {
		if reg != nil {
			reg.Release()
		}
	}
	return errs
}

// TestRegisterRefusalReachesPeers: one rank's refused Register fails every rank at once (not
// after the context's deadline), names the rank and its reason, registers nothing, and leaves
// Register usable on every rank.
func TestRegisterRefusalReachesPeers(t *testing.T) {
	requireGPU(t)
	const ws = 4
	g := newGroup(t, virtualRanks(ws), collective.Options{Timeout: 5 * time.Second}, 1<<20)
	start := time.Now()
	errs := registerAll(g, func(r int) (driver.DevicePtr, uint64) {
		if r == 2 {
			return g.ranks[r].in + 8, 1 << 16 // unaligned
		}
		return g.ranks[r].in, 1 << 16
	})
	require.Less(t, time.Since(start), 10*time.Second, "the refusal should reach the peers at once, not after the deadline")
	for r, err := range errs {
		if r == 2 {
			require.ErrorIs(t, err, collective.ErrInvalidArgument)
			assert.ErrorContains(t, err, "16-byte aligned")
			continue
		}
		var refused *collective.RefusedError
		require.ErrorAs(t, err, &refused, "rank %d", r)
		assert.ErrorContains(t, err, "rank 2 refused")
		assert.ErrorContains(t, err, "16-byte aligned")
	}
	// Register works afterwards, and the registered buffers are used.
	regs := make([]*collective.Registration, ws)
	g.parallel(func(rb *rankBufs) error {
		var err error
		regs[rb.comm.Rank()], err = rb.comm.Register(context.Background(), rb.in, rb.capacity)
		return err
	})
	rng := rand.New(rand.NewPCG(9, 10))
	nbytes := 64 << 10
	inputs := g.fill(rng, dtype.Float16, nbytes, false)
	want, err := reference(collective.OneShot, dtype.Float16, inputs)
	require.NoError(t, err)
	for _, rb := range g.ranks {
		require.NoError(t, rb.comm.AllReduceWith(rb.stream, rb.out, rb.in, nbytes/2, dtype.Float16, collective.OneShot))
	}
	g.syncAll(30 * time.Second)
	g.check(dtype.Float16, want, false, "registered after a refused Register")
	for _, reg := range regs {
		require.NoError(t, reg.Release())
		require.NoError(t, reg.Release(), "a second Release does nothing")
	}
}

// TestCallMismatch: ranks that issue different all-reduces (another count, another element
// type) get an error naming both ranks and both calls, in every algorithm, instead of wrong
// sums.
func TestCallMismatch(t *testing.T) {
	requireGPU(t)
	type side struct {
		count int
		dt    dtype.DType
	}
	cases := []struct {
		name        string
		rank0, rest side
	}{
		{"count", side{1024, dtype.BFloat16}, side{2048, dtype.BFloat16}},
		{"dtype", side{4096, dtype.Float16}, side{4096, dtype.BFloat16}},
		{"count, other grid", side{1 << 17, dtype.BFloat16}, side{1 << 18, dtype.BFloat16}},
	}
	for _, algo := range collective.Algorithms {
		for _, tc := range cases {
			if algo == collective.Push && tc.rest.count*tc.rest.dt.Size() > collective.DefaultPushMaxBytes {
				continue
			}
			t.Run(fmt.Sprintf("%v/%s", algo, tc.name), func(t *testing.T) {
				const ws = 3
				timeout := 3 * time.Second
				g := newGroup(t, virtualRanks(ws), collective.Options{Algorithm: algo, Timeout: timeout}, 1<<20)
				start := time.Now()
				for r, rb := range g.ranks {
					s := tc.rest
					if r == 0 {
						s = tc.rank0
					}
					require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, s.count, s.dt))
				}
				g.waitAll(4 * timeout)
				ke := rank0Mismatch(t, g, start)
				assert.Equal(t, uint64(tc.rank0.count), ke.Mine.Count)
				assert.Equal(t, tc.rank0.dt, ke.Mine.DType)
				assert.Equal(t, uint64(tc.rest.count), ke.Theirs.Count)
				assert.Equal(t, tc.rest.dt, ke.Theirs.DType)
				assert.Less(t, time.Since(start), timeout, "the mismatch should be reported at once, not after the watchdog's timeout")
				for r, rb := range g.ranks {
					err := rb.comm.Err()
					require.Error(t, err, "rank %d took part in a mismatched call and must not look healthy", r)
					assert.ErrorIs(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, 8, dtype.BFloat16), collective.ErrUnusable, "rank %d", r)
				}
				t.Logf("rank 0: %v", ke)
			})
		}
	}
}

// rank0Mismatch returns rank 0's error after a call in which it differed from every peer, so
// that it saw the mismatch itself: ErrCallMismatch, as a *KernelError naming rank 0 and a peer.
func rank0Mismatch(t *testing.T, g *group, start time.Time) *collective.KernelError {
	t.Helper()
	err := g.ranks[0].comm.Err()
	require.ErrorIs(t, err, collective.ErrCallMismatch, "rank 0 (after %v)", time.Since(start))
	var ke *collective.KernelError
	require.ErrorAs(t, err, &ke)
	assert.Equal(t, 0, ke.Rank)
	assert.NotEqual(t, 0, ke.Peer)
	return ke
}

// TestStagingMismatch: with registered inputs, a rank whose call is in place reads its peers'
// inputs through the staging buffers while a rank whose call is out of place reads them in
// place; the kernels see the two calls differ and report ErrCallMismatch instead of summing
// stale data, for OneShot and TwoShot (whose in-place call reads in place, so it is the
// unregistered rank 0 that stages there).
func TestStagingMismatch(t *testing.T) {
	requireGPU(t)
	for _, algo := range []collective.Algorithm{collective.OneShot, collective.TwoShot} {
		t.Run(algo.String(), func(t *testing.T) {
			const ws, count = 3, 4096
			timeout := 3 * time.Second
			g := newGroup(t, virtualRanks(ws), collective.Options{Algorithm: algo, Timeout: timeout}, 1<<20)
			g.parallel(func(rb *rankBufs) error {
				_, err := rb.comm.Register(context.Background(), rb.in, rb.capacity)
				return err
			})
			start := time.Now()
			for r, rb := range g.ranks {
				dst := rb.out
				if r == 0 && algo == collective.OneShot {
					dst = rb.in // in place: staged
				}
				src := rb.in
				if r == 0 && algo == collective.TwoShot {
					src = rb.out // not registered: staged
				}
				require.NoError(t, rb.comm.AllReduce(rb.stream, dst, src, count, dtype.BFloat16))
			}
			g.waitAll(4 * timeout)
			err := g.ranks[0].comm.Err()
			require.ErrorIs(t, err, collective.ErrCallMismatch, "rank 0 (after %v)", time.Since(start))
			var ke *collective.KernelError
			require.ErrorAs(t, err, &ke)
			assert.True(t, ke.Mine.Staged)
			assert.False(t, ke.Theirs.Staged)
			assert.Less(t, time.Since(start), timeout, "the mismatch should be reported at once")
			t.Logf("rank 0: %v", err)
		})
	}
}

// TestOutputRouteMismatch: a rank whose TwoShot writes straight into every rank's registered
// output beside ranks whose output is not registered (they gather from the tmp buffers, which
// the direct rank never wrote) gets ErrCallMismatch instead of a sum of stale data, for the
// plain all-reduce and the fused call.
func TestOutputRouteMismatch(t *testing.T) {
	requireGPU(t)
	const ws = 3
	timeout := 3 * time.Second
	check := func(t *testing.T, g *group, start time.Time) {
		t.Helper()
		g.waitAll(4 * timeout)
		err := g.ranks[0].comm.Err()
		require.ErrorIs(t, err, collective.ErrCallMismatch, "rank 0 (after %v)", time.Since(start))
		var ke *collective.KernelError
		require.ErrorAs(t, err, &ke)
		assert.True(t, ke.Mine.Direct)
		assert.False(t, ke.Theirs.Direct)
		assert.Less(t, time.Since(start), timeout, "the mismatch should be reported at once")
		t.Logf("rank 0: %v", err)
	}
	t.Run("allreduce", func(t *testing.T) {
		const count = 4096
		g := newGroup(t, virtualRanks(ws), collective.Options{Algorithm: collective.TwoShot, Timeout: timeout}, 1<<20)
		g.parallel(func(rb *rankBufs) error {
			_, err := rb.comm.Register(context.Background(), rb.out, 2*count)
			return err
		})
		start := time.Now()
		for r, rb := range g.ranks {
			dst := rb.out // registered: direct
			if r > 0 {
				dst = rb.out + 64<<10 // not registered: through tmp
			}
			require.NoError(t, rb.comm.AllReduce(rb.stream, dst, rb.in, count, dtype.BFloat16))
		}
		check(t, g, start)
	})
	t.Run("fused", func(t *testing.T) {
		const rows, hidden = 8, 8192
		const n = rows * hidden * 2
		g := newGroup(t, virtualRanks(ws), collective.Options{Timeout: timeout}, 1<<20)
		g.parallel(func(rb *rankBufs) error {
			if _, err := rb.comm.Register(context.Background(), rb.out, n); err != nil {
				return err
			}
			_, err := rb.comm.Register(context.Background(), rb.out+n, n)
			return err
		})
		for _, rb := range g.ranks {
			require.NoError(t, rb.comm.LoadFused(dtype.BFloat16))
		}
		start := time.Now()
		for r, rb := range g.ranks {
			a := collective.FusedArgs{In: rb.in, Residual: rb.in + n, Gamma: rb.in + 2*n,
				ResidualOut: rb.out, NormOut: rb.out + n, // registered: direct
				Rows: rows, Hidden: hidden, Eps: 1e-6, DType: dtype.BFloat16}
			if r > 0 {
				a.ResidualOut, a.NormOut = rb.out+4*n, rb.out+5*n // not registered: through tmp
			}
			require.NoError(t, rb.comm.AllReduceResidualRMSNormWith(rb.stream, a, collective.TwoShot))
		}
		check(t, g, start)
	})
}

// TestAnyCount: every element count is reduced exactly, for every algorithm and element type,
// and nothing after the last element of dst is written.
func TestAnyCount(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, ws := range []int{2, 3} {
		// room for the largest count and the guard after it
		g := newGroup(t, virtualRanks(ws), collective.Options{Timeout: 5 * time.Second}, 4<<20+256)
		for _, algo := range collective.Algorithms {
			for _, dt := range dtype.All {
				counts := []int{}
				for n := 1; n <= 33; n++ {
					counts = append(counts, n)
				}
				counts = append(counts, 1000003/dt.Size()/3*2+1, 65537, 4<<20/dt.Size()-1)
				for _, count := range counts {
					nbytes := count * dt.Size()
					if algo == collective.Push && nbytes > collective.DefaultPushMaxBytes {
						continue
					}
					what := fmt.Sprintf("ws %d, %v, %v, %d elements", ws, algo, dt, count)
					inputs := g.fill(rng, dt, nbytes, false)
					// a guard after the message's end: 0xFF bytes must survive
					for _, rb := range g.ranks {
						require.NoError(t, rb.comm.Context().MemsetD8(rb.out, 0xFF, uint64(nbytes+64)))
					}
					want, err := reference(algo, dt, inputs)
					require.NoError(t, err, what)
					for _, rb := range g.ranks {
						require.NoError(t, rb.comm.AllReduceWith(rb.stream, rb.out, rb.in, count, dt, algo), what)
					}
					g.syncAll(30 * time.Second)
					g.check(dt, want, false, what)
					for r, rb := range g.ranks {
						guard := make([]byte, 64)
						require.NoError(t, rb.comm.Context().CopyDtoH(guard, rb.out+driver.DevicePtr(nbytes)))
						for i, b := range guard {
							require.Equal(t, byte(0xFF), b, "%s: rank %d wrote byte %d after the message", what, r, i)
						}
					}
				}
			}
		}
	}
}

// TestGraphsReleaseSlots is a serving engine's life: one graph per batch size, 64 graphs of
// 160 all-reduces each (one per layer, all through the same two buffers), closed and captured
// again three times. Repeated buffers share a slot and closed graphs give theirs back, so the
// registration table never fills, and device memory returns to where it started.
func TestGraphsReleaseSlots(t *testing.T) {
	requireGPU(t)
	const ws, graphs, layers, rounds = 2, 64, 160, 3
	const maxCount = 64 * 256 // bf16 elements of the largest batch
	g := newGroup(t, virtualRanks(ws), collective.Options{Timeout: 5 * time.Second}, 2*maxCount)
	dev := g.ranks[0].comm.Context()
	rng := rand.New(rand.NewPCG(13, 14))
	var free0 uint64
	for round := range rounds {
		execs := make([][]*collective.Graph, ws)
		g.parallel(func(rb *rankBufs) error {
			for b := range graphs {
				count := (b + 1) * 256
				x, err := rb.comm.Capture(context.Background(), rb.stream, func() error {
					for range layers {
						if err := rb.comm.AllReduce(rb.stream, rb.out, rb.in, count, dtype.BFloat16); err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					return fmt.Errorf("round %d, graph %d: %w", round, b, err)
				}
				execs[rb.comm.Rank()] = append(execs[rb.comm.Rank()], x)
			}
			return nil
		})
		for _, b := range []int{0, graphs - 1} {
			count := (b + 1) * 256
			inputs := g.fill(rng, dtype.BFloat16, 2*count, false)
			want, err := reference(g.ranks[0].comm.Selected(int64(2*count), true), dtype.BFloat16, inputs)
			require.NoError(t, err)
			for r, rb := range g.ranks {
				require.NoError(t, execs[r][b].Launch(rb.stream))
			}
			g.syncAll(time.Minute)
			g.check(dtype.BFloat16, want, false, fmt.Sprintf("round %d, graph %d", round, b))
		}
		for r := range g.ranks {
			for _, x := range execs[r] {
				require.NoError(t, x.Close())
			}
		}
		free, _, err := dev.MemInfo()
		require.NoError(t, err)
		if round == 0 {
			free0 = free
		} else {
			assert.InDelta(t, float64(free0), float64(free), 8<<20, "round %d: device memory not given back: free %d -> %d", round, free0, free)
		}
	}
	// A closed graph refuses to launch.
	x, err := func() (*collective.Graph, error) {
		xs := make([]*collective.Graph, ws)
		g.parallel(func(rb *rankBufs) error {
			var err error
			xs[rb.comm.Rank()], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
				return rb.comm.AllReduce(rb.stream, rb.out, rb.in, 256, dtype.BFloat16)
			})
			return err
		})
		for _, x := range xs[1:] {
			x.Close()
		}
		return xs[0], xs[0].Close()
	}()
	require.NoError(t, err)
	assert.ErrorIs(t, x.Launch(g.ranks[0].stream), collective.ErrClosed)
}

// TestKernelFaultIsSticky runs its check in a child process, since a kernel fault kills the
// CUDA context of the whole process: after another kernel of the program faults, every call
// of the communicator and Err say it is unusable and why (the driver's error, wrapped).
func TestKernelFaultIsSticky(t *testing.T) {
	requireGPU(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestKernelFaultChild$", "-test.v")
	cmd.Env = append(childEnv(), "GOCCL_FAULT_CHILD=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "child:\n%s", out)
	require.Contains(t, string(out), "fault child ok", "child:\n%s", out)
}

// faultPTX holds a kernel that writes to the address it is given: 16 is never mapped.
const faultPTX = `
.version 7.8
.target sm_80
.address_size 64
.visible .entry fault(.param .u64 p_addr)
{
	.reg .b64 %a;
	ld.param.u64 %a, [p_addr];
	st.global.u32 [%a], 1;
	ret;
}
`

func TestKernelFaultChild(t *testing.T) {
	if os.Getenv("GOCCL_FAULT_CHILD") != "1" {
		t.Skip("run by TestKernelFaultIsSticky in a child process")
	}
	requireGPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms, err := collective.NewGroup(ctx, virtualRanks(2), collective.Options{})
	require.NoError(t, err)
	dev := comms[0].Context()
	stream, err := dev.NewStream()
	require.NoError(t, err)
	buf, err := dev.Alloc(1 << 16)
	require.NoError(t, err)
	mod, err := dev.LoadModule("fault", []byte(faultPTX))
	require.NoError(t, err)
	fn, err := mod.Function("fault")
	require.NoError(t, err)
	var args driver.Args
	args.Ptr(16)
	require.NoError(t, driver.Launch(stream, fn, &driver.LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}}, &args))
	require.Error(t, stream.Synchronize(), "the kernel should have faulted")

	for r, c := range comms {
		err := c.Err()
		require.ErrorIs(t, err, collective.ErrUnusable, "rank %d", r)
		require.ErrorIs(t, err, driver.ErrContextLost, "rank %d", r)
		err = c.AllReduce(stream, buf, buf, 1024, dtype.BFloat16)
		require.ErrorIs(t, err, collective.ErrUnusable, "rank %d", r)
		require.ErrorIs(t, err, driver.ErrContextLost, "rank %d: every later call says why", r)
		t.Logf("rank %d: %v", r, err)
	}
	for _, c := range comms {
		c.Close() // the context is lost: freeing may fail, but must not hang
	}
	fmt.Println("fault child ok")
}

// TestForeignStream drives AllReduce on streams made outside goccl, through a raw driver call
// (what another CUDA binding, cgo code or a CUDA library hands over), wrapped without being
// owned.
func TestForeignStream(t *testing.T) {
	requireGPU(t)
	g := newGroup(t, virtualRanks(2), collective.Options{Timeout: 5 * time.Second}, 1<<20)
	streams := make([]*driver.Stream, len(g.ranks))
	for r, rb := range g.ranks {
		h, destroy := rawStream(t, rb.comm.Context())
		t.Cleanup(destroy)
		var err error
		streams[r], err = driver.WrapStream(h)
		require.NoError(t, err)
		require.Equal(t, rb.comm.Device(), streams[r].Context().Device())
	}
	rng := rand.New(rand.NewPCG(15, 16))
	const nbytes = 256 << 10
	for _, algo := range collective.Algorithms {
		inputs := g.fill(rng, dtype.BFloat16, nbytes, false)
		want, err := reference(algo, dtype.BFloat16, inputs)
		require.NoError(t, err)
		for r, rb := range g.ranks {
			require.NoError(t, rb.comm.AllReduceWith(streams[r], rb.out, rb.in, nbytes/2, dtype.BFloat16, algo))
		}
		wctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for _, s := range streams {
			require.NoError(t, s.Wait(wctx))
		}
		cancel()
		g.check(dtype.BFloat16, want, false, fmt.Sprintf("%v on a foreign stream", algo))
	}
	for _, s := range streams {
		require.NoError(t, s.Close(), "closing a wrapped stream forgets it, it does not destroy it")
	}
}
