package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/collective/bootstrap"
	"github.com/goccl/goccl/driver"
)

// hostComm is a rank whose custom kernels serve it, built without a driver: its buffers are
// known device memory (the pointer cache holds them) and its ranks share one process
// (allLocal: a buffer is described by its address), so Register reaches its exchange over
// boot without a driver call. table is nil unless the test sets one.
func hostComm(rank, size int, boot bootstrap.Bootstrap, buffers ...allocRange) *Comm {
	c := &Comm{rank: rank, size: size, custom: true, allLocal: true, boot: boot, opts: Options{Timeout: time.Second},
		registered: map[driver.DevicePtr]*Registration{}, graphs: map[*Graph]struct{}{},
		opened: map[ipcKey]*openedBuffer{}}
	for _, b := range buffers {
		c.pointers.add(b)
	}
	return c
}

// registerAll calls Register on every rank at once, as the collective call needs, and returns
// each rank's error.
func registerAll(t *testing.T, comms []*Comm, ptr driver.DevicePtr, bytes uint64) []error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := make([]error, len(comms))
	done := make(chan struct{})
	for r, c := range comms {
		go func() {
			defer func() { done <- struct{}{} }()
			_, errs[r] = c.Register(ctx, ptr, bytes)
		}()
	}
	for range comms {
		<-done
	}
	return errs
}

// TestFullTableKeepsStagingSlot: a Register refused because the table is full gives back no
// slot, since it took none; above all never slot 0, the staging slot every eager pull
// all-reduce reads its peers through, which a later registration would otherwise be handed
// and overwrite. A Register that reserved a slot and then failed (a peer refused) gives that
// slot back once.
func TestFullTableKeepsStagingSlot(t *testing.T) {
	boots, err := bootstrap.NewInProcess(2)
	require.NoError(t, err)
	const buf = driver.DevicePtr(0x10000)
	comms := []*Comm{
		hostComm(0, 2, boots[0], allocRange{base: buf, size: 1 << 20}),
		hostComm(1, 2, boots[1], allocRange{base: buf, size: 1 << 20}),
	}
	// Rank 0 has one slot left; rank 1's table is full: slot 0 (staging) and a registration.
	comms[0].table = &slotTable{slots: 3, next: 2}
	comms[1].table = &slotTable{slots: 2, next: 2}

	for r, err := range registerAll(t, comms, buf, 4096) {
		require.Error(t, err, "rank %d", r)
		var refused *RefusedError
		if r == 0 {
			require.ErrorAs(t, err, &refused, "rank 0 learns rank 1's refusal")
		}
		assert.ErrorContains(t, err, "registration table is full", "rank %d", r)
	}
	assert.Empty(t, comms[0].registered)
	assert.Empty(t, comms[1].registered)

	// Rank 1 took no slot and gave none back.
	assert.Empty(t, comms[1].table.free)
	assert.Equal(t, 2, comms[1].table.inUse(), "the staging slot and the registration are still held")
	slot, err := comms[1].table.reserve()
	require.ErrorIs(t, err, ErrInvalidArgument, "the table is still full")
	assert.Equal(t, -1, slot)
	// Once the registration's slot 1 is released, it is the only slot handed out.
	comms[1].table.unreserve(1)
	slot, err = comms[1].table.reserve()
	require.NoError(t, err)
	assert.Equal(t, 1, slot)
	_, err = comms[1].table.reserve()
	require.Error(t, err)

	// Rank 0 reserved slot 2 and gave it back once.
	assert.Equal(t, []int{2}, comms[0].table.free)
	assert.Equal(t, 2, comms[0].table.inUse())
	for range 2 {
		slot, err := comms[0].table.reserve()
		if err != nil {
			assert.Equal(t, -1, slot)
			break
		}
		assert.Equal(t, 2, slot, "rank 0: only the slot that was given back")
	}
}

