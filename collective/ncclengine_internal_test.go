package collective

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/nccl"
)

// fakeNCCL stands in for an NCCL communicator. Like a real one, it must never be handed a call
// while it is aborted or being aborted: such a call reaches a freed ncclComm_t.
type fakeNCCL struct {
	mu        sync.Mutex
	asyncErr  error         // what AsyncError reports
	callErr   error         // what AllReduce returns
	callTime  time.Duration // how long AllReduce stays inside "NCCL"
	gpu       *fakeGPU      // where AllReduce queues its work; nil: nowhere
	onDestroy func()        // called by Destroy; nil: nothing

	inCall      atomic.Int32
	calls       atomic.Int32
	aborts      atomic.Int32
	destroys    atomic.Int32
	aborted     atomic.Bool
	callOnFreed atomic.Bool // a call met an aborted communicator, or an abort met a call
}

func (f *fakeNCCL) AllReduce(sendbuff, recvbuff, count uint64, dt nccl.DataType, op nccl.RedOp, stream uintptr) error {
	f.inCall.Add(1)
	defer f.inCall.Add(-1)
	f.calls.Add(1)
	if f.aborted.Load() {
		return nccl.ErrClosed // nccl.Comm refuses a call once its handle is retired
	}
	time.Sleep(f.callTime)
	if f.gpu != nil {
		f.gpu.enqueue()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.callErr
}

func (f *fakeNCCL) AsyncError() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.aborted.Load() {
		return nccl.ErrClosed
	}
	return f.asyncErr
}

func (f *fakeNCCL) Abort() error {
	if f.inCall.Load() > 0 {
		f.callOnFreed.Store(true)
	}
	if f.aborted.Swap(true) {
		return nil
	}
	f.aborts.Add(1)
	if f.gpu != nil {
		f.gpu.abort() // NCCL's kernels see the abort flag and end
	}
	return nil
}

func (f *fakeNCCL) Destroy(ctx context.Context) error {
	if f.onDestroy != nil {
		f.onDestroy()
	}
	f.destroys.Add(1)
	f.aborted.Store(true)
	return nil
}

// fakeGPU is one stream's queue of work: each piece has a position, and the GPU has finished
// everything up to done. An event is done once the work queued before its record is.
type fakeGPU struct {
	mu         sync.Mutex
	queued     int
	done       int
	abortedPos int // work up to here ends at an abort (NCCL's kernels); 0: none
	stuck      int // pieces from here on (NCCL's, waiting for a dead peer) never finish unless aborted; 0: none

	events atomic.Int32 // events created
}

// enqueue queues one piece of work and returns its position.
func (g *fakeGPU) enqueue() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.queued++
	return g.queued
}

// finish lets the GPU finish the work up to position n, or up to the first stuck piece.
func (g *fakeGPU) finish(n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stuck > 0 && n >= g.stuck && g.abortedPos == 0 {
		n = g.stuck - 1
	}
	g.done = max(g.done, n)
}

// abort ends every piece queued so far (an aborted communicator's kernels return).
func (g *fakeGPU) abort() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.abortedPos = g.queued
	g.done = max(g.done, g.queued)
}

func (g *fakeGPU) newEvent() (streamEvent, error) {
	g.events.Add(1)
	return &fakeEvent{gpu: g}, nil
}

type fakeEvent struct {
	gpu    *fakeGPU
	at     atomic.Int64 // position of the work it follows
	closed atomic.Bool
}

func (e *fakeEvent) Record(*driver.Stream) error {
	e.gpu.mu.Lock()
	defer e.gpu.mu.Unlock()
	e.at.Store(int64(e.gpu.queued))
	return nil
}

func (e *fakeEvent) Query() (bool, error) {
	if e.closed.Load() {
		return false, errors.New("query of a destroyed event")
	}
	e.gpu.mu.Lock()
	defer e.gpu.mu.Unlock()
	return int64(e.gpu.done) >= e.at.Load(), nil
}

func (e *fakeEvent) Close() error {
	e.closed.Store(true)
	return nil
}

// fakeEngine is an engine over f whose calls queue work on gpu and must complete within
// timeout; it is closed at the end of the test.
func fakeEngine(t *testing.T, f *fakeNCCL, gpu *fakeGPU, timeout time.Duration) *ncclEngine {
	t.Helper()
	f.gpu = gpu
	e := newNCCLEngine(f, gpu.newEvent, timeout)
	t.Cleanup(func() { e.close(context.Background()) })
	return e
}

