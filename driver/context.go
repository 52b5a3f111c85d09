package driver

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Context is a CUDA context: a retained primary context of one device (PrimaryContext), or a
// context owned by someone else (CurrentContext, WrapContext, Stream.Context of a WrapStream).
// The primary context is the one the CUDA runtime (and so PyTorch and NCCL) uses too, so
// memory and streams interoperate with them.
//
// Every method makes the context current on the calling OS thread itself, so a Context is
// safe to use from any goroutine, and callers never lock threads. A foreign Context works
// like a primary one for every method. Close releases what this package holds; objects
// created from the context (streams, events, memory, modules) must be closed or freed before.
type Context struct {
	handle  uintptr // CUcontext
	dev     Device
	foreign bool // not owned: Close leaves the context to its owner
	closed  atomic.Bool

	// health is the state of Health, guarded by its mutex: an idle stream of the context to
	// query, created on first use and destroyed by Close, and the capture mode that
	// cuThreadExchangeStreamCaptureMode swaps (a field, so that the driver writes to memory
	// that does not move).
	health struct {
		sync.Mutex
		stream uintptr
		mode   int32
	}
}

// PrimaryContext retains the primary context of d (cuDevicePrimaryCtxRetain). Each call
// retains once; Close releases once. It is owned: the primary context stays alive at least
// until Close.
func PrimaryContext(d Device) (*Context, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	var h uintptr
	if err := call(cuDevicePrimaryCtxRetain, uintptr(unsafe.Pointer(&h)), uintptr(d)); err != nil {
		return nil, fmt.Errorf("retain primary context of device %d: %w", d, err)
	}
	return &Context{handle: h, dev: d}, nil
}

// CurrentContext wraps the context current on the calling OS thread (cuCtxGetCurrent), such
// as one that cgo code or another CUDA library made current. Since the current context belongs
// to an OS thread, the calling goroutine must be locked to that thread (runtime.LockOSThread)
// for the answer to mean anything; note that every method of this package leaves its own
// context current on the threads it ran on.
//
// The Context is not owned: Close only forgets it, and the context must outlive every use of
// the wrapper. With no context current the error matches ErrInvalidContext.
func CurrentContext() (*Context, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return currentContext()
}

// currentContext is CurrentContext on a driver already initialized, with the calling
// goroutine locked to its thread.
func currentContext() (*Context, error) {
	var h uintptr
	if err := call(cuCtxGetCurrent, uintptr(unsafe.Pointer(&h))); err != nil {
		return nil, fmt.Errorf("get the current CUDA context: %w", err)
	}
	if h == 0 {
		return nil, fmt.Errorf("no CUDA context is current on this OS thread (make one current, with the calling goroutine locked to the thread, or use WrapContext or PrimaryContext): %w",
			ErrInvalidContext)
	}
	var d int32
	if err := call(cuCtxGetDevice, uintptr(unsafe.Pointer(&d))); err != nil {
		return nil, fmt.Errorf("get the device of the current CUDA context %#x: %w", h, err)
	}
	return &Context{handle: h, dev: Device(d), foreign: true}, nil
}

// WrapContext wraps a CUcontext made elsewhere (cuCtxCreate or cuDevicePrimaryCtxRetain in
// cgo code or another binding). It finds the context's device with cuCtxGetDevice, making
// handle current on a locked thread for the call and restoring the thread's previous context
// afterwards.
//
// The Context is not owned: Close only forgets it (it neither destroys nor releases the
// context), and the context must outlive every use of the wrapper and of what was created
// through it. handle must be a live context: the driver cannot tell every stale handle from a
// live one.
func WrapContext(handle uintptr) (*Context, error) {
	if handle == 0 {
		return nil, fmt.Errorf("wrap CUDA context: the handle is NULL: %w", ErrInvalidContext)
	}
	if err := Init(); err != nil {
		return nil, err
	}
	return wrapContext(handle)
}

