package driver

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests run WrapStream, CurrentContext, WrapContext, PointerInfo and Health against the
// fake libcuda of testdata/fakecuda.c: what reaches the driver (handles, the attribute array,
// the thread's context and capture mode) and how its answers become errors.

// fakeCall calls a function of the fake directly, as a foreign library would call libcuda.
func fakeCall(t *testing.T, sym func(string) uintptr, name string, args ...uintptr) uintptr {
	t.Helper()
	r, _, _ := purego.SyscallN(sym(name), args...)
	return r
}

// fakeCurrent returns the fake's context current on the calling thread, which the caller
// locked.
func fakeCurrent(t *testing.T, sym func(string) uintptr) uintptr {
	t.Helper()
	var h uintptr
	purego.SyscallN(sym("cuCtxGetCurrent"), uintptr(unsafe.Pointer(&h)))
	return h
}

// lockThread locks the test goroutine to its thread for the rest of the test: the fake, like
// the driver, keeps the current context per thread.
func lockThread(t *testing.T) {
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
}

func TestWrapStreamRefusesDefaultStreams(t *testing.T) {
	for _, h := range []uintptr{0, 1, 2} {
		s, err := WrapStream(h)
		assert.Nil(t, s)
		require.ErrorIs(t, err, ErrInvalidValue, "handle %d", h)
		assert.ErrorContains(t, err, "a default stream")
		assert.ErrorContains(t, err, "cuStreamCreate")
	}
}

func TestWrapStream(t *testing.T) {
	sym := fakeCUDA(t)
	for _, name := range []string{"cuCtxSetCurrent", "cuCtxGetCurrent", "cuCtxGetDevice", "cuStreamGetCtx",
		"cuStreamDestroy_v2", "cuStreamQuery", "cuEventCreate", "cuEventRecord", "cuLaunchKernel"} {
		swapSymbol(t, symbolSlot(t, name), sym(name))
	}
	lockThread(t)
	fakeCall(t, sym, "cuCtxSetCurrent", 0xc0) // the calling code's own context

	s, err := wrapStream(0xf5)
	require.NoError(t, err)
	assert.Equal(t, uint64(0xf5), fakeRecord(t, sym, 30), "stream given to cuStreamGetCtx")
	assert.Equal(t, uintptr(0xf5), s.Handle())
	assert.Equal(t, uintptr(0xc7), s.Context().Handle(), "the stream's context")
	assert.Equal(t, Device(3), s.Context().Device(), "the context's device")
	assert.Equal(t, uint64(0xc7), fakeRecord(t, sym, 31), "cuCtxGetDevice ran with the stream's context current")
	assert.Equal(t, uintptr(0xc0), fakeCurrent(t, sym), "the thread's context is restored")

	// Work on the wrapped stream runs in its context.
	done, err := s.Query()
	require.NoError(t, err)
	assert.True(t, done)
	assert.Equal(t, []uint64{0xf5, 0xc7}, []uint64{fakeRecord(t, sym, 37), fakeRecord(t, sym, 38)})
	_, _, f := fakeHandles() // a kernel of context 0xc0
	cfg := &LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{32, 1, 1}}
	err = Launch(s, f, cfg, nil)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.ErrorContains(t, err, "load the module in the stream's context")
	assert.Zero(t, fakeRecord(t, sym, 9), "the refused launch never reached the driver")
	f.mod.ctx = &Context{handle: 0xc7, dev: 3, foreign: true} // another wrapper of the stream's context
	require.NoError(t, Launch(s, f, cfg, nil))
	assert.Equal(t, uint64(0xf5), fakeRecord(t, sym, 9), "launched on the wrapped stream")

	// An event of the stream's context records on it; one of another context is refused
	// before the driver sees it.
	e, err := s.Context().NewEvent(false)
	require.NoError(t, err)
	require.NoError(t, e.Record(s))
	assert.Equal(t, []uint64{0xe1, 0xf5, 0xc7}, []uint64{fakeRecord(t, sym, 41), fakeRecord(t, sym, 42), fakeRecord(t, sym, 43)})
	c0, _, _ := fakeHandles()
	other := &Event{ctx: c0, handle: 0xe2}
	err = other.Record(s)
	require.ErrorIs(t, err, ErrInvalidValue)
	assert.ErrorContains(t, err, "create the event in the stream's context")
	assert.Equal(t, uint64(0xe1), fakeRecord(t, sym, 41), "the refused record never reached the driver")

	// Close forgets the wrapped stream without destroying it; an owned stream is destroyed.
	require.NoError(t, s.Close())
	require.NoError(t, s.Close())
	assert.Zero(t, fakeRecord(t, sym, 32), "cuStreamDestroy_v2 calls")
	_, err = s.Query()
	assert.ErrorContains(t, err, "stream is closed")
	owned := &Stream{ctx: c0, handle: 0x77}
	require.NoError(t, owned.Close())
	assert.Equal(t, []uint64{1, 0x77}, []uint64{fakeRecord(t, sym, 32), fakeRecord(t, sym, 33)})

	// A handle the driver does not know.
	_, err = wrapStream(0xdead)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, Result(400), ce.Code)
	assert.ErrorContains(t, err, "wrap stream 0xdead: find its context")
}

