package driver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The GPU tests use device 0 and skip without a GPU (GOCCL_REQUIRE_GPU=1 makes that a
// failure). Every wait is bounded by gpuTimeout.

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func u32s(b []byte) []uint32 {
	out := make([]uint32, len(b)/4)
	for i := range out {
		out[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return out
}

// alloc allocates n bytes of device memory, freed when the test ends.
func alloc(t testing.TB, c *Context, n uint64) DevicePtr {
	t.Helper()
	p, err := c.Alloc(n)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Free(p)) })
	return p
}

func newStream(t testing.TB, c *Context) *Stream {
	t.Helper()
	s, err := c.NewStream()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func allocHost(t testing.TB, c *Context, n uint64) *HostBuffer {
	t.Helper()
	h, err := c.AllocHost(n)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, h.Close()) })
	return h
}

func loadModule(t testing.TB, c *Context, name, ptx string) *Module {
	t.Helper()
	m, err := c.LoadModule(name, []byte(ptx))
	require.NoError(t, err, "%+v", err)
	t.Cleanup(func() { assert.NoError(t, m.Close()) })
	return m
}

func kernel(t testing.TB, m *Module, name string) *Function {
	t.Helper()
	f, err := m.Function(name)
	require.NoError(t, err)
	return f
}

func grid(n, block uint32) *LaunchConfig {
	return &LaunchConfig{Grid: [3]uint32{(n + block - 1) / block, 1, 1}, Block: [3]uint32{block, 1, 1}}
}

