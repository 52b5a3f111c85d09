package collective_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/dtype"
)

// requireNoAllocs issues call on every rank (one all-reduce of the group) as often as it
// will be measured, so that the communicators hold what such a run creates (an event per
// stream, the fused kernels' modules, the events that follow calls handed to NCCL), then
// fails the test if the calls of a second such run allocate in Go: testing.AllocsPerRun's
// mean over the runs, which counts whole allocations, must be 0.
func (g *group) requireNoAllocs(what string, call func(rb *rankBufs) error) {
	g.t.Helper()
	all := func() {
		for r, rb := range g.ranks {
			if err := call(rb); err != nil {
				g.t.Fatalf("%s: rank %d: %v", what, r, err)
			}
		}
	}
	const runs = 64
	for range runs {
		all()
	}
	g.syncAll(time.Minute)
	allocs := testing.AllocsPerRun(runs, all)
	g.syncAll(time.Minute)
	assert.Zero(g.t, allocs, "%s: Go allocations per call of every rank", what)
}

// TestEagerCallsAllocateNothing: after its first calls, an eager all-reduce allocates nothing
// in Go, whatever the algorithm and whether the buffers are registered or the call is in
// place, and neither do the fused call and ResidualRMSNorm: a service makes these calls
// thousands of times a second, and garbage there is GC work on its hot path.
func TestEagerCallsAllocateNothing(t *testing.T) {
	requireGPU(t)
	const nbytes = 32 << 10
	dt := dtype.BFloat16
	count := nbytes / dt.Size()
	for _, algo := range []collective.Algorithm{collective.Push, collective.OneShot, collective.TwoShot} {
		t.Run(algo.String(), func(t *testing.T) {
			g := newGroup(t, virtualRanks(2), collective.Options{Algorithm: algo, Timeout: 10 * time.Second}, 1<<20)
			outOfPlace := func(rb *rankBufs) error { return rb.comm.AllReduce(rb.stream, rb.out, rb.in, count, dt) }
			inPlace := func(rb *rankBufs) error { return rb.comm.AllReduce(rb.stream, rb.out, rb.out, count, dt) }
			g.requireNoAllocs("out of place", outOfPlace)
			g.requireNoAllocs("in place", inPlace)
			g.parallel(func(rb *rankBufs) error {
				if _, err := rb.comm.Register(context.Background(), rb.in, rb.capacity); err != nil {
					return err
				}
				_, err := rb.comm.Register(context.Background(), rb.out, rb.capacity)
				return err
			})
			g.requireNoAllocs("registered, out of place", outOfPlace)
			g.requireNoAllocs("registered, in place", inPlace)
		})
	}

	t.Run("fused", func(t *testing.T) {
		const rows, hidden = 8, 8192
		g := newFusedGroup(t, 2, collective.Options{Timeout: 10 * time.Second}, 1<<20)
		for _, rb := range g.ranks {
			require.NoError(t, rb.comm.LoadFused(dt))
		}
		args := func(rb *rankBufs) collective.FusedArgs {
			b := g.bufs[rb.comm.Rank()]
			return collective.FusedArgs{NormOut: b.normOut, ResidualOut: b.residual, In: b.in, Residual: b.residual,
				Gamma: b.gamma, Rows: rows, Hidden: hidden, Eps: fusedEps, DType: dt}
		}
		g.requireNoAllocs("AllReduceResidualRMSNorm", func(rb *rankBufs) error {
			return rb.comm.AllReduceResidualRMSNorm(rb.stream, args(rb))
		})
		g.requireNoAllocs("ResidualRMSNorm", func(rb *rankBufs) error {
			return rb.comm.ResidualRMSNorm(rb.stream, args(rb))
		})
		g.registerOutputs(rows * hidden * dt.Size())
		g.requireNoAllocs("AllReduceResidualRMSNorm, registered outputs", func(rb *rankBufs) error {
			return rb.comm.AllReduceResidualRMSNorm(rb.stream, args(rb))
		})
	})
}

// TestNCCLCallAllocatesNothing: an all-reduce that a communicator hands to NCCL allocates
// nothing in Go after its first calls: the events that let the watchdog and Close follow it
// are reused.
func TestNCCLCallAllocatesNothing(t *testing.T) {
	comm, stream := newNCCLOneRank(t)
	dev := comm.Context()
	const count = 8 << 10
	buf, err := dev.Alloc(2 * count)
	require.NoError(t, err)
	defer dev.Free(buf)
	g := &group{t: t, ranks: []*rankBufs{{comm: comm, stream: stream, in: buf, out: buf, capacity: 2 * count}}}
	g.requireNoAllocs("AllReduce to NCCL", func(rb *rankBufs) error {
		return rb.comm.AllReduce(rb.stream, rb.out, rb.in, count, dtype.BFloat16)
	})
}
