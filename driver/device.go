package driver

import (
	"fmt"
	"strings"
	"unsafe"
)

// Device is a GPU ordinal as CUDA numbers them, after CUDA_VISIBLE_DEVICES. It is a plain
// value: nothing to close. Its methods call Init.
type Device int32

// DeviceAttribute is a CUdevice_attribute, for Device.Attribute.
type DeviceAttribute int32

// Device attributes used by goccl (values of CUdevice_attribute).
const (
	AttrMaxThreadsPerBlock            DeviceAttribute = 1
	AttrMaxSharedMemoryPerBlock       DeviceAttribute = 8
	AttrWarpSize                      DeviceAttribute = 10
	AttrMultiprocessorCount           DeviceAttribute = 16
	AttrCanMapHostMemory              DeviceAttribute = 19
	AttrPCIBusID                      DeviceAttribute = 33
	AttrPCIDeviceID                   DeviceAttribute = 34
	AttrMaxThreadsPerMultiprocessor   DeviceAttribute = 39
	AttrUnifiedAddressing             DeviceAttribute = 41
	AttrPCIDomainID                   DeviceAttribute = 50
	AttrComputeCapabilityMajor        DeviceAttribute = 75
	AttrComputeCapabilityMinor        DeviceAttribute = 76
	AttrMaxSharedMemoryPerBlockOptin  DeviceAttribute = 97
	AttrVirtualMemoryManagement       DeviceAttribute = 102
	AttrHandleTypePOSIXFileDescriptor DeviceAttribute = 103
)

// DeviceCount returns the number of devices the driver sees.
func DeviceCount() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var n int32
	if err := call(cuDeviceGetCount, uintptr(unsafe.Pointer(&n))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// GetDevice returns device ordinal, checked against the devices the driver sees.
func GetDevice(ordinal int) (Device, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var d int32
	if err := call(cuDeviceGet, uintptr(unsafe.Pointer(&d)), uintptr(ordinal)); err != nil {
		return 0, fmt.Errorf("device %d: %w", ordinal, err)
	}
	return Device(d), nil
}

// Name returns the product name, e.g. "NVIDIA H200".
func (d Device) Name() (string, error) {
	if err := Init(); err != nil {
		return "", err
	}
	var buf [256]byte
	if err := call(cuDeviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d)); err != nil {
		return "", err
	}
	return bufString(buf[:]), nil
}

// Attribute returns a device attribute (cuDeviceGetAttribute).
func (d Device) Attribute(a DeviceAttribute) (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var v int32
	if err := call(cuDeviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(d)); err != nil {
		return 0, fmt.Errorf("device %d attribute %d: %w", d, a, err)
	}
	return int(v), nil
}

// SMCount returns the number of streaming multiprocessors.
func (d Device) SMCount() (int, error) { return d.Attribute(AttrMultiprocessorCount) }

// ComputeCapability returns the compute capability, e.g. 9, 0 for an H100 or H200.
func (d Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = d.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// PCIBusID returns the PCI address in lower-case hex, e.g. "0000:19:00.0", the form sysfs and
// NVML use.
func (d Device) PCIBusID() (string, error) {
	if err := Init(); err != nil {
		return "", err
	}
	var buf [64]byte
	if err := call(cuDeviceGetPCIBusId, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d)); err != nil {
		return "", err
	}
	return strings.ToLower(bufString(buf[:])), nil
}

// UUID returns the 16 bytes of the GPU's UUID (as in nvidia-smi -L, "GPU-" plus hex).
func (d Device) UUID() ([16]byte, error) {
	var u [16]byte
	if err := Init(); err != nil {
		return u, err
	}
	if err := call(cuDeviceGetUuid_v2, uintptr(unsafe.Pointer(&u)), uintptr(d)); err != nil {
		return [16]byte{}, err
	}
	return u, nil
}

// TotalMem returns the device memory size in bytes.
func (d Device) TotalMem() (uint64, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	var n uint64
	if err := call(cuDeviceTotalMem_v2, uintptr(unsafe.Pointer(&n)), uintptr(d)); err != nil {
		return 0, err
	}
	return n, nil
}

// SupportsVMM reports whether the device supports virtual memory management (cuMemCreate,
// cuMemMap); see also Has(FeatureVMM) for the driver side.
func (d Device) SupportsVMM() (bool, error) {
	v, err := d.Attribute(AttrVirtualMemoryManagement)
	return v != 0, err
}

// SupportsPOSIXFD reports whether VMM allocations of the device can be exported as POSIX file
// descriptors (PhysicalAlloc.ExportFD).
func (d Device) SupportsPOSIXFD() (bool, error) {
	v, err := d.Attribute(AttrHandleTypePOSIXFileDescriptor)
	return v != 0, err
}

// p2pNativeAtomics is CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED.
const p2pNativeAtomics = 3

// PeerNativeAtomics reports whether every atomic operation of d on the memory of peer is
// performed natively over their link (cuDeviceGetP2PAttribute,
// CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED): true over NVLink, usually false over
// PCIe. A device's atomics on its own memory are native (d == peer, which the driver does not
// answer for).
func PeerNativeAtomics(d, peer Device) (bool, error) {
	if d == peer {
		return true, nil
	}
	if err := Init(); err != nil {
		return false, err
	}
	v, err := p2pAttribute(p2pNativeAtomics, d, peer)
	if err != nil {
		return false, fmt.Errorf("native atomics of device %d on device %d: %w", d, peer, err)
	}
	return v != 0, nil
}

// p2pAttribute is cuDeviceGetP2PAttribute of the link from src to dst.
func p2pAttribute(attr int32, src, dst Device) (int32, error) {
	var v int32
	err := call(cuDeviceGetP2PAttribute, uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(src), uintptr(dst))
	return v, err
}

// CanAccessPeer reports whether d can map the memory of peer (cuDeviceCanAccessPeer). The
// driver answers for two distinct devices; for d == peer it reports what the driver says,
// although a device always reaches its own memory.
func CanAccessPeer(d, peer Device) (bool, error) {
	if err := Init(); err != nil {
		return false, err
	}
	var v int32
	if err := call(cuDeviceCanAccessPeer, uintptr(unsafe.Pointer(&v)), uintptr(d), uintptr(peer)); err != nil {
		return false, fmt.Errorf("can device %d access device %d: %w", d, peer, err)
	}
	return v != 0, nil
}
