package driver

import (
	"context"
	"encoding/binary"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests run the real code paths of Launch, LaunchEx and IPCOpenMemHandle against a fake
// libcuda compiled from testdata/fakecuda.c, which records what it receives: they check on a
// machine without GPU what a C callee sees of the Go side's arguments.

// fakeRecord reads slot i of the fake's record.
func fakeRecord(t *testing.T, sym func(string) uintptr, i int) uint64 {
	t.Helper()
	r, _, _ := purego.SyscallN(sym("fake_get"), uintptr(i))
	return uint64(r)
}

// testArgs packs the parameter list that the fake reads: u32, u64, 16 bytes, u64.
func testArgs(a *Args) {
	a.Reset()
	a.U32(0xa1b2c3d4)
	a.U64(0x1122334455667788)
	a.Bytes([]byte("0123456789abcdef"), 8)
	a.Ptr(0x7f0000001000)
}

func checkRecordedArgs(t *testing.T, sym func(string) uintptr) {
	t.Helper()
	assert.Equal(t, uint64(0xa1b2c3d4), fakeRecord(t, sym, 11))
	assert.Equal(t, uint64(0x1122334455667788), fakeRecord(t, sym, 12))
	pair := make([]byte, 16)
	binary.LittleEndian.PutUint64(pair, fakeRecord(t, sym, 13))
	binary.LittleEndian.PutUint64(pair[8:], fakeRecord(t, sym, 14))
	assert.Equal(t, "0123456789abcdef", string(pair))
	assert.Equal(t, uint64(0x7f0000001000), fakeRecord(t, sym, 15))
}

func TestABILaunch(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, sym("cuCtxSetCurrent"))
	swapSymbol(t, &cuLaunchKernel, sym("cuLaunchKernel"))
	_, s, f := fakeHandles()

	var a Args
	testArgs(&a)
	cfg := &LaunchConfig{Grid: [3]uint32{36, 2, 3}, Block: [3]uint32{512, 4, 5}, SharedMem: 4096}
	require.NoError(t, Launch(s, f, cfg, &a))
	want := []uint64{0xc0, 0xf0, 36, 2, 3, 512, 4, 5, 4096, 0x5e, 0}
	for i, w := range want {
		assert.Equal(t, w, fakeRecord(t, sym, i), "slot %d", i)
	}
	checkRecordedArgs(t, sym)

	// A failing CUresult becomes an *Error naming the function.
	f.handle = 0xbad
	err := Launch(s, f, cfg, &a)
	require.ErrorIs(t, err, ErrLaunchOutOfResources)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "cuLaunchKernel", e.Op)
	assert.Equal(t, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", e.Name)
}

func TestABILaunchEx(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, sym("cuCtxSetCurrent"))
	swapSymbol(t, &cuLaunchKernelEx, sym("cuLaunchKernelEx"))
	_, s, f := fakeHandles()

	var a Args
	cfg := &LaunchConfig{Grid: [3]uint32{7, 8, 9}, Block: [3]uint32{128, 2, 1}, SharedMem: 100}
	for _, pdl := range []bool{true, false} {
		testArgs(&a)
		require.NoError(t, LaunchEx(s, f, cfg, &a, pdl))
		want := []uint64{0xc0, 0xf0, 7, 8, 9, 128, 2, 1, 100, 0x5e, 0}
		for i, w := range want {
			assert.Equal(t, w, fakeRecord(t, sym, i), "pdl %v slot %d", pdl, i)
		}
		checkRecordedArgs(t, sym)
		if pdl {
			assert.Equal(t, uint64(1), fakeRecord(t, sym, 16), "one attribute")
			assert.Equal(t, uint64(6), fakeRecord(t, sym, 17), "PROGRAMMATIC_STREAM_SERIALIZATION")
			assert.Equal(t, uint64(1), fakeRecord(t, sym, 18), "allowed")
		} else {
			assert.Equal(t, uint64(0), fakeRecord(t, sym, 16), "no attribute")
		}
	}
	require.ErrorIs(t, LaunchEx(s, f, cfg, nil, true), ErrInvalidValue, "LaunchEx needs an Args")
}

// TestABIIPCOpenByValue checks that the 64-byte handle reaches the callee as a by-value struct
// and that the arguments around it stay in place.
func TestABIIPCOpenByValue(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, sym("cuCtxSetCurrent"))
	swapSymbol(t, &cuIpcGetMemHandle, sym("cuIpcGetMemHandle"))
	swapSymbol(t, &cuIpcOpenMemHandle_v2, sym("cuIpcOpenMemHandle_v2"))
	c, _, _ := fakeHandles()

	var h IPCMemHandle
	for i := range h {
		h[i] = byte(3*i + 1)
	}
	p, err := c.IPCOpenMemHandle(h)
	require.NoError(t, err)
	for i := range 8 {
		assert.Equal(t, binary.LittleEndian.Uint64(h[8*i:]), fakeRecord(t, sym, 20+i), "handle word %d", i)
	}
	assert.Equal(t, uint64(ipcMemLazyEnablePeerAccess), fakeRecord(t, sym, 28), "flags")
	want := binary.LittleEndian.Uint64(h[0:]) ^ binary.LittleEndian.Uint64(h[56:])
	assert.Equal(t, DevicePtr(want), p, "the pointer the callee wrote")

	// A handle exported by this process: the error explains the refusal.
	own, err := c.IPCGetMemHandle(0x1000)
	require.NoError(t, err)
	_, err = c.IPCOpenMemHandle(own)
	require.ErrorIs(t, err, ErrInvalidContext)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Equal(t, "cuIpcOpenMemHandle_v2", e.Op)
	assert.Contains(t, e.Message, "IPC handles cannot be opened in the process that created them")

	// The same refusal for a handle from elsewhere carries no such claim.
	foreign := own
	foreign[63] = 0
	_, err = c.IPCOpenMemHandle(foreign)
	require.ErrorIs(t, err, ErrInvalidContext)
	assert.NotContains(t, err.Error(), "process that created them")
}

