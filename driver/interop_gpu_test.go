package driver

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// GPU tests of the interop with other CUDA code: streams and contexts made elsewhere, pointer
// facts, and a context lost to a kernel fault (in a child process, since the fault ends the
// process's use of the GPU).

// rawStream creates a non-blocking stream in c with the bare driver calls, as a foreign
// library would, and destroys it when the test ends.
func rawStream(t *testing.T, c *Context) uintptr {
	t.Helper()
	var h uintptr
	runtime.LockOSThread()
	err := call(cuCtxSetCurrent, c.handle)
	if err == nil {
		err = call(cuStreamCreate, uintptr(unsafe.Pointer(&h)), streamNonBlocking)
	}
	runtime.UnlockOSThread()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.call(cuStreamDestroy_v2, h)) })
	return h
}

// axpyOn runs goccl_test_axpy (out[i] = a*in[i] + i) on s over n words of memory of c and
// checks the result, read back through pinned memory on the same stream.
func axpyOn(t *testing.T, c *Context, s *Stream, m *Module, n uint32, a uint32) {
	t.Helper()
	axpy := kernel(t, m, "goccl_test_axpy")
	in, out := alloc(t, c, 4*uint64(n)), alloc(t, c, 4*uint64(n))
	hin, hout := allocHost(t, c, 4*uint64(n)), allocHost(t, c, 4*uint64(n))
	src := randomBytes(uint64(a), int(4*n))
	copy(hin.Bytes(), src)
	var args Args
	args.Ptr(out)
	args.Ptr(in)
	args.U32(a)
	args.U32(n)
	require.NoError(t, s.CopyHtoDAsync(in, hin, 0, 4*uint64(n)))
	require.NoError(t, Launch(s, axpy, grid(n, 256), &args))
	require.NoError(t, s.CopyDtoHAsync(hout, 0, out, 4*uint64(n)))
	waitStream(t, s)
	want := u32s(src)
	for i, v := range u32s(hout.Bytes()) {
		if v != a*want[i]+uint32(i) {
			t.Fatalf("out[%d] = %d, want %d", i, v, a*want[i]+uint32(i))
		}
	}
}

func TestGPUWrapStream(t *testing.T) {
	c := requireGPU(t)
	for _, h := range []uintptr{0, 1, 2} {
		_, err := WrapStream(h)
		require.ErrorIs(t, err, ErrInvalidValue, "default stream %d", h)
	}

	h := rawStream(t, c)
	s, err := WrapStream(h)
	require.NoError(t, err)
	assert.Equal(t, h, s.Handle())
	assert.Equal(t, c.Handle(), s.Context().Handle(), "the stream's context is the primary context")
	assert.Equal(t, c.Device(), s.Context().Device())

	// Kernels and copies on the wrapped stream, with a module and memory of the primary context.
	m := loadModule(t, c, "goccl_test", testPTX)
	axpyOn(t, c, s, m, 10_007, 3)

	// Events of either wrapper of the context record on it and bound a wait.
	for _, ec := range []*Context{c, s.Context()} {
		e, err := ec.NewEvent(false)
		require.NoError(t, err)
		require.NoError(t, Launch(s, kernel(t, m, "goccl_test_empty"), grid(1, 32), nil))
		require.NoError(t, e.Record(s))
		ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
		require.NoError(t, e.Wait(ctx))
		cancel()
		done, err := e.Query()
		require.NoError(t, err)
		assert.True(t, done)
		require.NoError(t, e.Close())
	}
	require.NoError(t, s.Context().Health())

	// Close forgets the stream: it still works for its owner, and can be wrapped again.
	require.NoError(t, s.Close())
	require.NoError(t, s.Context().Close(), "closing the foreign wrapper")
	require.NoError(t, c.call(cuStreamQuery, h), "the raw stream outlives its wrapper")
	again, err := WrapStream(h)
	require.NoError(t, err)
	axpyOn(t, c, again, m, 1000, 5)
	require.NoError(t, again.Close())
	_, _, err = c.MemInfo()
	require.NoError(t, err, "the primary context is untouched")
}

