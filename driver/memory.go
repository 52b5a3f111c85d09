package driver

import (
	"fmt"
	"unsafe"
)

// DevicePtr is a device address (CUdeviceptr). Go never dereferences it; adding offsets is fine.
type DevicePtr uintptr

// cuStreamLegacy is CU_STREAM_LEGACY, the handle of the legacy default stream.
const cuStreamLegacy = 0x1

// Pointer attributes (CUpointer_attribute) used by PointerRange.
const (
	pointerRangeStartAddr = 11
	pointerRangeSize      = 12
)

// cuMemHostAlloc flags: PORTABLE (pinned for every context) | DEVICEMAP (mapped into the
// device address space).
const memHostAllocPortableDeviceMap = 0x01 | 0x02

// Alloc allocates bytes of device memory (cuMemAlloc_v2). Free it with Free.
func (c *Context) Alloc(bytes uint64) (DevicePtr, error) {
	if err := c.live(); err != nil {
		return 0, err
	}
	var p DevicePtr
	if err := c.call(cuMemAlloc_v2, uintptr(unsafe.Pointer(&p)), uintptr(bytes)); err != nil {
		return 0, fmt.Errorf("allocate %d bytes on device %d: %w", bytes, c.dev, err)
	}
	return p, nil
}

// Free frees memory from Alloc (cuMemFree_v2).
func (c *Context) Free(p DevicePtr) error { return c.call(cuMemFree_v2, uintptr(p)) }

// The synchronous copies and memsets below return once the device memory holds the result.
// cuMemcpyHtoD returns when the source is staged, cuMemcpyDtoD and cuMemset* return at once:
// their work runs on the legacy default stream, which the non-blocking streams of this
// package do not wait for. Synchronizing the legacy stream afterwards closes that gap, so
// work queued on any Stream afterwards sees the data.

// CopyHtoD copies src to device memory at dst.
func (c *Context) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := c.call(cuMemcpyHtoD_v2, uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src))); err != nil {
		return err
	}
	return c.call(cuStreamSynchronize, cuStreamLegacy)
}

// CopyDtoH copies len(dst) bytes from device memory at src into dst.
func (c *Context) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	return c.call(cuMemcpyDtoH_v2, uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
}

// CopyDtoD copies n bytes from src to dst, both device memory (or mapped host memory).
func (c *Context) CopyDtoD(dst, src DevicePtr, n uint64) error {
	if err := c.call(cuMemcpyDtoD_v2, uintptr(dst), uintptr(src), uintptr(n)); err != nil {
		return err
	}
	return c.call(cuStreamSynchronize, cuStreamLegacy)
}

// MemsetD8 sets n bytes at p to v.
func (c *Context) MemsetD8(p DevicePtr, v byte, n uint64) error {
	if err := c.call(cuMemsetD8_v2, uintptr(p), uintptr(v), uintptr(n)); err != nil {
		return err
	}
	return c.call(cuStreamSynchronize, cuStreamLegacy)
}

// MemsetD32 sets n 32-bit words at p (4-byte aligned) to v.
func (c *Context) MemsetD32(p DevicePtr, v uint32, n uint64) error {
	if err := c.call(cuMemsetD32_v2, uintptr(p), uintptr(v), uintptr(n)); err != nil {
		return err
	}
	return c.call(cuStreamSynchronize, cuStreamLegacy)
}

// PointerRange returns the allocation that contains p: its base address and size
// (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR and RANGE_SIZE). IPC handles name whole allocations,
// so sharing an interior pointer means sharing its base plus an offset.
func (c *Context) PointerRange(p DevicePtr) (base DevicePtr, size uint64, err error) {
	var b DevicePtr
	var s uint64
	if err := c.call(cuPointerGetAttribute, uintptr(unsafe.Pointer(&b)), pointerRangeStartAddr, uintptr(p)); err != nil {
		return 0, 0, fmt.Errorf("allocation range of %#x: %w", p, err)
	}
	if err := c.call(cuPointerGetAttribute, uintptr(unsafe.Pointer(&s)), pointerRangeSize, uintptr(p)); err != nil {
		return 0, 0, fmt.Errorf("allocation range of %#x: %w", p, err)
	}
	return b, s, nil
}

// HostBuffer is pinned host memory mapped into the device address space: the source and
// destination of async copies, and memory that kernels can write for the host to read (error
// records). Close frees it; Bytes must not be used afterwards.
type HostBuffer struct {
	ctx  *Context
	ptr  unsafe.Pointer // C memory from cuMemHostAlloc, never the Go heap
	size uint64
	dptr DevicePtr
}

