package driver

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Context is a retained primary context of one device: the context the CUDA runtime (and so
// PyTorch and NCCL) uses too, so memory and streams interoperate with them.
//
// Every method makes the context current on the calling OS thread itself, so a Context is
// safe to use from any goroutine, and callers never lock threads. Close releases it; objects
// created from it (streams, events, memory, modules) must be closed or freed before.
type Context struct {
	handle uintptr // CUcontext
	dev    Device
	closed atomic.Bool
}

// PrimaryContext retains the primary context of d (cuDevicePrimaryCtxRetain). Each call
// retains once; Close releases once.
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

// Device returns the device of c.
func (c *Context) Device() Device { return c.dev }

// Close releases the primary context (cuDevicePrimaryCtxRelease_v2). Calling it again does
// nothing.
func (c *Context) Close() error {
	if c == nil || !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	return call(cuDevicePrimaryCtxRelease_v2, uintptr(c.dev))
}

// makeCurrent binds c to the calling thread, which the caller has locked.
func (c *Context) makeCurrent() error {
	if c == nil || c.closed.Load() {
		return errContextClosed()
	}
	return call(cuCtxSetCurrent, c.handle)
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