// driverSymbol returns a libcuda function that the symbol table does not bind, for the tests
// that act as a foreign library; it skips when the driver does not export it.
func driverSymbol(t *testing.T, name string) uintptr {
	t.Helper()
	lib, err := purego.Dlopen(LibraryPath(), purego.RTLD_NOW|purego.RTLD_GLOBAL)
	require.NoError(t, err)
	fn, err := purego.Dlsym(lib, name)
	if err != nil {
		t.Skipf("libcuda %s does not export %s: %v", LibraryPath(), name, err)
	}
	return fn
}

func TestGPUForeignContext(t *testing.T) {
	c := requireGPU(t)

	t.Run("current", func(t *testing.T) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		require.NoError(t, call(cuCtxSetCurrent, c.handle))
		cur, err := CurrentContext()
		require.NoError(t, err)
		assert.Equal(t, c.Handle(), cur.Handle())
		assert.Equal(t, c.Device(), cur.Device())
		require.NoError(t, cur.Health())
		require.NoError(t, cur.Close())
		_, _, err = c.MemInfo()
		require.NoError(t, err, "closing the wrapper leaves the context alone")

		require.NoError(t, call(cuCtxSetCurrent, 0))
		_, err = CurrentContext()
		require.ErrorIs(t, err, ErrInvalidContext)
	})

	t.Run("created", func(t *testing.T) {
		// CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
		// CUresult cuCtxDestroy_v2(CUcontext ctx);
		create, destroy := driverSymbol(t, "cuCtxCreate_v2"), driverSymbol(t, "cuCtxDestroy_v2")
		var h uintptr
		runtime.LockOSThread()
		r := raw(create, uintptr(unsafe.Pointer(&h)), 0, uintptr(c.dev))
		runtime.UnlockOSThread()
		require.Zero(t, r, "cuCtxCreate_v2: %v", r)
		// Cleanups run last registered first: the objects made below, then the wrapper, then
		// the context.
		t.Cleanup(func() { assert.Zero(t, raw(destroy, h), "cuCtxDestroy_v2") })

		fc, err := WrapContext(h)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, fc.Close()) })
		assert.Equal(t, h, fc.Handle())
		assert.Equal(t, c.Device(), fc.Device())

		// Everything works in the foreign context: streams, modules, memory, launches.
		s := newStream(t, fc)
		m := loadModule(t, fc, "goccl_test", testPTX)
		axpyOn(t, fc, s, m, 4099, 7)
		require.NoError(t, fc.Health())

		// Memory belongs to the context that allocated it.
		pf := alloc(t, fc, 1<<20)
		pc := alloc(t, c, 1<<20)
		info, err := fc.PointerInfo(pf + 8)
		require.NoError(t, err)
		assert.Equal(t, PointerInfo{Type: MemoryDevice, Device: c.dev, Base: pf, Size: info.Size, InContext: true}, info)
		info, err = c.PointerInfo(pf)
		require.NoError(t, err)
		assert.False(t, info.InContext, "memory of another context on the same device")
		assert.Equal(t, c.dev, info.Device)
		info, err = fc.PointerInfo(pc)
		require.NoError(t, err)
		assert.False(t, info.InContext)
	})
}