func TestForeignContexts(t *testing.T) {
	sym := fakeCUDA(t)
	for _, name := range []string{"cuCtxSetCurrent", "cuCtxGetCurrent", "cuCtxGetDevice",
		"cuDevicePrimaryCtxRelease_v2", "cuMemAlloc_v2"} {
		if name == "cuMemAlloc_v2" {
			swapSymbol(t, &cuMemAlloc_v2, sym("fake_ok"))
			continue
		}
		swapSymbol(t, symbolSlot(t, name), sym(name))
	}
	lockThread(t)

	_, err := currentContext()
	require.ErrorIs(t, err, ErrInvalidContext)
	assert.ErrorContains(t, err, "no CUDA context is current on this OS thread")

	fakeCall(t, sym, "cuCtxSetCurrent", 0xc1)
	c, err := currentContext()
	require.NoError(t, err)
	assert.Equal(t, uintptr(0xc1), c.Handle())
	assert.Equal(t, Device(1), c.Device())

	w, err := wrapContext(0xc7)
	require.NoError(t, err)
	assert.Equal(t, uintptr(0xc7), w.Handle())
	assert.Equal(t, Device(3), w.Device())
	assert.Equal(t, uintptr(0xc1), fakeCurrent(t, sym), "WrapContext restores the thread's context")

	// A foreign context binds itself like a primary one.
	_, err = w.Alloc(64)
	require.NoError(t, err)
	assert.Equal(t, uintptr(0xc7), fakeCurrent(t, sym))

	// Close forgets foreign contexts; it releases primary ones.
	require.NoError(t, c.Close())
	require.NoError(t, w.Close())
	assert.Zero(t, fakeRecord(t, sym, 56), "no cuDevicePrimaryCtxRelease_v2 for foreign contexts")
	_, err = w.Alloc(64)
	assert.ErrorIs(t, err, ErrInvalidContext, "a closed wrapper is unusable")
	primary := &Context{handle: 0xc0, dev: 2}
	require.NoError(t, primary.Close())
	assert.Equal(t, []uint64{1, 2}, []uint64{fakeRecord(t, sym, 56), fakeRecord(t, sym, 57)})

	_, err = WrapContext(0)
	assert.ErrorIs(t, err, ErrInvalidContext)
}