// eventually waits up to limit for cond.
func eventually(limit time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestNCCLFailureAborts: whatever fails the NCCL engine (an asynchronous error that NCCL
// reports, such as a peer that went away, or a call that NCCL refuses) aborts its
// communicator at once. Until it is aborted, NCCL's kernels queued before wait for the peer
// forever: the stream never drains, and Close, which waits for this communicator's work
// before it frees anything, could never free it.
func TestNCCLFailureAborts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fail  func(f *fakeNCCL)
		issue bool // the failure comes from the next call
	}{
		{"async error", func(f *fakeNCCL) {
			f.mu.Lock()
			f.asyncErr = fmt.Errorf("ncclCommGetAsyncError: %w", nccl.ErrRemoteError)
			f.mu.Unlock()
		}, false},
		{"refused call", func(f *fakeNCCL) {
			f.mu.Lock()
			f.callErr = fmt.Errorf("ncclAllReduce: %w", nccl.ErrInvalidUsage)
			f.mu.Unlock()
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpu := &fakeGPU{stuck: 1} // the peer is gone: NCCL's kernels never finish
			f := &fakeNCCL{}
			// A timeout far beyond the test: only the failure may lead to the abort.
			e := fakeEngine(t, f, gpu, time.Hour)
			stream := &driver.Stream{}
			require.NoError(t, e.allReduce(stream, 0x1000, 0x1000, 1<<20, BFloat16, true))
			tc.fail(f)
			if tc.issue {
				require.ErrorIs(t, e.allReduce(stream, 0x1000, 0x1000, 1<<20, BFloat16, true), nccl.ErrInvalidUsage)
			}
			require.True(t, eventually(5*time.Second, func() bool { return e.failure() != nil }), "the engine saw the failure")
			assert.ErrorIs(t, e.failure(), ErrUnusable)
			require.True(t, eventually(5*time.Second, func() bool { return f.aborts.Load() == 1 }),
				"the communicator was not aborted: its queued kernels wait for the peer forever")
			gpu.finish(gpu.queued)
			assert.Equal(t, gpu.queued, gpu.done, "the queued work ended with the abort")
			assert.False(t, f.callOnFreed.Load())
		})
	}
}

// TestNCCLWatchdogAbortWaitsForCall: the watchdog aborts a timed-out communicator from its own
// goroutine, while the rank's goroutine may be handing NCCL its next call (a service that has
// not looked at Err yet). ncclCommAbort frees the communicator, so it must wait until that
// call is back from NCCL: the call must never reach a freed communicator, and the abort must
// come all the same.
func TestNCCLWatchdogAbortWaitsForCall(t *testing.T) {
	gpu := &fakeGPU{stuck: 1}
	f := &fakeNCCL{}
	e := fakeEngine(t, f, gpu, 20*time.Millisecond)
	stream := &driver.Stream{}
	require.NoError(t, e.allReduce(stream, 0x1000, 0x1000, 1<<20, BFloat16, true))
	gpu.finish(gpu.queued) // the first call can start, and never ends: its peer is gone

	// The next call spends 300 ms inside NCCL (a connection that NCCL sets up, say), long past
	// the first call's timeout.
	f.callTime = 300 * time.Millisecond
	_ = e.allReduce(stream, 0x2000, 0x2000, 1<<20, BFloat16, true)
	assert.False(t, f.callOnFreed.Load(), "the watchdog aborted the communicator while a call was inside NCCL")
	require.True(t, eventually(5*time.Second, func() bool { return f.aborts.Load() == 1 }), "the timed-out communicator was aborted")
	assert.ErrorIs(t, e.failure(), ErrTimeout)
}

// TestNCCLTimeoutCountsFromStart: Options.Timeout bounds how long an all-reduce handed to
// NCCL runs, counted from when the stream reaches it: work queued ahead of it on the stream
// (the service's own kernels, longer than the timeout) does not count, and does not get the
// communicator aborted. A call that starts and does not end within the timeout fails it.
func TestNCCLTimeoutCountsFromStart(t *testing.T) {
	gpu := &fakeGPU{}
	f := &fakeNCCL{}
	const timeout = 30 * time.Millisecond
	e := fakeEngine(t, f, gpu, timeout)
	stream := &driver.Stream{}
	ahead := gpu.enqueue() // a kernel of the service, queued before the all-reduce
	require.NoError(t, e.allReduce(stream, 0x1000, 0x1000, 1<<20, BFloat16, true))
	time.Sleep(10 * timeout)
	require.NoError(t, e.failure(), "the all-reduce timed out while the stream still ran the work queued ahead of it")
	assert.Zero(t, f.aborts.Load())

	gpu.finish(ahead) // the all-reduce starts, and completes well within the timeout
	time.Sleep(timeout / 3)
	gpu.finish(gpu.queued)
	require.True(t, eventually(5*time.Second, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.pending) == 0
	}), "the completed call was retired")
	require.NoError(t, e.failure())

	// The next call starts at once and never ends: its peer is gone.
	gpu.mu.Lock()
	gpu.stuck = gpu.queued + 1
	gpu.mu.Unlock()
	start := time.Now()
	require.NoError(t, e.allReduce(stream, 0x1000, 0x1000, 1<<20, BFloat16, true))
	gpu.finish(gpu.queued)
	require.True(t, eventually(5*time.Second, func() bool { return e.failure() != nil }))
	assert.ErrorIs(t, e.failure(), ErrTimeout)
	assert.GreaterOrEqual(t, time.Since(start), timeout)
	require.True(t, eventually(5*time.Second, func() bool { return f.aborts.Load() == 1 }))
}