// TestCloseInterruptsExchange: Close fails the bootstrap before it waits for the
// communicator's lock, so a Register or Capture waiting for a peer that never comes (a stuck
// process, a goroutine that died) fails at once instead of holding Close up until its ctx,
// here one without deadline, ends.
func TestCloseInterruptsExchange(t *testing.T) {
	for _, call := range []struct {
		name string
		do   func(c *Comm) error
	}{
		{"register", func(c *Comm) error {
			_, err := c.Register(context.Background(), 0x10000, 4096)
			return err
		}},
		// Without a GPU the stream capture fails to begin; with one, the stream (never
		// created) is refused: either way the rank takes its failure to the exchange, where
		// it waits for the peer.
		{"capture", func(c *Comm) error {
			_, err := c.Capture(context.Background(), &driver.Stream{}, func() error { return nil })
			return err
		}},
	} {
		t.Run(call.name, func(t *testing.T) {
			boots, err := bootstrap.NewInProcess(2)
			require.NoError(t, err)
			defer boots[1].Close()
			c := hostComm(0, 2, boots[0], allocRange{base: 0x10000, size: 1 << 20})
			c.table = &slotTable{slots: 4, next: 1}

			callDone := make(chan error, 1)
			go func() { callDone <- call.do(c) }()
			// Let the call reach its exchange. Should Close come first all the same, the
			// call fails with ErrClosed, and the test asserts the same outcome.
			time.Sleep(100 * time.Millisecond)

			start := time.Now()
			closeDone := make(chan error, 1)
			go func() { closeDone <- c.Close() }()
			select {
			case err := <-closeDone:
				require.NoError(t, err)
				assert.Less(t, time.Since(start), c.drainLimit(), "Close returned within its bound, but late")
			case <-time.After(c.drainLimit() + 2*time.Second):
				boots[0].Close()
				t.Fatalf("Close blocked for %v behind a %s waiting for its peer", time.Since(start), call.name)
			}
			select {
			case err := <-callDone:
				require.Error(t, err)
				assert.True(t, errors.Is(err, bootstrap.ErrClosed) || errors.Is(err, ErrClosed), "the %s fails because its rank closed: %v", call.name, err)
			case <-time.After(5 * time.Second):
				t.Fatalf("the %s still waits after Close", call.name)
			}
			assert.True(t, c.released)
			assert.Equal(t, 1, c.table.inUse(), "no slot leaked by the failed call")

			// The peer learns at once that this rank is gone.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			assert.ErrorIs(t, boots[1].Barrier(ctx), bootstrap.ErrPeerLost)
		})
	}
}

// TestCloseDestroysGraphs: the communicator's Close destroys the executables of the graphs
// still open, while its context is open (a Graph.Close after it could no longer do that, and
// the executable would leak); a Graph.Close after it then does nothing and returns nil, and a
// Launch is refused.
func TestCloseDestroysGraphs(t *testing.T) {
	boots, err := bootstrap.NewInProcess(1)
	require.NoError(t, err)
	c := hostComm(0, 1, boots[0])
	// An executable with no handle: its Close makes no driver call.
	g := &Graph{c: c, exec: &driver.GraphExec{}, slots: []int{1}}
	c.graphs[g] = struct{}{}

	require.NoError(t, c.Close())
	assert.Nil(t, g.Exec(), "the communicator's Close destroyed the executable")
	assert.Empty(t, c.graphs)
	require.NoError(t, g.Close())
	require.NoError(t, g.Close())
	assert.ErrorIs(t, g.Launch(&driver.Stream{}), ErrClosed)
}

// TestCloseDestroysGraphsBeforeNCCL: Close destroys the graphs' executables before the NCCL
// communicator, since a graph may hold captured NCCL calls whose resources NCCL frees when the
// graph goes.
func TestCloseDestroysGraphsBeforeNCCL(t *testing.T) {
	boots, err := bootstrap.NewInProcess(1)
	require.NoError(t, err)
	c := hostComm(0, 1, boots[0])
	g := &Graph{c: c, exec: &driver.GraphExec{}}
	c.graphs[g] = struct{}{}
	var execAtDestroy *driver.GraphExec
	fake := &fakeNCCL{onDestroy: func() { execAtDestroy = g.exec }}
	c.nccl = newNCCLEngine(fake, nil, 0)

	require.NoError(t, c.Close())
	assert.Equal(t, int32(1), fake.destroys.Load())
	assert.Nil(t, execAtDestroy, "the graph's executable was destroyed before the NCCL communicator")
}

