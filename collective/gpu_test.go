package collective_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/gputest"
	"github.com/goccl/goccl/internal/ref"
	"github.com/goccl/goccl/ptx"
)

// requireGPU skips the test without a usable GPU (see internal/gputest).
func requireGPU(t testing.TB) { gputest.Require(t) }

// rankBufs is one rank's stream and buffers in a test.
type rankBufs struct {
	comm     *collective.Comm
	stream   *driver.Stream
	in, out  driver.DevicePtr
	capacity uint64
}

// group is a communicator under test with per-rank streams and buffers of capacity bytes.
type group struct {
	t     testing.TB
	ranks []*rankBufs
}

func newGroup(t testing.TB, devices []int, opts collective.Options, capacity uint64) *group {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	comms, err := collective.NewGroup(ctx, devices, opts)
	require.NoError(t, err)
	g := &group{t: t}
	for _, c := range comms {
		rb := &rankBufs{comm: c, capacity: capacity}
		rb.stream, err = c.Context().NewStream()
		require.NoError(t, err)
		rb.in, err = c.Context().Alloc(capacity)
		require.NoError(t, err)
		rb.out, err = c.Context().Alloc(capacity)
		require.NoError(t, err)
		g.ranks = append(g.ranks, rb)
	}
	t.Cleanup(g.close)
	return g
}

func (g *group) close() {
	for _, rb := range g.ranks {
		ctx := rb.comm.Context()
		require.NoError(g.t, rb.stream.Synchronize())
		require.NoError(g.t, ctx.Free(rb.in))
		require.NoError(g.t, ctx.Free(rb.out))
		require.NoError(g.t, rb.stream.Close())
		require.NoError(g.t, rb.comm.Close())
	}
}

func virtualRanks(n int) []int { return make([]int, n) }

// syncAll waits for every rank's stream, bounded: a hung kernel fails the test instead of
// hanging it (the watchdog should have fired long before).
func (g *group) syncAll(limit time.Duration) {
	g.t.Helper()
	g.waitAll(limit)
	for r, rb := range g.ranks {
		require.NoError(g.t, rb.comm.Err(), "rank %d", r)
	}
}

// waitAll waits up to limit for every rank's stream, whatever the kernels reported.
func (g *group) waitAll(limit time.Duration) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for r, rb := range g.ranks {
		require.NoError(g.t, rb.stream.Wait(ctx), "rank %d: all-reduce still running after %v", r, limit)
	}
}

// fill writes fresh random inputs to every rank and poisons the outputs, returning the inputs.
// Ranks draw their inputs in parallel (8 MiB per rank at 16 ranks is a lot of random numbers).
func (g *group) fill(rng *rand.Rand, dt dtype.DType, nbytes int, inPlace bool) [][]byte {
	g.t.Helper()
	inputs := make([][]byte, len(g.ranks))
	var wg sync.WaitGroup
	for r := range g.ranks {
		seed1, seed2 := rng.Uint64(), rng.Uint64()
		wg.Add(1)
		go func() {
			defer wg.Done()
			inputs[r] = ref.Random(rand.New(rand.NewPCG(seed1, seed2)), dt, nbytes)
		}()
	}
	wg.Wait()
	for r, rb := range g.ranks {
		ctx := rb.comm.Context()
		require.NoError(g.t, ctx.CopyHtoD(rb.in, inputs[r]))
		if !inPlace {
			// 0xFFFF.. is a NaN in every dtype: an unwritten element cannot pass.
			require.NoError(g.t, ctx.MemsetD8(rb.out, 0xFF, uint64(nbytes)))
		}
	}
	return inputs
}

// check copies every rank's result back and compares it bitwise with want and with rank 0.
func (g *group) check(dt dtype.DType, want []byte, inPlace bool, what string) {
	g.t.Helper()
	for r, rb := range g.ranks {
		got := make([]byte, len(want))
		src := rb.out
		if inPlace {
			src = rb.in
		}
		require.NoError(g.t, rb.comm.Context().CopyDtoH(got, src))
		if n, first := ref.Compare(dt, want, got); n != 0 {
			g.t.Fatalf("%s: rank %d: %d of %d elements wrong; first at %d: want %s, got %s", what, r, n,
				len(want)/dt.Size(), first.Index, ref.Format(dt, first.Want), ref.Format(dt, first.Got))
		}
	}
}

