//go:build goccl_nvml_cgo && cgo

package topology

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// defaultNVML uses NVIDIA's go-nvml, which needs cgo. It is chosen only by the
// goccl_nvml_cgo build tag; every other build binds the same calls through purego
// (nvml_purego.go).
func defaultNVML() NVML {
	path := nvmlLibraryPath()
	return goNVML{lib: nvml.New(nvml.WithLibraryPath(path)), path: path}
}

// goNVML adapts an nvml.Interface: the real library or one of go-nvml's mock servers.
type goNVML struct {
	lib  nvml.Interface
	path string // for the message when the library does not load; "" for mocks
}

// goNVMLError turns a go-nvml status into nil or an *NVMLError.
func goNVMLError(op string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	return &NVMLError{Op: op, Code: NVMLReturn(r), Message: r.Error()}
}

func (g goNVML) Init() error {
	r := g.lib.Init()
	if r == nvml.ERROR_LIBRARY_NOT_FOUND {
		// go-nvml drops dlopen's reason; at least say what was looked for.
		return &NVMLError{Op: "nvmlInit_v2", Code: NVMLErrorLibraryNotFound,
			Message: fmt.Sprintf("could not load %s (install the NVIDIA driver's NVML or set GOCCL_LIBNVML to its path)", g.path)}
	}
	return goNVMLError("nvmlInit_v2", r)
}

func (g goNVML) Shutdown() error { return goNVMLError("nvmlShutdown", g.lib.Shutdown()) }

func (g goNVML) DriverVersion() (string, error) {
	v, r := g.lib.SystemGetDriverVersion()
	return v, goNVMLError("nvmlSystemGetDriverVersion", r)
}

func (g goNVML) DeviceCount() (int, error) {
	n, r := g.lib.DeviceGetCount()
	return n, goNVMLError("nvmlDeviceGetCount_v2", r)
}

func (g goNVML) DeviceByIndex(index int) (NVMLDevice, error) {
	d, r := g.lib.DeviceGetHandleByIndex(index)
	if err := goNVMLError("nvmlDeviceGetHandleByIndex_v2", r); err != nil {
		return nil, err
	}
	return goDevice{d}, nil
}

// goDevice adapts an nvml.Device.
type goDevice struct{ d nvml.Device }

// goPeer unwraps a peer of the same implementation.
func goPeer(op string, peer NVMLDevice) (nvml.Device, error) {
	p, ok := peer.(goDevice)
	if !ok {
		return nil, fmt.Errorf("%s: peer %T is not a device of this NVML", op, peer)
	}
	return p.d, nil
}

func (g goDevice) UUID() (string, error) {
	u, r := g.d.GetUUID()
	return u, goNVMLError("nvmlDeviceGetUUID", r)
}

func (g goDevice) PCIBusID() (string, error) {
	pci, r := g.d.GetPciInfo()
	return int8String(pci.BusId[:]), goNVMLError("nvmlDeviceGetPciInfo_v3", r)
}

func (g goDevice) P2PStatus(peer NVMLDevice, c P2PCap) (P2PStatus, error) {
	p, err := goPeer("nvmlDeviceGetP2PStatus", peer)
	if err != nil {
		return P2PUnknown, err
	}
	st, r := g.d.GetP2PStatus(p, nvml.GpuP2PCapsIndex(c))
	if err := goNVMLError("nvmlDeviceGetP2PStatus", r); err != nil {
		return P2PUnknown, err
	}
	return P2PStatus(st), nil
}

func (g goDevice) NVLinkActive(link int) (bool, error) {
	st, r := g.d.GetNvLinkState(link)
	return st == nvml.FEATURE_ENABLED, goNVMLError("nvmlDeviceGetNvLinkState", r)
}

func (g goDevice) NVLinkRemoteBusID(link int) (string, error) {
	pci, r := g.d.GetNvLinkRemotePciInfo(link)
	return int8String(pci.BusId[:]), goNVMLError("nvmlDeviceGetNvLinkRemotePciInfo_v2", r)
}

func (g goDevice) CommonAncestor(peer NVMLDevice) (Level, error) {
	p, err := goPeer("nvmlDeviceGetTopologyCommonAncestor", peer)
	if err != nil {
		return LevelUnknown, err
	}
	lvl, r := g.d.GetTopologyCommonAncestor(p)
	if err := goNVMLError("nvmlDeviceGetTopologyCommonAncestor", r); err != nil {
		return LevelUnknown, err
	}
	return levelFromNVML(uint32(lvl)), nil
}

// int8String is the NUL-terminated string in a go-nvml char array.
func int8String(b []int8) string {
	s := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