// TestEagerCallDuringCapture: while Capture runs fn, which it does without the
// communicator's lock, a call on a stream other than the captured one (another goroutine's
// eager all-reduce) is eager: it reads its input through the staging slot, sees no shared
// output, and neither takes a slot of the capture nor adds to its pattern. A call on the
// captured stream is captured. Telling them apart costs no allocation.
func TestEagerCallDuringCapture(t *testing.T) {
	const base = driver.DevicePtr(0x7000_0000)
	src, dst := driver.DevicePtr(0x1000_0000), driver.DevicePtr(0x2000_0000)
	const n = 4096
	c := &Comm{table: &slotTable{base: base, slots: 8, next: 1}, registered: map[driver.DevicePtr]*Registration{}}
	captured, other := &driver.Stream{}, &driver.Stream{}
	cs := newCaptureState()
	cs.stream = captured
	c.capture = cs

	hidden := c.callOn(other)
	assert.Nil(t, c.capture, "an eager call sees no capture")
	slot, staged, err := c.inputSlot(OneShot, dst, src, n)
	require.NoError(t, err)
	assert.Equal(t, [2]any{base, true}, [2]any{slot, staged}, "through the staging slot")
	_, shared := c.sharedOutput(dst, n)
	assert.False(t, shared)
	c.endCall(hidden)
	assert.Same(t, cs, c.capture, "the capture is back once the call is done")
	assert.Empty(t, cs.slots)
	assert.Empty(t, cs.uses)
	assert.Equal(t, 1, c.table.inUse())

	hidden = c.callOn(captured)
	assert.Same(t, cs, c.capture)
	slot, staged, err = c.inputSlot(OneShot, dst, src, n)
	require.NoError(t, err)
	assert.Equal(t, [2]any{base + slotBytes, false}, [2]any{slot, staged}, "a slot of the capture's own")
	_, shared = c.sharedOutput(dst, n)
	assert.True(t, shared)
	c.endCall(hidden)
	assert.Same(t, cs, c.capture)
	assert.Equal(t, []int{1}, cs.slots)
	assert.Equal(t, []uint32{0}, cs.uses)

	assert.True(t, cs.records(captured))
	assert.False(t, cs.records(other))
	assert.False(t, cs.records(nil))
	assert.Zero(t, testing.AllocsPerRun(100, func() { c.endCall(c.callOn(other)) }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { c.endCall(c.callOn(captured)) }))
	assert.Same(t, cs, c.capture)
}

// TestCaptureRefusalReachesPeers: a Capture that one rank refuses before it records (a nil
// fn, a nil or unusable stream, a failed communicator) goes to the peers through the
// exchange, as a refused Register does: every rank's Capture returns at once instead of
// waiting for its ctx, and the communicator's later exchanges still pair up.
func TestCaptureRefusalReachesPeers(t *testing.T) {
	noop := func() error { return nil }
	for _, tc := range []struct {
		name   string
		refuse func(c *Comm, ctx context.Context) error
		want   string
	}{
		{"nil fn", func(c *Comm, ctx context.Context) error {
			_, err := c.Capture(ctx, &driver.Stream{}, nil)
			return err
		}, "capture of a nil fn"},
		{"nil stream", func(c *Comm, ctx context.Context) error {
			_, err := c.Capture(ctx, nil, noop)
			return err
		}, "nil stream"},
		{"zero stream", func(c *Comm, ctx context.Context) error {
			_, err := c.Capture(ctx, &driver.Stream{}, noop)
			return err
		}, "not made by driver.NewStream"},
		{"failed communicator", func(c *Comm, ctx context.Context) error {
			c.failed = fmt.Errorf("%w: an earlier kernel timed out", ErrUnusable)
			_, err := c.Capture(ctx, &driver.Stream{}, noop)
			return err
		}, "an earlier kernel timed out"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			boots, err := bootstrap.NewInProcess(2)
			require.NoError(t, err)
			comms := make([]*Comm, 2)
			for r := range comms {
				comms[r] = hostComm(r, 2, boots[r], allocRange{base: 0x10000, size: 1 << 20})
				comms[r].table = &slotTable{slots: 4, next: 1}
				defer boots[r].Close()
			}
			// Long enough that a rank left waiting for its peer shows.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			peerErr := make(chan error, 1)
			go func() {
				// Without a GPU the peer has no stream either: it refuses its zero Stream and
				// takes that refusal to the exchange, where it meets rank 0's. Before rank 0's
				// refusal went there too, this rank waited for its ctx.
				_, err := comms[1].Capture(ctx, &driver.Stream{}, noop)
				peerErr <- err
			}()
			err = tc.refuse(comms[0], ctx)
			require.Error(t, err)
			assert.ErrorContains(t, err, tc.want)
			assert.ErrorContains(t, err, "rank 0: capture")
			require.Error(t, <-peerErr)
			assert.Less(t, time.Since(start), 10*time.Second, "the peer waited for its ctx instead of hearing of the refusal")

			// The ranks' exchanges still pair up: Register gets past its exchange to the
			// write of its slot, which needs a GPU.
			comms[0].failed = nil
			for r, err := range registerAll(t, comms, 0x10000, 4096) {
				require.Error(t, err, "rank %d", r)
				assert.ErrorContains(t, err, "write registration slot", "rank %d: Register after a refused Capture", r)
			}
		})
	}
}