func reference(algo collective.Algorithm, dt dtype.DType, inputs [][]byte) ([]byte, error) {
	switch algo {
	case collective.OneShot:
		return ref.OneShot(dt, inputs)
	case collective.TwoShot:
		return ref.TwoShot(dt, inputs)
	case collective.Push:
		return ref.Push(dt, inputs)
	}
	return nil, fmt.Errorf("no reference for algorithm %v", algo)
}

// testSizes are the sizes every algorithm is checked at, in bytes for dt: 16 B, 1040 elements, 64 KiB, 1 MiB,
// 8 MiB - 16 B.
func testSizes(dt dtype.DType) []int {
	return []int{16, 1040 * dt.Size(), 64 << 10, 1 << 20, 8<<20 - 16}
}

// TestAllReduceVirtualRanks runs every algorithm, dtype and size at several world sizes on
// one GPU, eager, in place and out of place, and compares bitwise with internal/ref.
func TestAllReduceVirtualRanks(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, ws := range []int{2, 3, 4, 8, 16} {
		for _, algo := range collective.Algorithms {
			t.Run(fmt.Sprintf("ws%d/%v", ws, algo), func(t *testing.T) {
				g := newGroup(t, virtualRanks(ws), collective.Options{Algorithm: algo, PushMaxBytes: 8 << 20, Timeout: 5 * time.Second}, 8<<20)
				for _, dt := range dtype.All {
					for i, nbytes := range testSizes(dt) {
						inPlace := i%2 == 1
						inputs := g.fill(rng, dt, nbytes, inPlace)
						want, err := reference(algo, dt, inputs)
						require.NoError(t, err)
						for _, rb := range g.ranks {
							dst := rb.out
							if inPlace {
								dst = rb.in
							}
							require.NoError(t, rb.comm.AllReduce(rb.stream, dst, rb.in, nbytes/dt.Size(), dt))
						}
						g.syncAll(30 * time.Second)
						g.check(dt, want, inPlace, fmt.Sprintf("%v %d bytes in-place=%v", dt, nbytes, inPlace))
					}
				}
			})
		}
	}
}

// TestAllReduceRegisteredAndGraph covers zero-copy registered inputs, registered outputs (the
// direct TwoShot) and graph capture with deferred registration (TwoShot direct there too),
// then replays the graph on fresh data.
func TestAllReduceRegisteredAndGraph(t *testing.T) {
	requireGPU(t)
	rng := rand.New(rand.NewPCG(3, 4))
	type variant struct {
		name                      string
		algo                      collective.Algorithm
		systemScope, flagBarriers bool
	}
	variants := []variant{{"oneshot", collective.OneShot, false, false}, {"twoshot", collective.TwoShot, false, false}, {"push", collective.Push, false, false},
		// virtual ranks get GPU-scope barriers by default: the system-scope ones, which ranks
		// on several GPUs use, must work too, counting arrivals (NVLink) and with round-number
		// flags (PCIe)
		{"oneshot-systemscope", collective.OneShot, true, false}, {"twoshot-systemscope", collective.TwoShot, true, false},
		{"oneshot-flags", collective.OneShot, true, true}, {"twoshot-flags", collective.TwoShot, true, true}}
	for _, ws := range []int{2, 4, 8, 16} {
		for _, v := range variants {
			algo := v.algo
			t.Run(fmt.Sprintf("ws%d/%s", ws, v.name), func(t *testing.T) {
				g := newGroup(t, virtualRanks(ws), collective.Options{Algorithm: algo, PushMaxBytes: 1 << 20, Timeout: 5 * time.Second,
					SystemScope: v.systemScope, FlagBarriers: v.flagBarriers}, 1<<20)
				dt := dtype.BFloat16
				nbytes := 1<<19 + 4096 + 16*ws // not a multiple of the block or thread count

				// Registered: every rank registers its input, concurrently (collective call).
				g.parallel(func(rb *rankBufs) error {
					_, err := rb.comm.Register(context.Background(), rb.in, rb.capacity)
					return err
				})
				for range 3 {
					inputs := g.fill(rng, dt, nbytes, false)
					want, err := reference(algo, dt, inputs)
					require.NoError(t, err)
					for _, rb := range g.ranks {
						require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, nbytes/dt.Size(), dt))
					}
					g.syncAll(30 * time.Second)
					g.check(dt, want, false, "registered")
				}

				// Registered outputs too: TwoShot writes straight into every rank's output
				// (direct), also in place, where the input goes through the staging buffer.
				g.parallel(func(rb *rankBufs) error {
					_, err := rb.comm.Register(context.Background(), rb.out, rb.capacity)
					return err
				})
				for range 2 {
					inputs := g.fill(rng, dt, nbytes, false)
					want := twiceReduced(t, algo, dt, inputs)
					for _, rb := range g.ranks {
						require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, nbytes/dt.Size(), dt))
						require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out, rb.out, nbytes/dt.Size(), dt))
					}
					g.syncAll(30 * time.Second)
					g.check(dt, want, false, "registered input and output, then in place")
				}

				// Graph: two all-reduces per graph, one out of place, one in place.
				graphs := make([]*collective.Graph, ws)
				g.parallel(func(rb *rankBufs) error {
					var err error
					graphs[rb.comm.Rank()], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
						if err := rb.comm.AllReduce(rb.stream, rb.out, rb.in, nbytes/dt.Size(), dt); err != nil {
							return err
						}
						return rb.comm.AllReduce(rb.stream, rb.out, rb.out, nbytes/dt.Size(), dt)
					})
					return err
				})
				for replay := range 3 {
					inputs := g.fill(rng, dt, nbytes, false)
					want := twiceReduced(t, algo, dt, inputs)
					for r, rb := range g.ranks {
						require.NoError(t, graphs[r].Launch(rb.stream))
					}
					g.syncAll(30 * time.Second)
					g.check(dt, want, false, fmt.Sprintf("graph replay %d", replay))
				}
				for _, x := range graphs {
					require.NoError(t, x.Close())
				}
			})
		}
	}
}

