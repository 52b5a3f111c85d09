package driver

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"unsafe"
)

// MemoryType is where memory lives (CUmemorytype), as Context.PointerInfo reports it.
type MemoryType int

// Memory types (values of CUmemorytype).
const (
	MemoryHost    MemoryType = 1 // CU_MEMORYTYPE_HOST: pinned or registered host memory
	MemoryDevice  MemoryType = 2 // CU_MEMORYTYPE_DEVICE: device memory, VMM mappings included
	MemoryArray   MemoryType = 3 // CU_MEMORYTYPE_ARRAY: a CUDA array
	MemoryUnified MemoryType = 4 // CU_MEMORYTYPE_UNIFIED: unified device or host memory
)

// String returns "host", "device", "array", "unified", or MemoryType(N).
func (t MemoryType) String() string {
	switch t {
	case MemoryHost:
		return "host"
	case MemoryDevice:
		return "device"
	case MemoryArray:
		return "array"
	case MemoryUnified:
		return "unified"
	}
	return "MemoryType(" + strconv.Itoa(int(t)) + ")"
}

// PointerInfo describes the allocation that contains an address, for checking arguments
// before a kernel reads or writes them.
type PointerInfo struct {
	Type MemoryType // where the memory lives
	// Device is the device the memory was allocated on or registered with (DEVICE_ORDINAL).
	Device  Device
	Managed bool // managed memory (cuMemAllocManaged), which migrates between host and devices
	// Base and Size are the allocation's address range (RANGE_START_ADDR, RANGE_SIZE): the
	// cuMemAlloc allocation, or for VMM memory the whole reservation of cuMemAddressReserve,
	// mapped or not.
	//
	// The driver reports every field for device memory. For other kinds of memory it may
	// refuse some; those stay zero, and Device -1.
	Base DevicePtr
	Size uint64
	// InContext: the memory belongs to the context PointerInfo was called on. VMM and
	// stream-ordered allocations belong to no context; for them it says whether they were
	// made on the context's device.
	InContext bool
}

// Pointer attributes (CUpointer_attribute) that PointerInfo asks for, in the order of
// pointerAttrs.
const (
	pointerContext       = 1
	pointerMemoryType    = 2
	pointerIsManaged     = 8
	pointerDeviceOrdinal = 9
)

var pointerAttrs = [...]uint32{pointerMemoryType, pointerDeviceOrdinal, pointerContext, pointerIsManaged,
	pointerRangeStartAddr, pointerRangeSize}

// pointerQuery is the memory of one cuPointerGetAttributes call: the attribute list, the
// void* array, and one 8-byte slot per attribute, zeroed before each call. The driver writes
// 1 (bool), 4 (unsigned int, int) or 8 bytes (CUcontext, CUdeviceptr, size_t) into a slot,
// so an 8-byte slot holds any of them, read from its low bytes (little-endian). Queries are
// pooled: the driver writes through data, which must point into memory that neither moves
// nor is freed during the call, and a heap object from the pool is both.
type pointerQuery struct {
	attrs [len(pointerAttrs)]uint32
	data  [len(pointerAttrs)]uintptr
	vals  [len(pointerAttrs)]uint64
}

var pointerQueries = sync.Pool{New: func() any {
	q := &pointerQuery{attrs: pointerAttrs}
	for i := range q.data {
		q.data[i] = uintptr(unsafe.Pointer(&q.vals[i]))
	}
	return q
}}