func TestGPUPointerInfo(t *testing.T) {
	c := requireGPU(t)
	const n = 64 << 20 // large enough to be an allocation of its own, not a driver sub-allocation
	p := alloc(t, c, n)
	hb := allocHost(t, c, 4096)
	pageable := make([]byte, 1<<20)
	freed, err := c.Alloc(n)
	require.NoError(t, err)
	require.NoError(t, c.Free(freed))

	check := func(t *testing.T) {
		info, err := c.PointerInfo(p)
		require.NoError(t, err)
		assert.Equal(t, MemoryDevice, info.Type)
		assert.Equal(t, c.dev, info.Device)
		assert.True(t, info.InContext)
		assert.False(t, info.Managed)
		assert.Equal(t, p, info.Base)
		assert.GreaterOrEqual(t, info.Size, uint64(n))

		interior, err := c.PointerInfo(p + n/2 + 3)
		require.NoError(t, err)
		assert.Equal(t, info, interior, "an interior pointer describes the same allocation")

		host, err := c.PointerInfo(hb.DevicePtr())
		require.NoError(t, err)
		assert.Equal(t, MemoryHost, host.Type)
		assert.LessOrEqual(t, host.Base, hb.DevicePtr())
		t.Logf("pinned host memory: %+v", host)

		_, err = c.PointerInfo(DevicePtr(uintptr(unsafe.Pointer(&pageable[4096]))))
		assert.ErrorIs(t, err, ErrNotDeviceMemory, "pageable Go memory")
		t.Logf("pageable: %v", err)
		_, err = c.PointerInfo(freed + 64)
		assert.ErrorIs(t, err, ErrNotDeviceMemory, "a freed allocation")
		t.Logf("freed: %v", err)
		_, err = c.PointerInfo(0x10)
		assert.ErrorIs(t, err, ErrNotDeviceMemory, "a made-up address")
	}
	t.Run("one call", func(t *testing.T) {
		require.True(t, Has(FeaturePointerAttributes), "%v", need(FeaturePointerAttributes))
		check(t)
		if !raceEnabled {
			assert.Zero(t, testing.AllocsPerRun(200, func() { _, _ = c.PointerInfo(p) }))
		}
		const calls = 10_000
		start := time.Now()
		for range calls {
			_, _ = c.PointerInfo(p)
		}
		t.Logf("PointerInfo: %v per call", time.Since(start)/calls)
	})
	t.Run("one call per attribute", func(t *testing.T) {
		swapSymbol(t, &cuPointerGetAttributes, 0)
		check(t)
	})

	t.Run("VMM", func(t *testing.T) {
		if ok, err := c.Device().SupportsVMM(); err != nil || !ok || !Has(FeatureVMM) {
			t.Skipf("no VMM: %v", err)
		}
		size, err := c.VMMGranularity()
		require.NoError(t, err)
		phys, err := c.CreatePhysical(size)
		require.NoError(t, err)
		defer func() { assert.NoError(t, phys.Release()) }()
		va, err := c.ReserveAddress(size, 0)
		require.NoError(t, err)
		defer func() { assert.NoError(t, c.FreeAddress(va, size)) }()
		require.NoError(t, c.Map(va, size, phys))
		defer func() { assert.NoError(t, c.Unmap(va, size)) }()
		info, err := c.PointerInfo(va + 100)
		require.NoError(t, err)
		t.Logf("VMM mapping: %+v", info)
		assert.Equal(t, MemoryDevice, info.Type)
		assert.Equal(t, c.dev, info.Device)
		assert.True(t, info.InContext, "VMM memory of the context's device")
		assert.Equal(t, va, info.Base)
		assert.Equal(t, size, info.Size)
	})
}

// TestGPUContextLost faults a kernel in a child process (writing to an address that is no
// allocation) and checks what the child saw: the fault and every later call match
// ErrContextLost, and Health reports it.
func TestGPUContextLost(t *testing.T) {
	c := requireGPU(t)
	require.NoError(t, c.Health(), "this process's context is fine")
	out := runHelper(t, "fault", nil)
	t.Logf("child:\n%s", out)
	got := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			got[k] = v
		}
	}
	assert.Equal(t, "ok", got["health_before_fault"])
	for _, k := range []string{"wait", "health", "wrapped_health", "event_query", "launch", "query", "alloc"} {
		assert.True(t, strings.HasPrefix(got[k], "lost:"), "%s after the fault: %q", k, got[k])
	}
	require.NoError(t, c.Health(), "a child's fault leaves this process's context alone")
}