// twiceReduced is the result of an all-reduce of inputs followed by an in-place all-reduce of
// its result: ws copies of the first sum, summed.
func twiceReduced(t *testing.T, algo collective.Algorithm, dt dtype.DType, inputs [][]byte) []byte {
	once, err := reference(algo, dt, inputs)
	require.NoError(t, err)
	twice := make([][]byte, len(inputs))
	for r := range twice {
		twice[r] = once
	}
	want, err := reference(algo, dt, twice)
	require.NoError(t, err)
	return want
}

// eachRank runs fn for every rank in its own goroutine, as a collective call needs, and
// returns each rank's error (parallel fails the test on any).
func (g *group) eachRank(fn func(rb *rankBufs) error) []error {
	errs := make([]error, len(g.ranks))
	var wg sync.WaitGroup
	for r, rb := range g.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(rb)
		}()
	}
	wg.Wait()
	return errs
}

// parallel runs fn for every rank in its own goroutine: collective calls such as Register
// and Capture block until every rank has called them.
func (g *group) parallel(fn func(rb *rankBufs) error) {
	g.t.Helper()
	require.NoError(g.t, errors.Join(g.eachRank(fn)...))
}

// TestAllReduceBackToBack issues 1000 all-reduces of changing sizes and algorithms (auto
// selection) without waiting in between and checks every result.
func TestAllReduceBackToBack(t *testing.T) {
	requireGPU(t)
	const ws, calls, maxBytes = 8, 1000, 256 << 10
	g := newGroup(t, virtualRanks(ws), collective.Options{Timeout: 5 * time.Second}, calls*maxBytes/8)
	rng := rand.New(rand.NewPCG(5, 6))
	dt := dtype.BFloat16
	// Every call reads and writes its own region, so all can be queued before checking.
	type call struct {
		off, nbytes int
		inputs      [][]byte
	}
	var cs []call
	off := 0
	for range calls {
		nbytes := 16 * (1 + rng.IntN(maxBytes/16/8))
		if off+nbytes > int(g.ranks[0].capacity) {
			break
		}
		cs = append(cs, call{off: off, nbytes: nbytes, inputs: make([][]byte, ws)})
		off += nbytes
	}
	for r, rb := range g.ranks {
		all := make([]byte, off)
		for i := range cs {
			cs[i].inputs[r] = ref.Random(rng, dt, cs[i].nbytes)
			copy(all[cs[i].off:], cs[i].inputs[r])
		}
		require.NoError(t, rb.comm.Context().CopyHtoD(rb.in, all))
		require.NoError(t, rb.comm.Context().MemsetD8(rb.out, 0xFF, uint64(off)))
	}
	for _, c := range cs {
		for _, rb := range g.ranks {
			p := driver.DevicePtr(c.off)
			require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out+p, rb.in+p, c.nbytes/dt.Size(), dt))
		}
	}
	g.syncAll(60 * time.Second)
	t.Logf("%d calls, %d bytes in all", len(cs), off)
	for r, rb := range g.ranks {
		all := make([]byte, off)
		require.NoError(t, rb.comm.Context().CopyDtoH(all, rb.out))
		for i, c := range cs {
			// Auto selection: the result must equal the reference of one of the algorithms.
			got := all[c.off : c.off+c.nbytes]
			ok := false
			for _, algo := range collective.Algorithms {
				want, err := reference(algo, dt, c.inputs)
				require.NoError(t, err)
				if n, _ := ref.Compare(dt, want, got); n == 0 {
					ok = true
					break
				}
			}
			require.True(t, ok, "rank %d call %d (%d bytes): result matches no algorithm's reference", r, i, c.nbytes)
		}
	}
}

