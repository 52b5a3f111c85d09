package driver

import (
	"fmt"
	"unsafe"
)

// Values of the VMM enums used here.
const (
	memAllocationTypePinned     = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memHandleTypePOSIXFD        = 1 // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	memLocationTypeDevice       = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessFlagsProtReadWrite = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	memAllocGranularityMinimum  = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
)

// memLocation mirrors CUmemLocation { CUmemLocationType type; int id; }.
type memLocation struct {
	typ int32
	id  int32
}

// memAllocationProp mirrors CUmemAllocationProp (32 bytes):
//
//	typedef struct CUmemAllocationProp_st {
//	    CUmemAllocationType type;
//	    CUmemAllocationHandleType requestedHandleTypes;
//	    CUmemLocation location;
//	    void *win32HandleMetaData;
//	    struct {
//	        unsigned char compressionType;
//	        unsigned char gpuDirectRDMACapable;
//	        unsigned short usage;
//	        unsigned char reserved[4];
//	    } allocFlags;
//	} CUmemAllocationProp;
type memAllocationProp struct {
	typ                  uint32
	requestedHandleTypes uint32
	location             memLocation
	win32HandleMetaData  uintptr
	allocFlags           [8]byte
}

// memAccessDesc mirrors CUmemAccessDesc { CUmemLocation location; CUmemAccess_flags flags; }.
type memAccessDesc struct {
	location memLocation
	flags    uint32
}

// PhysicalAlloc is device memory without an address (a CUmemGenericAllocationHandle): map it
// with Map, share it with ExportFD. Release frees it once every mapping is gone.
type PhysicalAlloc struct {
	ctx    *Context
	handle uint64 // 0 once released
}

// posixFDProp describes a pinned allocation on c's device that can be exported as a POSIX fd.
func (c *Context) posixFDProp() memAllocationProp {
	return memAllocationProp{
		typ:                  memAllocationTypePinned,
		requestedHandleTypes: memHandleTypePOSIXFD,
		location:             memLocation{typ: memLocationTypeDevice, id: int32(c.dev)},
	}
}

// VMMGranularity returns the minimum granularity of a POSIX-FD exportable allocation on c's
// device: sizes and addresses of CreatePhysical, ReserveAddress and Map are multiples of it.
func (c *Context) VMMGranularity() (uint64, error) {
	if err := c.live(); err != nil {
		return 0, err
	}
	if err := need(FeatureVMM); err != nil {
		return 0, err
	}
	prop := c.posixFDProp()
	var g uint64
	if err := c.call(cuMemGetAllocationGranularity, uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&prop)),
		memAllocGranularityMinimum); err != nil {
		return 0, fmt.Errorf("VMM granularity of device %d: %w", c.dev, err)
	}
	return g, nil
}

// CreatePhysical allocates size bytes of device memory that can be exported as a POSIX file
// descriptor (cuMemCreate). size must be a multiple of VMMGranularity.
func (c *Context) CreatePhysical(size uint64) (*PhysicalAlloc, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	if err := need(FeatureVMM); err != nil {
		return nil, err
	}
	prop := c.posixFDProp()
	var h uint64
	if err := c.call(cuMemCreate, uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&prop)), 0); err != nil {
		return nil, fmt.Errorf("create %d bytes of physical memory on device %d (size must be a multiple of VMMGranularity): %w",
			size, c.dev, err)
	}
	return &PhysicalAlloc{ctx: c, handle: h}, nil
}

// ExportFD exports the allocation as a POSIX file descriptor (cuMemExportToShareableHandle),
// to pass to another process over a Unix socket (SCM_RIGHTS) or as an inherited file. The
// caller owns the descriptor and closes it.
func (p *PhysicalAlloc) ExportFD() (int, error) {
	if p == nil || p.handle == 0 {
		return -1, errClosed("physical allocation")
	}
	var fd int32
	if err := p.ctx.call(cuMemExportToShareableHandle, uintptr(unsafe.Pointer(&fd)), uintptr(p.handle),
		memHandleTypePOSIXFD, 0); err != nil {
		return -1, fmt.Errorf("export physical allocation as a file descriptor: %w", err)
	}
	return int(fd), nil
}

