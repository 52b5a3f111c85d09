package collective_test

import (
	"context"
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

// eachRank runs fn for every rank in its own goroutine, as a collective call needs, and
// returns each rank's error (group.parallel fails the test on any).
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