// PointerInfo describes the memory at p (cuPointerGetAttributes: MEMORY_TYPE, DEVICE_ORDINAL,
// CONTEXT, IS_MANAGED, RANGE_START_ADDR, RANGE_SIZE, in one call that allocates nothing; one
// cuPointerGetAttribute call per attribute without FeaturePointerAttributes). p may point
// inside an allocation.
//
// An address the driver knows no allocation at, such as pageable host memory (Go memory), a
// freed allocation or a made-up address, returns an error matching ErrNotDeviceMemory.
// Pinned host memory is no error: its Type is MemoryHost.
func (c *Context) PointerInfo(p DevicePtr) (PointerInfo, error) {
	if cuPointerGetAttributes == 0 {
		return c.pointerInfoSingly(p)
	}
	q := pointerQueries.Get().(*pointerQuery)
	q.vals = [len(pointerAttrs)]uint64{}
	r, failed, err := c.hotResult(true, cuPointerGetAttributes, uintptr(len(q.attrs)),
		uintptr(unsafe.Pointer(&q.attrs[0])), uintptr(unsafe.Pointer(&q.data[0])), uintptr(p))
	vals := q.vals
	runtime.KeepAlive(q) // the driver wrote through q.data into q.vals
	pointerQueries.Put(q)
	if err != nil {
		return PointerInfo{}, err
	}
	switch {
	case r == 1 && failed == cuPointerGetAttributes:
		// One answer for all six: an unknown address, or an attribute that the driver does
		// not report for this kind of memory. One call per attribute tells them apart.
		return c.pointerInfoSingly(p)
	case r != 0:
		return PointerInfo{}, pointerError(p, failed, newError(failed, r))
	}
	return c.pointerInfo(p, vals)
}

// pointerInfoSingly is PointerInfo with one cuPointerGetAttribute call per attribute. The
// first, MEMORY_TYPE, fails for an unknown address; once it succeeded the driver knows the
// memory, and an attribute it refuses for that kind of memory keeps its "not reported" value.
func (c *Context) pointerInfoSingly(p DevicePtr) (PointerInfo, error) {
	var vals [len(pointerAttrs)]uint64
	for i, a := range pointerAttrs {
		err := c.call(cuPointerGetAttribute, uintptr(unsafe.Pointer(&vals[i])), uintptr(a), uintptr(p))
		if err == nil {
			continue
		}
		e, ok := err.(*Error)
		switch {
		case !ok || e.Op != symbolName(cuPointerGetAttribute):
			return PointerInfo{}, err // not the query: the context could not be made current
		case i > 0 && (e.Code == 1 || e.Code == 801):
			vals[i] = 0
			if a == pointerDeviceOrdinal {
				vals[i] = uint64(^uint32(0)) // the int -1: no device named
			}
			continue
		}
		return PointerInfo{}, pointerError(p, cuPointerGetAttribute, e)
	}
	return c.pointerInfo(p, vals)
}

// pointerError is the error of a failed pointer query: unknown addresses give
// CUDA_ERROR_INVALID_VALUE (or INVALID_CONTEXT: no context with unified addressing knows it),
// which wraps ErrNotDeviceMemory too.
func pointerError(p DevicePtr, failed uintptr, e *Error) error {
	if failed != cuCtxSetCurrent && (e.Code == 1 || e.Code == 201) {
		return fmt.Errorf("pointer %#x: %w (%w)", uintptr(p), ErrNotDeviceMemory, e)
	}
	return fmt.Errorf("attributes of pointer %#x: %w", uintptr(p), e)
}

// pointerInfo decodes the slots of the attributes, in the order of pointerAttrs.
func (c *Context) pointerInfo(p DevicePtr, v [len(pointerAttrs)]uint64) (PointerInfo, error) {
	typ := MemoryType(uint32(v[0]))
	if typ == 0 {
		// cuPointerGetAttributes succeeds on unknown addresses, with every attribute zero.
		return PointerInfo{}, fmt.Errorf("pointer %#x: the driver knows no allocation there: %w", uintptr(p), ErrNotDeviceMemory)
	}
	info := PointerInfo{
		Type:    typ,
		Device:  Device(int32(uint32(v[1]))),
		Managed: uint32(v[3]) != 0,
		Base:    DevicePtr(v[4]),
		Size:    v[5],
	}
	ctx := uintptr(v[2])
	info.InContext = ctx == c.handle || (ctx == 0 && info.Device == c.dev)
	return info, nil
}
