//go:build !goccl_nvml_cgo

package topology

import (
	"errors"
	"fmt"
	"structs"
	"unsafe"

	"github.com/ebitengine/purego"
)

// defaultNVML binds libnvidia-ml through purego, with or without cgo: no C compiler, no
// libc-linked NVML wrapper, nothing to build. The goccl_nvml_cgo tag swaps in go-nvml
// (nvml_cgo.go) instead.
func defaultNVML() NVML { return &puregoNVML{path: nvmlLibraryPath()} }

// puregoNVML calls libnvidia-ml's C functions through purego.SyscallN. The library is opened
// by Init and stays open for the life of the process: NVML's own threads make dlclose unsafe.
type puregoNVML struct {
	path string
	lib  uintptr

	errorString                     uintptr
	initV2                          uintptr
	shutdown                        uintptr
	systemGetDriverVersion          uintptr
	deviceGetCountV2                uintptr
	deviceGetHandleByIndexV2        uintptr
	deviceGetUUID                   uintptr
	deviceGetPciInfoV3              uintptr
	deviceGetP2PStatus              uintptr
	deviceGetNvLinkState            uintptr
	deviceGetNvLinkRemotePciInfoV2  uintptr
	deviceGetTopologyCommonAncestor uintptr
}

// symbols is the binding table: every C function used, all of them required. The versioned
// names are the ones current drivers export (the unversioned ones are older ABIs).
func (n *puregoNVML) symbols() []struct {
	name string
	fn   *uintptr
} {
	return []struct {
		name string
		fn   *uintptr
	}{
		{"nvmlErrorString", &n.errorString},
		{"nvmlInit_v2", &n.initV2},
		{"nvmlShutdown", &n.shutdown},
		{"nvmlSystemGetDriverVersion", &n.systemGetDriverVersion},
		{"nvmlDeviceGetCount_v2", &n.deviceGetCountV2},
		{"nvmlDeviceGetHandleByIndex_v2", &n.deviceGetHandleByIndexV2},
		{"nvmlDeviceGetUUID", &n.deviceGetUUID},
		{"nvmlDeviceGetPciInfo_v3", &n.deviceGetPciInfoV3},
		{"nvmlDeviceGetP2PStatus", &n.deviceGetP2PStatus},
		{"nvmlDeviceGetNvLinkState", &n.deviceGetNvLinkState},
		{"nvmlDeviceGetNvLinkRemotePciInfo_v2", &n.deviceGetNvLinkRemotePciInfoV2},
		{"nvmlDeviceGetTopologyCommonAncestor", &n.deviceGetTopologyCommonAncestor},
	}
}

// load opens the library and resolves every symbol. A library that does not open is
// ErrNoNVML; one that lacks a symbol is too old for us, which is an error of its own.
func (n *puregoNVML) load() error {
	if n.lib != 0 {
		return nil
	}
	lib, err := purego.Dlopen(n.path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return fmt.Errorf("%w: dlopen %s: %v (install the NVIDIA driver's NVML or set GOCCL_LIBNVML to its path)",
			ErrNoNVML, n.path, err)
	}
	for _, s := range n.symbols() {
		p, err := purego.Dlsym(lib, s.name)
		if err != nil {
			return fmt.Errorf("load NVML %s: symbol %s: %w (driver too old?)", n.path, s.name, err)
		}
		*s.fn = p
	}
	n.lib = lib
	return nil
}

// check turns an nvmlReturn_t into nil or an *NVMLError carrying NVML's text for it.
func (n *puregoNVML) check(op string, r uintptr) error {
	// nvmlReturn_t is a C enum: only the low 32 bits of the register are defined.
	code := NVMLReturn(int32(uint32(r)))
	if code == NVMLSuccess {
		return nil
	}
	// const char* nvmlErrorString(nvmlReturn_t result);
	s, _, _ := purego.SyscallN(n.errorString, uintptr(uint32(code)))
	return &NVMLError{Op: op, Code: code, Message: goString(s)}
}

// Init loads the library and initialises NVML.
func (n *puregoNVML) Init() error {
	if err := n.load(); err != nil {
		return err
	}
	// nvmlReturn_t nvmlInit_v2(void);
	r, _, _ := purego.SyscallN(n.initV2)
	return n.check("nvmlInit_v2", r)
}

// Shutdown releases what Init set up.
func (n *puregoNVML) Shutdown() error {
	if n.lib == 0 {
		return errors.New("nvmlShutdown: NVML was never initialised")
	}
	// nvmlReturn_t nvmlShutdown(void);
	r, _, _ := purego.SyscallN(n.shutdown)
	return n.check("nvmlShutdown", r)
}