func TestPointerInfo(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, sym("cuCtxSetCurrent"))
	swapSymbol(t, &cuPointerGetAttributes, sym("cuPointerGetAttributes"))
	swapSymbol(t, &cuPointerGetAttribute, sym("cuPointerGetAttribute"))
	c, _, _ := fakeHandles() // context 0xc0 on device 0
	foreign := &Context{handle: 0xc7, dev: 3, foreign: true}

	cases := []struct {
		name string
		c    *Context
		p    DevicePtr
		want PointerInfo
	}{
		{"device", c, 0x10000123, PointerInfo{Type: MemoryDevice, Base: 0x10000000, Size: 0x100000, InContext: true}},
		{"pinned host", c, 0x20000010, PointerInfo{Type: MemoryHost, Base: 0x20000000, Size: 0x1000, InContext: true}},
		{"host, no range", c, 0x21000000, PointerInfo{Type: MemoryHost, Device: 1, InContext: true}},
		{"VMM (no context)", c, 0x30000005, PointerInfo{Type: MemoryDevice, Base: 0x30000000, Size: 0x200000, InContext: true}},
		{"device 1", c, 0x40000000, PointerInfo{Type: MemoryDevice, Device: 1, Base: 0x40000000, Size: 0x1000}},
		{"managed", c, 0x50000fff, PointerInfo{Type: MemoryDevice, Managed: true, Base: 0x50000000, Size: 0x1000, InContext: true}},
		{"another context", c, 0x60000000, PointerInfo{Type: MemoryDevice, Device: 3, Base: 0x60000000, Size: 0x1000}},
		{"foreign context's own", foreign, 0x60000000, PointerInfo{Type: MemoryDevice, Device: 3, Base: 0x60000000, Size: 0x1000, InContext: true}},
		{"VMM from another device's context", foreign, 0x30000000, PointerInfo{Type: MemoryDevice, Base: 0x30000000, Size: 0x200000}},
	}
	check := func(t *testing.T, perCall func() (plural, singular uint64)) {
		for _, tc := range cases {
			p0, s0 := perCall()
			got, err := tc.c.PointerInfo(tc.p)
			require.NoError(t, err, tc.name)
			assert.Equal(t, tc.want, got, tc.name)
			p1, s1 := perCall()
			if tc.want.Size == 0 { // refused attributes: the one call fails, one per attribute follow
				assert.Equal(t, uint64(len(pointerAttrs)), s1-s0, tc.name)
				continue
			}
			if cuPointerGetAttributes != 0 {
				assert.Equal(t, uint64(1), p1-p0, "%s: one cuPointerGetAttributes call", tc.name)
				assert.Zero(t, s1-s0, tc.name)
			} else {
				assert.Equal(t, uint64(len(pointerAttrs)), s1-s0, "%s: one cuPointerGetAttribute call per attribute", tc.name)
			}

			// Right after a known address, the same pooled slots must not leak its answers.
			_, err = tc.c.PointerInfo(0x70000000)
			require.ErrorIs(t, err, ErrNotDeviceMemory, "%s, then an unknown address", tc.name)
		}
	}
	counts := func() (uint64, uint64) { return fakeRecord(t, sym, 44), fakeRecord(t, sym, 54) }

	t.Run("one call", func(t *testing.T) {
		check(t, counts)
		_, err := c.PointerInfo(0x10000000)
		require.NoError(t, err)
		assert.Equal(t, uint64(len(pointerAttrs)), fakeRecord(t, sym, 45), "numAttributes")
		for i, a := range []uint64{2, 9, 1, 8, 11, 12} { // MEMORY_TYPE, DEVICE_ORDINAL, CONTEXT, IS_MANAGED, RANGE_START_ADDR, RANGE_SIZE
			assert.Equal(t, a, fakeRecord(t, sym, 46+i), "attribute %d", i)
		}
		assert.Equal(t, uint64(0x10000000), fakeRecord(t, sym, 52), "pointer")
		assert.Equal(t, uint64(0xc0), fakeRecord(t, sym, 53), "with the context current")

		// A driver that refuses the address outright.
		_, err = c.PointerInfo(0x1)
		require.ErrorIs(t, err, ErrNotDeviceMemory)
		require.ErrorIs(t, err, ErrInvalidValue, "the driver's error is kept")
		if !raceEnabled {
			assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = c.PointerInfo(0x10000000) }))
		}
	})
	t.Run("one call per attribute", func(t *testing.T) {
		swapSymbol(t, &cuPointerGetAttributes, 0)
		check(t, counts)
	})
	t.Run("errors", func(t *testing.T) {
		fakeCall(t, sym, "fake_set_sticky", 700)
		_, err := c.PointerInfo(0x10000000)
		require.ErrorIs(t, err, ErrContextLost)
		assert.NotErrorIs(t, err, ErrNotDeviceMemory, "a dead context is not a bad pointer")
		fakeCall(t, sym, "fake_set_sticky", 0)

		closed := &Context{handle: 0xc0}
		closed.closed.Store(true)
		_, err = closed.PointerInfo(0x10000000)
		assert.ErrorIs(t, err, ErrInvalidContext)
	})
}

