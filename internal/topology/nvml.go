package topology

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// NVML is the small part of NVIDIA's management library that topology uses. The default
// (Options.NVML nil) is a purego binding of libnvidia-ml in every build, cgo or not, and
// NVIDIA's go-nvml under the goccl_nvml_cgo build tag; tests pass a fake, or go-nvml's mock
// servers under the tag. Implementations need not be
// safe for concurrent use: Discover calls them from one goroutine.
type NVML interface {
	// Init loads and initialises the library. A missing library is an error matching
	// ErrNoNVML.
	Init() error
	// Shutdown undoes Init.
	Shutdown() error
	// DriverVersion is the kernel driver's version, e.g. "550.54.15".
	DriverVersion() (string, error)
	// DeviceCount is the number of GPUs NVML sees. NVML ignores CUDA_VISIBLE_DEVICES, so
	// this may be more than CUDA sees, in another order.
	DeviceCount() (int, error)
	// DeviceByIndex returns NVML's GPU number index (0 <= index < DeviceCount).
	DeviceByIndex(index int) (NVMLDevice, error)
}

// NVMLDevice is one GPU as NVML sees it. Methods taking a peer accept only devices of the
// same NVML.
type NVMLDevice interface {
	// UUID is the GPU's UUID as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx".
	UUID() (string, error)
	// PCIBusID is the bus id in NVML's format ("00000000:19:00.0").
	PCIBusID() (string, error)
	// P2PStatus says whether the peer capability c works between this GPU and peer.
	P2PStatus(peer NVMLDevice, c P2PCap) (P2PStatus, error)
	// NVLinkActive says whether NVLink link (0 <= link < NVLinkMaxLinks) is up. Links the
	// GPU does not have return an error with code NVMLErrorInvalidArgument or
	// NVMLErrorNotSupported.
	NVLinkActive(link int) (bool, error)
	// NVLinkRemoteBusID is the PCI bus id (NVML's format) of the device at the other end of
	// an active link: a GPU, or an NVSwitch.
	NVLinkRemoteBusID(link int) (string, error)
	// CommonAncestor is the closest PCIe/system level the two GPUs share.
	CommonAncestor(peer NVMLDevice) (Level, error)
}

// NVLinkMaxLinks is NVML_NVLINK_MAX_LINKS: link numbers probed per GPU.
const NVLinkMaxLinks = 36

// P2PCap is an nvmlGpuP2PCapsIndex_t: which peer-to-peer capability to ask about.
type P2PCap int32

// The capabilities topology asks NVML about (NVML_P2P_CAPS_INDEX_*).
const (
	P2PRead    P2PCap = 0
	P2PWrite   P2PCap = 1
	P2PNVLink  P2PCap = 2
	P2PAtomics P2PCap = 3
)

// String names the capability as NVML's enum does, lower case.
func (c P2PCap) String() string {
	switch c {
	case P2PRead:
		return "read"
	case P2PWrite:
		return "write"
	case P2PNVLink:
		return "nvlink"
	case P2PAtomics:
		return "atomics"
	}
	return "cap(" + strconv.Itoa(int(c)) + ")"
}

// P2PStatus is an nvmlGpuP2PStatus_t: whether a peer capability works, and if not why.
type P2PStatus int32

// NVML_P2P_STATUS_* values.
const (
	P2POK                      P2PStatus = 0
	P2PChipsetNotSupported     P2PStatus = 1
	P2PGPUNotSupported         P2PStatus = 2
	P2PIOHTopologyNotSupported P2PStatus = 3
	P2PDisabledByRegkey        P2PStatus = 4
	P2PNotSupported            P2PStatus = 5
	P2PUnknown                 P2PStatus = 6
)

var p2pStatusNames = []string{"ok", "chipset not supported", "GPU not supported",
	"IOH topology not supported", "disabled by regkey", "not supported", "unknown"}

// String says what the status means, e.g. "chipset not supported".
func (s P2PStatus) String() string {
	if s < 0 || int(s) >= len(p2pStatusNames) {
		return "p2p status " + strconv.Itoa(int(s))
	}
	return p2pStatusNames[s]
}

// Level is how far apart two GPUs are on the PCIe/system tree (nvmlGpuTopologyLevel_t),
// named as nvidia-smi topo -m names it.
type Level int

// Levels from closest to farthest. LevelUnknown (the zero value) means NVML did not say.
const (
	LevelUnknown Level = iota
	// LevelInternal: two GPUs on one board.
	LevelInternal
	// LevelPIX: at most one PCIe bridge between them.
	LevelPIX
	// LevelPXB: several PCIe bridges, no host bridge.
	LevelPXB
	// LevelPHB: through a PCIe host bridge.
	LevelPHB
	// LevelNode: across host bridges within one NUMA node.
	LevelNode
	// LevelSystem: across NUMA nodes (the SMP interconnect).
	LevelSystem
)

// String is the nvidia-smi topo -m abbreviation ("SYS", "PIX", ...), "?" when unknown.
func (l Level) String() string {
	switch l {
	case LevelInternal:
		return "INT"
	case LevelPIX:
		return "PIX"
	case LevelPXB:
		return "PXB"
	case LevelPHB:
		return "PHB"
	case LevelNode:
		return "NODE"
	case LevelSystem:
		return "SYS"
	}
	return "?"
}

