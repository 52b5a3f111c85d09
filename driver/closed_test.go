package driver

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestNilOrClosedContextIsAnError: every method of a nil or closed Context fails with
// ErrInvalidContext before it reaches the driver. Some methods read the context's device
// before their first driver call (for an error message, or an allocation's location); on a
// nil Context that read panicked, although makeCurrent had the error ready. A closed context
// must not answer either: EnablePeerAccess to a peer on its own device returned nil.
func TestNilOrClosedContextIsAnError(t *testing.T) {
	closed := &Context{handle: 0xc0, dev: 2, foreign: true} // foreign: Close calls nothing
	require.NoError(t, closed.Close())
	peer := &Context{handle: 0xc1, dev: 2}

	for name, c := range map[string]*Context{"nil": nil, "closed": closed} {
		methods := map[string]func() error{
			"Synchronize":      c.Synchronize,
			"MemInfo":          func() error { _, _, err := c.MemInfo(); return err },
			"EnablePeerAccess": func() error { return c.EnablePeerAccess(peer) },
			"Alloc":            func() error { _, err := c.Alloc(64); return err },
			"Free":             func() error { return c.Free(0x1000) },
			"CopyHtoD":         func() error { return c.CopyHtoD(0x1000, []byte{1}) },
			"CopyDtoH":         func() error { return c.CopyDtoH([]byte{1}, 0x1000) },
			"CopyDtoD":         func() error { return c.CopyDtoD(0x1000, 0x2000, 1) },
			"MemsetD8":         func() error { return c.MemsetD8(0x1000, 1, 1) },
			"MemsetD32":        func() error { return c.MemsetD32(0x1000, 1, 1) },
			"PointerRange":     func() error { _, _, err := c.PointerRange(0x1000); return err },
			"PointerInfo":      func() error { _, err := c.PointerInfo(0x1000); return err },
			"AllocHost":        func() error { _, err := c.AllocHost(64); return err },
			"NewStream":        func() error { _, err := c.NewStream(); return err },
			"NewEvent":         func() error { _, err := c.NewEvent(false); return err },
			"LoadModule":       func() error { _, err := c.LoadModule("k", []byte("//")); return err },
			"Health":           c.Health,
			"IPCGetMemHandle":  func() error { _, err := c.IPCGetMemHandle(0x1000); return err },
			"IPCCloseMemHandle": func() error {
				return c.IPCCloseMemHandle(0x1000)
			},
			"VMMGranularity":   func() error { _, err := c.VMMGranularity(); return err },
			"CreatePhysical":   func() error { _, err := c.CreatePhysical(2 << 20); return err },
			"ImportPhysicalFD": func() error { _, err := c.ImportPhysicalFD(-1); return err },
			"ReserveAddress":   func() error { _, err := c.ReserveAddress(2<<20, 0); return err },
			"FreeAddress":      func() error { return c.FreeAddress(0x1000, 2<<20) },
			"Map":              func() error { return c.Map(0x1000, 2<<20, &PhysicalAlloc{handle: 1}) },
			"Unmap":            func() error { return c.Unmap(0x1000, 2<<20) },
			"SetAccess":        func() error { return c.SetAccess(0x1000, 2<<20, 0) },
		}
		if runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64" { // elsewhere: ErrNotSupported
			methods["IPCOpenMemHandle"] = func() error { _, err := c.IPCOpenMemHandle(IPCMemHandle{}); return err }
		}
		for method, call := range methods {
			var err error
			require.NotPanics(t, func() { err = call() }, "%s context: %s", name, method)
			assert.ErrorIs(t, err, ErrInvalidContext, "%s context: %s", name, method)
		}
	}
	assert.NoError(t, (*Context)(nil).Close(), "closing nothing does nothing")
}

// TestNilHostBufferIsClosed: a nil HostBuffer behaves as a closed one, as nil Streams, Events,
// Modules, Graphs and PhysicalAllocs do: Close does nothing, Bytes is nil, and copies to or
// from it fail. Close and Bytes dereferenced it and panicked.
func TestNilHostBufferIsClosed(t *testing.T) {
	var h *HostBuffer
	require.NotPanics(t, func() {
		assert.NoError(t, h.Close())
		assert.Nil(t, h.Bytes())
		assert.Zero(t, h.DevicePtr())
	})
	_, s, _ := fakeHandles()
	assert.ErrorIs(t, s.CopyHtoDAsync(0x1000, h, 0, 1), ErrInvalidValue)
	assert.ErrorIs(t, s.CopyDtoHAsync(h, 0, 0x1000, 1), ErrInvalidValue)
}

// TestFunctionOfClosedModuleRefused: Module.Close unloads the module's kernels, so their
// CUfunction handles dangle; Attribute and MaxActiveBlocksPerSM refuse them, as Launch does,
// rather than hand them to the driver (which would read freed memory). The fake driver
// answers success to anything that reaches it, so only the refusal makes an error.
func TestFunctionOfClosedModuleRefused(t *testing.T) {
	fake := fakeCUDA(t)
	swapSymbol(t, &cuCtxSetCurrent, fake("fake_ok"))
	swapSymbol(t, &cuFuncGetAttribute, fake("fake_ok"))
	swapSymbol(t, &cuOccupancyMaxActiveBlocksPerMultiprocessor, fake("fake_ok"))
	swapSymbol(t, &cuModuleUnload, fake("fake_ok"))
	_, _, f := fakeHandles()

	_, err := f.Attribute(FuncNumRegs)
	require.NoError(t, err, "a live kernel reaches the driver")
	_, err = f.MaxActiveBlocksPerSM(128, 0)
	require.NoError(t, err, "a live kernel reaches the driver")

	require.NoError(t, f.mod.Close())
	for name, fn := range map[string]*Function{
		"closed module": f,
		"nil":           nil,
		"no module":     {handle: 0xf0, name: "orphan"},
	} {
		require.NotPanics(t, func() {
			_, err := fn.Attribute(FuncNumRegs)
			assert.ErrorIs(t, err, ErrInvalidValue, "%s: Attribute", name)
			assert.ErrorContains(t, err, "kernel (or its module) is closed", "%s: Attribute", name)
			_, err = fn.MaxActiveBlocksPerSM(128, 0)
			assert.ErrorIs(t, err, ErrInvalidValue, "%s: MaxActiveBlocksPerSM", name)
			assert.ErrorContains(t, err, "kernel (or its module) is closed", "%s: MaxActiveBlocksPerSM", name)
		}, name)
	}
}