// TestNCCLReplayTimeout: the replay of a captured graph that holds NCCL calls is followed by
// the watchdog as a whole, since the watchdog cannot see the graph's calls one by one: it may
// run up to the timeout times the calls it holds, counted from when the stream reaches it,
// and a replay stuck past that (a peer that never replays its graph) aborts the communicator
// with an ErrTimeout that names the replay. Once the engine has failed, no graph is launched:
// the aborted communicator has freed what the graph's NCCL calls use.
func TestNCCLReplayTimeout(t *testing.T) {
	gpu := &fakeGPU{}
	f := &fakeNCCL{}
	const timeout = 20 * time.Millisecond
	const calls = 5
	e := fakeEngine(t, f, gpu, timeout)
	stream := &driver.Stream{}
	var launches atomic.Int32
	launch := func() error {
		launches.Add(1)
		gpu.mu.Lock()
		gpu.stuck = gpu.queued + 1 // the graph's NCCL calls wait for a peer that never replays
		gpu.mu.Unlock()
		gpu.enqueue()
		return nil
	}
	start := time.Now()
	require.NoError(t, e.replay(stream, launch, calls, "a replay of a test graph"))
	gpu.finish(gpu.queued)
	time.Sleep(2 * timeout)
	require.NoError(t, e.failure(), "the replay timed out after twice the timeout; it holds %d calls", calls)
	assert.Zero(t, f.aborts.Load())

	require.True(t, eventually(5*time.Second, func() bool { return e.failure() != nil }), "the stuck replay was never timed out")
	assert.GreaterOrEqual(t, time.Since(start), calls*timeout)
	assert.ErrorIs(t, e.failure(), ErrTimeout)
	assert.ErrorIs(t, e.failure(), ErrUnusable)
	assert.Contains(t, e.failure().Error(), "a replay of a test graph")
	require.True(t, eventually(5*time.Second, func() bool { return f.aborts.Load() == 1 }), "the timed-out communicator was aborted")

	err := e.replay(stream, launch, calls, "a replay of a test graph")
	require.ErrorIs(t, err, ErrUnusable, "a replay after the failure")
	assert.Equal(t, int32(1), launches.Load(), "a graph was launched on an aborted communicator")
	assert.False(t, f.callOnFreed.Load())
}

// TestNCCLReplayLimitSaturates: a graph of very many calls under a long timeout gets no limit
// rather than one that wrapped around to a short (or negative) time.
func TestNCCLReplayLimitSaturates(t *testing.T) {
	gpu := &fakeGPU{}
	e := fakeEngine(t, &fakeNCCL{}, gpu, time.Hour)
	require.NoError(t, e.replay(&driver.Stream{}, func() error { gpu.enqueue(); return nil }, 1<<40, "a replay"))
	e.mu.Lock()
	defer e.mu.Unlock()
	require.Len(t, e.pending, 1)
	assert.Equal(t, time.Duration(math.MaxInt64), e.pending[0].limit)
}