func TestGPUDevice(t *testing.T) {
	c := requireGPU(t)
	d := c.Device()
	n, err := DeviceCount()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, 1)
	_, err = GetDevice(n)
	assert.Error(t, err, "ordinal past the last device")

	name, err := d.Name()
	require.NoError(t, err)
	assert.NotEmpty(t, name)
	sms, err := d.SMCount()
	require.NoError(t, err)
	assert.Positive(t, sms)
	major, minor, err := d.ComputeCapability()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, major, 8, "goccl's kernels target sm_80 and later")
	bus, err := d.PCIBusID()
	require.NoError(t, err)
	assert.Regexp(t, regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]$`), bus)
	uuid, err := d.UUID()
	require.NoError(t, err)
	assert.NotEqual(t, [16]byte{}, uuid)
	total, err := d.TotalMem()
	require.NoError(t, err)
	free, ctxTotal, err := c.MemInfo()
	require.NoError(t, err)
	assert.Positive(t, total)
	assert.LessOrEqual(t, free, ctxTotal)
	assert.InDelta(t, float64(total), float64(ctxTotal), float64(total)/10)
	v, err := DriverVersion()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, v, 11080)
	vmm, err := d.SupportsVMM()
	require.NoError(t, err)
	fd, err := d.SupportsPOSIXFD()
	require.NoError(t, err)
	t.Logf("%s (sm_%d%d, %d SMs, %d GiB) at %s, CUDA %s, libcuda %s, VMM %v, POSIX fd %v",
		name, major, minor, sms, total>>30, bus, versionString(v), LibraryPath(), vmm, fd)
}

func TestGPUMemoryRoundTrip(t *testing.T) {
	c := requireGPU(t)
	const n = 1<<20 + 13 // odd on purpose
	data := randomBytes(1, n)
	p := alloc(t, c, n)
	q := alloc(t, c, n)

	// Synchronous: host -> device -> device -> host.
	require.NoError(t, c.CopyHtoD(p, data))
	require.NoError(t, c.CopyDtoD(q, p, n))
	got := make([]byte, n)
	require.NoError(t, c.CopyDtoH(got, q))
	require.True(t, bytes.Equal(data, got), "sync round trip")

	require.NoError(t, c.MemsetD8(q+1, 0xab, 3))
	require.NoError(t, c.MemsetD32(q+4, 0xdeadbeef, 2))
	require.NoError(t, c.CopyDtoH(got[:16], q))
	assert.Equal(t, append([]byte{data[0], 0xab, 0xab, 0xab, 0xef, 0xbe, 0xad, 0xde, 0xef, 0xbe, 0xad, 0xde}, data[12:16]...), got[:16])

	base, size, err := c.PointerRange(p + 1000)
	require.NoError(t, err)
	assert.Equal(t, p, base)
	assert.GreaterOrEqual(t, size, uint64(n))

	// Asynchronous, through pinned host buffers.
	s := newStream(t, c)
	in := allocHost(t, c, n)
	out := allocHost(t, c, n)
	data2 := randomBytes(2, n)
	copy(in.Bytes(), data2)
	require.NoError(t, s.CopyHtoDAsync(p, in, 0, n))
	require.NoError(t, s.CopyDtoDAsync(q, p, n))
	require.NoError(t, s.MemsetD32Async(q, 7, 1))
	require.NoError(t, s.MemsetD8Async(q+4, 9, 4))
	require.NoError(t, s.CopyDtoHAsync(out, 0, q, n))
	waitStream(t, s)
	want := append([]byte{7, 0, 0, 0, 9, 9, 9, 9}, data2[8:]...)
	require.True(t, bytes.Equal(want, out.Bytes()), "async round trip")

	// Part of a buffer, and bounds.
	require.NoError(t, s.CopyDtoHAsync(out, 100, p, 50))
	waitStream(t, s)
	assert.Equal(t, data2[:50], out.Bytes()[100:150])
	assert.ErrorIs(t, s.CopyDtoHAsync(out, n-10, p, 11), ErrInvalidValue)

	// Mapped host memory is addressable from the device.
	require.NoError(t, c.CopyDtoD(q, in.DevicePtr(), 64))
	require.NoError(t, c.CopyDtoH(got[:64], q))
	assert.Equal(t, data2[:64], got[:64])
}

func TestGPULaunch(t *testing.T) {
	c := requireGPU(t)
	// A NUL-terminated image is taken as is.
	m := loadModule(t, c, "goccl_test", testPTX+"\x00")
	t.Logf("info log: %q", m.InfoLog())
	axpy := kernel(t, m, "goccl_test_axpy")
	assert.Equal(t, "goccl_test_axpy", axpy.Name())
	_, err := m.Function("goccl_test_nope")
	assert.ErrorIs(t, err, ErrNotFound)

	const n = 100_003
	in := u32s(randomBytes(3, 4*n))
	inBytes := make([]byte, 4*n)
	for i, v := range in {
		binary.LittleEndian.PutUint32(inBytes[4*i:], v)
	}
	dIn := alloc(t, c, 4*n)
	dOut := alloc(t, c, 4*n)
	require.NoError(t, c.CopyHtoD(dIn, inBytes))
	s := newStream(t, c)

	var a Args
	a.Ptr(dOut)
	a.Ptr(dIn)
	a.U32(3)
	a.U32(n)
	require.NoError(t, Launch(s, axpy, grid(n, 256), &a))
	waitStream(t, s)
	outBytes := make([]byte, 4*n)
	require.NoError(t, c.CopyDtoH(outBytes, dOut))
	out := u32s(outBytes)
	for i := range out {
		if out[i] != 3*in[i]+uint32(i) {
			t.Fatalf("out[%d] = %d, want 3*%d+%d", i, out[i], in[i], i)
		}
	}

	// A by-value byte array parameter.
	sum2 := kernel(t, m, "goccl_test_sum2")
	pair := make([]byte, 16)
	binary.LittleEndian.PutUint64(pair, 40)
	binary.LittleEndian.PutUint64(pair[8:], 2)
	a.Reset()
	a.Ptr(dOut)
	a.Bytes(pair, 8)
	require.NoError(t, Launch(s, sum2, grid(1, 1), &a))
	waitStream(t, s)
	require.NoError(t, c.CopyDtoH(outBytes[:8], dOut))
	assert.Equal(t, uint64(42), binary.LittleEndian.Uint64(outBytes))

	// Attributes and occupancy.
	maxThreads, err := axpy.Attribute(FuncMaxThreadsPerBlock)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, maxThreads, 256)
	regs, err := axpy.Attribute(FuncNumRegs)
	require.NoError(t, err)
	blocks, err := axpy.MaxActiveBlocksPerSM(256, 0)
	require.NoError(t, err)
	assert.Positive(t, blocks)
	t.Logf("goccl_test_axpy: %d registers, %d blocks of 256 per SM", regs, blocks)

	// Arguments checked against the kernel's parameters, where the driver lists them.
	if !Has(FeatureParamInfo) {
		t.Logf("no argument check: %v", need(FeatureParamInfo))
		return
	}
	assert.Equal(t, []uint16{8, 8, 4, 4}, axpy.params)
	assert.Equal(t, []uint16{8, 16}, sum2.params)
	a.Reset()
	a.Ptr(dOut)
	a.Ptr(dIn)
	a.U32(3)
	assert.ErrorContains(t, Launch(s, axpy, grid(n, 256), &a), "3 arguments given, the kernel takes 4")
	a.U64(n)
	assert.ErrorContains(t, Launch(s, axpy, grid(n, 256), &a), "argument 3 is 8 bytes")
}

// TestGPUGoroutines launches from many goroutines at once, each with its own stream: no
// goroutine locks its thread, the package binds the context for every call.
func TestGPUGoroutines(t *testing.T) {
	c := requireGPU(t)
	m := loadModule(t, c, "goccl_test", testPTX)
	axpy := kernel(t, m, "goccl_test_axpy")
	const workers, n, rounds = 8, 4096, 50
	in := alloc(t, c, 4*n)
	require.NoError(t, c.MemsetD32(in, 1, n))
	outs := make([]DevicePtr, workers)
	streams := make([]*Stream, workers)
	for w := range workers {
		outs[w] = alloc(t, c, 4*n)
		streams[w] = newStream(t, c)
	}
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			var a Args
			for r := range rounds {
				a.Reset()
				a.Ptr(outs[w])
				a.Ptr(in)
				a.U32(uint32(w*1000 + r))
				a.U32(n)
				if err := Launch(streams[w], axpy, grid(n, 256), &a); err != nil {
					errs <- err
					return
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
			defer cancel()
			errs <- streams[w].Wait(ctx)
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
	got := make([]byte, 4*n)
	for w := range workers {
		require.NoError(t, c.CopyDtoH(got, outs[w]))
		a := uint32(w*1000 + rounds - 1) // the last round wins
		for i, v := range u32s(got) {
			if v != a+uint32(i) {
				t.Fatalf("worker %d: out[%d] = %d, want %d", w, i, v, a+uint32(i))
			}
		}
	}
}

// TestGPUHotPathAllocs counts Go allocations of the hot methods against the real driver.
func TestGPUHotPathAllocs(t *testing.T) {
	skipUnderRace(t)
	c := requireGPU(t)
	m := loadModule(t, c, "goccl_test", testPTX)
	empty := kernel(t, m, "goccl_test_empty")
	s := newStream(t, c)
	e, err := c.NewEvent(false)
	require.NoError(t, err)
	defer e.Close()
	p := alloc(t, c, 1<<10)
	a := new(Args)
	cfg := grid(1, 32)
	check := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(200, func() {
		a.Reset()
		check(Launch(s, empty, cfg, a))
		check(LaunchEx(s, empty, cfg, a, false))
		check(e.Record(s))
		check(s.WaitEvent(e))
		check(s.CopyDtoDAsync(p+512, p, 512))
		check(s.MemsetD32Async(p, 1, 128))
		_, err := s.Query()
		check(err)
	})
	waitStream(t, s)
	assert.Zero(t, allocs)
}

func TestGPUJITErrors(t *testing.T) {
	c := requireGPU(t)
	_, err := c.LoadModule("goccl_test_bad", []byte(badPTX))
	require.ErrorIs(t, err, ErrInvalidPTX)
	var je *JITError
	require.ErrorAs(t, err, &je)
	assert.Equal(t, "goccl_test_bad", je.Kernel)
	assert.Equal(t, "cuModuleLoadDataEx", je.Err.Op)
	found := false
	for _, l := range je.Log {
		found = found || strings.Contains(l, badPTXLine)
	}
	assert.True(t, found, "the JIT log names the bad line: %q", je.Log)
	assert.Contains(t, err.Error(), "load module goccl_test_bad: cuModuleLoadDataEx: CUDA_ERROR_INVALID_PTX")
	t.Logf("%+v", err)

	newer := strings.Replace(testPTX, ".version 7.8", ".version 99.9", 1)
	_, err = c.LoadModule("goccl_test_future", []byte(newer))
	require.ErrorIs(t, err, ErrUnsupportedPTXVersion)
	t.Logf("%v", err)
}

func TestGPULaunchExPDL(t *testing.T) {
	c := requireGPU(t)
	major, _, err := c.Device().ComputeCapability()
	require.NoError(t, err)
	if major < 9 {
		t.Skipf("PDL needs sm_90, device is sm_%d", major*10)
	}
	require.True(t, Has(FeatureLaunchEx), "%v", need(FeatureLaunchEx))
	m := loadModule(t, c, "goccl_test_pdl", pdlPTX)
	produce := kernel(t, m, "goccl_test_produce")
	consume := kernel(t, m, "goccl_test_consume")
	const n = 1 << 20
	x := alloc(t, c, 4*n)
	y := alloc(t, c, 4*n)
	s := newStream(t, c)
	var pa, ca Args
	pa.Ptr(x)
	pa.U32(n)
	ca.Ptr(y)
	ca.Ptr(x)
	ca.U32(n)
	out := make([]byte, 4*n)
	for rep := range 3 {
		require.NoError(t, s.MemsetD32Async(x, 0, n))
		require.NoError(t, s.MemsetD32Async(y, 0, n))
		require.NoError(t, LaunchEx(s, produce, grid(n, 256), &pa, false))
		require.NoError(t, LaunchEx(s, consume, grid(n, 256), &ca, true))
		waitStream(t, s)
		require.NoError(t, c.CopyDtoH(out, y))
		for i, v := range u32s(out) {
			if v != 2*uint32(i+1) {
				t.Fatalf("rep %d: y[%d] = %d, want %d", rep, i, v, 2*(i+1))
			}
		}
	}
}

func TestGPUGraphCaptureReplay(t *testing.T) {
	c := requireGPU(t)
	require.True(t, Has(FeatureGraphs), "%v", need(FeatureGraphs))
	m := loadModule(t, c, "goccl_test", testPTX)
	axpy := kernel(t, m, "goccl_test_axpy")
	const n = 4099
	in, tmp, out := alloc(t, c, 4*n), alloc(t, c, 4*n), alloc(t, c, 4*n)
	hin, hout := allocHost(t, c, 4*n), allocHost(t, c, 4*n)
	s := newStream(t, c)

	require.NoError(t, s.BeginCapture(CaptureThreadLocal))
	capturing, err := s.IsCapturing()
	require.NoError(t, err)
	require.True(t, capturing)
	var a Args
	a.Ptr(tmp)
	a.Ptr(in)
	a.U32(5)
	a.U32(n)
	require.NoError(t, s.CopyHtoDAsync(in, hin, 0, 4*n))
	require.NoError(t, s.MemsetD32Async(tmp, 0, n))
	require.NoError(t, Launch(s, axpy, grid(n, 128), &a))
	require.NoError(t, s.CopyDtoDAsync(out, tmp, 4*n))
	require.NoError(t, s.CopyDtoHAsync(hout, 0, out, 4*n))
	g, err := s.EndCapture()
	require.NoError(t, err)
	capturing, err = s.IsCapturing()
	require.NoError(t, err)
	require.False(t, capturing)
	x, err := g.Instantiate()
	require.NoError(t, err)
	require.NoError(t, g.Close())
	defer func() { assert.NoError(t, x.Close()) }()

	a.Reset() // the graph keeps its own copy of the arguments
	for rep := range 3 {
		data := randomBytes(uint64(10+rep), 4*n)
		copy(hin.Bytes(), data)
		require.NoError(t, x.Launch(s))
		waitStream(t, s)
		src, got := u32s(data), u32s(hout.Bytes())
		for i := range got {
			if got[i] != 5*src[i]+uint32(i) {
				t.Fatalf("replay %d: out[%d] = %d, want %d", rep, i, got[i], 5*src[i]+uint32(i))
			}
		}
	}
}

func TestGPUEventsAndWaits(t *testing.T) {
	c := requireGPU(t)
	m := loadModule(t, c, "goccl_test", testPTX)
	empty := kernel(t, m, "goccl_test_empty")
	spin := kernel(t, m, "goccl_test_spin")
	s := newStream(t, c)
	s2 := newStream(t, c)

	start, err := c.NewEvent(true)
	require.NoError(t, err)
	defer start.Close()
	end, err := c.NewEvent(true)
	require.NoError(t, err)
	defer end.Close()
	require.NoError(t, start.Record(s))
	for range 10 {
		require.NoError(t, Launch(s, empty, grid(1, 32), nil))
	}
	require.NoError(t, end.Record(s))
	require.NoError(t, s2.WaitEvent(end))
	waitStream(t, s2)
	done, err := end.Query()
	require.NoError(t, err)
	assert.True(t, done, "s2 waited for the event")
	d, err := Elapsed(start, end)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, d, time.Duration(0))

	plain, err := c.NewEvent(false)
	require.NoError(t, err)
	require.NoError(t, plain.Record(s))
	ctx, cancel := context.WithTimeout(context.Background(), gpuTimeout)
	defer cancel()
	require.NoError(t, plain.Wait(ctx))
	_, err = Elapsed(plain, plain)
	assert.Error(t, err, "no timing on a CU_EVENT_DISABLE_TIMING event")
	require.NoError(t, plain.Close())
	require.NoError(t, plain.Close(), "closing twice is a no-op")
	assert.ErrorIs(t, plain.Record(s), ErrInvalidValue, "a closed event is an error, not a crash")

	// A kernel waiting on the host: Wait with a deadline returns ErrTimeout, and succeeds once
	// the host releases the kernel.
	flag := allocHost(t, c, 4)
	word := (*uint32)(unsafe.Pointer(&flag.Bytes()[0]))
	atomic.StoreUint32(word, 0)
	defer atomic.StoreUint32(word, 1) // never leave the kernel spinning
	var a Args
	a.Ptr(flag.DevicePtr())
	require.NoError(t, Launch(s, spin, grid(1, 1), &a))
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	err = s.Wait(short)
	require.ErrorIs(t, err, ErrTimeout)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	done, err = s.Query()
	require.NoError(t, err)
	assert.False(t, done)
	atomic.StoreUint32(word, 1)
	waitStream(t, s)

	closed, err := c.NewStream()
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	assert.ErrorContains(t, closed.Synchronize(), "stream is closed")
	assert.ErrorContains(t, Launch(closed, empty, grid(1, 1), nil), "stream is closed")
}

func TestGPUPeerAccess(t *testing.T) {
	c := requireGPU(t)
	d := c.Device()
	self, err := CanAccessPeer(d, d)
	require.NoError(t, err)
	t.Logf("CanAccessPeer(%d, %d) = %v", d, d, self)
	require.NoError(t, c.EnablePeerAccess(c), "a context reaches its own memory")
	require.NoError(t, c.EnablePeerAccess(c))

	n, err := DeviceCount()
	require.NoError(t, err)
	if n < 2 {
		t.Logf("one device: no peer pair to test")
		return
	}
	d1, err := GetDevice(1)
	require.NoError(t, err)
	c1, err := PrimaryContext(d1)
	require.NoError(t, err)
	defer c1.Close()
	can, err := CanAccessPeer(d, d1)
	require.NoError(t, err)
	err = c.EnablePeerAccess(c1)
	if !can {
		require.ErrorIs(t, err, ErrPeerAccessUnsupported)
		return
	}
	require.NoError(t, err)
	require.NoError(t, c.EnablePeerAccess(c1), "enabling twice is fine")
}

// runHelper runs this test binary as a child in role, with env and extra files, and returns
// its stdout.
func runHelper(t *testing.T, role string, env []string, files ...*os.File) string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*gpuTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childEnv+"="+role), env...)
	cmd.ExtraFiles = files
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "child %s: %s", role, stderr.String())
	return string(out)
}

// childSum extracts the "sha256=" line of a child's output.
func childSum(t *testing.T, out string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, "sha256="); ok {
			return v
		}
	}
	t.Fatalf("no sha256= line in child output %q", out)
	return ""
}

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// TestGPUIPCTwoProcesses exports an allocation with a legacy IPC handle; a second process
// opens it, checks its content and writes into its second half.
func TestGPUIPCTwoProcesses(t *testing.T) {
	c := requireGPU(t)
	const n = 1 << 20
	data := randomBytes(4, n)
	p := alloc(t, c, n)
	require.NoError(t, c.CopyHtoD(p, data))
	h, err := c.IPCGetMemHandle(p)
	require.NoError(t, err)

	_, err = c.IPCOpenMemHandle(h)
	require.Error(t, err)
	var e *Error
	require.ErrorAs(t, err, &e)
	assert.Contains(t, e.Error(), "IPC handles cannot be opened in the process that created them")
	t.Logf("same-process open: %v", err)

	out := runHelper(t, "ipc", []string{"GOCCL_TEST_IPC_HANDLE=" + hex.EncodeToString(h[:]),
		"GOCCL_TEST_SIZE=" + strconv.Itoa(n)})
	assert.Equal(t, sum(data), childSum(t, out), "the child read what the parent wrote")
	got := make([]byte, n)
	require.NoError(t, c.CopyDtoH(got, p))
	assert.True(t, bytes.Equal(data[:n/2], got[:n/2]))
	assert.True(t, bytes.Equal(bytes.Repeat([]byte{0x5a}, n/2), got[n/2:]), "the child's write is visible")
}

// TestGPUVMMTwoProcesses exports a VMM allocation as a POSIX file descriptor; a second process
// imports it (inherited as fd 3), maps it, checks its content and writes into its second half.
func TestGPUVMMTwoProcesses(t *testing.T) {
	c := requireGPU(t)
	require.True(t, Has(FeatureVMM), "%v", need(FeatureVMM))
	for _, probe := range []func() (bool, error){c.Device().SupportsVMM, c.Device().SupportsPOSIXFD} {
		ok, err := probe()
		require.NoError(t, err)
		if !ok {
			t.Skip("device without VMM or POSIX file descriptor export")
		}
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

	data := randomBytes(5, int(size))
	require.NoError(t, c.CopyHtoD(va, data))
	fd, err := phys.ExportFD()
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "vmm-export")
	defer f.Close()

	out := runHelper(t, "vmm", []string{"GOCCL_TEST_SIZE=" + strconv.FormatUint(size, 10)}, f)
	assert.Equal(t, sum(data), childSum(t, out))
	got := make([]byte, size)
	require.NoError(t, c.CopyDtoH(got, va))
	half := size / 2
	assert.True(t, bytes.Equal(data[:half], got[:half]))
	assert.True(t, bytes.Equal(bytes.Repeat([]byte{0xc3}, int(half)), got[half:]), "the child's write is visible")
}

// runChild is the second process of the two-process tests: it prints "sha256=<hex>" of what
// it reads and writes a pattern into the second half of the buffer. Role "fault" is
// TestGPUContextLost's child instead (childFault).
func runChild(role string) error {
	if role == "fault" {
		c, err := PrimaryContext(0)
		if err != nil {
			return err
		}
		return childFault(c) // the context is lost: nothing to release
	}
	size, err := strconv.ParseUint(os.Getenv("GOCCL_TEST_SIZE"), 10, 64)
	if err != nil {
		return fmt.Errorf("GOCCL_TEST_SIZE: %w", err)
	}
	d, err := GetDevice(0)
	if err != nil {
		return err
	}
	c, err := PrimaryContext(d)
	if err != nil {
		return err
	}
	switch role {
	case "ipc":
		err = childIPC(c, size)
	case "vmm":
		err = childVMM(c, size)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	return errors.Join(err, c.Close())
}

func childIPC(c *Context, size uint64) error {
	raw, err := hex.DecodeString(os.Getenv("GOCCL_TEST_IPC_HANDLE"))
	if err != nil || len(raw) != 64 {
		return fmt.Errorf("GOCCL_TEST_IPC_HANDLE: want 128 hex digits: %v", err)
	}
	var h IPCMemHandle
	copy(h[:], raw)
	p, err := c.IPCOpenMemHandle(h)
	if err != nil {
		return err
	}
	return errors.Join(childReadAndMark(c, p, size, 0x5a), c.IPCCloseMemHandle(p))
}

func childVMM(c *Context, size uint64) (err error) {
	phys, err := c.ImportPhysicalFD(3) // the first of cmd.ExtraFiles
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, phys.Release()) }()
	va, err := c.ReserveAddress(size, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, c.FreeAddress(va, size)) }()
	if err := c.Map(va, size, phys); err != nil {
		return err
	}
	return errors.Join(childReadAndMark(c, va, size, 0xc3), c.Unmap(va, size))
}

// childReadAndMark prints the checksum of the size bytes at p and sets their second half to mark.
func childReadAndMark(c *Context, p DevicePtr, size uint64, mark byte) error {
	buf := make([]byte, size)
	if err := c.CopyDtoH(buf, p); err != nil {
		return err
	}
	fmt.Printf("sha256=%s\n", sum(buf))
	return c.MemsetD8(p+DevicePtr(size/2), mark, size/2)
}