// wrapContext is WrapContext on a driver already initialized.
func wrapContext(handle uintptr) (*Context, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var prev uintptr
	if err := call(cuCtxGetCurrent, uintptr(unsafe.Pointer(&prev))); err != nil {
		return nil, fmt.Errorf("wrap CUDA context %#x: get the thread's current context: %w", handle, err)
	}
	if err := call(cuCtxSetCurrent, handle); err != nil {
		return nil, fmt.Errorf("wrap CUDA context %#x: make it current: %w", handle, err)
	}
	var d int32
	err := call(cuCtxGetDevice, uintptr(unsafe.Pointer(&d)))
	// The thread may belong to code that relies on its current context (a cgo caller).
	restore := call(cuCtxSetCurrent, prev)
	if err != nil {
		return nil, fmt.Errorf("wrap CUDA context %#x: get its device: %w", handle, err)
	}
	if restore != nil {
		return nil, fmt.Errorf("wrap CUDA context %#x: restore the thread's context %#x: %w", handle, prev, restore)
	}
	return &Context{handle: handle, dev: Device(d), foreign: true}, nil
}

// Device returns the device of c.
func (c *Context) Device() Device { return c.dev }

// Handle returns the raw CUcontext, for handing to other CUDA libraries. It stays owned by c
// (a primary context) or by its owner (a foreign context): the receiver must not destroy it.
func (c *Context) Handle() uintptr { return c.handle }

// Close releases what c holds: the stream of Health, then, for a primary context, the
// retain (cuDevicePrimaryCtxRelease_v2). For a foreign context it does nothing else: the
// context stays its owner's. Calling it again does nothing. It must not run concurrently with
// other methods of c.
func (c *Context) Close() error {
	if c == nil || !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	err := c.closeHealth()
	if c.foreign {
		return err
	}
	return errors.Join(err, call(cuDevicePrimaryCtxRelease_v2, uintptr(c.dev)))
}

// makeCurrent binds c to the calling thread, which the caller has locked.
func (c *Context) makeCurrent() error {
	if err := c.live(); err != nil {
		return err
	}
	return call(cuCtxSetCurrent, c.handle)
}

// live returns nil when c can be used. Methods that read c's fields before their first
// driver call (its device for an error message or an allocation property) check it first,
// so that a nil Context is an error, not a panic.
func (c *Context) live() error {
	if c == nil || c.closed.Load() {
		return errContextClosed()
	}
	return nil
}

// errContextClosed is the error for using a closed (or nil) Context.
func errContextClosed() error {
	return fmt.Errorf("context is closed or nil: %w", ErrInvalidContext)
}

// errClosed is the error for using a closed (or nil) object. It allocates, so the hot paths
// call it only once they know they fail.
func errClosed(what string) error {
	return fmt.Errorf("%s is closed or nil: %w", what, ErrInvalidValue)
}

// Synchronize waits for all work of the context (cuCtxSynchronize), with no time limit: prefer
// Stream.Wait, which takes a deadline.
func (c *Context) Synchronize() error { return c.call(cuCtxSynchronize) }

// MemInfo returns the free and total memory of the device (cuMemGetInfo_v2).
func (c *Context) MemInfo() (free, total uint64, err error) {
	var f, t uint64
	if err := c.call(cuMemGetInfo_v2, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t))); err != nil {
		return 0, 0, err
	}
	return f, t, nil
}

// EnablePeerAccess lets kernels and copies of c reach memory allocated in peer
// (cuCtxEnablePeerAccess). Enabling it twice, or for the same device, returns nil. Devices
// without a peer-to-peer path return an error matching ErrPeerAccessUnsupported.
func (c *Context) EnablePeerAccess(peer *Context) error {
	if err := c.live(); err != nil {
		return err
	}
	if peer == nil || peer.closed.Load() {
		return errClosed("peer context")
	}
	if peer.dev == c.dev {
		return nil // the driver rejects a context as its own peer; it needs no mapping
	}
	err := c.call(cuCtxEnablePeerAccess, peer.handle, 0)
	switch {
	case err == nil, isCode(err, 704):
		return nil
	case isCode(err, 217):
		return fmt.Errorf("device %d cannot access device %d (no P2P path; see nvidia-smi topo -m): %w",
			c.dev, peer.dev, err)
	}
	return fmt.Errorf("enable peer access from device %d to device %d: %w", c.dev, peer.dev, err)
}

// isCode reports whether err is an *Error with code r.
func isCode(err error, r Result) bool {
	e, ok := err.(*Error)
	return ok && e.Code == r
}