func TestHealth(t *testing.T) {
	sym := fakeCUDA(t)
	for _, name := range []string{"cuCtxSetCurrent", "cuStreamCreate", "cuStreamQuery", "cuStreamDestroy_v2",
		"cuThreadExchangeStreamCaptureMode", "cuLaunchKernel", "cuEventQuery", "cuDevicePrimaryCtxRelease_v2"} {
		if name == "cuEventQuery" {
			swapSymbol(t, &cuEventQuery, sym("cuStreamQuery")) // same prototype: it returns the sticky code
			continue
		}
		swapSymbol(t, symbolSlot(t, name), sym(name))
	}
	lockThread(t)
	mode := int32(CaptureThreadLocal) // the thread's mode before Health, to be restored
	purego.SyscallN(sym("cuThreadExchangeStreamCaptureMode"), uintptr(unsafe.Pointer(&mode)))

	c, s, f := fakeHandles()
	require.NoError(t, c.Health())
	assert.Equal(t, []uint64{1, streamNonBlocking, 0xc0}, []uint64{fakeRecord(t, sym, 34), fakeRecord(t, sym, 35), fakeRecord(t, sym, 36)},
		"one non-blocking stream created in the context")
	stream := fakeRecord(t, sym, 37)
	assert.NotZero(t, stream)
	assert.Equal(t, uint64(0xc0), fakeRecord(t, sym, 38), "queried with the context current")
	assert.Equal(t, uint64(CaptureRelaxed), fakeRecord(t, sym, 39), "queried in relaxed capture mode")
	assert.Equal(t, uintptr(CaptureThreadLocal), fakeCall(t, sym, "fake_capture_mode"), "the thread's mode is restored")

	require.NoError(t, c.Health())
	assert.Equal(t, uint64(1), fakeRecord(t, sym, 34), "the stream is reused")
	if !raceEnabled {
		assert.Zero(t, testing.AllocsPerRun(100, func() { _ = c.Health() }))
	}

	fakeCall(t, sym, "fake_set_sticky", 600) // work of its own still running: healthy
	require.NoError(t, c.Health())
	fakeCall(t, sym, "fake_set_sticky", 999)
	err := c.Health()
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrContextLost)
	assert.ErrorContains(t, err, "check the CUDA context of device 0")

	// After a fault, Health and every later call report the lost context.
	fakeCall(t, sym, "fake_set_sticky", 700)
	err = c.Health()
	require.ErrorIs(t, err, ErrContextLost)
	require.ErrorIs(t, err, ErrIllegalAddress)
	assert.ErrorContains(t, err, "CUDA context of device 0 is lost")
	assert.Equal(t, uintptr(CaptureThreadLocal), fakeCall(t, sym, "fake_capture_mode"), "restored on failure too")
	err = Launch(s, f, &LaunchConfig{Grid: [3]uint32{1, 1, 1}, Block: [3]uint32{1, 1, 1}}, nil)
	require.ErrorIs(t, err, ErrContextLost)
	_, err = s.Query()
	require.ErrorIs(t, err, ErrContextLost)
	_, err = (&Event{ctx: c, handle: 0xe1}).Query()
	require.ErrorIs(t, err, ErrContextLost)
	err = (&Event{ctx: c, handle: 0xe1}).Wait(context.Background())
	require.ErrorIs(t, err, ErrContextLost, "Wait returns the fault, not a timeout")

	// A context lost before Health's first call: the stream cannot be created.
	lost := &Context{handle: 0xc1, dev: 1, foreign: true}
	err = lost.Health()
	require.ErrorIs(t, err, ErrContextLost)
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, "cuStreamCreate", ce.Op)
	require.NoError(t, lost.Close(), "nothing to destroy")

	// Close destroys Health's stream; the lost context's error is not Close's.
	require.NoError(t, c.Close())
	assert.Equal(t, []uint64{1, stream}, []uint64{fakeRecord(t, sym, 32), fakeRecord(t, sym, 33)})
	assert.Equal(t, uint64(1), fakeRecord(t, sym, 56), "the primary context is released")
	assert.ErrorIs(t, c.Health(), ErrInvalidContext)

	// Without cuThreadExchangeStreamCaptureMode, Health queries in the thread's own mode.
	fakeCall(t, sym, "fake_set_sticky", 0)
	swapSymbol(t, &cuThreadExchangeStreamCaptureMode, 0)
	c2 := &Context{handle: 0xc7, dev: 3, foreign: true}
	require.NoError(t, c2.Health())
	assert.Equal(t, uint64(CaptureThreadLocal), fakeRecord(t, sym, 39))
	require.NoError(t, c2.Close())
	assert.Equal(t, uint64(2), fakeRecord(t, sym, 32), "a foreign context's Health stream is destroyed too")
	assert.Equal(t, uint64(1), fakeRecord(t, sym, 56), "but the foreign context is not released")
}