// DriverVersion is the kernel driver's version string.
func (n *puregoNVML) DriverVersion() (string, error) {
	buf := make([]byte, 80) // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
	// nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
	r, _, _ := purego.SyscallN(n.systemGetDriverVersion, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	if err := n.check("nvmlSystemGetDriverVersion", r); err != nil {
		return "", err
	}
	return cBytesString(buf), nil
}

// DeviceCount is the number of GPUs NVML sees.
func (n *puregoNVML) DeviceCount() (int, error) {
	var count uint32
	// nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
	r, _, _ := purego.SyscallN(n.deviceGetCountV2, uintptr(unsafe.Pointer(&count)))
	if err := n.check("nvmlDeviceGetCount_v2", r); err != nil {
		return 0, err
	}
	return int(count), nil
}

// DeviceByIndex returns NVML's GPU number index.
func (n *puregoNVML) DeviceByIndex(index int) (NVMLDevice, error) {
	var h uintptr
	// nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
	r, _, _ := purego.SyscallN(n.deviceGetHandleByIndexV2, uintptr(uint32(index)), uintptr(unsafe.Pointer(&h)))
	if err := n.check("nvmlDeviceGetHandleByIndex_v2", r); err != nil {
		return nil, err
	}
	return puregoDevice{n: n, h: h}, nil
}

// puregoDevice is an nvmlDevice_t (an opaque pointer owned by NVML).
type puregoDevice struct {
	n *puregoNVML
	h uintptr
}

// peerHandle unwraps a peer of the same implementation.
func peerHandle(op string, peer NVMLDevice) (uintptr, error) {
	p, ok := peer.(puregoDevice)
	if !ok {
		return 0, fmt.Errorf("%s: peer %T is not a device of this NVML", op, peer)
	}
	return p.h, nil
}

func (d puregoDevice) UUID() (string, error) {
	buf := make([]byte, 96) // NVML_DEVICE_UUID_V2_BUFFER_SIZE
	// nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length);
	r, _, _ := purego.SyscallN(d.n.deviceGetUUID, d.h, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	if err := d.n.check("nvmlDeviceGetUUID", r); err != nil {
		return "", err
	}
	return cBytesString(buf), nil
}

// nvmlPciInfo mirrors nvmlPciInfo_t (68 bytes, 4-byte aligned).
type nvmlPciInfo struct {
	_              structs.HostLayout
	busIDLegacy    [16]byte // NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE
	domain         uint32
	bus            uint32
	device         uint32
	pciDeviceID    uint32
	pciSubSystemID uint32
	busID          [32]byte // NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE
}

func (d puregoDevice) PCIBusID() (string, error) {
	var pci nvmlPciInfo
	// nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci);
	r, _, _ := purego.SyscallN(d.n.deviceGetPciInfoV3, d.h, uintptr(unsafe.Pointer(&pci)))
	if err := d.n.check("nvmlDeviceGetPciInfo_v3", r); err != nil {
		return "", err
	}
	return cBytesString(pci.busID[:]), nil
}

func (d puregoDevice) P2PStatus(peer NVMLDevice, c P2PCap) (P2PStatus, error) {
	ph, err := peerHandle("nvmlDeviceGetP2PStatus", peer)
	if err != nil {
		return P2PUnknown, err
	}
	var st int32
	// nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
	//     nvmlGpuP2PCapsIndex_t p2pIndex, nvmlGpuP2PStatus_t *p2pStatus);
	r, _, _ := purego.SyscallN(d.n.deviceGetP2PStatus, d.h, ph, uintptr(c), uintptr(unsafe.Pointer(&st)))
	if err := d.n.check("nvmlDeviceGetP2PStatus", r); err != nil {
		return P2PUnknown, err
	}
	return P2PStatus(st), nil
}

func (d puregoDevice) NVLinkActive(link int) (bool, error) {
	var st int32
	// nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
	//     nvmlEnableState_t *isActive);
	r, _, _ := purego.SyscallN(d.n.deviceGetNvLinkState, d.h, uintptr(uint32(link)), uintptr(unsafe.Pointer(&st)))
	if err := d.n.check("nvmlDeviceGetNvLinkState", r); err != nil {
		return false, err
	}
	return st == 1, nil // NVML_FEATURE_ENABLED
}

func (d puregoDevice) NVLinkRemoteBusID(link int) (string, error) {
	var pci nvmlPciInfo
	// nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
	//     nvmlPciInfo_t *pci);
	r, _, _ := purego.SyscallN(d.n.deviceGetNvLinkRemotePciInfoV2, d.h, uintptr(uint32(link)), uintptr(unsafe.Pointer(&pci)))
	if err := d.n.check("nvmlDeviceGetNvLinkRemotePciInfo_v2", r); err != nil {
		return "", err
	}
	return cBytesString(pci.busID[:]), nil
}

func (d puregoDevice) CommonAncestor(peer NVMLDevice) (Level, error) {
	ph, err := peerHandle("nvmlDeviceGetTopologyCommonAncestor", peer)
	if err != nil {
		return LevelUnknown, err
	}
	var lvl uint32
	// nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
	//     nvmlDevice_t device2, nvmlGpuTopologyLevel_t *pathInfo);
	r, _, _ := purego.SyscallN(d.n.deviceGetTopologyCommonAncestor, d.h, ph, uintptr(unsafe.Pointer(&lvl)))
	if err := d.n.check("nvmlDeviceGetTopologyCommonAncestor", r); err != nil {
		return LevelUnknown, err
	}
	return levelFromNVML(lvl), nil
}

// cBytesString is the NUL-terminated string at the start of b.
func cBytesString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// goString copies the NUL-terminated C string at p (memory NVML owns, never the Go heap).
func goString(p uintptr) string {
	if p == 0 {
		return ""
	}
	// Reinterpreting the word avoids a uintptr->unsafe.Pointer conversion that vet (rightly,
	// for Go memory) flags; p points into the C library's static data.
	base := *(*unsafe.Pointer)(unsafe.Pointer(&p))
	n := 0
	for *(*byte)(unsafe.Add(base, n)) != 0 {
		n++
	}
	return string(unsafe.Slice((*byte)(base), n))
}