// TestNCCLCallsAllocateNothing: an eager all-reduce handed to NCCL, followed by the watchdog
// until it completes, allocates nothing once the engine has its events: a service calls it
// thousands of times a second, and garbage there is GC work on its hot path. The calls here
// complete one by one, as a stream drains them, with the watchdog's checks in between.
func TestNCCLCallsAllocateNothing(t *testing.T) {
	gpu := &fakeGPU{}
	e := fakeEngine(t, &fakeNCCL{}, gpu, time.Hour)
	stream := &driver.Stream{}
	call := func() {
		if err := e.allReduce(stream, 0x1000, 0x2000, 1<<10, BFloat16, true); err != nil {
			t.Fatal(err)
		}
		gpu.finish(gpu.queued)
		if e.check() {
			t.Fatal("the engine failed")
		}
	}
	for range 64 {
		call() // the engine's events and its queue reach their working size
	}
	assert.Zero(t, testing.AllocsPerRun(1000, call), "allocations per call")

	// Calls that pile up before the stream drains (a burst of eager calls) allocate only
	// while the queue grows past its largest size so far.
	burst := func() {
		for range 32 {
			if err := e.allReduce(stream, 0x1000, 0x2000, 1<<10, BFloat16, true); err != nil {
				t.Fatal(err)
			}
		}
		gpu.finish(gpu.queued)
		if e.check() {
			t.Fatal("the engine failed")
		}
	}
	burst()
	assert.Zero(t, testing.AllocsPerRun(100, burst), "allocations per burst of 32 calls")
	e.mu.Lock()
	assert.Empty(t, e.pending, "every completed call left the queue")
	e.mu.Unlock()
}

// TestNCCLEventsFollowCallsInFlight: the events that follow calls handed to NCCL are as many
// as the calls in flight need, however fast the calls come: a call that finds no spare event
// retires the completed calls itself instead of creating events until the watchdog's next
// check.
func TestNCCLEventsFollowCallsInFlight(t *testing.T) {
	gpu := &fakeGPU{}
	e := fakeEngine(t, &fakeNCCL{}, gpu, time.Hour)
	stream := &driver.Stream{}
	for i := range 1000 {
		require.NoError(t, e.allReduce(stream, 0x1000, 0x2000, 1<<10, BFloat16, true))
		if i%4 == 3 {
			gpu.finish(gpu.queued) // the stream drains every four calls
		}
	}
	// Four calls in flight follow with eight events; the spare ones of the four before, and a
	// check's timing, may add as many again.
	assert.LessOrEqual(t, gpu.events.Load(), int32(16), "events created for 1000 calls, at most 4 in flight")
}

// failingEvents makes gpu's events, but the n-th one (from 1) fails to be made.
func failingEvents(gpu *fakeGPU, n int32) func() (streamEvent, error) {
	var made atomic.Int32
	return func() (streamEvent, error) {
		if made.Add(1) == n {
			return nil, errors.New("cuEventCreate: CUDA_ERROR_OUT_OF_MEMORY")
		}
		return gpu.newEvent()
	}
}

// TestNCCLEventFailureFailsTheEngine: an event the engine cannot make fails the engine and
// aborts the NCCL communicator, whichever it is: the start of a call (the call is then not
// made while the peers make theirs: this rank is out of step), the end of a call or of a
// replay (queued, but neither the watchdog nor Close would follow it). The error of one that
// was queued says so (errQueued), for the caller to let Close wait for its work.
func TestNCCLEventFailureFailsTheEngine(t *testing.T) {
	replay := func(e *ncclEngine, gpu *fakeGPU) error {
		return e.replay(&driver.Stream{}, func() error { gpu.enqueue(); return nil }, 3, "a replay of a test graph")
	}
	call := func(e *ncclEngine, _ *fakeGPU) error {
		return e.allReduce(&driver.Stream{}, 0x1000, 0x1000, 1<<20, BFloat16, true)
	}
	for _, tc := range []struct {
		name   string
		failAt int32 // the event that fails: 1 the start, 2 the end
		do     func(*ncclEngine, *fakeGPU) error
		queued bool
	}{
		{"call start", 1, call, false},
		{"call end", 2, call, true},
		{"replay start", 1, replay, false},
		{"replay end", 2, replay, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpu := &fakeGPU{stuck: 1} // the peer is gone: what was queued never ends unless aborted
			f := &fakeNCCL{gpu: gpu}
			e := newNCCLEngine(f, failingEvents(gpu, tc.failAt), time.Hour)
			t.Cleanup(func() { e.close(context.Background()) })
			err := tc.do(e, gpu)
			require.Error(t, err)
			assert.Equal(t, tc.queued, errors.Is(err, errQueued), "%v", err)
			assert.Equal(t, tc.queued, gpu.queued > 0, "queued work")
			require.ErrorIs(t, e.failure(), ErrUnusable, "the engine failed at once, not after the hour's timeout")
			assert.ErrorContains(t, e.failure(), "CUDA_ERROR_OUT_OF_MEMORY")
			require.True(t, eventually(5*time.Second, func() bool { return f.aborts.Load() == 1 }), "the communicator was aborted")
		})
	}
}