// TestEventWaitDeadline checks Event.Wait's bound, as TestWaitDeadline does for streams.
func TestEventWaitDeadline(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, sym("cuCtxSetCurrent"))
	swapSymbol(t, &cuEventQuery, sym("fake_not_ready"))
	c, _, _ := fakeHandles()
	e := &Event{ctx: c, handle: 0xe1}
	done, err := e.Query()
	require.NoError(t, err)
	require.False(t, done)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = e.Wait(ctx)
	assert.ErrorIs(t, err, ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// symbolSlot returns the variable that the symbol table binds name to.
func symbolSlot(t *testing.T, name string) *uintptr {
	t.Helper()
	for _, s := range symbolTable {
		if s.name == name {
			return s.fn
		}
	}
	t.Fatalf("%s is not in the symbol table", name)
	return nil
}

func TestMemoryTypeString(t *testing.T) {
	assert.Equal(t, "device", MemoryDevice.String())
	assert.Equal(t, "host", MemoryHost.String())
	assert.Equal(t, "array", MemoryArray.String())
	assert.Equal(t, "unified", MemoryUnified.String())
	assert.Equal(t, "MemoryType(9)", MemoryType(9).String())
}

// TestIsCapturing: the capture status comes back right, from the stream's context, and asking
// allocates nothing (collective asks on every all-reduce).
func TestIsCapturing(t *testing.T) {
	if err := need(FeatureGraphs); err != nil {
		// IsCapturing asks for the feature first, which needs the symbol table of a real
		// libcuda (GOCCL_LIBCUDA; CI has Debian's).
		if os.Getenv("GOCCL_REQUIRE_TOOLS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	sym := fakeCUDA(t)
	for _, name := range []string{"cuCtxSetCurrent", "cuStreamIsCapturing"} {
		swapSymbol(t, symbolSlot(t, name), sym(name))
	}
	_, s, _ := fakeHandles()
	capturing, err := s.IsCapturing()
	require.NoError(t, err)
	assert.False(t, capturing)
	assert.Equal(t, uint64(0x5e), fakeRecord(t, sym, 58), "stream given to cuStreamIsCapturing")
	assert.Equal(t, uint64(0xc0), fakeRecord(t, sym, 59), "with the stream's context current")
	fakeCall(t, sym, "fake_set_capturing", 1)
	capturing, err = s.IsCapturing()
	require.NoError(t, err)
	assert.True(t, capturing)
	if !raceEnabled { // the race detector makes sync.Pool drop items on purpose
		assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = s.IsCapturing() }))
	}
}

// TestCaptureID: the capture id comes back while the stream captures, 0 otherwise, with the
// optional outputs left NULL, and asking allocates nothing (collective asks while a Capture
// runs, to tell the streams that record into it).
func TestCaptureID(t *testing.T) {
	if err := need(FeatureGraphs); err != nil {
		if os.Getenv("GOCCL_REQUIRE_TOOLS") == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	sym := fakeCUDA(t)
	for _, name := range []string{"cuCtxSetCurrent", "cuStreamGetCaptureInfo_v2"} {
		swapSymbol(t, symbolSlot(t, name), sym(name))
	}
	_, s, _ := fakeHandles()
	id, err := s.CaptureID()
	require.NoError(t, err)
	assert.Zero(t, id)
	assert.Equal(t, uint64(0x5e), fakeRecord(t, sym, 63), "stream given to cuStreamGetCaptureInfo_v2")
	assert.Zero(t, fakeRecord(t, sym, 64), "graph, dependencies and their count not asked for")
	fakeCall(t, sym, "fake_set_capturing", 1)
	id, err = s.CaptureID()
	require.NoError(t, err)
	assert.Equal(t, uint64(0x1d5e), id)
	if !raceEnabled {
		assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = s.CaptureID() }))
	}

	swapSymbol(t, symbolSlot(t, "cuStreamGetCaptureInfo_v2"), 0)
	_, err = s.CaptureID()
	assert.ErrorIs(t, err, ErrNotSupported)
}