// AllocHost allocates bytes of pinned, device-mapped host memory (cuMemHostAlloc with
// PORTABLE|DEVICEMAP). The memory is not zeroed.
func (c *Context) AllocHost(bytes uint64) (*HostBuffer, error) {
	var p unsafe.Pointer
	if err := c.call(cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes), memHostAllocPortableDeviceMap); err != nil {
		return nil, fmt.Errorf("allocate %d bytes of pinned host memory: %w", bytes, err)
	}
	var d DevicePtr
	if err := c.call(cuMemHostGetDevicePointer_v2, uintptr(unsafe.Pointer(&d)), uintptr(p), 0); err != nil {
		_ = c.call(cuMemFreeHost, uintptr(p))
		return nil, fmt.Errorf("map pinned host memory into device %d: %w", c.dev, err)
	}
	return &HostBuffer{ctx: c, ptr: p, size: bytes, dptr: d}, nil
}

// Bytes returns the host view of the buffer (nil once closed, or for a nil HostBuffer).
func (h *HostBuffer) Bytes() []byte {
	if h == nil || h.ptr == nil {
		return nil
	}
	return unsafe.Slice((*byte)(h.ptr), h.size)
}

// DevicePtr returns the device address of the buffer (cuMemHostGetDevicePointer_v2); 0 once
// closed, or for a nil HostBuffer.
func (h *HostBuffer) DevicePtr() DevicePtr {
	if h == nil {
		return 0
	}
	return h.dptr
}

// Close frees the buffer (cuMemFreeHost). Calling it again, or on a nil HostBuffer, does
// nothing.
func (h *HostBuffer) Close() error {
	if h == nil || h.ptr == nil {
		return nil
	}
	p := h.ptr
	h.ptr, h.dptr = nil, 0
	return h.ctx.call(cuMemFreeHost, uintptr(p))
}

// hostRange checks that [off, off+n) lies in h and returns its address.
func (h *HostBuffer) hostRange(off, n uint64) (unsafe.Pointer, error) {
	if h == nil || h.ptr == nil {
		return nil, errClosed("host buffer")
	}
	if off > h.size || n > h.size-off {
		return nil, fmt.Errorf("host buffer range [%d, %d+%d) exceeds its %d bytes: %w", off, off, n, h.size, ErrInvalidValue)
	}
	return unsafe.Add(h.ptr, off), nil
}

// CopyDtoDAsync queues a copy of n bytes from src to dst on s. It allocates nothing.
func (s *Stream) CopyDtoDAsync(dst, src DevicePtr, n uint64) error {
	if s == nil || s.handle == 0 {
		return errClosed("stream")
	}
	return s.ctx.hot(cuMemcpyDtoDAsync_v2, uintptr(dst), uintptr(src), uintptr(n), s.handle)
}

// CopyHtoDAsync queues a copy of n bytes at offset off of src to dst on s. It allocates nothing.
func (s *Stream) CopyHtoDAsync(dst DevicePtr, src *HostBuffer, off, n uint64) error {
	if s == nil || s.handle == 0 {
		return errClosed("stream")
	}
	p, err := src.hostRange(off, n)
	if err != nil {
		return err
	}
	return s.ctx.hot(cuMemcpyHtoDAsync_v2, uintptr(dst), uintptr(p), uintptr(n), s.handle)
}

// CopyDtoHAsync queues a copy of n bytes from src to offset off of dst on s. It allocates
// nothing. The data is in dst once the stream got there (Stream.Wait, an Event).
func (s *Stream) CopyDtoHAsync(dst *HostBuffer, off uint64, src DevicePtr, n uint64) error {
	if s == nil || s.handle == 0 {
		return errClosed("stream")
	}
	p, err := dst.hostRange(off, n)
	if err != nil {
		return err
	}
	return s.ctx.hot(cuMemcpyDtoHAsync_v2, uintptr(p), uintptr(src), uintptr(n), s.handle)
}

// MemsetD8Async queues setting n bytes at p to v on s. It allocates nothing.
func (s *Stream) MemsetD8Async(p DevicePtr, v byte, n uint64) error {
	if s == nil || s.handle == 0 {
		return errClosed("stream")
	}
	return s.ctx.hot(cuMemsetD8Async, uintptr(p), uintptr(v), uintptr(n), s.handle)
}

// MemsetD32Async queues setting n 32-bit words at p (4-byte aligned) to v on s. It allocates
// nothing.
func (s *Stream) MemsetD32Async(p DevicePtr, v uint32, n uint64) error {
	if s == nil || s.handle == 0 {
		return errClosed("stream")
	}
	return s.ctx.hot(cuMemsetD32Async, uintptr(p), uintptr(v), uintptr(n), s.handle)
}