// childFault is the child of TestGPUContextLost. It prints key=value lines: "ok", "lost: err"
// for an error matching ErrContextLost, "other: err" for any other error.
func childFault(c *Context) error {
	report := func(key string, err error) {
		switch {
		case err == nil:
			fmt.Printf("%s=ok\n", key)
		case errors.Is(err, ErrContextLost):
			fmt.Printf("%s=lost: %v\n", key, err)
		default:
			fmt.Printf("%s=other: %v\n", key, err)
		}
	}
	report("health_before_fault", c.Health())
	m, err := c.LoadModule("goccl_test", []byte(testPTX))
	if err != nil {
		return err
	}
	axpy, err := m.Function("goccl_test_axpy")
	if err != nil {
		return err
	}
	in, err := c.Alloc(4096)
	if err != nil {
		return err
	}
	s, err := c.NewStream()
	if err != nil {
		return err
	}
	e, err := c.NewEvent(false)
	if err != nil {
		return err
	}
	var a Args
	a.Ptr(0x100) // out: no allocation there
	a.Ptr(in)
	a.U32(1)
	a.U32(1024)
	if err := Launch(s, axpy, grid(1024, 256), &a); err != nil {
		return fmt.Errorf("launch of the faulting kernel: %w", err)
	}
	if err := e.Record(s); err != nil {
		return err
	}

	// How soon Health sees the fault while nothing waits on the stream (informational).
	start := time.Now()
	var health error
	for time.Since(start) < 5*time.Second {
		if health = c.Health(); health != nil {
			break
		}
		time.Sleep(100 * time.Microsecond)
	}
	fmt.Printf("health_before_wait_after=%v\n", time.Since(start))
	report("health_before_wait", health)

	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	report("wait", s.Wait(ctx))
	report("health", c.Health())
	w, err := WrapContext(c.Handle())
	if err != nil {
		report("wrapped_health", err)
	} else {
		report("wrapped_health", w.Health())
	}
	_, err = e.Query()
	report("event_query", err)
	report("launch", Launch(s, axpy, grid(1024, 256), &a))
	_, err = s.Query()
	report("query", err)
	_, err = c.Alloc(4096)
	report("alloc", err)
	var le *Error
	if errors.As(health, &le) || errors.As(s.Wait(ctx), &le) {
		fmt.Printf("code=%d %s\n", le.Code, le.Name)
	}
	return nil
}

// TestGPUHealthDuringCapture calls Health from another goroutine while a stream of the same
// context captures in CaptureGlobal mode, the mode that forbids unsafe calls on every thread:
// Health neither fails nor breaks the capture, also when its first call creates its stream.
func TestGPUHealthDuringCapture(t *testing.T) {
	c := requireGPU(t)
	require.True(t, Has(FeatureGraphs), "%v", need(FeatureGraphs))
	m := loadModule(t, c, "goccl_test", testPTX)
	empty := kernel(t, m, "goccl_test_empty")
	require.NoError(t, c.Health(), "creates Health's stream before any capture")

	// capture runs health on another goroutine in the middle of a global capture and returns
	// its error and the capture's.
	capture := func(t *testing.T, health func() error) (healthErr, captureErr error) {
		s := newStream(t, c)
		require.NoError(t, s.BeginCapture(CaptureGlobal))
		require.NoError(t, Launch(s, empty, grid(1, 32), nil))
		errc := make(chan error, 1)
		go func() { errc <- health() }()
		healthErr = <-errc
		_ = Launch(s, empty, grid(1, 32), nil) // fails if the capture broke; EndCapture says so
		g, captureErr := s.EndCapture()
		if g != nil {
			assert.NoError(t, g.Close())
		}
		return healthErr, captureErr
	}

	t.Run("stream exists", func(t *testing.T) {
		healthErr, captureErr := capture(t, c.Health)
		require.NoError(t, healthErr)
		require.NoError(t, captureErr)
	})
	t.Run("first call", func(t *testing.T) {
		w, err := WrapContext(c.Handle())
		require.NoError(t, err)
		defer func() { assert.NoError(t, w.Close()) }()
		healthErr, captureErr := capture(t, w.Health)
		require.NoError(t, healthErr)
		require.NoError(t, captureErr)
	})

}
