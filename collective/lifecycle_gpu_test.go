package collective_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective"
	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/dtype"
	"github.com/goccl/goccl/internal/ref"
)

// allocEach allocates a buffer of n bytes on every rank, freed when the test ends (before the
// group closes).
func (g *group) allocEach(n uint64) []driver.DevicePtr {
	g.t.Helper()
	bufs := make([]driver.DevicePtr, len(g.ranks))
	for r, rb := range g.ranks {
		var err error
		bufs[r], err = rb.comm.Context().Alloc(n)
		require.NoError(g.t, err)
		ctx := rb.comm.Context()
		g.t.Cleanup(func() { ctx.Free(bufs[r]) })
	}
	return bufs
}

// TestRegisterFullTableKeepsStaging: a Register refused because the registration table is full
// leaves the staging slot alone. Had the refused call given slot 0 back, a later Register would
// be handed it and overwrite every rank's staging pointers, and eager pull all-reduces would
// then sum the registered buffers instead of their inputs.
func TestRegisterFullTableKeepsStaging(t *testing.T) {
	requireGPU(t)
	const nbytes = 16 << 10
	dt := dtype.BFloat16
	// Two slots: the staging slot and one for a registration.
	g := newGroup(t, virtualRanks(2), collective.Options{Algorithm: collective.OneShot, MaxSlots: 2, Timeout: 5 * time.Second}, nbytes)
	a, b := g.allocEach(nbytes), g.allocEach(nbytes)
	register := func(bufs []driver.DevicePtr) ([]*collective.Registration, []error) {
		regs := make([]*collective.Registration, len(g.ranks))
		return regs, g.eachRank(func(rb *rankBufs) error {
			var err error
			regs[rb.comm.Rank()], err = rb.comm.Register(context.Background(), bufs[rb.comm.Rank()], nbytes)
			return err
		})
	}
	release := func(regs []*collective.Registration) {
		for _, reg := range regs {
			if reg != nil {
				require.NoError(t, reg.Release())
			}
		}
	}

	regsA, errs := register(a)
	for _, err := range errs {
		require.NoError(t, err)
	}
	_, errs = register(b)
	for r, err := range errs {
		assert.ErrorContains(t, err, "registration table is full", "rank %d", r)
	}
	// Slot 1 comes free: one registration fits again, and only one.
	release(regsA)
	regsA, errs = register(a)
	for _, err := range errs {
		require.NoError(t, err)
	}
	defer release(regsA)
	regsB, errs := register(b)
	defer release(regsB)
	for r, err := range errs {
		assert.ErrorContains(t, err, "registration table is full", "rank %d: the staging slot was handed out", r)
	}

	// The staging pointers are intact: an eager OneShot of unregistered buffers, which reads
	// its peers through them, sums its inputs.
	for _, bufs := range [][]driver.DevicePtr{a, b} {
		for r, rb := range g.ranks {
			require.NoError(t, rb.comm.Context().MemsetD8(bufs[r], 0, nbytes))
		}
	}
	rng := rand.New(rand.NewPCG(5, 6))
	inputs := g.fill(rng, dt, nbytes, false)
	want, err := ref.OneShot(dt, inputs)
	require.NoError(t, err)
	for _, rb := range g.ranks {
		require.NoError(t, rb.comm.AllReduce(rb.stream, rb.out, rb.in, nbytes/dt.Size(), dt))
	}
	g.syncAll(30 * time.Second)
	g.check(dt, want, false, "eager OneShot after a full table")
}