// TestWatchdog leaves one rank out: the others must give up within about the timeout and
// report ErrTimeout naming the missing rank.
func TestWatchdog(t *testing.T) {
	requireGPU(t)
	for _, algo := range collective.Algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			const ws = 4
			timeout := 300 * time.Millisecond
			g := newGroup(t, virtualRanks(ws), collective.Options{Algorithm: algo, Timeout: timeout}, 1<<20)
			nbytes := 64 << 10
			start := time.Now()
			for _, rb := range g.ranks[:ws-1] {
				require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, nbytes/2, dtype.BFloat16))
			}
			wctx, cancel := context.WithTimeout(context.Background(), 10*timeout)
			defer cancel()
			for r, rb := range g.ranks[:ws-1] {
				require.NoError(t, rb.stream.Wait(wctx), "rank %d still waiting after %v", r, 10*timeout)
			}
			elapsed := time.Since(start)
			require.Less(t, elapsed, 2*timeout+200*time.Millisecond, "the watchdog took too long")
			for r, rb := range g.ranks[:ws-1] {
				err := rb.comm.Err()
				require.ErrorIs(t, err, collective.ErrTimeout, "rank %d", r)
				var ke *collective.KernelError
				require.ErrorAs(t, err, &ke)
				require.Equal(t, r, ke.Rank)
				require.Equal(t, ws-1, ke.Peer, "rank %d should name the missing rank: %v", r, err)
				wantPhase := ptx.PhaseEntry
				if algo == collective.Push {
					wantPhase = ptx.PhasePush
				}
				require.Equal(t, wantPhase, ke.Phase, "rank %d should name the phase it waited in: %v", r, err)
				require.Contains(t, err.Error(), wantPhase.String())
				// Unusable afterwards, and says so.
				require.ErrorIs(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, 8, dtype.BFloat16), collective.ErrUnusable)
			}
			t.Logf("watchdog fired after %v (timeout %v): %v", elapsed, timeout, g.ranks[0].comm.Err())
		})
	}
}

// TestWatchdogQueuedKernels leaves one rank out while the others have many all-reduces queued
// (as a graph replay would): after the first kernel gives up, the queued ones must give up
// within one ptx.StaleAfterNs period each (they see the rank's error record), not wait out
// the timeout in turn, which would take queued x timeout.
func TestWatchdogQueuedKernels(t *testing.T) {
	requireGPU(t)
	for _, algo := range collective.Algorithms {
		t.Run(algo.String(), func(t *testing.T) {
			const ws, queued = 4, 50
			timeout := 200 * time.Millisecond
			g := newGroup(t, virtualRanks(ws), collective.Options{Algorithm: algo, Timeout: timeout}, 1<<20)
			nbytes := 64 << 10
			start := time.Now()
			for range queued {
				for _, rb := range g.ranks[:ws-1] {
					require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, nbytes/2, dtype.BFloat16))
				}
			}
			// Enqueueing must have been quicker than the timeout, or the later calls would
			// have been refused rather than queued.
			require.Less(t, time.Since(start), timeout/2, "enqueueing %d all-reduces took too long for this test", queued)
			wctx, cancel := context.WithTimeout(context.Background(), queued*timeout)
			defer cancel()
			for r, rb := range g.ranks[:ws-1] {
				require.NoError(t, rb.stream.Wait(wctx), "rank %d still running after %v", r, queued*timeout)
			}
			elapsed := time.Since(start)
			require.Less(t, elapsed, 3*timeout, "the queued kernels waited for the timeout again")
			for r, rb := range g.ranks[:ws-1] {
				var ke *collective.KernelError
				require.ErrorAs(t, rb.comm.Err(), &ke, "rank %d", r)
				require.Equal(t, ws-1, ke.Peer, "rank %d should name the missing rank: %v", r, ke)
			}
			t.Logf("%d queued all-reduces per rank done %v after the first call (timeout %v)", queued, elapsed, timeout)
		})
	}
}