// TestCaptureWhileCapturing: a Capture while the rank is already capturing is refused on this
// rank alone, without an exchange: one would pair with the peers' exchange of the capture in
// progress.
func TestCaptureWhileCapturing(t *testing.T) {
	c := hostComm(0, 2, nil) // no bootstrap: an exchange would fail the test
	c.capture = newCaptureState()
	_, err := c.Capture(context.Background(), &driver.Stream{}, func() error { return nil })
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "rank 0 is already capturing")
}

// TestErrAfterCloseKeepsFailure: a failure found before Close (here the NCCL engine's) is what
// Err reports after Close, not ErrClosed: Close reads it before it frees the engine.
func TestErrAfterCloseKeepsFailure(t *testing.T) {
	f := &fakeNCCL{asyncErr: errors.New("ncclCommGetAsyncError: peer rank 1 died")}
	c := &Comm{opts: Options{Timeout: time.Second}, nccl: newNCCLEngine(f, nil, time.Second)}
	require.True(t, eventually(5*time.Second, func() bool { return c.nccl.failure() != nil }), "the engine saw the failure")
	require.NoError(t, c.Close())
	err := c.Err()
	assert.ErrorIs(t, err, ErrUnusable)
	assert.ErrorContains(t, err, "peer rank 1 died")
	assert.NotErrorIs(t, err, ErrClosed)
}

// TestDrainLimitSaturates: a Timeout meant as "forever" gives a drain limit that saturates
// instead of wrapping to a negative or short one, which would make Close give up at once.
func TestDrainLimitSaturates(t *testing.T) {
	for _, timeout := range []time.Duration{time.Second, 1 << 62, math.MaxInt64} {
		o, err := Options{Timeout: timeout}.withDefaults()
		require.NoError(t, err)
		c := &Comm{opts: o}
		assert.GreaterOrEqual(t, c.drainLimit(), timeout, "Timeout %v", timeout)
	}
	assert.Equal(t, 7*time.Second, (&Comm{opts: Options{Timeout: time.Second}}).drainLimit())
}

// TestCloseDuringRecordingCapture: a Close while a Capture is recording (its fn runs, in another
// goroutine or calling Close itself) frees nothing and returns at once: its graph may hold NCCL
// calls, which NCCL must see destroyed before its communicator. The Capture frees everything
// once fn has returned, and a later Close does nothing.
func TestCloseDuringRecordingCapture(t *testing.T) {
	c := hostComm(0, 2, nil)
	cs := newCaptureState()
	c.capture = cs // fn runs
	start := time.Now()
	require.NoError(t, c.Close())
	assert.Less(t, time.Since(start), c.drainLimit(), "Close waited for the Capture")
	assert.True(t, c.closed, "the communicator takes no new work")
	assert.False(t, c.released, "Close freed the communicator while a Capture was recording")
	require.NoError(t, c.Close(), "a second Close while fn runs")
	assert.False(t, c.released)

	// fn returns and Capture ends: as its closed path does, with the lock held.
	c.mu.Lock()
	c.capture = nil
	require.NoError(t, c.releasePendingNow())
	c.mu.Unlock()
	assert.True(t, c.released, "the Capture freed everything")
	require.NoError(t, c.Close())

	// fn panics: record's cleanup frees it too.
	p := hostComm(0, 2, nil)
	p.table = &slotTable{slots: 4, next: 1}
	pcs := newCaptureState()
	pcs.stream = &driver.Stream{}
	p.capture = pcs
	assert.Panics(t, func() {
		_, _ = p.record(pcs.stream, pcs, func() error {
			require.NoError(t, p.Close(), "Close from fn")
			panic("fn fails")
		})
	})
	assert.True(t, p.released, "record's cleanup freed what the Close from fn left")
	assert.Nil(t, p.capture)
}

// TestGraphLaunchRefusesBadStream: a replay on a nil or zero stream is refused before anything
// is recorded on it, so that a graph holding NCCL calls does not fail the NCCL engine (a replay
// it cannot follow would) over a caller's mistake.
func TestGraphLaunchRefusesBadStream(t *testing.T) {
	f := &fakeNCCL{}
	c := hostComm(0, 2, nil)
	c.nccl = newNCCLEngine(f, func() (streamEvent, error) { return nil, errors.New("no event on a bad stream") }, time.Second)
	t.Cleanup(func() { c.nccl.close(context.Background()) })
	g := &Graph{c: c, calls: 1, ncclCalls: 1}
	for _, stream := range []*driver.Stream{nil, {}} {
		assert.ErrorIs(t, g.Launch(stream), ErrInvalidArgument)
	}
	assert.NoError(t, c.nccl.failure(), "the NCCL engine has not failed")
	assert.Zero(t, f.aborts.Load())
}