// TestGraphCloseAfterCommClose: the communicator's Close destroys the executables of the graphs
// still open while its context is still open, so a Graph.Close after it returns nil (it used
// to fail with "context is closed", and the executable leaked).
func TestGraphCloseAfterCommClose(t *testing.T) {
	requireGPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	comms, err := collective.NewGroup(ctx, virtualRanks(2), collective.Options{Timeout: 5 * time.Second})
	require.NoError(t, err)
	const count = 4096
	streams := make([]*driver.Stream, len(comms))
	bufs := make([]driver.DevicePtr, len(comms))
	for r, c := range comms {
		// The stream of the communicator's own context: the graph's executable belongs to
		// that context, which the communicator's Close closes.
		streams[r], err = c.Context().NewStream()
		require.NoError(t, err)
		bufs[r], err = c.Context().Alloc(2 * count)
		require.NoError(t, err)
	}
	graphs := make([]*collective.Graph, len(comms))
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			graphs[r], errs[r] = c.Capture(ctx, streams[r], func() error {
				return c.AllReduce(streams[r], bufs[r], bufs[r], count, collective.BFloat16)
			})
		}()
	}
	wg.Wait()
	for r := range comms {
		require.NoError(t, errs[r])
		require.NoError(t, graphs[r].Launch(streams[r]))
	}
	for r, c := range comms {
		require.NoError(t, streams[r].Wait(ctx))
		require.NoError(t, c.Err())
		require.NoError(t, c.Context().Free(bufs[r]))
		require.NoError(t, streams[r].Close())
	}
	for _, c := range comms {
		require.NoError(t, c.Close())
	}
	for r, x := range graphs {
		assert.Nil(t, x.Exec(), "rank %d: the communicator's Close destroyed the executable", r)
		require.NoError(t, x.Close(), "rank %d", r)
		require.NoError(t, x.Close(), "rank %d", r)
		assert.ErrorIs(t, x.Launch(streams[r]), collective.ErrClosed)
	}
}

// TestEagerCallDuringCapture: an all-reduce that another goroutine issues on another stream
// while a rank captures is an eager call: it runs now and sums its own inputs, takes no slot
// of the capture (a captured call's slot is filled only after capture: an eager kernel
// reading it would record ErrUnfilledSlot) and leaves the captured graph as it would be
// without it.
func TestEagerCallDuringCapture(t *testing.T) {
	requireGPU(t)
	const nbytes = 16 << 10
	dt := dtype.BFloat16
	count := nbytes / dt.Size()
	g := newGroup(t, virtualRanks(2), collective.Options{Algorithm: collective.OneShot, Timeout: 5 * time.Second}, nbytes)
	eagerIn, eagerOut := g.allocEach(nbytes), g.allocEach(nbytes)
	eagerStreams := make([]*driver.Stream, len(g.ranks))
	rng := rand.New(rand.NewPCG(7, 8))
	eagerInputs := make([][]byte, len(g.ranks))
	for r, rb := range g.ranks {
		var err error
		eagerStreams[r], err = rb.comm.Context().NewStream()
		require.NoError(t, err)
		defer eagerStreams[r].Close()
		eagerInputs[r] = ref.Random(rng, dt, nbytes)
		require.NoError(t, rb.comm.Context().CopyHtoD(eagerIn[r], eagerInputs[r]))
	}

	graphs := make([]*collective.Graph, len(g.ranks))
	g.parallel(func(rb *rankBufs) error {
		r := rb.comm.Rank()
		var err error
		graphs[r], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
			eager := make(chan error, 1)
			go func() { eager <- rb.comm.AllReduce(eagerStreams[r], eagerOut[r], eagerIn[r], count, dt) }()
			if err := <-eager; err != nil {
				return fmt.Errorf("eager call during capture: %w", err)
			}
			return rb.comm.AllReduce(rb.stream, rb.out, rb.in, count, dt)
		})
		return err
	})
	defer func() {
		for _, x := range graphs {
			require.NoError(t, x.Close())
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want, err := ref.OneShot(dt, eagerInputs)
	require.NoError(t, err)
	for r, rb := range g.ranks {
		require.NoError(t, eagerStreams[r].Wait(ctx))
		require.NoError(t, rb.comm.Err(), "rank %d", r)
		got := make([]byte, nbytes)
		require.NoError(t, rb.comm.Context().CopyDtoH(got, eagerOut[r]))
		n, _ := ref.Compare(dt, want, got)
		assert.Zero(t, n, "rank %d: elements of the eager call wrong", r)
	}

	inputs := g.fill(rng, dt, nbytes, false)
	want, err = ref.OneShot(dt, inputs)
	require.NoError(t, err)
	for r, rb := range g.ranks {
		require.NoError(t, graphs[r].Launch(rb.stream))
	}
	g.syncAll(30 * time.Second)
	g.check(dt, want, false, "graph captured beside an eager call")
}

// TestForkedStreamCallDuringCapture: a call on a stream forked from the captured one (it
// waits for an event recorded on it, so the driver records it into the same graph) is part
// of the graph, and the graph's replay reduces new inputs exactly.
func TestForkedStreamCallDuringCapture(t *testing.T) {
	requireGPU(t)
	const nbytes = 16 << 10
	dt := dtype.BFloat16
	count := nbytes / dt.Size()
	g := newGroup(t, virtualRanks(2), collective.Options{Algorithm: collective.OneShot, Timeout: 5 * time.Second}, nbytes)
	graphs := make([]*collective.Graph, len(g.ranks))
	g.parallel(func(rb *rankBufs) error {
		cx := rb.comm.Context()
		forked, err := cx.NewStream()
		if err != nil {
			return err
		}
		defer forked.Close()
		fork, err := cx.NewEvent(false)
		if err != nil {
			return err
		}
		defer fork.Close()
		join, err := cx.NewEvent(false)
		if err != nil {
			return err
		}
		defer join.Close()
		graphs[rb.comm.Rank()], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
			if err := fork.Record(rb.stream); err != nil {
				return err
			}
			if err := forked.WaitEvent(fork); err != nil {
				return err
			}
			if err := rb.comm.AllReduce(forked, rb.out, rb.in, count, dt); err != nil {
				return err
			}
			if err := join.Record(forked); err != nil {
				return err
			}
			return rb.stream.WaitEvent(join)
		})
		return err
	})
	defer func() {
		for _, x := range graphs {
			require.NoError(t, x.Close())
		}
	}()
	rng := rand.New(rand.NewPCG(9, 10))
	for run := range 2 {
		inputs := g.fill(rng, dt, nbytes, false)
		want, err := ref.OneShot(dt, inputs)
		require.NoError(t, err)
		for r, rb := range g.ranks {
			require.NoError(t, graphs[r].Launch(rb.stream))
		}
		g.syncAll(30 * time.Second)
		g.check(dt, want, false, fmt.Sprintf("graph with a call on a forked stream, run %d", run))
	}
}