// ImportPhysicalFD imports an allocation exported by ExportFD, possibly in another process
// (cuMemImportFromShareableHandle). fd stays owned by the caller.
func (c *Context) ImportPhysicalFD(fd int) (*PhysicalAlloc, error) {
	if err := c.live(); err != nil {
		return nil, err
	}
	if err := need(FeatureVMM); err != nil {
		return nil, err
	}
	var h uint64
	// For POSIX fds the void *osHandle argument is the descriptor's value itself.
	if err := c.call(cuMemImportFromShareableHandle, uintptr(unsafe.Pointer(&h)), uintptr(fd), memHandleTypePOSIXFD); err != nil {
		return nil, fmt.Errorf("import physical allocation from file descriptor %d: %w", fd, err)
	}
	return &PhysicalAlloc{ctx: c, handle: h}, nil
}

// Release drops this reference to the allocation (cuMemRelease); the memory is freed once it
// is also unmapped everywhere. Calling it again does nothing.
func (p *PhysicalAlloc) Release() error {
	if p == nil || p.handle == 0 {
		return nil
	}
	h := p.handle
	p.handle = 0
	return p.ctx.call(cuMemRelease, uintptr(h))
}

// ReserveAddress reserves size bytes of device address space aligned to align (0: the
// granularity) without memory behind it (cuMemAddressReserve). Free it with FreeAddress.
func (c *Context) ReserveAddress(size, align uint64) (DevicePtr, error) {
	if err := c.live(); err != nil {
		return 0, err
	}
	if err := need(FeatureVMM); err != nil {
		return 0, err
	}
	var p DevicePtr
	if err := c.call(cuMemAddressReserve, uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(align), 0, 0); err != nil {
		return 0, fmt.Errorf("reserve %d bytes of device address space: %w", size, err)
	}
	return p, nil
}

// FreeAddress returns a reservation from ReserveAddress (cuMemAddressFree); unmap it first.
func (c *Context) FreeAddress(p DevicePtr, size uint64) error {
	if err := c.live(); err != nil {
		return err
	}
	if err := need(FeatureVMM); err != nil {
		return err
	}
	return c.call(cuMemAddressFree, uintptr(p), uintptr(size))
}

// Map maps phys at p (reserved, size bytes) and makes it readable and writable from c's device
// (cuMemMap, cuMemSetAccess). Use SetAccess to open it to more devices.
func (c *Context) Map(p DevicePtr, size uint64, phys *PhysicalAlloc) error {
	if err := c.live(); err != nil {
		return err
	}
	if err := need(FeatureVMM); err != nil {
		return err
	}
	if phys == nil || phys.handle == 0 {
		return errClosed("physical allocation")
	}
	if err := c.call(cuMemMap, uintptr(p), uintptr(size), 0, uintptr(phys.handle), 0); err != nil {
		return fmt.Errorf("map %d bytes at %#x: %w", size, p, err)
	}
	if err := c.SetAccess(p, size, c.dev); err != nil {
		_ = c.call(cuMemUnmap, uintptr(p), uintptr(size))
		return err
	}
	return nil
}

// Unmap unmaps [p, p+size) (cuMemUnmap); the reservation stays.
func (c *Context) Unmap(p DevicePtr, size uint64) error {
	if err := c.live(); err != nil {
		return err
	}
	if err := need(FeatureVMM); err != nil {
		return err
	}
	return c.call(cuMemUnmap, uintptr(p), uintptr(size))
}

// SetAccess makes mapped memory [p, p+size) readable and writable from each of devs
// (cuMemSetAccess).
func (c *Context) SetAccess(p DevicePtr, size uint64, devs ...Device) error {
	if err := c.live(); err != nil {
		return err
	}
	if err := need(FeatureVMM); err != nil {
		return err
	}
	if len(devs) == 0 {
		return fmt.Errorf("set access to %#x: no device given: %w", p, ErrInvalidValue)
	}
	desc := make([]memAccessDesc, len(devs))
	for i, d := range devs {
		desc[i] = memAccessDesc{location: memLocation{typ: memLocationTypeDevice, id: int32(d)}, flags: memAccessFlagsProtReadWrite}
	}
	if err := c.call(cuMemSetAccess, uintptr(p), uintptr(size), uintptr(unsafe.Pointer(&desc[0])), uintptr(len(desc))); err != nil {
		return fmt.Errorf("set access to %d bytes at %#x for devices %v: %w", size, p, devs, err)
	}
	return nil
}