// TestNewCloseLeaks creates and closes a group 200 times: device memory must return to its
// starting level.
func TestNewCloseLeaks(t *testing.T) {
	requireGPU(t)
	ctxDev, err := driver.PrimaryContext(0)
	require.NoError(t, err)
	defer ctxDev.Close()
	once := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		comms, err := collective.NewGroup(ctx, virtualRanks(2), collective.Options{})
		require.NoError(t, err)
		for _, c := range comms {
			require.NoError(t, c.Close())
		}
	}
	requireNoDeviceLeak(t, ctxDev, 200, once)
}

// requireNoDeviceLeak runs round once to warm up (modules, caches), then rounds times: the
// device's free memory must come back to its level after the first round, within 4 MiB.
func requireNoDeviceLeak(t *testing.T, dev *driver.Context, rounds int, round func()) {
	t.Helper()
	round()
	free0, _, err := dev.MemInfo()
	require.NoError(t, err)
	for range rounds {
		round()
	}
	free1, _, err := dev.MemInfo()
	require.NoError(t, err)
	require.InDelta(t, float64(free0), float64(free1), 4<<20, "device memory leaked: free %d -> %d", free0, free1)
}

// BenchmarkAllReduceHost measures the host cost of one eager AllReduce call (argument checks,
// staging copy, launch); the GPU work runs meanwhile and is waited for outside the timer.
// BenchmarkAllReduceLaunchOnly (internal tests) launches the same kernel with the same
// arguments through driver.Launch alone, and scripts/bench/launch.c is the C baseline: run
// them interleaved to compare (docs/benchmarks.md).
func BenchmarkAllReduceHost(b *testing.B) {
	requireGPU(b)
	for _, algo := range []collective.Algorithm{collective.Push, collective.OneShot} {
		b.Run(algo.String(), func(b *testing.B) {
			g := newGroup(b, virtualRanks(2), collective.Options{Algorithm: algo}, 1<<20)
			const nbytes = 16 << 10
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				for _, rb := range g.ranks {
					if err := rb.comm.AllReduce(rb.stream, rb.out, rb.in, nbytes/2, dtype.BFloat16); err != nil {
						b.Fatal(err)
					}
				}
				if i%64 == 63 {
					b.StopTimer()
					g.syncAll(time.Minute)
					b.StartTimer()
				}
			}
			b.StopTimer()
			g.syncAll(time.Minute)
			// Two calls per iteration, one per rank.
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/call")
		})
	}
}

// TestNewPeerNeverJoins: a rank whose peer never calls New must fail when its context ends,
// not hang.
func TestNewPeerNeverJoins(t *testing.T) {
	requireGPU(t)
	boots, err := bootstrap.NewInProcess(2)
	require.NoError(t, err)
	defer boots[1].Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = collective.New(ctx, 0, boots[0], collective.Options{})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 10*time.Second)
	t.Logf("New without its peer: %v after %v", err, time.Since(start))
}

// TestInitTime reports how long NewGroup takes for 8 virtual ranks, twice: the first includes
// the PTX JIT unless the driver's compute cache already holds the kernels (run the test with
// CUDA_CACHE_DISABLE=1 for a cold JIT every time); the second finds them in that cache.
func TestInitTime(t *testing.T) {
	requireGPU(t)
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		start := time.Now()
		comms, err := collective.NewGroup(ctx, virtualRanks(8), collective.Options{})
		elapsed := time.Since(start)
		cancel()
		require.NoError(t, err)
		for _, c := range comms {
			require.NoError(t, c.Close())
		}
		t.Logf("NewGroup of 8 ranks, run %d (CUDA_CACHE_DISABLE=%q): %v", i+1, os.Getenv("CUDA_CACHE_DISABLE"), elapsed)
	}
}