// TestCapturePanic: a panic in Capture's fn reaches the caller, and leaves the rank out of
// capture, its stream no longer capturing and the capture's slots given back, so that the next
// Capture works. More panicking captures run than the table has room for, had their slots
// stayed taken.
func TestCapturePanic(t *testing.T) {
	requireGPU(t)
	const nbytes = 16 << 10
	dt := dtype.BFloat16
	count := nbytes / dt.Size()
	// The staging slot and two more: a direct TwoShot shares its input and its output.
	g := newGroup(t, virtualRanks(2), collective.Options{Algorithm: collective.TwoShot, MaxSlots: 3, Timeout: 5 * time.Second}, nbytes)
	const boom = "fn panics"
	for round := range 3 {
		g.parallel(func(rb *rankBufs) error {
			var recovered any
			func() {
				defer func() {
					if p := recover(); p != nil {
						recovered = p
					}
				}()
				_, err := rb.comm.Capture(context.Background(), rb.stream, func() error {
					if err := rb.comm.AllReduce(rb.stream, rb.out, rb.in, count, dt); err != nil {
						return err
					}
					panic(boom)
				})
				recovered = err
			}()
			if recovered != boom {
				return fmt.Errorf("round %d, rank %d: Capture ended with %v, want the panic %q", round, rb.comm.Rank(), recovered, boom)
			}
			if capturing, err := rb.stream.IsCapturing(); err != nil || capturing {
				return fmt.Errorf("round %d, rank %d: stream still capturing (%v)", round, rb.comm.Rank(), err)
			}
			return nil
		})
	}

	graphs := make([]*collective.Graph, len(g.ranks))
	g.parallel(func(rb *rankBufs) error {
		var err error
		graphs[rb.comm.Rank()], err = rb.comm.Capture(context.Background(), rb.stream, func() error {
			return rb.comm.AllReduce(rb.stream, rb.out, rb.in, count, dt)
		})
		return err
	})
	defer func() {
		for _, x := range graphs {
			require.NoError(t, x.Close())
		}
	}()
	inputs := g.fill(rand.New(rand.NewPCG(9, 10)), dt, nbytes, false)
	want, err := ref.TwoShot(dt, inputs)
	require.NoError(t, err)
	for r, rb := range g.ranks {
		require.NoError(t, graphs[r].Launch(rb.stream))
	}
	g.syncAll(30 * time.Second)
	g.check(dt, want, false, "graph captured after panicking captures")
}
