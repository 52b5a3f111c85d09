package driver

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestABILaunchWithoutBinding: once the probe has allowed it, Launch and LaunchEx call the
// driver without cuCtxSetCurrent, and still pass everything else.
func TestABILaunchWithoutBinding(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, sym("cuCtxSetCurrent"))
	swapSymbol(t, &cuLaunchKernel, sym("cuLaunchKernel"))
	swapSymbol(t, &cuLaunchKernelEx, sym("cuLaunchKernelEx"))
	prev := streamLaunch.Swap(true)
	t.Cleanup(func() { streamLaunch.Store(prev) })
	_, s, f := fakeHandles()
	var a Args
	testArgs(&a)
	cfg := &LaunchConfig{Grid: [3]uint32{36, 1, 1}, Block: [3]uint32{512, 1, 1}}

	require.NoError(t, call(sym("cuCtxSetCurrent"), 0)) // slot 0 records the bound context
	require.NoError(t, Launch(s, f, cfg, &a))
	assert.Zero(t, fakeRecord(t, sym, 0), "Launch bound a context")
	assert.Equal(t, uint64(0x5e), fakeRecord(t, sym, 9), "stream")
	checkRecordedArgs(t, sym)

	require.NoError(t, LaunchEx(s, f, cfg, &a, true))
	assert.Zero(t, fakeRecord(t, sym, 0), "LaunchEx bound a context")
	checkRecordedArgs(t, sym)

	// Other hot calls still bind: they have no stream to take the context from, or were not probed.
	streamLaunch.Store(false)
	require.NoError(t, Launch(s, f, cfg, &a))
	assert.Equal(t, uint64(0xc0), fakeRecord(t, sym, 0), "Launch without the probe's consent must bind")
}

// TestGPUStreamLaunch probes the driver and, where it launches into the stream's context,
// checks that a kernel launched from a thread with no current context computes the right
// thing. On the drivers goccl was measured on (CUDA 13) the probe must succeed.
func TestGPUStreamLaunch(t *testing.T) {
	c := requireGPU(t)
	err := ProbeStreamLaunch(c)
	version, verr := DriverVersion()
	require.NoError(t, verr)
	if err != nil {
		if version >= 13000 {
			t.Fatalf("CUDA %d: %v", version, err)
		}
		t.Skipf("CUDA %d launches need a current context here: %v", version, err)
	}
	require.True(t, StreamLaunch())
	m := loadModule(t, c, "goccl_test", testPTX)
	axpy := kernel(t, m, "goccl_test_axpy")
	const n = 4096
	in, out := alloc(t, c, 4*n), alloc(t, c, 4*n)
	require.NoError(t, c.MemsetD32(in, 3, n))
	s := newStream(t, c)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	require.NoError(t, call(cuCtxGetCurrent, uintptr(unsafe.Pointer(&prev))))
	require.NoError(t, call(cuCtxSetCurrent, 0))
	var a Args
	a.Ptr(out)
	a.Ptr(in)
	a.U32(7)
	a.U32(n)
	launchErr := Launch(s, axpy, grid(n, 256), &a)
	require.NoError(t, call(cuCtxSetCurrent, prev))
	require.NoError(t, launchErr)
	waitStream(t, s)
	got := make([]byte, 4*n)
	require.NoError(t, c.CopyDtoH(got, out))
	for i, v := range u32s(got) {
		// goccl_test_axpy: out[i] = a*in[i] + i
		require.Equal(t, uint32(7*3+i), v, "element %d", i)
	}
}