// TestWaitDeadline polls a stream that never completes: Query answers "not done" without
// allocating, and Wait ends with the context.
func TestWaitDeadline(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, sym("cuCtxSetCurrent"))
	swapSymbol(t, &cuStreamQuery, sym("fake_not_ready"))
	_, s, _ := fakeHandles()

	done, err := s.Query()
	require.NoError(t, err)
	require.False(t, done)
	if !raceEnabled {
		assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = s.Query() }))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Wait(ctx)
	assert.ErrorIs(t, err, ErrTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), 2*time.Second)

	canceled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	err = s.Wait(canceled)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, ErrTimeout, "a canceled wait is not a timeout")
}

// TestCallZeroAllocs calls libc through the hot call helper (with sched_yield, which returns
// 0, standing in for cuCtxSetCurrent): a call with a value and a pointer to heap memory.
func TestCallZeroAllocs(t *testing.T) {
	skipUnderRace(t)
	swapSymbol(t, &cuCtxSetCurrent, libcSymbol(t, "sched_yield"))
	clock := libcSymbol(t, "clock_gettime")
	c, _, _ := fakeHandles()
	ts := new([2]int64)
	allocs := testing.AllocsPerRun(1000, func() {
		if c.hot(clock, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(ts))) != nil {
			panic("clock_gettime failed")
		}
	})
	assert.Zero(t, allocs)
	assert.NotZero(t, ts[0]+ts[1], "clock_gettime wrote through the pointer")
}

// TestHotPathZeroAllocs runs every hot method against libc's sched_yield, which returns 0 and
// ignores its arguments, standing in for each driver function: what is measured is this
// package's own work (checks, context binding, argument packing, the call).
func TestHotPathZeroAllocs(t *testing.T) {
	skipUnderRace(t)
	yield := libcSymbol(t, "sched_yield")
	for _, slot := range []*uintptr{&cuCtxSetCurrent, &cuLaunchKernel, &cuLaunchKernelEx, &cuEventRecord,
		&cuStreamWaitEvent, &cuMemcpyDtoDAsync_v2, &cuMemcpyHtoDAsync_v2, &cuMemcpyDtoHAsync_v2,
		&cuMemsetD8Async, &cuMemsetD32Async, &cuGraphLaunch, &cuStreamQuery, &cuEventQuery} {
		swapSymbol(t, slot, yield)
	}
	c, s, f := fakeHandles()
	f.params = []uint16{4, 8, 16, 8}
	e := &Event{ctx: c, handle: 0xe0}
	x := &GraphExec{ctx: c, handle: 0x9e}
	host := make([]byte, 64) // stands in for pinned memory: the fakes never touch it
	hb := &HostBuffer{ctx: c, ptr: unsafe.Pointer(&host[0]), size: 64, dptr: 0x4000}
	cfg := &LaunchConfig{Grid: [3]uint32{36, 1, 1}, Block: [3]uint32{512, 1, 1}}
	a := new(Args)

	check := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		testArgs(a)
		check(Launch(s, f, cfg, a))
		check(LaunchEx(s, f, cfg, a, true))
		check(e.Record(s))
		check(s.WaitEvent(e))
		check(s.CopyDtoDAsync(0x1000, 0x2000, 64))
		check(s.CopyHtoDAsync(0x1000, hb, 16, 32))
		check(s.CopyDtoHAsync(hb, 0, 0x1000, 64))
		check(s.MemsetD8Async(0x1000, 7, 64))
		check(s.MemsetD32Async(0x1000, 7, 16))
		check(x.Launch(s))
		if done, err := s.Query(); !done || err != nil {
			panic(err)
		}
		if done, err := e.Query(); !done || err != nil {
			panic(err)
		}
	})
	assert.Zero(t, allocs, "Go allocations per round of hot calls")
}

func skipUnderRace(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector (sync.Pool drops items)")
	}
}

func TestABIPeerNativeAtomics(t *testing.T) {
	sym := fakeCUDA(t)
	swapSymbol(t, &cuDeviceGetP2PAttribute, sym("cuDeviceGetP2PAttribute"))
	v, err := p2pAttribute(p2pNativeAtomics, 0, 1)
	require.NoError(t, err)
	assert.Equal(t, int32(1), v)
	assert.Equal(t, []uint64{3, 0, 1}, []uint64{fakeRecord(t, sym, 60), fakeRecord(t, sym, 61), fakeRecord(t, sym, 62)}, "attribute, source, destination")
	v, err = p2pAttribute(p2pNativeAtomics, 1, 0)
	require.NoError(t, err)
	assert.Zero(t, v)
	assert.Equal(t, []uint64{3, 1, 0}, []uint64{fakeRecord(t, sym, 60), fakeRecord(t, sym, 61), fakeRecord(t, sym, 62)})

	// a device's own memory: native, without asking the driver (which refuses src == dst)
	swapSymbol(t, &cuDeviceGetP2PAttribute, 0)
	own, err := PeerNativeAtomics(2, 2)
	require.NoError(t, err)
	assert.True(t, own)
}
