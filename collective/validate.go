package collective

import (
	"errors"
	"math"
	"slices"

	"github.com/goccl/goccl/driver"
	"github.com/goccl/goccl/ptx"
)

// checkStream refuses a stream this rank cannot launch on: nil, closed, not made by the
// driver package (a zero Stream has no context), or of another device.
func (c *Comm) checkStream(stream *driver.Stream) error {
	switch {
	case stream == nil:
		return invalid("nil stream")
	case stream.Context() == nil || stream.Handle() == 0:
		return invalid("the stream is closed, or was not made by driver.NewStream or driver.WrapStream")
	case stream.Context().Device() != c.dev:
		return invalid("stream belongs to device %d, this rank runs on device %d", stream.Context().Device(), c.dev)
	}
	return nil
}

// validate checks a call's arguments and returns its size in bytes. It runs before anything is
// launched, so a bad call never reaches a kernel.
func (c *Comm) validate(stream *driver.Stream, dst, src driver.DevicePtr, count int, dt DType) (int64, error) {
	if !dt.Valid() {
		return 0, invalid("unsupported element type %v: use Float32, Float16 or BFloat16", dt)
	}
	if count <= 0 {
		return 0, invalid("count %d: must be positive", count)
	}
	// Compare before multiplying: count*size may not fit an int64. (route checks the size
	// against MaxBytes, which only the custom kernels have.)
	if int64(count) > math.MaxInt64/int64(dt.Size()) {
		return 0, invalid("%d elements of %v are more bytes than an int64 holds", count, dt)
	}
	nbytes := int64(count) * int64(dt.Size())
	switch {
	case src == 0 || dst == 0:
		return 0, invalid("nil buffer (src %#x, dst %#x)", uint64(src), uint64(dst))
	case src%ptx.VectorBytes != 0 || dst%ptx.VectorBytes != 0:
		return 0, invalid("buffers must be 16-byte aligned (src %#x, dst %#x)", uint64(src), uint64(dst))
	case uint64(src) > math.MaxUint64-uint64(nbytes) || uint64(dst) > math.MaxUint64-uint64(nbytes):
		return 0, invalid("buffer of %d bytes at src %#x or dst %#x wraps around the address space", nbytes, uint64(src), uint64(dst))
	case dst != src && overlap(dst, src, uint64(nbytes)):
		return 0, invalid("dst %#x and src %#x overlap without being equal (%d bytes): pass dst == src for an in-place all-reduce, or buffers that do not overlap", uint64(dst), uint64(src), nbytes)
	}
	if err := c.checkStream(stream); err != nil {
		return 0, err
	}
	if err := c.checkPointer("src", src, uint64(nbytes)); err != nil {
		return 0, err
	}
	if dst != src {
		if err := c.checkPointer("dst", dst, uint64(nbytes)); err != nil {
			return 0, err
		}
	}
	return nbytes, nil
}

func overlap(a, b driver.DevicePtr, n uint64) bool {
	return a < b+driver.DevicePtr(n) && b < a+driver.DevicePtr(n)
}

// pointerCache holds the allocations that checkPointer found to be device memory of this
// rank's device, sorted by base, so that known buffers cost no driver call. An allocation
// freed and replaced by another of the same range is not asked about again: a buffer must stay
// allocated while calls that use it are queued, as with any CUDA library.
type pointerCache struct {
	ranges []allocRange
}

type allocRange struct {
	base driver.DevicePtr
	size uint64
}

// maxCachedAllocations bounds the cache; past it the whole cache is forgotten, and the
// allocations still in use are checked with the driver again.
const maxCachedAllocations = 4096

// find reports whether [p, p+n) lies inside one cached allocation.
func (pc *pointerCache) find(p driver.DevicePtr, n uint64) bool {
	i, _ := slices.BinarySearchFunc(pc.ranges, p, func(r allocRange, p driver.DevicePtr) int {
		switch {
		case r.base+driver.DevicePtr(r.size) <= p:
			return -1
		case r.base > p:
			return 1
		}
		return 0
	})
	if i == len(pc.ranges) {
		return false
	}
	r := pc.ranges[i]
	return r.base <= p && p+driver.DevicePtr(n) <= r.base+driver.DevicePtr(r.size)
}

func (pc *pointerCache) add(r allocRange) {
	if len(pc.ranges) >= maxCachedAllocations {
		pc.ranges = pc.ranges[:0]
	}
	i, found := slices.BinarySearchFunc(pc.ranges, r.base, func(e allocRange, b driver.DevicePtr) int {
		switch {
		case e.base < b:
			return -1
		case e.base > b:
			return 1
		}
		return 0
	})
	if found {
		pc.ranges[i] = r
		return
	}
	pc.ranges = slices.Insert(pc.ranges, i, r)
}

// checkPointer refuses a buffer [p, p+n) that is not device memory of this rank's device
// inside one allocation: a host pointer, a freed allocation, memory of another device or
// garbage would otherwise fault in the kernel and leave the CUDA context of the whole process
// unusable. The answer is cached per allocation. A range whose end wraps around the address
// space is refused first: its wrapped end would pass both the cache's and the allocation's
// bounds.
func (c *Comm) checkPointer(what string, p driver.DevicePtr, n uint64) error {
	if uint64(p) > math.MaxUint64-n {
		return invalid("%s %#x of %d bytes wraps around the address space: pass the buffer's size in bytes", what, uint64(p), n)
	}
	if c.pointers.find(p, n) {
		return nil
	}
	info, err := c.ctx.PointerInfo(p)
	switch {
	case errors.Is(err, driver.ErrNotDeviceMemory):
		return invalid("%s %#x is not memory CUDA knows (a host pointer, a freed allocation, or garbage): pass device memory of device %d", what, uint64(p), c.dev)
	case err != nil:
		return c.fail(err)
	case info.Type != driver.MemoryDevice:
		return invalid("%s %#x is %v memory: pass device memory of device %d", what, uint64(p), info.Type, c.dev)
	case info.Device != c.dev:
		return invalid("%s %#x is memory of device %d, but this rank runs on device %d", what, uint64(p), info.Device, c.dev)
	case p+driver.DevicePtr(n) > info.Base+driver.DevicePtr(info.Size):
		return invalid("%s %#x+%d runs past the end of its allocation (%#x, %d bytes)", what, uint64(p), n, uint64(info.Base), info.Size)
	}
	c.pointers.add(allocRange{base: info.Base, size: info.Size})
	return nil
}