// levelFromNVML maps an nvmlGpuTopologyLevel_t to a Level.
func levelFromNVML(v uint32) Level {
	switch v {
	case 0:
		return LevelInternal
	case 10:
		return LevelPIX
	case 20:
		return LevelPXB
	case 30:
		return LevelPHB
	case 40:
		return LevelNode
	case 50:
		return LevelSystem
	}
	return LevelUnknown
}

// ErrNoNVML means libnvidia-ml could not be loaded. Discover treats it as a normal state:
// the topology then holds only what CUDA says (no NVLink or PCIe facts).
var ErrNoNVML = errors.New("NVML library (libnvidia-ml.so.1) not available")

// NVMLReturn is an nvmlReturn_t status code.
type NVMLReturn int32

// The codes topology looks at; String knows them all.
const (
	NVMLSuccess              NVMLReturn = 0
	NVMLErrorInvalidArgument NVMLReturn = 2
	NVMLErrorNotSupported    NVMLReturn = 3
	NVMLErrorDriverNotLoaded NVMLReturn = 9
	NVMLErrorLibraryNotFound NVMLReturn = 12
	nvmlErrorUnknown         NVMLReturn = 999
)

// nvmlReturnNames are the NVML_ERROR_* names of codes 1..30, in order.
var nvmlReturnNames = strings.Fields(`UNINITIALIZED INVALID_ARGUMENT NOT_SUPPORTED NO_PERMISSION
	ALREADY_INITIALIZED NOT_FOUND INSUFFICIENT_SIZE INSUFFICIENT_POWER DRIVER_NOT_LOADED TIMEOUT
	IRQ_ISSUE LIBRARY_NOT_FOUND FUNCTION_NOT_FOUND CORRUPTED_INFOROM GPU_IS_LOST RESET_REQUIRED
	OPERATING_SYSTEM LIB_RM_VERSION_MISMATCH IN_USE MEMORY NO_DATA VGPU_ECC_NOT_SUPPORTED
	INSUFFICIENT_RESOURCES FREQ_NOT_SUPPORTED ARGUMENT_VERSION_MISMATCH DEPRECATED NOT_READY
	GPU_NOT_FOUND INVALID_STATE RESET_TYPE_NOT_SUPPORTED`)

// String gives the C name, e.g. "NVML_ERROR_NOT_SUPPORTED".
func (r NVMLReturn) String() string {
	switch {
	case r == NVMLSuccess:
		return "NVML_SUCCESS"
	case r >= 1 && int(r) <= len(nvmlReturnNames):
		return "NVML_ERROR_" + nvmlReturnNames[r-1]
	case r == nvmlErrorUnknown:
		return "NVML_ERROR_UNKNOWN"
	}
	return "NVML_ERROR_" + strconv.Itoa(int(r))
}

// NVMLError is a failed NVML call: the function, its status code and NVML's own text for it
// (nvmlErrorString).
type NVMLError struct {
	Op      string
	Code    NVMLReturn
	Message string
}

// Error reads "nvmlDeviceGetP2PStatus: NVML_ERROR_NOT_SUPPORTED (3): Not Supported".
func (e *NVMLError) Error() string {
	return fmt.Sprintf("%s: %s (%d): %s", e.Op, e.Code, int32(e.Code), e.Message)
}

// Is makes a library-not-found status match ErrNoNVML.
func (e *NVMLError) Is(target error) bool {
	return target == ErrNoNVML && e.Code == NVMLErrorLibraryNotFound
}

// nvmlCode returns the NVML status of err, or NVMLSuccess when err is not an *NVMLError.
func nvmlCode(err error) NVMLReturn {
	var e *NVMLError
	if errors.As(err, &e) {
		return e.Code
	}
	return NVMLSuccess
}

// nvmlLibraryPath is what the default NVML opens: $GOCCL_LIBNVML when set (tests, unusual
// installs), else the soname the dynamic loader resolves.
func nvmlLibraryPath() string {
	if p := os.Getenv("GOCCL_LIBNVML"); p != "" {
		return p
	}
	return "libnvidia-ml.so.1"
}

// NormalizeBusID turns a PCI bus id in any of the formats NVML and CUDA use
// ("00000000:19:00.0", "0000:19:00.0", "19:00.0", any case) into CUDA's
// "0000:19:00.0", lower case. ok is false when s is not a bus id.
func NormalizeBusID(s string) (id string, ok bool) {
	s = strings.TrimSpace(s)
	var domain uint64
	rest := s
	if strings.Count(s, ":") == 2 {
		d, r, _ := strings.Cut(s, ":")
		v, err := strconv.ParseUint(d, 16, 32)
		if err != nil {
			return "", false
		}
		domain, rest = v, r
	}
	bus, devfn, found := strings.Cut(rest, ":")
	if !found {
		return "", false
	}
	dev, fn, found := strings.Cut(devfn, ".")
	if !found {
		return "", false
	}
	b, err1 := strconv.ParseUint(bus, 16, 8)
	d, err2 := strconv.ParseUint(dev, 16, 8)
	f, err3 := strconv.ParseUint(fn, 16, 8)
	if err1 != nil || err2 != nil || err3 != nil || d > 31 || f > 7 {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, b, d, f), true
}
